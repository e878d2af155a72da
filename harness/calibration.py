"""Calibration texts for GPTQ/AWQ: where they come from, and proof that they never saw an evaluated item.

Sources, in order: `--calibration FILE` (a sample of real traffic: JSONL with a `text` field, or one text per
line), an evalset's own calibration split (its spec's `calibration` key), or the corpus that ships with the
project (`evalsets/calibration/`, English and Chinese text of the bundled sets' domain, written for the project
and never evaluated). Texts from the evaluated items themselves are never used: calibrating on the test items,
answers included, biases the verdict toward GO.

Overlap: every evaluated item's fields (question, context, instruction, answers/references) are cut into
13-grams of tokens (words for Latin script, single characters for CJK, so Chinese counts too); an item overlaps
when at least 10% of its 13-grams (for a field shorter than 13 tokens but at least 8: the whole field) occur
in the calibration texts. Any overlapping item is an error unless the run allows it, and then the format's
verdict cannot be GO.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from harness.cache import stable_hash
from harness.errors import UserError
from harness.jsonl import read_jsonl_numbered
from harness.metrics.tokenizers import CJK_RE, detect_language

BUNDLED_CORPUS = Path(__file__).resolve().parent.parent / "evalsets" / "calibration"
NGRAM = 13
SHORTEST_FIELD = 8  # a field of 8-12 tokens is compared whole; shorter ones (names, numbers) are not evidence
ITEM_OVERLAP_SHARE = 0.10
_TOKEN_RE = re.compile(f"{CJK_RE.pattern}|[^\\W_]+", re.UNICODE)


@dataclass(frozen=True)
class Overlap:
    """How much of the evaluated data the calibration texts contain."""

    ngram: int
    items_total: int
    items_overlapping: int
    calibration_ngram_share: float  # share of the calibration texts' 13-grams found in evaluated items
    overlapping: tuple[str, ...] = ()  # "evalset/id" of every overlapping item
    allowed: bool = False

    @property
    def clean(self) -> bool:
        return self.items_overlapping == 0


@dataclass(frozen=True)
class CalibrationSet:
    source: str  # "bundled corpus (evalsets/calibration)", "evalset NAME calibration split FILE" or a path
    texts: tuple[str, ...]
    token_counts: tuple[int, ...] = ()
    overlap: Overlap | None = None
    languages: tuple[str, ...] = field(default=())

    @property
    def hash(self) -> str:
        return "sha256:" + stable_hash(list(self.texts))

    def summary(self, used: int | None = None) -> dict:
        """The report's calibration block for a format that used the first `used` texts."""
        count = len(self.texts) if used is None else min(used, len(self.texts))
        tokens = self.token_counts[:count]
        return {"source": self.source, "texts": count,
                "tokens_mean": round(sum(tokens) / len(tokens), 1) if tokens else None,
                "tokens_min": min(tokens) if tokens else None,
                "hash": "sha256:" + stable_hash(list(self.texts[:count])),
                "overlap": asdict(self.overlap) if self.overlap else None}


TEXT_OBJECT = "a JSON object with a 'text' field"


def read_text_file(path: Path, what: str) -> list[str]:
    """JSONL with a `text` field per line (read with harness.jsonl: a U+2028 inside a string is no line break), or
    one text per line (lines split on "\\n" only, so such a character stays in its text); errors name the file and
    line."""
    if path.suffix == ".jsonl":
        texts = [_text_field(path, number, record)
                 for number, record in read_jsonl_numbered(path, fix=f"each line needs {TEXT_OBJECT}")]
    else:
        try:
            lines = path.read_text(encoding="utf-8-sig").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{what} {path}: cannot read it ({exc})") from None
        texts = [line.removesuffix("\r") for line in lines if line.strip()]
    if not texts:
        raise UserError(f"{what} {path}: no calibration texts in it (one text per line, or JSONL with 'text')")
    return texts


def _text_field(path: Path, number: int, record: dict) -> str:
    if "text" not in record:
        raise UserError(f"{path}:{number}: expected {TEXT_OBJECT}")
    value = record["text"]
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{path}:{number}: field 'text' must be a non-empty string")
    return value


def bundled_texts(languages: Iterable[str]) -> list[str]:
    """The shipped corpus, its languages interleaved (en, zh, en, ...) so that any prefix holds both."""
    wanted = [lang for lang in ("en", "zh") if lang in set(languages)] or ["en", "zh"]
    streams = [read_text_file(BUNDLED_CORPUS / f"{lang}.jsonl", "bundled calibration corpus") for lang in wanted]
    mixed: list[str] = []
    for index in range(max(len(s) for s in streams)):
        mixed.extend(stream[index] for stream in streams if index < len(stream))
    return mixed


