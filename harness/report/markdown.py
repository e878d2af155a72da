"""report.md: the verdicts, paste-ready for a change review.

Order: verdict table (and where the scores came from), recommendation, how to read a verdict, per format
(reasons, scores, memory, latency, capacity, worst regressions), served by vLLM (when any format was),
provenance. Each format's tables are folded under its reasons (<details>). The whole file stays under 60,000
characters (a GitHub comment holds 65,536): when the input is large, excerpts shrink, then regression rows go, then
long lists are cut; the verdict table is always kept. summary.md is the short form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.report.fidelity import (FIDELITY_COLUMNS, fidelity_caption, fidelity_rows, largest_lines,
                                     position_lines)
from harness.report.regressions import RegressionGroup, worst_regressions
from harness.report.schema import FormatResult, RunReport
from harness.report.spot_checks import SPOT_CHECK_COLUMNS, spot_check_caption, spot_check_rows, unacceptable_quotes
from harness.units import DASH, clip, excerpt, prompt_excerpt
from harness.report.view import (ARTIFACT_COLUMNS, BASELINE_SCORE_COLUMNS, CALIBRATION_COLUMNS, EVALSET_COLUMNS,
                                 LATENCY_COLUMNS, LEGEND, SCORE_COLUMNS, SERVED_LATENCY_COLUMNS, served_backend,
                                 served_title,
                                 VERDICT_COLUMNS, artifact_rows, backend_note, calibration_rows, capacity_text,
                                 environment_items, evalset_rows, formats_in_order, latency_caption, latency_origin,
                                 latency_rows, memory_caption, memory_rows, Phrase, provenance_items,
                                 recommendation_sentence, score_rows, served_views, ServedView, serving_caption,
                                 serving_rows, timeline_peak_text, verdict_rows, VerdictRow, vllm_command)

MAX_CHARS = 60_000
_TRUNCATED_NOTE = "\n\n_Report cut to stay under 60,000 characters; report.json and report.html hold everything._\n"

_STATUS_MARK = {"pass": "✓", "fail": "✗", "inconclusive": "?"}
_MD_SPECIAL = set("\\`*_[]<>&~|")


@dataclass(frozen=True)
class _Layout:
    """How much detail fits: shrunk step by step until the file is small enough."""

    excerpt_chars: int
    rows_per_group: int
    list_items: int
    cell_chars: int


_LAYOUTS = (
    _Layout(240, 5, 40, 400),
    _Layout(160, 5, 40, 300),
    _Layout(100, 5, 20, 200),
    *(_Layout(100, rows, 20, 200) for rows in (4, 3, 2, 1)),
    _Layout(60, 1, 10, 160),
    _Layout(60, 0, 10, 160),
    _Layout(40, 0, 3, 100),
)


def md_inline(text: Any) -> str:
    """Untrusted text on one Markdown line: markup characters escaped, newlines flattened."""
    out = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))
    return " ".join(out.splitlines()) if ("\n" in out or "\r" in out) else out


def md_cell(text: Any) -> str:
    """Untrusted text in a table cell: `|` escaped so it cannot split the cell, newlines as <br>."""
    out = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))
    return "<br>".join(out.splitlines()) if ("\n" in out or "\r" in out) else out


def md_fence(text: str, info: str = "sh") -> str:
    """Text as a fenced code block, verbatim: the fence is longer than any run of backticks inside."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{info}\n{text}\n{fence}"


def md_code(text: Any) -> str:
    """Our own text (flags, hashes) as inline code; pipes still escaped for tables."""
    body = str(text).replace("`", "'").replace("|", "\\|")
    return f"`{' '.join(body.split())}`" if body else DASH


def render_markdown(report: RunReport, samples: list[dict[str, Any]]) -> str:
    groups = worst_regressions(report, samples, limit=max(layout.rows_per_group for layout in _LAYOUTS))
    text = ""
    for layout in _LAYOUTS:
        text = _render(report, groups, layout)
        if len(text) < MAX_CHARS:
            return text
    return _hard_cut(text)


def _hard_cut(text: str) -> str:
    """Last resort for absurd inputs: keep the head (verdict table first) and cut at a line end."""
    head = text[: MAX_CHARS - len(_TRUNCATED_NOTE) - 16]
    return head[: head.rfind("\n") + 1 or len(head)].rstrip() + _TRUNCATED_NOTE


