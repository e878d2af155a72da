"""Scoring: one prediction against its golds (`score_prediction`), or against an evalset item (`score_item`)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

from harness.metrics.qa import qa_scores
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
    """QA: golds are the answers (empty = unanswerable); generation: golds are the references."""
    if task == "qa":
        return qa_scores(prediction, golds, metrics, language, abstain_phrases)
    if task == "generation":
        scores = rouge_scorer_for(language).score(prediction, golds)
        return {m: scores[m] for m in metrics}
    raise ValueError(f"unknown task {task!r}; use qa or generation")


def score_item(evalset: EvalSet, item: EvalItem, prediction: str) -> dict[str, float]:
    """Per-metric scores (0-100) of one prediction, in the set's metric order."""
    if evalset.task == "qa":
        return score_prediction("qa", evalset.item_language(item), prediction, item.answers,
                                evalset.metrics, evalset.abstain_phrases)
    # generation keeps "auto": the mixed tokenizer equals rouge-score's default on text without CJK
    return score_prediction("generation", evalset.language, prediction, item.references, evalset.metrics)
