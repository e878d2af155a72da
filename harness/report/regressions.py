"""The items where a candidate lost the most against the baseline, for a reviewer to read.

Paired by (evalset, id) on the evalset's gated metric; only items whose score dropped
are listed, worst first. Shared by the Markdown and HTML reports.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from harness.report.schema import SAMPLE_FIELDS, RunReport
from harness.units import format_number, format_signed, is_number
from harness.report.view import baseline_name, candidates, gate_metrics


@dataclass(frozen=True)
class Regression:
    item_id: str
    baseline_score: float
    candidate_score: float
    prompt: str
    baseline_output: str
    candidate_output: str
    references: tuple[str, ...]

    @property
    def change(self) -> float:
        return self.candidate_score - self.baseline_score

    @property
    def change_text(self) -> str:
        """'80.0 → 40.0 (−40.0)', the last column of both renderers' tables."""
        return f"{format_number(self.baseline_score)} → {format_number(self.candidate_score)} ({format_signed(self.change)})"


@dataclass(frozen=True)
class RegressionGroup:
    candidate: str
    evalset: str
    metric: str
    rows: tuple[Regression, ...]  # worst first
    compared: int  # items present for both formats with a score
    regressed: int  # of those, items whose score dropped

    @property
    def counts_text(self) -> str:
        return f"{self.regressed} of {self.compared} items dropped"


def worst_regressions(
    report: RunReport, samples: list[dict[str, Any]], limit: int = 5
) -> list[RegressionGroup]:
    """One group per candidate x evalset that has paired items, in report order."""
    baseline = baseline_name(report)
    if baseline is None:
        return []
    by_format: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for record in samples:
        key = (str(record.get("format")), str(record.get("evalset")))
        by_format.setdefault(key, {})[str(record.get("id"))] = record

    evalsets = list(report.evalsets)
    evalsets += sorted({e for _, e in by_format if e not in evalsets})
    groups: list[RegressionGroup] = []
    for candidate, _ in candidates(report):
        for evalset in evalsets:
            base_items = by_format.get((baseline, evalset))
            cand_items = by_format.get((candidate, evalset))
            if not base_items or not cand_items:
                continue
            metric = _metric_for(report, evalset, base_items)
            if metric is None:
                continue
            group = _group(candidate, evalset, metric, base_items, cand_items, limit)
            if group.compared:
                groups.append(group)
    return groups


def _metric_for(report: RunReport, evalset: str, items: dict[str, dict[str, Any]]) -> str | None:
    gated = gate_metrics(report, evalset)
    if gated:
        return gated[0]
    sample = next(iter(items.values()))
    numeric = [k for k, v in sample.items() if k not in SAMPLE_FIELDS and is_number(v)]
    return numeric[0] if numeric else None


def _group(
    candidate: str,
    evalset: str,
    metric: str,
    base_items: dict[str, dict[str, Any]],
    cand_items: dict[str, dict[str, Any]],
    limit: int,
) -> RegressionGroup:
    drops: list[tuple[float, str]] = []
    compared = 0
    for item_id, cand in cand_items.items():
        base = base_items.get(item_id)
        if base is None or not is_number(base.get(metric)) or not is_number(cand.get(metric)):
            continue
        compared += 1
        change = float(cand[metric]) - float(base[metric])
        if change < 0:
            drops.append((change, item_id))
    rows = tuple(
        _regression(item_id, metric, base_items[item_id], cand_items[item_id])
        for _, item_id in heapq.nsmallest(limit, drops)
    )
    return RegressionGroup(candidate, evalset, metric, rows, compared, len(drops))


def _regression(item_id: str, metric: str, base: dict[str, Any], cand: dict[str, Any]) -> Regression:
    refs = base.get("references") or cand.get("references") or []
    if isinstance(refs, str):
        refs = [refs]
    return Regression(
        item_id=item_id,
        baseline_score=float(base[metric]),
        candidate_score=float(cand[metric]),
        prompt=str(cand.get("prompt") or base.get("prompt") or ""),
        baseline_output=str(base.get("prediction") or ""),
        candidate_output=str(cand.get("prediction") or ""),
        references=tuple(str(r) for r in refs),
    )