def choose_calibration(path: str | None, evalsets: Sequence, wanted: int) -> CalibrationSet:
    """The first `wanted` texts of the calibration source this run uses (overlap not yet checked)."""
    if path:
        texts = read_text_file(Path(path), "--calibration")
        return CalibrationSet(str(path), tuple(texts[:wanted]))
    splits = [e for e in evalsets if getattr(e, "calibration_path", None)]
    if splits:
        texts = [t for e in splits for t in read_text_file(e.calibration_path, f"evalset {e.name} calibration")]
        names = ", ".join(f"{e.name} ({e.calibration_path.name})" for e in splits)
        return CalibrationSet(f"calibration split of {names}", tuple(texts[:wanted]))
    languages = {_set_language(e) for e in evalsets}
    texts = bundled_texts(languages)
    return CalibrationSet("bundled corpus (evalsets/calibration)", tuple(texts[:wanted]),
                          languages=tuple(sorted(languages)))


def _set_language(evalset) -> str:
    if evalset.language in ("en", "zh"):
        return evalset.language
    sample = " ".join(item.context or item.question for item in evalset.items[:20])
    return detect_language(sample)


def tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower())


def ngrams(words: Sequence[str], n: int = NGRAM) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def measure_overlap(texts: Sequence[str], evalsets: Sequence, *, allowed: bool = False) -> Overlap:
    calibration_words = [tokens(t) for t in texts]
    calibration_grams = set().union(*(ngrams(w) for w in calibration_words)) if texts else set()
    joined = [" ".join(w) for w in calibration_words]
    evaluated_grams: set[tuple[str, ...]] = set()
    overlapping: list[str] = []
    total = 0
    for evalset in evalsets:
        for item in evalset.items:
            total += 1
            shared = grams = 0
            for text in _item_fields(item):
                words = tokens(text)
                if len(words) >= NGRAM:
                    field_grams = ngrams(words)
                    evaluated_grams |= field_grams
                    grams += len(field_grams)
                    shared += len(field_grams & calibration_grams)
                elif len(words) >= SHORTEST_FIELD:
                    grams += 1
                    phrase = " ".join(words)
                    shared += any(phrase in text_words for text_words in joined)
            if grams and shared / grams >= ITEM_OVERLAP_SHARE:
                overlapping.append(f"{evalset.name}/{item.id}")
    share = len(calibration_grams & evaluated_grams) / len(calibration_grams) if calibration_grams else 0.0
    return Overlap(NGRAM, total, len(overlapping), round(share, 4), tuple(overlapping), allowed)


def _item_fields(item) -> list[str]:
    return [t for t in dict.fromkeys((item.question, item.context, item.instruction, *item.answers,
                                      *item.references)) if t]


def check_overlap(calibration: CalibrationSet, evalsets: Sequence, *, allowed: bool) -> CalibrationSet:
    """Attach the overlap figure; refuse overlapping calibration unless the user allowed it."""
    overlap = measure_overlap(calibration.texts, evalsets, allowed=allowed)
    if not overlap.clean and not allowed:
        shown = ", ".join(overlap.overlapping[:10]) + (" ..." if overlap.items_overlapping > 10 else "")
        raise UserError(f"calibration ({calibration.source}) overlaps {overlap.items_overlapping} of "
                        f"{overlap.items_total} evaluated items ({shown}): calibrating on the test items biases the "
                        "verdict toward GO; pass calibration text that is not evaluated (--calibration FILE), or "
                        "--allow-calibration-overlap to run anyway (no GO then)")
    return CalibrationSet(calibration.source, calibration.texts, calibration.token_counts, overlap,
                          calibration.languages)


def with_token_counts(calibration: CalibrationSet, tokenizer) -> CalibrationSet:
    counts = [len(ids) for ids in tokenizer(list(calibration.texts), add_special_tokens=False)["input_ids"]]
    return CalibrationSet(calibration.source, calibration.texts, tuple(counts), calibration.overlap,
                          calibration.languages)


def load_calibration(path: str | None, evalsets: Sequence, wanted: int, tokenizer, *,
                     allow_overlap: bool = False) -> CalibrationSet:
    """The calibration texts (never the evaluated items), checked for overlap with every item of the sets, not
    only the --max-items share this run scores."""
    from harness import progress

    calibration = choose_calibration(path, evalsets, wanted)
    calibration = check_overlap(calibration, evalsets, allowed=allow_overlap)
    calibration = with_token_counts(calibration, tokenizer)
    progress.say(f"calibration: {len(calibration.texts)} texts from {calibration.source}, "
                 f"{calibration.summary()['tokens_mean']:.0f} tokens on average; overlap with evaluated items: "
                 f"{calibration.overlap.items_overlapping} of {calibration.overlap.items_total}")
    return calibration
