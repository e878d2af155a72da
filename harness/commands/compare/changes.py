"""What changed between two reports: input differences, verdict flips, then scores, memory, latency, recommendation.

A format that was GO in OLD regresses when NEW gives it any other verdict, does not have it (a format that stops
being measured is no evidence that it still works), or ran it and it failed (a status other than "ok" counts as
NO-GO whatever verdict it carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from harness.commands.compare.comparability import ARROW, Difference, find_differences
from harness.decide import format_bytes, format_ms, num, signed
from harness.report.schema import FormatResult, Latency, LatencyStats, Memory, RunReport, ScoreEntry

VALUE_TOLERANCE = 0.05  # score points; smaller changes print as 0.0 and are float noise


@dataclass(frozen=True)
class Comparison:
    differences: list[Difference]  # incomparable ones first
    verdicts: list[str]
    scores: list[str]
    memory: list[str]
    latency: list[str]
    recommendation: list[str]
    regressed: list[str]  # formats GO in OLD and not GO (or missing, or failed) in NEW

    @property
    def incomparable(self) -> list[Difference]:
        return [d for d in self.differences if d.incomparable]

    def sections(self) -> list[tuple[str, list[str]]]:
        return [("Verdicts", self.verdicts), ("Scores", self.scores), ("Memory", self.memory),
                ("Latency", self.latency), ("Recommendation", self.recommendation)]


def effective_verdict(entry: FormatResult) -> str:
    """The verdict, except that a format which did not run to the end (status other than "ok") is NO-GO."""
    return entry.verdict if entry.status == "ok" else "NO-GO"


def compare_reports(old: RunReport, new: RunReport) -> Comparison:
    verdicts: list[str] = []
    scores: list[str] = []
    memory: list[str] = []
    latency: list[str] = []
    regressed: list[str] = []
    old_formats, new_formats = old.formats, new.formats
    for name in [*old_formats, *(n for n in new_formats if n not in old_formats)]:
        before, after = old_formats.get(name), new_formats.get(name)
        if before is None:
            verdicts.append(f"{name}: (new) {effective_verdict(new_formats[name])}")
            continue
        was = effective_verdict(before)
        if after is None:
            verdicts.append(f"{name}: {was} {ARROW} (not in the new report)")
            if was == "GO":
                regressed.append(name)
            continue
        now = effective_verdict(after)
        if was != now:
            verdicts.append(f"{name}: {was} {ARROW} {now}{_why(after) if now != 'GO' else ''}")
            if was == "GO":
                regressed.append(name)
        scores.extend(_score_changes(name, before.scores, after.scores))
        memory.extend(_memory_changes(name, before.memory, after.memory))
        latency.extend(_latency_changes(name, before.latency, after.latency))
    rec_before, rec_after = old.recommendation.format, new.recommendation.format
    recommendation = [] if rec_before == rec_after else [f"{rec_before or 'none'} {ARROW} {rec_after or 'none'}"]
    return Comparison(find_differences(old, new), verdicts, scores, memory, latency, recommendation, regressed)


def _why(entry: FormatResult) -> str:
    reasons = list(entry.reasons)
    if not reasons and entry.status != "ok":
        reasons = [f"status {entry.status}: {entry.error or 'no error message'}"]
    return f" ({reasons[0]}{'; …' if len(reasons) > 1 else ''})" if reasons else ""


Scores = dict[str, dict[str, ScoreEntry]]


def _score_changes(name: str, before: Scores, after: Scores) -> list[str]:
    lines = []
    for evalset in [*before, *(e for e in after if e not in before)]:
        old_metrics, new_metrics = before.get(evalset, {}), after.get(evalset, {})
        for metric in [*old_metrics, *(m for m in new_metrics if m not in old_metrics)]:
            was, now = old_metrics.get(metric), new_metrics.get(metric)
            label = f"{name} {evalset}/{metric}"
            if was is None or now is None:
                lines.append(f"{label}: {'only in the new report' if now else 'not in the new report'}")
                continue
            parts = []
            if _moved(was.value, now.value):
                parts.append(f"{num(was.value)} {ARROW} {num(now.value)}{_change(was.value, now.value)}")
            if _moved(was.delta, now.delta):
                parts.append(f"delta vs baseline {signed(was.delta)} {ARROW} {signed(now.delta)}")
            if was.status != now.status:
                parts.append(f"{was.status or 'not gated'} {ARROW} {now.status or 'not gated'}")
            if parts:
                lines.append(f"{label}: " + "; ".join(parts))
    return lines


def _memory_changes(name: str, before: Memory | None, after: Memory | None) -> list[str]:
    was = before.peak_bytes if before else None
    now = after.peak_bytes if after else None
    if was == now:
        return []
    return [f"{name} peak memory: {format_bytes(was)} {ARROW} {format_bytes(now)}{_percent(was, now)}"]


def _latency_changes(name: str, before: Latency | None, after: Latency | None) -> list[str]:
    lines = []
    for kind, label in (("ttft_ms", "TTFT p95"), ("tpot_ms", "TPOT p95")):
        was, now = _p95(before, kind), _p95(after, kind)
        if was != now:
            lines.append(f"{name} {label}: {format_ms(was)} {ARROW} {format_ms(now)}{_percent(was, now)}")
    return lines


def _p95(latency: Latency | None, kind: str) -> float | None:
    """The batch-1 p95 of TTFT or TPOT (older reports' top-level copies are read into batch_1 by the schema)."""
    if latency is None or latency.batch_1 is None:
        return None
    stats: LatencyStats = getattr(latency.batch_1, kind)
    return stats.p95


def _moved(was: float | None, now: float | None) -> bool:
    if was is None or now is None:
        return was is not now
    return abs(now - was) >= VALUE_TOLERANCE


def _change(was: float | None, now: float | None) -> str:
    return "" if was is None or now is None else f" ({signed(now - was)})"


def _percent(was: float | None, now: float | None) -> str:
    if was is None or now is None or was == 0:
        return ""
    return f" ({signed(100 * (now - was) / was)}%)"
