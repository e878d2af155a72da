"""Per-item metrics, 0-100. QA: em, f1, contains (metrics.qa); generation: rouge1/2/L F-measure (metrics.rouge)."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from harness.metrics.qa import QA_METRICS, qa_scores
from harness.metrics.rouge import ROUGE_TYPES, RougeScorer
from harness.metrics.tokenizers import MixedTokenizer, RougeDefaultTokenizer

GENERATION_METRICS = ROUGE_TYPES
METRICS_BY_TASK: dict[str, tuple[str, ...]] = {"qa": QA_METRICS, "generation": GENERATION_METRICS}
ALL_METRICS: tuple[str, ...] = QA_METRICS + GENERATION_METRICS
DEFAULT_GATE: dict[str, tuple[str, ...]] = {"qa": ("f1",), "generation": ("rougeL",)}
BINARY_METRICS = frozenset({"em", "contains"})  # every value is 0 or 100

_QA_TOKENIZER_NAMES = {
    "en": "SQuAD normalization (words)",
    "zh": "CMRC 2018 (CJK chars, Latin words)",
    "auto": "SQuAD (words) or CMRC 2018 (CJK chars) per item",
}


def tokenizer_name(language: str, task: str = "generation") -> str:
    """What the report records as the tokenizer a set's metrics used (ROUGE's by default)."""
    if task == "qa":
        return _QA_TOKENIZER_NAMES[language]
    return RougeDefaultTokenizer.name if language == "en" else MixedTokenizer.name


@lru_cache(maxsize=None)
def rouge_scorer_for(language: str) -> RougeScorer:
    return RougeScorer(language)


def score_prediction(
    task: str,
    language: str,
    prediction: str,
    golds: Sequence[str],
    metrics: Sequence[str],
    abstain_phrases: Sequence[str] = (),
) -> dict[str, float]:
    """QA: golds are the answers (empty = unanswerable); generation: golds are the references."""
    if task == "qa":
        return qa_scores(prediction, golds, metrics, language, abstain_phrases)
    if task == "generation":
        scores = rouge_scorer_for(language).score(prediction, golds)
        return {m: scores[m] for m in metrics}
    raise ValueError(f"unknown task {task!r}; use qa or generation")


__all__ = [
    "ALL_METRICS",
    "BINARY_METRICS",
    "DEFAULT_GATE",
    "GENERATION_METRICS",
    "METRICS_BY_TASK",
    "QA_METRICS",
    "score_prediction",
    "tokenizer_name",
]
