"""Extractive-QA metrics (0-100): exact match, token F1, contains; max over the gold answers.

English follows the official SQuAD v1.1/v2.0 evaluate script: lowercase, remove ASCII punctuation,
remove the articles a/an/the, collapse whitespace; F1 over the bag of whitespace tokens.

Chinese follows cmrc2018_evaluate.py: lowercase, drop punctuation, segment into single CJK characters
with runs of Latin letters/digits kept as one token each; F1 from the longest common *contiguous*
run of segments (its `find_lcs`); EM on the punctuation-free strings. Two deliberate departures: the
punctuation set is the script's list plus every ASCII and Unicode punctuation mark (the script leaves
e.g. ',' '.' '?' to nltk, which makes them tokens), and Latin runs are split on whitespace instead of
nltk.word_tokenize (equivalent once punctuation is gone, and needs no tokenizer data). The script
deletes punctuation without splitting, so "Apple，Google" became one token; here only in-word joiners
(- _ ' ’ / ·) are deleted that way ("ω-force" -> "ωforce", as in the script) and other marks separate.

language "auto": the Chinese rules when the gold answers (or, with no gold, the prediction) contain CJK.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Sequence

from harness.metrics.tokenizers import CJK_RE, has_cjk

QA_METRICS = ("em", "f1", "contains")

_ASCII_PUNCT = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b", re.UNICODE)
# cmrc2018_evaluate.py's sp_char (also holds symbols such as + = ~ that are not Unicode punctuation).
_CMRC_SPECIAL = frozenset(
    "-:_*^/\\~`+=，。：？！“”；’《》…·、「」（）－～『』"
)
_IN_WORD_JOINERS = frozenset("-_'’/·－")


def _is_zh_punct(ch: str) -> bool:
    return ch in _CMRC_SPECIAL or ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_en(text: str) -> str:
    """SQuAD's normalize_answer."""
    text = "".join(ch for ch in text.lower() if ch not in _ASCII_PUNCT)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def normalize_zh(text: str) -> str:
    """CMRC's remove_punctuation (lowercase, strip, drop punctuation), whitespace collapsed."""
    return " ".join("".join(ch for ch in text.lower() if not _is_zh_punct(ch)).split())


def segment_zh(text: str) -> list[str]:
    """CMRC's mixed_segmentation with rm_punc=True: CJK chars one by one, Latin/digit runs as words."""
    segments: list[str] = []
    run = ""
    for ch in text.lower().strip():
        if ch in _IN_WORD_JOINERS:
            continue  # deleted, not a separator: "ω-force" becomes one token "ωforce"
        if _is_zh_punct(ch):
            segments.extend(run.split())
            run = ""
        elif CJK_RE.match(ch):
            segments.extend(run.split())
            run = ""
            segments.append(ch)
        else:
            run += ch
    segments.extend(run.split())
    return segments


def _longest_common_run(a: list[str], b: list[str]) -> int:
    """Length of the longest common contiguous run (cmrc2018_evaluate.find_lcs)."""
    best = 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def _f1_from_overlap(overlap: int, n_pred: int, n_gold: int) -> float:
    if overlap == 0:
        return 0.0
    precision, recall = overlap / n_pred, overlap / n_gold
    return 100.0 * 2 * precision * recall / (precision + recall)


def _f1_en(prediction: str, gold: str) -> float:
    pred, ref = normalize_en(prediction).split(), normalize_en(gold).split()
    if not pred or not ref:
        return 100.0 if pred == ref else 0.0
    overlap = sum((Counter(pred) & Counter(ref)).values())
    return _f1_from_overlap(overlap, len(pred), len(ref))


def _f1_zh(prediction: str, gold: str) -> float:
    pred, ref = segment_zh(prediction), segment_zh(gold)
    if not pred or not ref:
        return 100.0 if pred == ref else 0.0
    return _f1_from_overlap(_longest_common_run(ref, pred), len(pred), len(ref))


def _contains(normalized_pred: str, normalized_gold: str, language: str) -> bool:
    if not normalized_gold:
        return not normalized_pred
    if language == "zh":
        return normalized_gold in normalized_pred
    return f" {normalized_gold} " in f" {normalized_pred} "  # whole words: "1" is not in "10"


def resolve_language(language: str, answers: Sequence[str], prediction: str = "") -> str:
    if language in ("en", "zh"):
        return language
    if language != "auto":
        raise ValueError(f"unknown language {language!r}; use en, zh or auto")
    evidence = answers if answers else [prediction]
    return "zh" if any(has_cjk(text) for text in evidence) else "en"


def _require_answers(answers: Sequence[str]) -> None:
    if isinstance(answers, str) or not answers:
        raise ValueError("answers must be a non-empty list of strings (use qa_scores for unanswerable items)")


def exact_match(prediction: str, answers: Sequence[str], language: str = "en") -> float:
    _require_answers(answers)
    lang = resolve_language(language, answers, prediction)
    normalize = normalize_zh if lang == "zh" else normalize_en
    pred = normalize(prediction)
    return 100.0 if any(normalize(gold) == pred for gold in answers) else 0.0


def f1(prediction: str, answers: Sequence[str], language: str = "en") -> float:
    _require_answers(answers)
    lang = resolve_language(language, answers, prediction)
    score = _f1_zh if lang == "zh" else _f1_en
    return max(score(prediction, gold) for gold in answers)


def contains(prediction: str, answers: Sequence[str], language: str = "en") -> float:
    _require_answers(answers)
    lang = resolve_language(language, answers, prediction)
    normalize = normalize_zh if lang == "zh" else normalize_en
    pred = normalize(prediction)
    return 100.0 if any(_contains(pred, normalize(gold), lang) for gold in answers) else 0.0


def _normalize_any(text: str) -> str:
    return normalize_en(normalize_zh(text))


def abstains(prediction: str, phrases: Sequence[str]) -> bool:
    """Empty (after normalization) or containing one of the abstain phrases, compared normalized."""
    pred = _normalize_any(prediction)
    if not pred:
        return True
    return any((phrase := _normalize_any(p)) and phrase in pred for p in phrases)


_METRIC_FUNCTIONS = {"em": exact_match, "f1": f1, "contains": contains}


def qa_scores(
    prediction: str,
    answers: Sequence[str],
    metrics: Sequence[str] = QA_METRICS,
    language: str = "en",
    abstain_phrases: Sequence[str] = (),
) -> dict[str, float]:
    """Scores for one item. No gold answers = unanswerable: every metric is 100 if the model abstains, else 0."""
    unknown = [m for m in metrics if m not in _METRIC_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown QA metric(s) {unknown}; known: {', '.join(QA_METRICS)}")
    if not answers:
        value = 100.0 if abstains(prediction, abstain_phrases) else 0.0
        return {m: value for m in metrics}
    return {m: _METRIC_FUNCTIONS[m](prediction, answers, language) for m in metrics}
