"""Per-item metrics, 0-100. QA: em, f1, contains (metrics.qa); generation: rouge1/2/L F-measure (metrics.rouge);
scoring a prediction or an evalset item (metrics.score)."""

from __future__ import annotations

from harness.metrics.qa import QA_METRICS
from harness.metrics.registry import METRIC_SPECS, MetricSpec, default_gate, metric_names, register_metric
from harness.metrics.rouge import ROUGE_TYPES
from harness.metrics.score import rouge_scorer_for, score_item, score_prediction
from harness.metrics.tokenizers import MixedTokenizer, RougeDefaultTokenizer

GENERATION_METRICS = ROUGE_TYPES
# The built-in metrics; metric_names() also has the registered ones.
ALL_METRICS: tuple[str, ...] = QA_METRICS + GENERATION_METRICS

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


__all__ = [
    "ALL_METRICS",
    "GENERATION_METRICS",
    "METRIC_SPECS",
    "MetricSpec",
    "QA_METRICS",
    "default_gate",
    "metric_names",
    "register_metric",
    "rouge_scorer_for",
    "score_item",
    "score_prediction",
    "tokenizer_name",
]
