"""The HTML plots (four for the run, one memory timeline per format that has one), drawn with matplotlib's Agg canvas and returned as PNG bytes.

matplotlib is imported inside `render_plots` only (it costs about a second), and
through `matplotlib.figure.Figure` rather than pyplot, so no global backend or
figure registry is touched. A plot that has no data is left out; one that fails to
draw is reported as a `Plot` with an error, never as a failed report.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from harness.cache import cache_dir
from harness.report.schema import FormatResult, RunReport
from harness.units import is_number
from harness.report.view import (TIMELINE_LABELS, candidates, formats_in_order, gated_scores, largest_batch_kv,
                                  latency_run, memory_timeline, timeline_peak_text)

GIB = 2**30
VERDICT_COLOURS = {"GO": "#1a7f37", "NO-GO": "#cf222e", "INCONCLUSIVE": "#bf8700", "BASELINE": "#57606a"}
STATUS_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#bf8700"}
MAX_FOREST_ROWS = 60  # beyond that the labels are unreadable; the tables hold the rest


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    caption: str
    png: bytes | None = None
    error: str | None = None


def render_plots(report: RunReport, samples: list[dict[str, Any]] | tuple = ()) -> list[Plot]:
    # matplotlib writes its font cache into MPLCONFIGDIR when it is first imported: keep it in our cache.
    os.environ["MPLCONFIGDIR"] = str(cache_dir("matplotlib"))
    try:
        import matplotlib  # noqa: F401  (fails here, not halfway through a plot, when missing)
    except ImportError as exc:
        return [Plot("plots", "Plots", "", error=f"matplotlib is not installed ({exc}); the tables hold every figure")]
    specs: list[tuple[str, str, Callable[[RunReport], tuple[Any, str] | None]]] = [
        ("accuracy_memory", "Accuracy vs peak memory", _accuracy_vs_memory),
        ("latency", "Latency per format (batch 1)", _latency),
        ("memory", "Memory breakdown", _memory_breakdown),
        ("forest", "Gated deltas against the margin", _forest),
        ("fidelity_items", "Fidelity per item", lambda report: _fidelity_items(report, samples)),
        ("fidelity_positions", "Fidelity by output position", _fidelity_positions),
    ]
    for name, fmt in formats_in_order(report):
        if memory_timeline(fmt) is not None:
            specs.append((f"timeline:{name}", f"Memory over time: {name}",
                          lambda report, fmt=fmt, name=name: _timeline(name, fmt)))
    plots = []
    for key, title, draw in specs:
        try:
            with _quiet_matplotlib():
                drawn = draw(report)
                if drawn is None:
                    continue
                figure, caption = drawn
                plots.append(Plot(key, title, caption, png=_png(figure)))
        except Exception as exc:  # a broken plot must not cost the reviewer the report
            plots.append(Plot(key, title, "", error=f"could not draw: {type(exc).__name__}: {exc}"))
    return plots


class _quiet_matplotlib:
    """Plain-text labels (a '$' in a format name must not start mathtext), no glyph warnings."""

    def __enter__(self) -> None:
        import matplotlib

        self._rc = matplotlib.rc_context({"text.parse_math": False, "font.size": 9, "axes.titlesize": 10})
        self._rc.__enter__()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._warnings.__exit__(*exc)
        self._rc.__exit__(*exc)


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _colour(fmt: FormatResult) -> str:
    return VERDICT_COLOURS[fmt.verdict]


def _accuracy_vs_memory(report: RunReport) -> tuple[Any, str] | None:
    points = []
    for name, fmt in formats_in_order(report):
        peak = fmt.memory.peak_bytes if fmt.memory is not None else None
        values = [gs.score.value for gs in gated_scores(report, fmt) if is_number(gs.score.value)]
        if is_number(peak) and values:
            points.append((name, peak / GIB, sum(values) / len(values), _colour(fmt)))
    if not points:
        return None
    figure = _figure(6.0, 4.0)
    ax = figure.subplots()
    for name, x, y, colour in points:
        ax.scatter([x], [y], s=60, color=colour, zorder=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("mean gated score (0–100)")
    ax.set_xlim(left=0, right=max(p[1] for p in points) * 1.2)
    ax.margins(y=0.15)
    ax.grid(True, alpha=0.3)
    ax.set_title("Accuracy vs peak memory (colour = verdict)")
    return figure, "Each format's peak memory against the mean of its gated metrics over all evalsets."


def _latency(report: RunReport) -> tuple[Any, str] | None:
    rows = []
    for name, fmt in formats_in_order(report):
        run = latency_run(fmt, "batch_1")
        if run is not None and (is_number(run.ttft_ms.p50) or is_number(run.tpot_ms.p50)):
            rows.append((name, run.ttft_ms, run.tpot_ms, _colour(fmt)))
    if not rows:
        return None
    figure = _figure(7.0, 3.6)
    axes = figure.subplots(1, 2)
    for ax, key, label in ((axes[0], 1, "TTFT (ms)"), (axes[1], 2, "TPOT (ms)")):
        names = [r[0] for r in rows]
        p50 = [r[key].p50 if is_number(r[key].p50) else 0.0 for r in rows]
        p95 = [r[key].p95 if is_number(r[key].p95) else p for r, p in zip(rows, p50)]
        upper = [max(high - low, 0.0) for low, high in zip(p50, p95)]
        ax.bar(names, p50, color=[r[3] for r in rows], yerr=[[0.0] * len(rows), upper], capsize=4)
        ax.set_ylabel(label)
        ax.set_title(f"{label.split()[0]} p50, whisker to p95")
        ax.tick_params(axis="x", labelrotation=30)
        ax.grid(True, axis="y", alpha=0.3)
    return figure, "Bars are p50 at batch 1, whiskers reach p95; colour is the verdict."


def _memory_breakdown(report: RunReport) -> tuple[Any, str] | None:
    rows = []
    for name, fmt in formats_in_order(report):
        memory = fmt.memory
        if memory is None or not is_number(memory.weights_bytes):
            continue
        kv = largest_batch_kv(memory)[0] or 0.0
        rows.append((name, memory.weights_bytes / GIB, kv / GIB, (memory.activation_peak_bytes or 0.0) / GIB,
                     memory.peak_bytes))
    if not rows:
        return None
    figure = _figure(6.0, 4.0)
    ax = figure.subplots()
    names = [r[0] for r in rows]
    weights = [r[1] for r in rows]
    kv = [r[2] for r in rows]
    act = [r[3] for r in rows]
    ax.bar(names, weights, label="weights", color="#0969da")
    ax.bar(names, kv, bottom=weights, label="KV cache at the largest measured batch", color="#8250df")
    ax.bar(names, act, bottom=[w + k for w, k in zip(weights, kv)], label="activation peak", color="#fb8500")
    peaks = [(n, r[4] / GIB) for n, r in zip(names, rows) if is_number(r[4])]
    if peaks:
        ax.scatter([p[0] for p in peaks], [p[1] for p in peaks], marker="_", s=400, color="black", zorder=3,
                   label="measured peak")
    ax.set_ylabel("GiB")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Memory breakdown")
    return figure, ("Weights, the KV cache at the largest measured batch, and the activation peak, stacked; ticks mark "
                    "the measured peak.")


def _forest(report: RunReport) -> tuple[Any, str] | None:
    rows = []
    for name, fmt in candidates(report):
        for gs in gated_scores(report, fmt):
            score = gs.score
            if is_number(score.delta) and is_number(score.ci_low) and is_number(score.ci_high):
                rows.append((f"{name} · {gs.evalset}/{gs.metric}", score))
    if not rows:
        return None
    left_out = max(len(rows) - MAX_FOREST_ROWS, 0)
    rows = rows[:MAX_FOREST_ROWS]
    figure = _figure(7.0, 1.2 + 0.35 * len(rows))
    ax = figure.subplots()
    ys = list(range(len(rows)))[::-1]
    margin_drawn = False
    for y, (_, score) in zip(ys, rows):
        colour = STATUS_COLOURS.get(score.status or "", "#57606a")
        ax.plot([score.ci_low, score.ci_high], [y, y], color=colour, linewidth=2)
        ax.plot([score.delta], [y], marker="o", color=colour)
        if is_number(score.margin):
            ax.plot([-score.margin] * 2, [y - 0.4, y + 0.4], color="#cf222e", linestyle="--", linewidth=1.5,
                    label=None if margin_drawn else "−margin")
            margin_drawn = True
    ax.axvline(0.0, color="#57606a", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels([label for label, _ in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("candidate − baseline (points, 95% interval)")
    ax.grid(True, axis="x", alpha=0.3)
    if margin_drawn:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Gated deltas vs −margin (colour = check status)")
    caption = "Each gated metric's paired delta and 95% interval; GO needs the whole interval right of the red −margin line."
    if left_out:
        caption += f" {left_out} more rows are in the tables."
    return figure, caption


def _fidelity_items(report: RunReport, samples) -> tuple[Any, str] | None:
    """Each item's KL per candidate (one row per format): where the divergence concentrates."""
    names = [name for name, fmt in candidates(report) if fmt.fidelity]
    per_format = {name: [s["fidelity"]["kl"] for s in samples
                         if s.get("format") == name and isinstance(s.get("fidelity"), dict)
                         and is_number(s["fidelity"].get("kl"))] for name in names}
    per_format = {name: values for name, values in per_format.items() if values}
    if not per_format:
        return None
    figure = _figure(7.0, 1.2 + 0.45 * len(per_format))
    ax = figure.subplots()
    ys = list(range(len(per_format)))[::-1]
    for y, (name, values) in zip(ys, per_format.items()):
        jitter = [y + 0.25 * (((i * 37) % 17) / 16 - 0.5) for i in range(len(values))]
        ax.scatter([max(v, 1e-5) for v in values], jitter, s=10, alpha=0.6, color=_colour(report.formats[name]))
        limits = [e.max_kl for e in (report.formats[name].fidelity or {}).values()]
        if limits:
            ax.plot([max(limits)] * 2, [y - 0.4, y + 0.4], color="#cf222e", linestyle="--", linewidth=1.5)
    ax.set_xscale("log")
    ax.set_yticks(ys)
    ax.set_yticklabels(list(per_format))
    ax.set_xlabel("KL(baseline ‖ format) per item, nats/token (log scale)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Per-item divergence from the baseline (red: the policy's max_kl)")
    return figure, ("One dot per item: its mean KL over its output tokens. A few items far right carry most of the "
                    "divergence; read them in the fidelity tables.")


