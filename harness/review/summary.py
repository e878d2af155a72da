"""Per format: what the reviewers found on the random sample, with exact intervals, and the [spot_checks] rule.

Several reviewers of one item: each side's acceptability and the preference go by majority; a tie counts against
the candidate (unacceptable for it, acceptable for the baseline, baseline preferred), so disagreement never
helps a GO. The increase in the unacceptable share (candidate minus baseline, paired on the same items) is judged
on a one-sided exact upper bound: it cannot exceed the share of items that became unacceptable (acceptable for
the baseline, not for the candidate), whose Clopper-Pearson bound at the policy's confidence is the upper bound.
It fails when even its lower bound (newly unacceptable minus newly acceptable, each bounded at half the error
rate) exceeds the limit. The worst-items stratum is counted apart and never enters the rates.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.review.exact import clopper_pearson, fleiss_kappa, items_for_upper_bound, lower_bound, upper_bound
from harness.review.judgments import Judgment


@dataclass(frozen=True)
class Share:
    count: int
    of: int
    value: float  # percent
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class QuotedItem:
    """An item judged unacceptable for the candidate, quoted beside the baseline's output."""

    key: str
    evalset: str
    id: str
    stratum: str
    candidate: str
    baseline: str
    reference: str
    baseline_acceptable: bool
    comments: tuple[str, ...]


@dataclass(frozen=True)
class SpotCheckSummary:
    format: str
    reviewers: tuple[str, ...]
    judged: int  # random-stratum items with at least one judgment
    judgments: int  # judgment lines counted (all strata, all reviewers)
    worse: Share  # candidate judged worse than the baseline
    candidate_unacceptable: Share
    baseline_unacceptable: Share
    newly_unacceptable: int  # acceptable for the baseline, not for the candidate
    newly_acceptable: int  # the other way round
    increase: float  # points: candidate's unacceptable share minus the baseline's
    increase_low: float
    increase_high: float  # one-sided upper bound, points
    agreement: float | None  # Fleiss' kappa on the candidate's acceptability, items judged twice or more
    multiply_judged: int
    worst_judged: int
    worst_unacceptable: int
    unacceptable_items: tuple[QuotedItem, ...] = field(default=())


@dataclass(frozen=True)
class SpotCheckJudgment:
    status: Literal["pass", "fail", "inconclusive"]
    detail: str
    counts: bool  # whether the verdict takes it: a fail always; pass and inconclusive when the policy requires them


def summarize(judgments: list[Judgment], rows: list[dict[str, Any]], baseline: str, confidence: float
              ) -> dict[str, SpotCheckSummary]:
    texts = {(str(r.get("format")), str(r.get("evalset")), str(r.get("id"))): r for r in rows}
    by_format: dict[str, dict[str, list[Judgment]]] = defaultdict(lambda: defaultdict(list))
    for j in judgments:
        by_format[j.format][j.item].append(j)
    alpha = 1.0 - confidence
    summaries = {}
    for name, items in by_format.items():
        majority = {k: _majority(js) for k, js in items.items()}
        votes = {k: v for k, v in majority.items() if items[k][0].stratum == "random"}
        worst = [v for k, v in majority.items() if items[k][0].stratum != "random"]
        n = len(votes)
        cand_bad = sum(1 for v in votes.values() if not v[1])
        base_bad = sum(1 for v in votes.values() if not v[0])
        worse = sum(1 for v in votes.values() if v[2] == "baseline")
        newly_bad = sum(1 for v in votes.values() if v[0] and not v[1])
        newly_good = sum(1 for v in votes.values() if not v[0] and v[1])
        multiply = [js for js in items.values() if len({j.reviewer for j in js}) >= 2]
        quoted = []
        for key, js in items.items():
            base_ok, cand_ok, _ = majority[key]
            if not cand_ok:
                first = js[0]
                cand_row = texts.get((name, first.evalset, first.id), {})
                base_row = texts.get((baseline, first.evalset, first.id), {})
                quoted.append(QuotedItem(key, first.evalset, first.id, first.stratum,
                                         str(cand_row.get("prediction", "")), str(base_row.get("prediction", "")),
                                         _reference(cand_row), base_ok, tuple(j.comment for j in js if j.comment)))
        summaries[name] = SpotCheckSummary(
            name, tuple(sorted({j.reviewer for js in items.values() for j in js})), n,
            sum(len(js) for js in items.values()),
            _share(worse, n, confidence), _share(cand_bad, n, confidence), _share(base_bad, n, confidence),
            newly_bad, newly_good,
            100.0 * (cand_bad - base_bad) / n if n else 0.0,
            100.0 * (lower_bound(newly_bad, n, alpha / 2) - upper_bound(newly_good, n, alpha / 2)) if n else -100.0,
            100.0 * upper_bound(newly_bad, n, alpha) if n else 100.0,
            fleiss_kappa([["ok" if j.candidate_acceptable else "bad" for j in js] for js in multiply]),
            len(multiply), len(worst), sum(1 for v in worst if not v[1]),
            tuple(sorted(quoted, key=lambda q: (q.stratum != "random", q.key))))
    return summaries


