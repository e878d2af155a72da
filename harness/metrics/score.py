"""Scoring: one prediction against its golds (`score_prediction`), or against an evalset item (`score_item`)."""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol, Sequence

from harness.errors import UserError
from harness.metrics.qa import abstains, qa_scores
from harness.metrics.registry import METRIC_SPECS
from harness.metrics.rouge import RougeScorer



class ScoredItem(Protocol):
    """What scoring reads of an item (harness.evalsets.EvalItem is one): metrics is a leaf, so it names no evalset
    type."""

    answers: Sequence[str]
    references: Sequence[str]


class ScoredSet(Protocol):
    """What scoring reads of an evalset (harness.evalsets.EvalSet is one)."""

    task: str
    language: str
    metrics: Sequence[str]
    abstain_phrases: Sequence[str]

    def item_language(self, item: ScoredItem) -> str: ...


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
    """QA: golds are the answers (empty = unanswerable); generation: golds are the references. Built-in metrics
    come from their task's scorer; registered ones (harness.metrics.registry) from their own item_score."""
    if task not in ("qa", "generation"):
        raise ValueError(f"unknown task {task!r}; use qa or generation")
    built_in = [m for m in metrics if m not in METRIC_SPECS or METRIC_SPECS[m].built_in]
    if task == "qa":
        scores = qa_scores(prediction, golds, built_in, language, abstain_phrases) if built_in else {}
    else:
        scores = rouge_scorer_for(language).score(prediction, golds) if built_in else {}
    for name in metrics:
        if name not in scores:
            scores[name] = _registered_score(METRIC_SPECS[name], prediction, golds, language, abstain_phrases)
    return {m: scores[m] for m in metrics}


def _registered_score(spec, prediction: str, golds: Sequence[str], language: str,
                      abstain_phrases: Sequence[str]) -> float:
    if spec.task == "qa" and not golds:  # unanswerable: the QA rule for every metric
        return 100.0 if abstains(prediction, abstain_phrases) else 0.0
    value = spec.item_score(prediction, golds, language)
    # A plugin's score reaches the paired statistics and the verdict: only a number on quantgate's 0-100 scale may.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 100.0:
        raise UserError(f"metric '{spec.name}' scored an item {value!r}: a metric's item_score must return a number "
                        "from 0 to 100 (points); fix the metric (a 0-1 score times 100)")
    return float(value)


def score_item(evalset: ScoredSet, item: ScoredItem, prediction: str) -> dict[str, float]:
    """Per-metric scores (0-100) of one prediction, in the set's metric order."""
    if evalset.task == "qa":
        return score_prediction("qa", evalset.item_language(item), prediction, item.answers,
                                evalset.metrics, evalset.abstain_phrases)
    # generation keeps "auto": the mixed tokenizer equals rouge-score's default on text without CJK
    return score_prediction("generation", evalset.language, prediction, item.references, evalset.metrics)