def _fidelity_positions(report: RunReport) -> tuple[Any, str] | None:
    """Mean KL by band of output positions, per candidate and evalset: does it grow with the answer's length?"""
    lines = [(f"{name} · {evalset}", entry.by_position) for name, fmt in candidates(report)
             for evalset, entry in (fmt.fidelity or {}).items() if entry.by_position and len(entry.by_position) > 1]
    if not lines:
        return None
    figure = _figure(7.0, 3.2)
    ax = figure.subplots()
    for label, bands in lines[:MAX_FOREST_ROWS]:
        ax.plot([b.start for b in bands], [b.kl for b in bands], marker="o", markersize=3, label=label)
    ax.set_xlabel("output position (first token of a 16-token band)")
    ax.set_ylabel("mean KL, nats/token")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Divergence along the answer")
    return figure, "Mean KL per 16-token band of the output; a rising line means long answers drift further."


TIMELINE_COLOURS = {"rss_bytes": "#0969da", "nvml_used_bytes": "#cf222e", "cuda_reserved_bytes": "#8250df",
                    "cuda_allocated_bytes": "#1a7f37"}
STAGE_SHADES = ("#f6f8fa", "#eaeef2")


def _timeline(name: str, fmt: FormatResult) -> tuple[Any, str] | None:
    """One format's memory over time: a line per sampled figure, a band per stage, each peak marked."""
    timeline = memory_timeline(fmt)
    if timeline is None:
        return None
    points = timeline.points
    fields = [f for f in timeline.fields if any(is_number(getattr(p, f)) for p in points)]
    if not fields:
        return None
    figure = _figure(7.0, 3.4)
    ax = figure.subplots()
    top = max(v for p in points for f in fields if is_number(v := getattr(p, f))) / GIB
    for index, stage in enumerate(timeline.stages):
        if not (is_number(stage.start_s) and is_number(stage.end_s)):
            continue
        ax.axvspan(stage.start_s, stage.end_s, color=STAGE_SHADES[index % 2], zorder=0)
        ax.text((stage.start_s + stage.end_s) / 2, top * 1.23, stage.stage, ha="center",
                va="top", fontsize=7, rotation=90 if len(timeline.stages) > 4 else 0, color="#57606a")
    for field in fields:
        series = [(p.t_s, v / GIB) for p in points if is_number(v := getattr(p, field))]
        colour = TIMELINE_COLOURS[field]
        ax.plot([t for t, _ in series], [v for _, v in series], color=colour, linewidth=1.5,
                label=TIMELINE_LABELS[field], zorder=2)
        peak = getattr(timeline.peaks, field)
        if peak is not None and is_number(peak.t_s):
            ax.scatter([peak.t_s], [peak.bytes / GIB], marker="v", s=50, color=colour, zorder=3)
            ax.annotate(f"peak {peak.bytes / GIB:.2f} GiB", (peak.t_s, peak.bytes / GIB),
                        textcoords="offset points", xytext=(4, 6), fontsize=7, color=colour)
    ax.set_ylim(bottom=0, top=top * 1.25 if top > 0 else 1)
    ax.set_xlim(left=0, right=max(timeline.duration_s or 0, points[-1].t_s) or 1)
    ax.set_xlabel("time since the job began (s)")
    ax.set_ylabel("GiB")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{name}: memory over time (bands = stages, ▼ = peak)")
    interval = timeline.interval_s
    every = f"every {interval * 1000:.0f} ms" if is_number(interval) else "at a fixed interval"
    return figure, f"Sampled {every} in {name}'s own process; {timeline_peak_text(fmt)}."
