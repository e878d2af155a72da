"""summary.md: what a change review or a CI job summary needs, in at most 8 KB whatever the run's size: the verdict
per format with its peak memory and the rule that carried it, the recommendation, each non-GO reason on one line,
and links to the full reports. Reasons are cut, then listed fewer per format, until it fits."""

from __future__ import annotations

from harness.report.fidelity import verdict_text
from harness.report.markdown import md_cell, md_inline
from harness.report.schema import RunReport
from harness.report.spot_checks import spot_check_cell
from harness.units import clip
from harness.report.view import formats_in_order, recommendation_sentence, verdict_rows

MAX_BYTES = 8 * 1024
_LAYOUTS = ((240, 6), (160, 4), (120, 3), (100, 2), (80, 1), (60, 1))  # (characters a reason, reasons a format)
LINKS = "[report.md](report.md) · [report.html](report.html) · [report.json](report.json) · [junit.xml](junit.xml)"


def render_summary(report: RunReport) -> str:
    text = ""
    for chars, per_format in _LAYOUTS:
        text = _render(report, chars, per_format)
        if len(text.encode("utf-8")) <= MAX_BYTES:
            return text
    head = text.encode("utf-8")[: MAX_BYTES - 200].decode("utf-8", errors="ignore")
    return head[: head.rfind("\n") + 1] + f"\n… cut to stay under 8 KB: {LINKS}\n"


def _render(report: RunReport, chars: int, per_format: int) -> str:
    model = clip(report.model.source or report.model.path or "model", 80)
    spot = any(fmt.spot_checks is not None for fmt in report.formats.values())
    lines = [f"### quantgate: {md_inline(model)}", "",
             "| Format | Verdict | Peak memory |" + (" Spot checks by people |" if spot else ""),
             "|---|---|---|" + ("---|" if spot else "")]
    rows = {row.name: row for row in verdict_rows(report)}
    for name, fmt in formats_in_order(report):
        verdict = fmt.verdict if fmt.role == "baseline" else f"**{verdict_text(fmt)}**"
        cell = f" {md_cell(spot_check_cell(fmt))} |" if spot else ""
        lines.append(f"| {md_cell(clip(name, 40))} | {verdict} | {rows[name].peak} |{cell}")
    lines += ["", "".join(f"**{p.text}**" if p.strong else (md_inline(p.text) if p.data else p.text)
                          for p in recommendation_sentence(report))]
    why = []
    for name, fmt in formats_in_order(report):
        if fmt.role == "baseline" or fmt.verdict == "GO":
            continue
        reasons = [r for r in fmt.reasons if r] or [fmt.error or "no reason recorded"]
        shown = [f"  - {md_inline(clip(r, chars))}" for r in reasons[:per_format]]
        more = [f"  - … {len(reasons) - per_format} more in report.md"] if len(reasons) > per_format else []
        why += [f"- **{md_inline(clip(name, 40))}** ({fmt.verdict})", *shown, *more]
    if why:
        lines += ["", "Why not GO:", "", *why]
    lines += ["", f"Full reports: {LINKS}"]
    return "\n".join(lines) + "\n"
