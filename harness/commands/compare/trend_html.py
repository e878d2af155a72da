"""`quantgate compare --html FILE`: the trend over runs as one self-contained page, what a weekly job attaches.

Self-contained as report.html is: inline CSS, the plot as a base64 PNG data URI drawn with the helpers of
plots.py (Agg canvas, no pyplot), no script, and the same Content-Security-Policy. Every text goes through escape.
"""

from __future__ import annotations

import base64
import math
import os
from typing import Any

from harness.cache import cache_dir
from harness.commands.compare.trend import FormatTrend, Trend, point_cell, verdict_cell
from harness.errors import UserError
from harness.report.html import CSP, e
from harness.report.plots import VERDICT_COLOURS, Plot, _figure, _png, _quiet_matplotlib
from harness.units import is_number

MAX_PLOTTED_FORMATS = 12
GREY = "#57606a"
LINE_COLOURS = ("#0969da", "#8250df", "#fb8500", "#1b7c83", "#bf3989", "#6e7781")  # not the verdict colours
_VERDICT_CLASS = {"GO": "go", "NO-GO": "nogo", "INCONCLUSIVE": "inconclusive", "BASELINE": "baseline"}


def render_trend_html(trend: Trend, regressed: list[str], plot: Plot | None = None) -> str:
    """The page; `plot` defaults to drawing it."""
    plot = render_trend_plot(trend) if plot is None else plot
    last = trend.runs[-1].report
    model = last.model.source or last.model.path or "model"
    body = [f"<header><h1>quantgate trend: {e(model)}</h1><p class=\"sub\">{len(trend.runs)} runs, "
            f"{e(trend.runs[0].created_at)} to {e(trend.runs[-1].created_at)}</p></header>"]
    if regressed:
        body.append(f'<p class="error">No longer GO in the last run: {e(", ".join(regressed))}</p>')
    body.append(_runs(trend))
    body.append(_differences(trend))
    body.append(_plot(plot))
    for fmt in trend.formats:
        header = "".join(f"<th>#{i + 1}</th>" for i in range(len(trend.runs)))
        rows = ["<tr><th>verdict</th>" + "".join(_verdict_td(fmt, i, verdict_cell(fmt, i))
                                                  for i in range(len(trend.runs))) + "</tr>"]
        rows += [f"<tr><th>{e(label)}</th>" + "".join(f"<td>{e(point_cell(p))}</td>" for p in series) + "</tr>"
                 for label, series in fmt.metrics.items()]
        body.append(f'<section class="format"><h2>{e(fmt.name)}</h2><table><thead><tr><th></th>{header}</tr>'
                    f'</thead><tbody>{"".join(rows)}</tbody></table></section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            f"<title>quantgate trend: {e(model)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(body) + "\n</main>\n</body>\n</html>\n")


def _runs(trend: Trend) -> str:
    rows = []
    for i, run in enumerate(trend.runs):
        verdicts = ", ".join(f"{f.name} {f.verdicts[i]}" for f in trend.formats if f.verdicts[i] is not None)
        rows.append(f"<tr><td>#{i + 1}</td><td>{e(run.created_at)}</td><td><code>{e(run.path)}</code></td>"
                    f"<td>{e(verdicts)}</td></tr>")
    return ('<section id="runs"><h2>Runs, oldest first</h2><table><thead><tr><th>#</th><th>created</th>'
            f'<th>report</th><th>verdicts</th></tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def _differences(trend: Trend) -> str:
    items = [f"<li>{e(pair.label)} {e(d.describe())}"
             + (' <strong class="s-nogo">(scores not comparable)</strong>' if d.incomparable else "") + "</li>"
             for pair in trend.pairs for d in pair.differences]
    if not items:
        return '<section id="differences"><h2>Differences between runs</h2><p>none</p></section>'
    return f'<section id="differences"><h2>Differences between runs</h2><ul>{"".join(items)}</ul></section>'


def _verdict_td(fmt: FormatTrend, index: int, text: str) -> str:
    turned = " turn" if fmt.turn_at(index) else ""
    verdict = fmt.verdicts[index]
    klass = f"v-{_VERDICT_CLASS.get(verdict, 'nogo')}" if verdict else "absent"
    return f'<td class="{klass}{turned}">{e(text)}</td>'


def _plot(plot: Plot | None) -> str:
    if plot is None:
        return ""
    if not plot.png:
        return f'<figure class="noplot"><p>{e(plot.title)}: {e(plot.error or "no data")}</p></figure>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (f'<figure><img alt="{e(plot.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(plot.caption)}</figcaption></figure>")


def render_trend_plot(trend: Trend) -> Plot | None:
    """Per format, each gated metric's value over the runs; markers coloured by that run's verdict, a dashed line
    where the verdict turned. None when no run has a gated score."""
    try:  # matplotlib writes its font cache where MPLCONFIGDIR says when first imported: our cache, as plots.py does
        os.environ["MPLCONFIGDIR"] = str(cache_dir("matplotlib"))
    except UserError:
        pass
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return Plot("trend", "Trend", "", error=f"matplotlib is not installed ({exc}); the tables hold every score")
    plotted = [f for f in trend.formats if any(p is not None and is_number(p.value)
                                                for series in f.metrics.values() for p in series)]
    if not plotted:
        return None
    try:
        with _quiet_matplotlib():
            figure = _draw(trend, plotted[:MAX_PLOTTED_FORMATS])
            png = _png(figure)
    except Exception as exc:  # a broken plot must not cost the job its page
        return Plot("trend", "Trend", "", error=f"could not draw: {type(exc).__name__}: {exc}")
    caption = ("Each gated metric's score per run (0–100); marker colour is the format's verdict in that run, a "
               "dashed line marks where the verdict turned.")
    if len(plotted) > MAX_PLOTTED_FORMATS:
        caption += f" {len(plotted) - MAX_PLOTTED_FORMATS} more formats are in the tables."
    return Plot("trend", "Gated scores per run", caption, png=png)


def _draw(trend: Trend, formats: list[FormatTrend]) -> Any:
    xs = list(range(1, len(trend.runs) + 1))
    ticks = [f"#{i}\n{run.created_at[:10]}" for i, run in zip(xs, trend.runs)]
    figure = _figure(8.0, 0.8 + 2.4 * len(formats))
    axes = figure.subplots(len(formats), 1, squeeze=False)[:, 0]
    for ax, fmt in zip(axes, formats):
        colours = [VERDICT_COLOURS.get(v or "", GREY) for v in fmt.verdicts]
        for number, (label, series) in enumerate(fmt.metrics.items()):
            ys = [p.value if p is not None and is_number(p.value) else math.nan for p in series]
            ax.plot(xs, ys, color=LINE_COLOURS[number % len(LINE_COLOURS)], linewidth=1.5, label=label)
            ax.scatter(xs, ys, c=colours, s=36, zorder=3)
        for turn in fmt.turns:
            ax.axvline(turn.at + 0.5, color=VERDICT_COLOURS.get(turn.new, GREY), linestyle="--", linewidth=1.2)
            ax.annotate(turn.describe(), (turn.at + 0.5, 1.0), xycoords=("data", "axes fraction"),
                        textcoords="offset points", xytext=(3, -10), fontsize=8)
        ax.set_title(fmt.name)
        ax.set_ylabel("score (0–100)")
        ax.set_xticks(xs)
        ax.set_xticklabels(ticks, fontsize=7)
        ax.set_xlim(0.5, len(xs) + 0.5)
        ax.margins(y=0.2)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    return figure


_CSS = """
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans", sans-serif; color: #1f2328; }
main { max-width: 1100px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { margin: 0; font-size: 22px; } .sub { margin: 2px 0; color: #57606a; }
h2 { margin: 24px 0 8px; font-size: 18px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; white-space: nowrap; }
th { background: #f6f8fa; }
td.v-go { color: #1a7f37; } td.v-nogo { color: #cf222e; } td.v-inconclusive { color: #9a6700; }
td.v-baseline, td.absent { color: #57606a; }
td.turn { font-weight: 700; outline: 2px solid currentColor; outline-offset: -3px; }
.error { background: #ffebe9; border: 1px solid #cf222e; padding: 8px 12px; }
.s-nogo { color: #cf222e; }
figure { margin: 12px 0; border: 1px solid #d0d7de; padding: 8px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #57606a; font-size: 12px; margin-top: 4px; }
"""