def _majority(js: list[Judgment]) -> tuple[bool, bool, str]:
    """(baseline acceptable, candidate acceptable, preferred) by majority; a tie goes against the candidate."""
    latest = {j.reviewer: j for j in js}.values()
    count = len(latest)
    base_ok = sum(j.baseline_acceptable for j in latest) * 2 >= count
    cand_ok = sum(j.candidate_acceptable for j in latest) * 2 > count
    prefs = [j.preferred for j in latest]
    top = max(prefs.count(p) for p in ("baseline", "same", "candidate"))
    preferred = next(p for p in ("baseline", "same", "candidate") if prefs.count(p) == top)  # ties: baseline first
    return base_ok, cand_ok, preferred


def _share(count: int, of: int, confidence: float) -> Share:
    if of == 0:
        return Share(0, 0, 0.0, 0.0, 100.0)
    low, high = clopper_pearson(count, of, confidence)
    return Share(count, of, 100.0 * count / of, 100.0 * low, 100.0 * high)


def _reference(row: dict[str, Any]) -> str:
    refs = row.get("references")
    if isinstance(refs, list):
        return " | ".join(str(r) for r in refs)
    return str(refs or "")


def judge(summary: SpotCheckSummary | None, *, required: bool, min_reviewed: int, max_increase: float,
          confidence: float, planned: int | None = None) -> SpotCheckJudgment | None:
    """The [spot_checks] rule for one format; None when there is nothing to say (no judgments, not required).
    An observed increase past the limit counts whether or not the policy requires spot checks: people saw the
    format do worse, so it cannot be GO until more judgments clear it (or the exact bound fails it). `planned`:
    the random-sample items the plan holds for this format; more than that is never asked for."""
    if summary is None or summary.judged == 0:
        if not required:
            return None
        return SpotCheckJudgment("inconclusive", "spot checks are required by the policy and none of its random "
                                 "sample was judged: run `quantgate review RUN_DIR`, judge the items, then "
                                 "`quantgate report RUN_DIR --reviews review-*.jsonl`", True)
    n = summary.judged
    figures = (f"unacceptable {summary.candidate_unacceptable.value:.1f}% vs the baseline's "
               f"{summary.baseline_unacceptable.value:.1f}% on {n} judged item(s): increase {summary.increase:+.1f} "
               f"points, upper bound {summary.increase_high:.1f} (one-sided {confidence:.0%}, exact) against the "
               f"{max_increase:g}-point limit")
    if summary.increase_low > max_increase:
        return SpotCheckJudgment("fail", f"{figures}: even the lower bound {summary.increase_low:.1f} is past it",
                                 True)
    observed_past = summary.increase > max_increase
    counts = required or observed_past
    seen = (f"; the reviewers saw {summary.newly_unacceptable} item(s) become unacceptable, an increase past the "
            "limit, so it cannot be GO") if observed_past else ""
    if n < min_reviewed:
        return SpotCheckJudgment("inconclusive", f"{figures}; the policy needs {min_reviewed} judged items: "
                                 f"{_more(min_reviewed, n, planned)}{seen}", counts)
    if summary.increase_high <= max_increase:
        return SpotCheckJudgment("pass", figures, required)
    rate = summary.newly_unacceptable / n
    needed = items_for_upper_bound(rate, max_increase / 100.0, 1.0 - confidence, n)
    more = (_more(needed, n, planned, "judged items at this rate would decide it") if needed
            else "at this rate more items cannot make it pass: the sample's own rate reaches the limit")
    return SpotCheckJudgment("inconclusive", f"{figures}: {more}{seen}", counts)


def _more(needed: int, judged: int, planned: int | None, what: str = "") -> str:
    """'judge 2 more', or, past what the plan holds, 'make a larger plan'."""
    if planned is not None and needed > planned:
        return (f"{needed} judged items are needed and the plan holds {planned} for this format: make a larger "
                f"plan (`quantgate review RUN_DIR --items {needed}`) and judge its items")
    return f"about {needed - judged} more {what}" if what else f"judge {needed - judged} more"
