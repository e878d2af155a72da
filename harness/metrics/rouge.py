"""ROUGE-1/2/L F-measure (0-100) via rouge-score, with a language-aware tokenizer."""

from __future__ import annotations

from typing import Sequence

from harness.metrics.tokenizers import rouge_tokenizer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class RougeScorer:
    """Scores a prediction against one or more references; per metric the best reference counts."""

    def __init__(self, language: str = "en") -> None:
        from rouge_score import rouge_scorer  # imports nltk (about 2 s): only when ROUGE is scored

        self.tokenizer = rouge_tokenizer(language)
        self._scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=self.tokenizer)

    def score(self, prediction: str, references: Sequence[str]) -> dict[str, float]:
        if isinstance(references, str) or not references:
            raise ValueError("references must be a non-empty list of strings")
        best = dict.fromkeys(ROUGE_TYPES, 0.0)
        for reference in references:
            scores = self._scorer.score(reference, prediction)  # rouge-score takes (target, prediction)
            for name in ROUGE_TYPES:
                best[name] = max(best[name], scores[name].fmeasure * 100.0)
        return best