def _render(report: RunReport, groups: list[RegressionGroup], layout: _Layout) -> str:
    parts = [
        _title(report),
        _verdict_table(report, layout),
        _backend_note(report),
        _recommendation(report),
        "**How to read a verdict**\n\n" + "\n".join(f"- **{term}** {text}" for term, text in LEGEND),
    ]
    for name, fmt in formats_in_order(report):
        parts.append(_format_section(report, name, fmt, groups, layout))
    parts.append(_served(report, layout))
    parts.append(_provenance(report, layout))
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(report: RunReport) -> str:
    model = report.model.source or report.model.path or "model"
    when = report.created_at
    return f"# quantgate: {md_inline(clip(model, 120))}" + (f" ({md_inline(when)})" if when else "")


# --- verdict table -------------------------------------------------------------------------


def _verdict_table(report: RunReport, layout: _Layout) -> str:
    rows = ["| " + " | ".join(VERDICT_COLUMNS) + " |", "|" + "---|" * len(VERDICT_COLUMNS)]
    for row in verdict_rows(report):
        cells = [
            md_cell(row.name),
            row.verdict if row.verdict == "BASELINE" else f"**{row.verdict_text}**",
            row.peak,
            row.weights,
            row.tpot_p50,
            _gated_cell(row, layout),
            md_cell(row.fidelity) + (f" {_STATUS_MARK[row.fidelity_status]}" if row.fidelity_status else ""),
            md_code(clip(row.vllm_flags, layout.cell_chars)) if row.vllm_flags else DASH,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _backend_note(report: RunReport) -> str:
    note = backend_note(report)
    return f"_{md_inline(note)}_" if note else ""


def _gated_cell(row: VerdictRow, layout: _Layout) -> str:
    entries: list[tuple[int, str]] = []
    for gated in row.gated:
        mark = _STATUS_MARK.get(gated.status, "")
        text = f"{md_cell(gated.label)} {gated.figure}" + (f" {mark}" if mark else "")
        entries.append((0 if gated.status in ("fail", "inconclusive") else 1, text))
    if row.error is not None:
        entries.insert(0, (0, "failed: " + md_cell(clip(row.error, layout.cell_chars))))
    if not entries:
        return DASH
    limit = max(layout.list_items // 4, 3)
    if len(entries) > limit:  # keep the failing/inconclusive ones visible first
        kept = sorted(range(len(entries)), key=lambda i: (entries[i][0], i))[:limit]
        shown = [entries[i][1] for i in sorted(kept)]
        shown.append(f"… {len(entries) - limit} more in the sections below")
    else:
        shown = [text for _, text in entries]
    return "<br>".join(shown)


def _recommendation(report: RunReport) -> str:
    return "".join(_phrase(p) for p in recommendation_sentence(report))


def _phrase(phrase: Phrase) -> str:
    text = md_inline(phrase.text) if phrase.data else phrase.text
    return f"**{text}**" if phrase.strong else text


# --- per-format sections -------------------------------------------------------------------


def _format_section(
    report: RunReport, name: str, fmt: FormatResult, groups: list[RegressionGroup], layout: _Layout
) -> str:
    head = [f"## {md_inline(name)}: {fmt.verdict}"]
    if fmt.status == "failed":
        head.append(f"**Failed:** {md_inline(clip(fmt.error or 'no error recorded', 2 * layout.cell_chars))}")
    reasons = [r for r in fmt.reasons if r]
    if reasons:
        head.append("**Reasons**\n\n" + _bullets([md_inline(clip(r, layout.cell_chars)) for r in reasons], layout))
    parts = [
        _scores_table(fmt, layout),
        _memory_table(fmt),
        _timeline_line(fmt),
        _latency_table(report, fmt),
        _capacity(report, fmt),
        _serving(report, fmt, layout),
        _fidelity(fmt, layout, served=served_backend(report)),
        _spot_checks(fmt, layout),
    ]
    if fmt.role != "baseline":
        parts += [_regressions(group, layout) for group in groups if group.candidate == name]
    details = "\n\n".join(p for p in parts if p)
    if details:  # folded: a review reads the reasons; the tables open on a click (GitHub renders <details>)
        head.append(f"<details><summary>Scores, memory, latency, serving and the worst items of {md_inline(name)}"
                    f"</summary>\n\n{details}\n\n</details>")
    return "\n\n".join(head)


def _fidelity(fmt: FormatResult, layout: _Layout, served: bool = False) -> str:
    rows = fidelity_rows(fmt)
    if not rows:
        return ""
    parts = ["**Fidelity to the baseline**\n\n" + md_inline(fidelity_caption(fmt, served)),
             "\n".join(_table(FIDELITY_COLUMNS, rows, layout, "fidelity rows")).strip()]
    positions = position_lines(fmt)
    if positions:
        parts.append(_bullets([md_inline(line) for line in positions], layout))
    largest = largest_lines(fmt)
    if largest:
        parts.append("**Largest divergence** (items)\n\n" + _bullets([md_inline(line) for line in largest], layout))
    return "\n\n".join(parts)


def _spot_checks(fmt: FormatResult, layout: _Layout) -> str:
    if fmt.spot_checks is None:
        return ""
    parts = ["**Spot checks by people**\n\n" + md_inline(spot_check_caption(fmt)),
             "\n".join(_table(SPOT_CHECK_COLUMNS, spot_check_rows(fmt), layout, "spot-check rows")).strip()]
    quotes = unacceptable_quotes(fmt)
    if quotes:
        rows = [[heading, candidate, baseline, reference] for heading, candidate, baseline, reference in quotes]
        parts.append("**Judged unacceptable** (candidate beside baseline)\n\n" + "\n".join(_table(
            ("Item", "Candidate", "Baseline", "Reference"), rows, layout, "items judged unacceptable")).strip())
    return "\n\n".join(parts)


def _bullets(items: list[str], layout: _Layout) -> str:
    shown = items[: layout.list_items]
    lines = [f"- {item}" for item in shown]
    if len(items) > len(shown):
        lines.append(f"- … {len(items) - len(shown)} more in report.json")
    return "\n".join(lines)


def _scores_table(fmt: FormatResult, layout: _Layout) -> str:
    scores = score_rows(fmt)
    if not scores:
        return ""
    baseline = fmt.role == "baseline"
    columns = BASELINE_SCORE_COLUMNS if baseline else [c for c in SCORE_COLUMNS if c != "Method"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for score in scores[: layout.list_items]:
        cells = [md_cell(score.evalset), f"**{md_cell(score.metric)}**" if score.gated else md_cell(score.metric),
                 score.score]
        cells += [score.n] if baseline else [score.delta, score.margin, score.mde, score.p_value,
                                             md_cell(score.status or DASH)]
        rows.append("| " + " | ".join(cells) + " |")
    if len(scores) > layout.list_items:
        rows.append(f"\n… {len(scores) - layout.list_items} more scores in report.json")
    return "**Scores** (gated metrics in bold)\n\n" + "\n".join(rows)


def _memory_table(fmt: FormatResult) -> str:
    rows = memory_rows(fmt)
    if not rows:
        return ""
    lines = [f"| **{r.label}** | **{r.value}** |" if r.is_peak else f"| {r.label} | {r.value} |" for r in rows]
    return f"**{md_inline(memory_caption(fmt))}**\n\n| Figure | Bytes |\n|---|---|\n" + "\n".join(lines)


def _timeline_line(fmt: FormatResult) -> str:
    text = timeline_peak_text(fmt)
    return f"**Memory over time:** {md_inline(text)}" if text else ""


def _latency_table(report: RunReport, fmt: FormatResult) -> str:
    rows = latency_rows(fmt)
    if not rows:
        return ""
    origin = latency_origin(report, fmt)
    head = f"**{md_inline(latency_caption(fmt))}**" + (f"\n\n_{md_inline(origin)}_" if origin else "")
    return head + "\n\n" + _figure_table(LATENCY_COLUMNS, rows)


def _figure_table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    """A table of our own figures (no escaping needed)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def _capacity(report: RunReport, fmt: FormatResult) -> str:
    text = capacity_text(report, fmt)
    if not text:
        return ""
    command = "" if serving_rows(fmt) else vllm_command(fmt)  # with `serving`, its vLLM row prints it
    return f"**Capacity.** {md_inline(text)}" + (f"\n\n    {command}" if command else "")


def _serving(report: RunReport, fmt: FormatResult, layout: _Layout) -> str:
    rows = serving_rows(fmt)
    if not rows:
        return ""
    lines = [f"**{md_inline(serving_caption(report, fmt))}**", ""]
    for row in rows:
        lines.append(f"- **{md_inline(row.engine)}**: {md_inline(clip(row.summary, 2 * layout.cell_chars))}")
        if row.command:
            lines += ["", f"      {row.command}"]
        if row.config_yaml:
            lines += ["", "      # --config file:"] + [f"      {line}" for line in row.config_yaml.splitlines()]
        lines.append("")
    return "\n".join(lines).rstrip()


def _served(report: RunReport, layout: _Layout) -> str:
    views = served_views(report)
    if not views:
        return ""
    return "\n\n".join([f"## {served_title(report)}"] + [_served_format(view, layout) for view in views])


def _served_format(view: ServedView, layout: _Layout) -> str:
    parts = [f"### {md_inline(view.name)}: {md_inline(view.status)}"]
    if view.reason:
        parts.append(f"**Reason:** {md_inline(clip(view.reason, 2 * layout.cell_chars))}")
    parts.append("\n".join(f"- **{label}:** {md_inline(clip(text, 2 * layout.cell_chars))}"
                           for label, text in view.lines))
    if view.latency:
        parts.append(_figure_table(SERVED_LATENCY_COLUMNS, view.latency))
    if view.command:
        parts.append(md_fence(view.command))
    return "\n\n".join(parts)


def _regressions(group: RegressionGroup, layout: _Layout) -> str:
    head = (
        f"**Worst regressions: {md_inline(group.evalset)}** ({md_inline(group.metric)}; {group.counts_text})"
    )
    if not group.rows:
        return head + "\n\nNo item scored lower than the baseline."
    if layout.rows_per_group == 0:
        return head + "\n\n_Rows left out to keep this report under 60,000 characters; see report.html._"
    rows = [
        f"| Item | Prompt (excerpt) | Baseline output | {md_cell(group.candidate)} output | {md_cell(group.metric)} change |",
        "|---|---|---|---|---|",
    ]
    for reg in group.rows[: layout.rows_per_group]:
        rows.append(
            "| "
            + " | ".join(
                [
                    md_cell(clip(reg.item_id, 60)),
                    md_cell(prompt_excerpt(reg.prompt, layout.excerpt_chars)) or "_(empty)_",
                    _excerpt_cell(reg.baseline_output, layout.excerpt_chars),
                    _excerpt_cell(reg.candidate_output, layout.excerpt_chars),
                    reg.change_text,
                ]
            )
            + " |"
        )
    left_out = min(len(group.rows), group.regressed) - min(len(group.rows), layout.rows_per_group)
    if left_out > 0:
        rows.append(f"\n_{left_out} more rows left out to keep this report under 60,000 characters._")
    return head + "\n\n" + "\n".join(rows)


def _excerpt_cell(text: str, limit: int) -> str:
    return md_cell(excerpt(text, limit)) if text else "_(empty)_"


# --- provenance ----------------------------------------------------------------------------


def _provenance(report: RunReport, layout: _Layout) -> str:
    lines = ["## Provenance", ""]
    for label, text in provenance_items(report):
        lines.append(f"- **{label}:** {md_inline(clip(text, 2 * layout.cell_chars))}")
    env = environment_items(report)
    if env:
        shown = [md_inline(clip(item, 80)) for item in env[: 2 * layout.list_items]]
        more = f", … {len(env) - len(shown)} more" if len(env) > len(shown) else ""
        lines.append("- **Environment:** " + ", ".join(shown) + more)
    lines += _table(EVALSET_COLUMNS, evalset_rows(report), layout, "evalsets")
    lines += _table(CALIBRATION_COLUMNS, calibration_rows(report), layout, "calibration rows")
    lines += _table(ARTIFACT_COLUMNS, artifact_rows(report), layout, "artifacts")
    return "\n".join(lines)


def _table(columns: tuple[str, ...], rows: list[list[str]], layout: _Layout, what: str) -> list[str]:
    if not rows:
        return []
    lines = ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for cells in rows[: layout.list_items]:
        lines.append("| " + " | ".join(md_cell(clip(c, layout.cell_chars)) for c in cells) + " |")
    if len(rows) > layout.list_items:
        lines.append(f"\n… {len(rows) - layout.list_items} more {what} in report.json")
    return lines
