"""report.html: one self-contained page for a person: the Markdown's content plus plots.

Self-contained means no fetches at all: CSS inline, plots as base64 PNG data URIs, no
script. A Content-Security-Policy meta tag forbids scripts and remote loads, so even a
mistake in escaping could not run code or phone home. All text from the model, the
datasets and the report goes through html.escape.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from typing import Any, Iterable

from harness.report.fidelity import (FIDELITY_COLUMNS, fidelity_caption, fidelity_rows, largest_lines,
                                     position_lines)
from harness.report.plots import Plot, render_plots
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

MAX_BYTES = 2 * 1024 * 1024
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
_VERDICT_CLASS = {"GO": "go", "NO-GO": "nogo", "INCONCLUSIVE": "inconclusive", "BASELINE": "baseline"}
_STATUS_CLASS = {"pass": "go", "fail": "nogo", "inconclusive": "inconclusive"}


@dataclass(frozen=True)
class _Layout:
    """How much detail fits, shrunk step by step until the page is under MAX_BYTES: characters of a prompt excerpt
    and of an output, regression rows per group, items per provenance list."""

    excerpt_chars: int
    output_chars: int
    rows_per_group: int
    list_items: int


_LAYOUTS = tuple(_Layout(*sizes) for sizes in ((600, 800, 5, 200), (300, 400, 5, 100), (160, 200, 3, 50),
                                               (80, 100, 1, 20), (80, 100, 0, 10)))


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def render_html(report: RunReport, samples: list[dict[str, Any]], plots: list[Plot] | None = None) -> str:
    """The page; `plots` defaults to drawing them (pass [] to leave plots out)."""
    if plots is None:
        plots = render_plots(report, samples)
    groups = worst_regressions(report, samples, limit=max(layout.rows_per_group for layout in _LAYOUTS))
    page = ""
    for layout in _LAYOUTS:
        page = _page(report, groups, plots, layout)
        if len(page.encode("utf-8")) < MAX_BYTES:
            break
    return page


def _page(report: RunReport, groups: list[RegressionGroup], plots: list[Plot], layout: _Layout) -> str:
    model = report.model.source or report.model.path or "model"
    body = [
        _header(report, model),
        '<section id="verdicts">',
        _verdict_table(report, layout),
        _note(backend_note(report)),
        _recommendation(report),
        _legend(),
        "</section>",
        _plots(plots),
    ]
    for index, (name, fmt) in enumerate(formats_in_order(report)):
        body.append(_format_section(report, index, name, fmt, groups, layout))
    body.append(_served(report))
    body.append(_provenance(report, layout))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>quantgate report: {e(clip(model, 120))}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n<main>\n" + "\n".join(p for p in body if p) + "\n</main>\n</body>\n</html>\n"
    )


def _badge(verdict: str) -> str:
    return f'<span class="badge v-{_VERDICT_CLASS.get(verdict, "nogo")}">{e(verdict)}</span>'


def _table(columns: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """Cells are already HTML (escaped by the caller); headers are escaped here."""
    head = "".join(f"<th>{e(c)}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<div class="scroll"><table{klass}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table></div>'
    )


def _header(report: RunReport, model: str) -> str:
    bits = [e(report.created_at), e(f"{report.device.kind} {report.device.name}".strip())]
    sub = " · ".join(b for b in bits if b)
    return f'<header><h1>quantgate report</h1><p class="model">{e(model)}</p><p class="sub">{sub}</p></header>'


# --- verdicts ------------------------------------------------------------------------------


def _verdict_table(report: RunReport, layout: _Layout) -> str:
    rows = [
        [
            f'<a href="#fmt-{row.anchor}">{e(row.name)}</a>',
            _badge(row.verdict) + (f'<br><span class="note">{e(row.verdict_text[len(row.verdict):].strip())}</span>'
                                   if row.verdict_text != row.verdict else ""),
            e(row.peak),
            e(row.weights),
            e(row.tpot_p50),
            _gated_cell(row, layout),
            (f'<span class="s-{_STATUS_CLASS[row.fidelity_status]}">{e(row.fidelity)}</span>'
             if row.fidelity_status else e(row.fidelity or DASH)),
            _flags(row.vllm_flags) if row.vllm_flags else DASH,
        ]
        for row in verdict_rows(report)
    ]
    return _table(VERDICT_COLUMNS, rows, cls="verdicts")


def _note(text: str) -> str:
    return f'<p class="note">{e(text)}</p>' if text else ""


def _flags(flags: str) -> str:
    """One `--flag value` per line: the cell wraps between flags, never inside one."""
    items: list[str] = []
    for token in str(flags).split():
        if token.startswith("--") or not items:
            items.append(token)
        else:
            items[-1] += " " + token
    return "<br>".join(f'<code class="flag">{e(item)}</code>' for item in items)


def _gated_cell(row: VerdictRow, layout: _Layout) -> str:
    lines = []
    if row.error is not None:
        lines.append(f'<span class="error-inline">failed: {e(row.error)}</span>')
    for gated in row.gated[: layout.list_items]:
        label = e(gated.label)
        if row.is_baseline:
            lines.append(f"{label} {e(gated.figure)}")
        else:
            cls = _STATUS_CLASS.get(gated.status, "")
            mark = {"pass": "✓", "fail": "✗", "inconclusive": "?"}.get(gated.status, "")
            lines.append(f'<span class="s-{cls}">{label} {e(gated.figure)} {mark}</span>')
    return "<br>".join(lines) or DASH


def _recommendation(report: RunReport) -> str:
    return f'<p class="recommendation">{"".join(_phrase(p) for p in recommendation_sentence(report))}</p>'


def _phrase(phrase: Phrase) -> str:
    text = e(phrase.text) if phrase.data else phrase.text
    return f"<strong>{text}</strong>" if phrase.strong else text


def _legend() -> str:
    items = "\n".join(f"<li><strong>{e(term)}</strong> {e(text)}</li>" for term, text in LEGEND)
    return f'<div class="legend"><h3>How to read a verdict</h3>\n<ul>\n{items}\n</ul></div>'


def _plots(plots: list[Plot]) -> str:
    if not plots:
        return ""
    figures = []
    for plot in plots:
        if plot.png:
            data = base64.b64encode(plot.png).decode("ascii")
            figures.append(
                f'<figure><img alt="{e(plot.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(plot.caption)}</figcaption></figure>"
            )
        else:
            figures.append(f'<figure class="noplot"><p>{e(plot.title)}: {e(plot.error or "no data")}</p></figure>')
    return '<section id="plots"><h2>Plots</h2>\n<div class="plots">\n' + "\n".join(figures) + "\n</div></section>"


# --- per format ----------------------------------------------------------------------------


def _format_section(
    report: RunReport, index: int, name: str, fmt: FormatResult, groups: list[RegressionGroup], layout: _Layout
) -> str:
    verdict = fmt.verdict
    parts = [f'<section class="format v-border-{_VERDICT_CLASS.get(verdict, "nogo")}" id="fmt-{index}">',
             f"<h2>{e(name)} {_badge(verdict)}</h2>"]
    if fmt.status == "failed":
        parts.append(f'<div class="error"><strong>Failed:</strong> {e(fmt.error or "no error recorded")}</div>')
    reasons = [r for r in fmt.reasons if r]
    if reasons:
        shown = "".join(f"<li>{e(r)}</li>" for r in reasons[: layout.list_items])
        more = f"<li>… {len(reasons) - layout.list_items} more in report.json</li>" if len(reasons) > layout.list_items else ""
        parts.append(f'<h3>Reasons</h3><ul class="reasons">{shown}{more}</ul>')
    parts += [_scores(fmt, layout), _memory(fmt), _timeline(fmt), _latency(report, fmt), _capacity(report, fmt),
              _serving(report, fmt), _fidelity(fmt, served_backend(report)), _spot_checks(fmt, layout),
              _checks(fmt, layout)]
    if fmt.role != "baseline":
        parts += [_regressions(group, layout) for group in groups if group.candidate == name]
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _scores(fmt: FormatResult, layout: _Layout) -> str:
    scores = score_rows(fmt)
    if not scores:
        return ""
    baseline = fmt.role == "baseline"
    rows = []
    for score in scores[: layout.list_items]:
        row = [e(score.evalset), f"<strong>{e(score.metric)}</strong>" if score.gated else e(score.metric),
               e(score.score)]
        status = f'<span class="s-{_STATUS_CLASS.get(score.status, "")}">{e(score.status or DASH)}</span>'
        row += [e(score.n)] if baseline else [e(score.delta), e(score.margin), e(score.mde), e(score.p_value),
                                              e(score.method), status]
        rows.append(row)
    columns = BASELINE_SCORE_COLUMNS if baseline else SCORE_COLUMNS
    more = f"<p>… {len(scores) - layout.list_items} more scores in report.json</p>" if len(scores) > layout.list_items else ""
    return "<h3>Scores <small>(gated metrics in bold)</small></h3>\n" + _table(columns, rows) + more


def _memory(fmt: FormatResult) -> str:
    rows = memory_rows(fmt)
    if not rows:
        return ""
    cells = [
        [f"<strong>{e(r.label)}</strong>", f"<strong>{e(r.value)}</strong>"] if r.is_peak else [e(r.label), e(r.value)]
        for r in rows
    ]
    return f"<h3>{e(memory_caption(fmt))}</h3>\n" + _table(("Figure", "Bytes"), cells, cls="narrow")


def _timeline(fmt: FormatResult) -> str:
    text = timeline_peak_text(fmt)
    return f'<p class="timeline"><strong>Memory over time:</strong> {e(text)} (plot under Plots)</p>' if text else ""


def _latency(report: RunReport, fmt: FormatResult) -> str:
    rows = latency_rows(fmt)
    if not rows:
        return ""
    return (f"<h3>{e(latency_caption(fmt))}</h3>\n" + _note(latency_origin(report, fmt))
            + _table(LATENCY_COLUMNS, [[e(c) for c in row] for row in rows]))


def _capacity(report: RunReport, fmt: FormatResult) -> str:
    text = capacity_text(report, fmt)
    if not text:
        return ""
    command = "" if serving_rows(fmt) else vllm_command(fmt)  # with `serving`, its vLLM row prints it
    return f"<h3>Capacity</h3><p>{e(text)}</p>" + (f"<pre><code>{e(command)}</code></pre>" if command else "")


def _fidelity(fmt: FormatResult, served: bool = False) -> str:
    rows = fidelity_rows(fmt)
    if not rows:
        return ""
    extra = "".join(f"<li>{e(line)}</li>" for line in position_lines(fmt))
    largest = "".join(f"<li>{e(line)}</li>" for line in largest_lines(fmt))
    return (f"<h3>Fidelity to the baseline</h3><p>{e(fidelity_caption(fmt, served))}</p>"
            + _table(FIDELITY_COLUMNS, [[e(c) for c in row] for row in rows])
            + (f"<ul>{extra}</ul>" if extra else "")
            + (f"<h4>Largest divergence</h4><ul>{largest}</ul>" if largest else ""))


def _spot_checks(fmt: FormatResult, layout: _Layout) -> str:
    if fmt.spot_checks is None:
        return ""
    quotes = unacceptable_quotes(fmt)
    shown = "".join(f'<tr><td>{e(heading)}</td><td class="output">{e(candidate)}</td><td class="output">{e(baseline)}'
                    f'</td><td class="output">{e(reference)}</td></tr>' for heading, candidate, baseline, reference
                    in quotes[: layout.list_items])
    more = f"<p>… {len(quotes) - layout.list_items} more in report.json</p>" if len(quotes) > layout.list_items else ""
    return (f"<h3>Spot checks by people</h3><p>{e(spot_check_caption(fmt))}</p>"
            + _table(SPOT_CHECK_COLUMNS, [[e(c) for c in row] for row in spot_check_rows(fmt)])
            + (f"<h4>Judged unacceptable (candidate beside baseline)</h4><table><thead><tr><th>Item</th>"
               f"<th>Candidate</th><th>Baseline</th><th>Reference</th></tr></thead><tbody>{shown}</tbody></table>{more}"
               if quotes else ""))


def _serving(report: RunReport, fmt: FormatResult) -> str:
    rows = serving_rows(fmt)
    if not rows:
        return ""
    cells = []
    for row in rows:
        command = f"<pre><code>{e(row.command)}</code></pre>" if row.command else ""
        if row.config_yaml:
            command += f"<pre><code>{e(row.config_yaml)}</code></pre>"
        cells.append([e(row.engine), e(row.summary) + command])
    return f"<h3>{e(serving_caption(report, fmt))}</h3>\n" + _table(["Engine", "Settings"], cells)


def _served(report: RunReport) -> str:
    views = served_views(report)
    if not views:
        return ""
    return "\n".join([f'<section id="served"><h2>{e(served_title(report))}</h2>', *map(_served_format, views), "</section>"])


def _served_format(view: ServedView) -> str:
    cls = {"ok": "go", "unsupported": "inconclusive"}.get(view.status, "nogo")
    parts = [f'<h3>{e(view.name)} <span class="s-{cls}">{e(view.status)}</span></h3>']
    if view.reason:
        parts.append(f'<p class="served-reason"><strong>Reason:</strong> {e(view.reason)}</p>')
    parts.append("<ul>" + "".join(f"<li><strong>{e(label)}:</strong> {e(text)}</li>" for label, text in view.lines)
                 + "</ul>")
    if view.latency:
        parts.append(_table(SERVED_LATENCY_COLUMNS, [[e(c) for c in row] for row in view.latency]))
    if view.command:
        parts.append(f"<pre><code>{e(view.command)}</code></pre>")
    return "\n".join(parts)


def _checks(fmt: FormatResult, layout: _Layout) -> str:
    checks = fmt.checks
    if not checks:
        return ""
    rows = [
        [
            e(c.name),
            e(c.kind),
            f'<span class="s-{_STATUS_CLASS[c.status]}">{e(c.status)}</span>',
            e(c.detail),
        ]
        for c in checks[: layout.list_items]
    ]
    more = f"<p>… {len(checks) - layout.list_items} more in report.json</p>" if len(checks) > layout.list_items else ""
    return (
        f"<details><summary>All checks ({len(checks)})</summary>\n"
        + _table(("Check", "Kind", "Status", "Detail"), rows)
        + more
        + "</details>"
    )


def _regressions(group: RegressionGroup, layout: _Layout) -> str:
    head = (
        f"<h3>Worst regressions: {e(group.evalset)} <small>({e(group.metric)}; {group.counts_text})</small></h3>"
    )
    if not group.rows:
        return head + "<p>No item scored lower than the baseline.</p>"
    if layout.rows_per_group == 0:
        return head + "<p>Rows left out to keep this page under 2 MB.</p>"
    rows = []
    for reg in group.rows[: layout.rows_per_group]:
        rows.append(
            [
                e(reg.item_id),
                _text(prompt_excerpt(reg.prompt, layout.excerpt_chars)),
                _text(excerpt(" | ".join(reg.references), layout.output_chars) if reg.references else "(none: abstain)"),
                _text(excerpt(reg.baseline_output, layout.output_chars)),
                _text(excerpt(reg.candidate_output, layout.output_chars)),
                e(reg.change_text),
            ]
        )
    columns = ("Item", "Prompt (excerpt)", "Reference", "Baseline output", f"{group.candidate} output",
               f"{group.metric} change")
    return head + "\n" + _table(columns, rows, cls="regressions")


def _text(value: str) -> str:
    return f'<div class="txt">{e(value)}</div>' if value else '<div class="txt empty">(empty)</div>'


# --- provenance ----------------------------------------------------------------------------


def _provenance(report: RunReport, layout: _Layout) -> str:
    items = "".join(f"<li><strong>{e(label)}:</strong> {e(text)}</li>" for label, text in provenance_items(report))
    env = environment_items(report)
    if env:
        items += f"<li><strong>Environment:</strong> {e(', '.join(env[: 2 * layout.list_items]))}</li>"
    parts = ['<section id="provenance"><h2>Provenance</h2>', f"<ul>{items}</ul>"]
    evalsets = evalset_rows(report)[: layout.list_items]
    if evalsets:
        parts.append(_table(EVALSET_COLUMNS, [[e(c) for c in row] for row in evalsets], cls="prov-evalsets"))
    calibration = calibration_rows(report)
    if calibration:
        parts.append(_table(CALIBRATION_COLUMNS, [[e(c) for c in row] for row in calibration], cls="prov-calibration"))
    artifacts = artifact_rows(report)
    if artifacts:
        parts.append(_table(ARTIFACT_COLUMNS, [[e(clip(c, 600)) for c in row] for row in artifacts], cls="prov-artifacts"))
    parts.append("</section>")
    return "\n".join(parts)


_CSS = """
:root { --go: #1a7f37; --nogo: #cf222e; --inc: #9a6700; --base: #57606a; --line: #d0d7de; --soft: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK SC", sans-serif;
       color: #1f2328; background: #fff; }
main { max-width: 1280px; margin: 0 auto; padding: 16px 24px 48px; }
header h1 { margin: 0; font-size: 22px; }
header .model { margin: 2px 0; font-weight: 600; }
header .sub { margin: 0; color: var(--base); }
h2 { margin: 28px 0 8px; font-size: 19px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { margin: 18px 0 6px; font-size: 15px; }
small { color: var(--base); font-weight: normal; }
table { border-collapse: collapse; margin: 6px 0 10px; width: 100%; }
table.narrow { width: auto; }
.scroll { overflow-x: auto; }
table.prov-evalsets td:nth-child(n+7), table.prov-artifacts td:nth-child(2), table.prov-artifacts td:nth-child(5) {
  overflow-wrap: anywhere; }
code.flag { white-space: nowrap; }
table.verdicts td:nth-child(3), table.verdicts td:nth-child(4), table.verdicts td:nth-child(5) { white-space: nowrap; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); }
table.verdicts { margin-top: 16px; }
table.verdicts td:nth-child(7) code { font-size: 12px; }
table.verdicts td:nth-child(6) { min-width: 18em; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: var(--soft); padding: 8px; overflow-x: auto; white-space: pre-wrap; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-weight: 700; font-size: 12px; }
.v-go { background: var(--go); } .v-nogo { background: var(--nogo); }
.v-inconclusive { background: #bf8700; } .v-baseline { background: var(--base); }
.s-go { color: var(--go); } .s-nogo { color: var(--nogo); font-weight: 600; } .s-inconclusive { color: var(--inc); }
section.format { border-left: 4px solid var(--line); padding-left: 14px; margin-top: 24px; }
.v-border-go { border-left-color: var(--go) !important; } .v-border-nogo { border-left-color: var(--nogo) !important; }
.v-border-inconclusive { border-left-color: #bf8700 !important; } .v-border-baseline { border-left-color: var(--base) !important; }
.recommendation { font-size: 15px; background: var(--soft); border: 1px solid var(--line); padding: 8px 12px; }
.legend ul { margin: 4px 0; padding-left: 20px; }
.error { background: #ffebe9; border: 1px solid var(--nogo); padding: 8px 12px; margin: 8px 0; }
.error-inline { color: var(--nogo); }
.note { color: var(--base); font-style: italic; margin: 4px 0; }
.served-reason { background: #fff8c5; border: 1px solid #d4a72c; padding: 6px 10px; }
#served h3 .s-go, #served h3 .s-nogo, #served h3 .s-inconclusive { font-size: 13px; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 12px; }
figure { margin: 0; border: 1px solid var(--line); padding: 8px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: var(--base); font-size: 12px; margin-top: 4px; }
.txt { white-space: pre-wrap; word-break: break-word; max-height: 16em; overflow-y: auto; }
.txt.empty { color: var(--base); font-style: italic; }
table.regressions td { font-size: 13px; }
details { margin: 8px 0; } summary { cursor: pointer; color: #0969da; }
@media print { .txt { max-height: none; } }
"""
