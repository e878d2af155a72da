"""Scoring: one prediction against its golds (`score_prediction`), or against an evalset item (`score_item`)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

from harness.metrics.qa import abstains, qa_scores
from harness.metrics.registry import METRIC_SPECS
from harness.metrics.rouge import RougeScorer

if TYPE_CHECKING:  # harness.evalsets imports harness.metrics: at run time sets and items are duck-typed
    from harness.evalsets import EvalItem, EvalSet


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
    return float(spec.item_score(prediction, golds, language))


def score_item(evalset: EvalSet, item: EvalItem, prediction: str) -> dict[str, float]:
    """Per-metric scores (0-100) of one prediction, in the set's metric order."""
    if evalset.task == "qa":
        return score_prediction("qa", evalset.item_language(item), prediction, item.answers,
                                evalset.metrics, evalset.abstain_phrases)
    # generation keeps "auto": the mixed tokenizer equals rouge-score's default on text without CJK
    return score_prediction("generation", evalset.language, prediction, item.references, evalset.metrics)
