"""People's judgments into a finished run's verdicts: report.json gains each candidate's `spot_checks`, and its
verdict, reasons, recommendation and exit code follow the [spot_checks] rule. Folding again (more judgments, another
reviewer) starts from the verdict before the previous fold, so nothing is counted twice."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from harness.decide import empty_spot_checks, exit_code, recommend
from harness.policy import Policy
from harness.review.judgments import Judgment
from harness.review.plan import ReviewPlan
from harness.review.summary import SpotCheckJudgment, SpotCheckSummary, judge, summarize


def fold_reviews(report, rows: list[dict[str, Any]], plan: ReviewPlan, judgments: list[Judgment], policy: Policy):
    """The report with the spot checks folded in (a new RunReport; the input is not changed)."""
    from harness.report.schema import Check, FormatResult, Recommendation, SpotCheckEntry

    rules = policy.spot_checks
    summaries = summarize(judgments, rows, plan.baseline, policy.confidence)
    formats: dict[str, Any] = {}
    for name, fmt in report.formats.items():
        if fmt.role != "candidate":
            formats[name] = fmt
            continue
        verdict, rule, reasons, checks = _without_spot_checks(fmt)
        summary = summaries.get(name)
        planned = sum(1 for item in plan.items if item.format == name and item.stratum == "random")
        judgment = judge(summary, required=rules.required, min_reviewed=rules.min_reviewed,
                         max_increase=rules.max_unacceptable_increase, confidence=policy.confidence,
                         planned=planned) if fmt.status == "ok" else None
        update: dict[str, Any] = {"verdict": verdict, "rule": rule, "reasons": reasons, "checks": checks,
                                  "spot_checks": None}
        if judgment is not None or summary is not None:
            entry = _entry(plan, summary, judgment, verdict, rule, reasons)
            update["spot_checks"] = SpotCheckEntry.model_validate(entry)
            if judgment is not None and judgment.counts:
                reason = f"spot_checks: {judgment.detail}"
                update["checks"] = [*checks, Check(name="spot_checks", kind="spot_check", status=judgment.status,
                                                   detail=judgment.detail,
                                                   reason="" if judgment.status == "pass" else reason)]
                update.update(_fold(verdict, rule, reasons, judgment, reason))
        formats[name] = fmt.model_copy(update=update)
        if update["spot_checks"] is None:  # nothing to say: the field stays out of report.json
            formats[name] = FormatResult.model_validate(
                {k: v for k, v in formats[name].model_dump(exclude_unset=True).items() if k != "spot_checks"})
    verdicts = {n: f.verdict for n, f in formats.items() if f.role == "candidate"}
    peaks = {n: (f.memory.peak_bytes if f.memory else None) for n, f in formats.items()}
    recommendation = Recommendation.model_validate(recommend(verdicts, peaks))
    baseline_ok = all(f.status == "ok" for f in formats.values() if f.role == "baseline")
    return report.model_copy(update={"formats": formats, "recommendation": recommendation,
                                     "exit_code": exit_code(verdicts, policy) or int(not baseline_ok)})


def _without_spot_checks(fmt) -> tuple[str, str | None, list[str], list]:
    previous = fmt.spot_checks
    checks = [c for c in fmt.checks if c.kind != "spot_check"]
    if previous is None:
        return fmt.verdict, fmt.rule, list(fmt.reasons), checks
    return previous.verdict_without, previous.rule_without, list(previous.reasons_without), checks


def _fold(verdict: str, rule: str | None, reasons: list[str], judgment: SpotCheckJudgment, reason: str) -> dict:
    """A failing spot check makes any verdict NO-GO; a required one without enough judgments turns a GO
    INCONCLUSIVE; a passing one leaves the verdict and says so in the GO line."""
    if judgment.status == "fail":
        kept = [] if verdict == "GO" else reasons
        return {"verdict": "NO-GO", "rule": None, "reasons": [reason, *kept]}
    if judgment.status == "inconclusive":
        if verdict == "GO":
            return {"verdict": "INCONCLUSIVE", "rule": None, "reasons": [reason]}
        return {"reasons": [*reasons, reason]}
    if verdict == "GO":
        return {"reasons": [f"{reasons[0]}; spot checks hold: {judgment.detail}" if reasons else judgment.detail,
                            *reasons[1:]]}
    return {}


def _entry(plan: ReviewPlan, summary: SpotCheckSummary | None, judgment: SpotCheckJudgment | None, verdict: str,
           rule: str | None, reasons: list[str]) -> dict[str, Any]:
    figures = asdict(summary) if summary is not None else empty_spot_checks()
    for key in ("plan", "format", "newly_unacceptable"):
        figures.pop(key, None)
    figures.pop("newly_acceptable", None)
    for item in figures["unacceptable_items"]:
        item["comments"] = list(item["comments"])
    figures["reviewers"] = list(figures["reviewers"])
    figures["unacceptable_items"] = list(figures["unacceptable_items"])
    return {"plan": plan.plan, **figures,
            "status": judgment.status if judgment is not None and judgment.counts else None,
            "detail": judgment.detail if judgment is not None else "no judgments",
            "verdict_without": verdict, "rule_without": rule, "reasons_without": reasons}
