"""What every renderer reads out of report.json and samples.jsonl, in one place.

report.json is produced by the pipeline; the renderers read it parsed (harness/report/schema.py: RunReport,
FormatResult, ...). Fields a failed format could not measure are None, and every accessor here shows them as a
dash or leaves their row out instead of raising.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from harness.jsonl import read_jsonl
from harness.capacity.gpus import with_article
from harness.report import schema
from harness.capacity import engine_names, engine_title
from harness.report.fidelity import fidelity_cell, verdict_text
from harness.report.schema import (FormatResult, LatencyRun, LatencyStats, Manifest, Memory, MemoryTimeline, Overlap,
                                   RunReport, Saturation, ScoreEntry, Served, ServedKvCache)
from harness.runtime.serving_engine import is_serving_engine, serving_engine_title
from harness.units import DASH, format_bytes, format_int, format_interval, format_ms, format_number, format_signed, is_number

# "How to read a verdict": (term, explanation), rendered by both Markdown and HTML
LEGEND = (
    ("GO", "means every floor and memory/latency budget holds and a rule carries it (named beside the verdict): "
     "the task rule, every gated metric's 95% interval of (candidate − baseline) above −margin on enough evidence "
     "(at least min_items items, and a set that could detect a drop of the margin); or the fidelity rule, the "
     "format reproduces the baseline token by token within the policy's KL and top-1 limits on every gated "
     "evalset while no gated metric's mean drops past its margin."),
    ("NO-GO", "means an interval lies wholly below −margin, the fidelity interval lies wholly beyond its limit, a "
     "floor or budget fails, or the format did not run (its error is shown)."),
    ("INCONCLUSIVE", "means the data cannot tell: an interval straddles −margin, the set is too small, or the "
     "metric cannot tell formats apart. Add items; MDE is the smallest drop this evalset could detect."),
    ("Deltas", "are paired item by item on a 0–100 scale: −1.2 [−3.0, +0.5] is the mean change and its 95% "
     "interval; ✓ pass, ✗ fail, ? inconclusive."),
    ("Fidelity", "is KL(baseline ‖ format) in nats per token and how often the format's top token is the "
     "baseline's, teacher-forced on the baseline's own output; the verdict table shows the worst evalset's 95% "
     "bounds."),
    ("Memory", "is the peak of each format's own process on the device named in its section; BASELINE is the "
     "reference every candidate is compared with."),
)


@dataclass(frozen=True)
class GatedScore:
    evalset: str
    metric: str
    score: ScoreEntry


VERDICT_COLUMNS = ("Format", "Verdict", "Peak memory", "Weights", "TPOT p50", "Gated metrics: delta [95% CI]",
                   "Fidelity to the baseline", "vLLM flags")


@dataclass(frozen=True)
class GatedFigure:
    """One gated metric of a verdict-table row: the baseline's value, or a candidate's delta and its status."""

    label: str  # "evalset/metric"
    figure: str  # "61.2" for the baseline, "-1.2 [-3.0, +0.5]" for a candidate
    status: str  # "pass", "fail", "inconclusive"; "" for the baseline


@dataclass(frozen=True)
class VerdictRow:
    """One format's row of the verdict table, as plain text (the renderers escape and mark it up)."""

    anchor: int  # the format's place in the report (its section's id)
    name: str
    is_baseline: bool
    verdict: str
    peak: str  # "9.85 GiB (cuda)"
    weights: str
    tpot_p50: str
    error: str | None  # a failed format's error
    gated: list[GatedFigure]
    vllm_flags: str  # "" when none
    fidelity: str = ""  # harness.report.fidelity.fidelity_cell
    fidelity_status: str = ""
    verdict_text: str = ""  # the verdict and the rule that carried it: "GO (fidelity rule)"


def verdict_rows(report: RunReport) -> list[VerdictRow]:
    return [_verdict_row(report, index, name, fmt) for index, (name, fmt) in enumerate(formats_in_order(report))]


def _verdict_row(report: RunReport, index: int, name: str, fmt: FormatResult) -> VerdictRow:
    memory = fmt.memory
    peak = format_bytes(memory.peak_bytes if memory is not None else None)
    if peak != DASH and memory is not None and memory.device:
        peak += f" ({memory.device})"
    baseline = fmt.role == "baseline"
    gated = [GatedFigure(f"{gs.evalset}/{gs.metric}", format_number(gs.score.value) if baseline
                         else delta_interval(gs.score), "" if baseline else gs.score.status or "")
             for gs in gated_scores(report, fmt)]
    error = (fmt.error or "no error recorded") if fmt.status == "failed" else None
    weights = memory.weights_bytes if memory is not None else None
    capacity = fmt.vllm_capacity()
    flags = capacity.vllm_flags if capacity is not None else ""
    fidelity, fidelity_status = fidelity_cell(fmt)
    return VerdictRow(index, name, baseline, fmt.verdict, peak, format_bytes(weights), format_ms(_tpot_p50(fmt)), error,
                      gated, flags, fidelity, fidelity_status, verdict_text(fmt))


def _tpot_p50(fmt: FormatResult) -> float | None:
    """batch_1's TPOT p50 (older reports' top-level copies are read into batch_1 by the schema)."""
    run = latency_run(fmt, "batch_1")
    return run.tpot_ms.p50 if run is not None else None


def delta_interval(score: ScoreEntry) -> str:
    """'−1.2 [−3.0, +0.5]': the paired delta and its 95% interval."""
    return format_interval(score.delta, score.ci_low, score.ci_high)


@dataclass(frozen=True)
class Phrase:
    """A piece of a sentence the renderers print: `data` (a format name, the producer's words) is escaped by the
    renderer, template text is not; `strong` pieces are bold."""

    text: str
    strong: bool = False
    data: bool = False


NO_RECOMMENDATION = "no candidate format is GO; keep serving the baseline"


def recommendation_sentence(report: RunReport) -> list[Phrase]:
    """'Recommendation: ship FORMAT: WHY. Runner-up: NAME.', built once for both renderers."""
    rec = report.recommendation
    phrases = [Phrase("Recommendation:", strong=True)]
    if rec.format:
        phrases += [Phrase(" ship "), Phrase(rec.format, strong=True, data=True)]
        phrases += [Phrase(": "), Phrase(rec.why, data=True)] if rec.why else [Phrase(".")]
    else:
        phrases += [Phrase(" "), Phrase(rec.why, data=True) if rec.why else Phrase(NO_RECOMMENDATION)]
    if rec.runner_up:
        phrases += [Phrase(" Runner-up: "), Phrase(rec.runner_up, data=True), Phrase(".")]
    return phrases


def load_samples(path: Path) -> list[dict[str, Any]]:
    """Per-item records; a missing file means no items (e.g. every format failed)."""
    if not path.is_file():
        return []
    return read_jsonl(path, fix=schema.REWRITE)


def samples_path(run_dir: Path, report: RunReport) -> Path:
    return run_dir / report.samples


def missing_samples(report: RunReport, samples: list[dict[str, Any]]) -> list[str]:
    """'format/evalset: k of n items' for every format that ran and evalset whose items samples.jsonl lacks:
    renderings made from fewer rows would quietly drop scores and regressions."""
    counts: dict[tuple[str, str], set[str]] = {}
    for row in samples:
        counts.setdefault((str(row.get("format")), str(row.get("evalset"))), set()).add(str(row.get("id")))
    missing = []
    for name in ordered_format_names(report):
        if report.formats[name].status != "ok":
            continue
        for evalset, info in report.evalsets.items():
            found = len(counts.get((name, evalset), ()))
            if found < info.n:
                missing.append(f"{name}/{evalset}: {found} of {info.n} items")
    return missing


def ordered_format_names(report: RunReport) -> list[str]:
    """Baseline first, then the order the run was asked for, then anything else."""
    requested = [f for f in report.settings.formats if f in report.formats]
    order = requested + [f for f in report.formats if f not in requested]
    return sorted(order, key=lambda name: 0 if report.formats[name].role == "baseline" else 1)  # stable


def formats_in_order(report: RunReport) -> list[tuple[str, FormatResult]]:
    """(name, result) in ordered_format_names order."""
    return [(name, report.formats[name]) for name in ordered_format_names(report)]


def baseline_name(report: RunReport) -> str | None:
    return next((name for name, fmt in formats_in_order(report) if fmt.role == "baseline"), None)


def candidates(report: RunReport) -> list[tuple[str, FormatResult]]:
    return [(name, fmt) for name, fmt in formats_in_order(report) if fmt.role != "baseline"]


def gate_metrics(report: RunReport, evalset: str) -> list[str]:
    """The metrics the verdict gates on for this evalset (spec `gate`), else its first metric; [] for an evalset
    the report does not describe."""
    spec = report.evalsets.get(evalset)
    if spec is None:
        return []
    return spec.gate or spec.metrics[:1]


def iter_scores(fmt: FormatResult) -> Iterator[tuple[str, str, ScoreEntry]]:
    for evalset, metrics in fmt.scores.items():
        for metric, score in metrics.items():
            yield evalset, metric, score


BASELINE_SCORE_COLUMNS = ("Evalset", "Metric", "Score", "n")
SCORE_COLUMNS = ("Evalset", "Metric", "Score", "Delta [95% CI]", "Margin", "MDE", "p", "Method", "Status")


@dataclass(frozen=True)
class ScoreRow:
    """One row of a format's scores table, as plain text (the baseline's rows use evalset to n only)."""

    evalset: str
    metric: str
    gated: bool
    score: str
    n: str
    delta: str  # "-1.2 [-3.0, +0.5]"
    margin: str
    mde: str
    p_value: str
    method: str
    status: str  # "pass", "fail", "inconclusive"; "" when none


def score_rows(fmt: FormatResult) -> list[ScoreRow]:
    """Every score of one format, gated metrics first (they decide the verdict)."""
    scores = sorted(iter_scores(fmt), key=lambda s: 0 if s[2].gated else 1)
    return [ScoreRow(evalset, metric, score.gated, format_number(score.value), format_int(score.n), delta_interval(score),
                     format_number(score.margin), format_number(score.mde), format_number(score.p_value, 3), score.method or DASH,
                     score.status or "")
            for evalset, metric, score in scores]


def gated_scores(report: RunReport, fmt: FormatResult) -> list[GatedScore]:
    """Scores marked gated by decide; for the baseline (never marked) the spec's gate metrics."""
    marked = [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if s.gated]
    if marked:
        return marked
    return [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if m in gate_metrics(report, e)]


# --- plain-text figures shared by the Markdown and HTML renderers (they escape them) --------

LATENCY_COLUMNS = ("Run", "Requests", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "E2E p50", "E2E p95", "Throughput")


@dataclass(frozen=True)
class MemoryRow:
    label: str
    value: str
    is_peak: bool = False


def largest_batch_kv(memory: Memory) -> tuple[float | None, int | None]:
    """KV bytes held at the largest measured batch (measured; else predicted per token x tokens), and its tokens."""
    tokens = memory.largest_batch.tokens if memory.largest_batch is not None else None
    measured, per_token = memory.kv_bytes_largest_batch, memory.kv_bytes_per_token
    if is_number(measured):
        return measured, tokens
    return (per_token * tokens if is_number(per_token) and is_number(tokens) else None), tokens


def memory_rows(fmt: FormatResult) -> list[MemoryRow]:
    """Weights / KV / activations / peak, then the raw device figures that exist; [] if nothing was measured."""
    memory = fmt.memory
    if memory is None or not any(is_number(v) for v in (memory.peak_bytes, memory.weights_bytes,
                                                         memory.activation_peak_bytes)):
        return []
    kv_at_largest, tokens = largest_batch_kv(memory)
    rows = [
        MemoryRow("Weights", _with_measured(memory.weights_bytes, memory.weights_bytes_measured)),
        MemoryRow("KV cache per token", _with_measured(memory.kv_bytes_per_token, memory.kv_bytes_per_token_measured)),
    ]
    if is_number(kv_at_largest) and is_number(tokens):
        rows.append(MemoryRow(f"KV cache at largest batch ({format_int(tokens)} tokens)", format_bytes(kv_at_largest)))
    rows.append(MemoryRow("Activation peak", format_bytes(memory.activation_peak_bytes)))
    rows.append(MemoryRow("Peak", format_bytes(memory.peak_bytes), is_peak=True))
    for value, label in (
        (memory.rss_peak_bytes, "Peak RSS"),
        (memory.cuda_max_allocated_bytes, "torch.cuda max allocated"),
        (memory.cuda_max_reserved_bytes, "torch.cuda max reserved"),
        (memory.nvml_peak_used_bytes, "NVML peak used (nvidia-smi)"),
    ):
        if is_number(value):
            rows.append(MemoryRow(label, format_bytes(value)))
    return rows


def _with_measured(value: int | None, measured: int | None) -> str:
    text = format_bytes(value)
    if is_number(measured) and measured != value:
        text += f" (measured {format_bytes(measured)})"
    return text


def memory_caption(fmt: FormatResult) -> str:
    memory = fmt.memory
    device = memory.device if memory is not None else None
    figures = memory.figures if memory is not None else None
    return f"Memory on {device or 'unknown device'}" + (f"; peak is {figures}" if figures else "")


TIMELINE_LABELS = {"rss_bytes": "RSS", "nvml_used_bytes": "NVML used", "cuda_allocated_bytes": "allocated",
                   "cuda_reserved_bytes": "reserved"}


def memory_timeline(fmt: FormatResult) -> MemoryTimeline | None:
    """The format's memory.timeline when it has points (reports before it was kept have none)."""
    timeline = fmt.memory.timeline if fmt.memory is not None else None
    return timeline if timeline is not None and timeline.points else None


def timeline_peak_text(fmt: FormatResult) -> str:
    """'peak RSS 1.42 GiB at 12.3 s (generate:en_faq)', each sampled figure's peak '; '-joined on a GPU
    ('peak NVML used ... ; peak allocated ...'); '' without a timeline."""
    timeline = memory_timeline(fmt)
    if timeline is None:
        return ""
    parts = []
    for field in timeline.fields:
        peak = getattr(timeline.peaks, field)
        if peak is None:
            continue
        text = f"peak {TIMELINE_LABELS[field]} {format_bytes(peak.bytes)}"
        if is_number(peak.t_s):
            text += f" at {peak.t_s:.1f} s"
        if peak.stage:
            text += f" ({peak.stage})"
        parts.append(text)
    growth = timeline_growth(timeline)
    if growth:
        parts.append(growth)
    return "; ".join(parts)


GROWTH_MIN_BYTES = 256 * 2**20
GROWTH_MIN_SHARE = 0.5


def timeline_growth(timeline: MemoryTimeline) -> str:
    """A sentence when the headline figure kept rising through the evaluation: its lowest point in the last
    generate stage at least GROWTH_MIN_SHARE and GROWTH_MIN_BYTES above its lowest in the first. Lowest points, so
    one batch's transient peak does not count; '' otherwise (fewer than two generate stages included)."""
    field = timeline.fields[0]
    lows: dict[str, int] = {}
    for point in timeline.points:
        value = getattr(point, field)
        if point.stage and point.stage.startswith("generate:") and value is not None:
            lows[point.stage] = min(lows.get(point.stage, value), value)
    if len(lows) < 2:
        return ""
    (first, start), (last, end) = next(iter(lows.items())), list(lows.items())[-1]
    if end - start < max(GROWTH_MIN_BYTES, GROWTH_MIN_SHARE * start):
        return ""
    return (f"{TIMELINE_LABELS[field]} kept rising through the evaluation, its lowest {format_bytes(start)} in {first} "
            f"and {format_bytes(end)} in {last}: memory that grows with each new input shape (a kernel cache) or a "
            "leak, which a long-running server would show too")


def latency_run(fmt: FormatResult, which: Literal["batch_1", "batched"]) -> LatencyRun | None:
    """'batch_1' or 'batched'; None when the format did not measure it."""
    latency = fmt.latency
    run = None if latency is None else latency.batch_1 if which == "batch_1" else latency.batched
    if run is None:
        return None
    measured = any(is_number(v) for stats in (run.ttft_ms, run.tpot_ms, run.e2e_ms)
                   for v in (stats.p50, stats.p95, stats.max, stats.mean, stats.stdev, stats.count))
    return run if measured else None


def latency_rows(fmt: FormatResult) -> list[list[str]]:
    rows = []
    for which in ("batch_1", "batched"):
        run = latency_run(fmt, which)
        if run is None:
            continue
        label = "batch 1" if which == "batch_1" else f"batch {format_int(run.batch_size)}"
        cells = [label, format_int(run.requests or run.ttft_ms.count)]
        for stats in (run.ttft_ms, run.tpot_ms, run.e2e_ms):
            cells += [format_ms(stats.p50), p95_text(stats)]
        tput = run.throughput_tok_s
        cells.append(f"{format_number(tput)} tok/s" if is_number(tput) else DASH)
        rows.append(cells)
    return rows


def p95_text(stats: LatencyStats) -> str:
    """The p95, or 'max of N: X' when N requests are too few for a 95th percentile."""
    return tail_text(stats, "p95")


def tail_text(stats: LatencyStats, key: Literal["p95", "p99"]) -> str:
    """A tail percentile (`key`: 'p95', or 'p99' of served stats), or 'max of N: X' when N requests are too few
    for it."""
    from harness.measure.latency import P95_MIN_REQUESTS

    value, count = getattr(stats, key), stats.count
    if is_number(count) and 0 < count < P95_MIN_REQUESTS:
        if is_number(stats.max):
            return f"max of {format_int(count)}: {format_ms(stats.max)}"
        return f"{key} of only {format_int(count)}: {format_ms(value)}"  # a report from before "max" was kept
    return format_ms(value)


def latency_caption(fmt: FormatResult) -> str:
    latency = fmt.latency
    if latency is None:
        return "Latency on unknown device"
    extra = []
    if is_number(latency.threads):
        extra.append(f"{latency.threads} thread(s)")
    if is_number(latency.warmup_requests):
        extra.append(f"{latency.warmup_requests} warm-up requests")
    return f"Latency on {latency.device or 'unknown device'}" + (f" ({', '.join(extra)})" if extra else "")


# --- served by vLLM (report.formats[NAME].served; settings.backend "vllm") ---------------------------

SERVED_LATENCY_COLUMNS = ("Concurrency", "Requests", "TTFT p50", "TTFT p95", "TTFT p99", "ITL p50", "ITL p95",
                          "TPOT p50", "TPOT p95", "E2E p50", "E2E p95", "Output tok/s")
_IN_TRANSFORMERS = "Latency below is measured in transformers (eager, in-process)"


@dataclass(frozen=True)
class ServedView:
    """One format's served block as every renderer prints it (plain text; the renderer escapes it)."""

    name: str
    status: str  # ok, unsupported, failed
    reason: str  # why not ok; "" when ok or not given
    lines: list[tuple[str, str]]  # (label, text): vLLM, kernels, KV cache, saturation, scores
    latency: list[list[str]]  # SERVED_LATENCY_COLUMNS rows, lowest concurrency first
    command: str  # the exact `vllm serve` command; "" when quantgate did not start the server


def served_views(report: RunReport) -> list[ServedView]:
    """Every format with a `served` block, in report order; [] when none has one (no section then)."""
    return [served_view(name, fmt.served) for name, fmt in formats_in_order(report) if fmt.served is not None]


def served_view(name: str, served: Served) -> ServedView:
    lines = [("vLLM", served_engine_text(served))]
    if served.kernels or served.status == "ok":
        kernels = ", ".join(served.kernels) or "none named in vLLM's log"
        library = f" (kernel library {served.cpu_kernel_library})" if served.cpu_kernel_library else ""
        lines.append(("Kernels", kernels + library))
    if served.kv_cache is not None:
        lines.append(("KV cache", served_kv_text(served.kv_cache)))
    if served.saturation is not None:
        lines.append(("Saturation", saturation_text(served.saturation)))
    lines.append(("Scores", "from this server" if served.scored else "from transformers"))
    return ServedView(name, served.status, served.reason or "", lines, served_latency_rows(served),
                      served.command or "")


def served_engine_text(served: Served) -> str:
    """'vLLM 0.32.0 from project environment .venv-vllm; started in 41.2 s; peak RSS 1.20 GiB; log PATH'."""
    source, endpoint = served.source or DASH, served.endpoint
    parts = [f"{engine_title(served.engine)} {served.version or '(version unknown)'} from {source}"
             + (f" at {endpoint}" if endpoint and endpoint not in source else "")]
    if is_number(served.startup_s):
        parts.append(f"started in {format_number(served.startup_s)} s")
    if is_number(served.rss_peak_bytes):
        parts.append(f"peak RSS {format_bytes(served.rss_peak_bytes)}")
    if served.log:
        parts.append(f"log {served.log}")
    return "; ".join(parts)


def served_kv_text(kv: ServedKvCache) -> str:
    """'predicted 46,592 tokens vs vLLM's 46,592 tokens (error +0.0%), max concurrency 45.50 predicted vs 45.50
    vLLM at 1,024 tokens'; then the block size and vLLM's KV memory."""
    error = kv.relative_error
    text = (f"predicted {format_int(kv.predicted_tokens)} tokens vs vLLM's {format_int(kv.vllm_tokens)} "
            f"tokens (error {format_signed(100 * error) + '%' if is_number(error) else DASH}), max concurrency "
            f"{format_number(kv.predicted_max_concurrency, 2)} predicted vs "
            f"{format_number(kv.vllm_max_concurrency, 2)} vLLM at {format_int(kv.max_model_len)} tokens")
    extra = [f"{format_int(kv.block_size)}-token blocks"] if is_number(kv.block_size) else []
    if is_number(kv.vllm_kv_memory_gib):
        extra.append(f"vLLM's KV memory {format_number(kv.vllm_kv_memory_gib, 2)} GiB")
    return text + (f" ({', '.join(extra)})" if extra else "")


def saturation_text(saturation: Saturation) -> str:
    """'holds under load (REASON)' or 'does not hold under load: REASON'."""
    reason = saturation.reason
    if saturation.holds:
        return "holds under load" + (f" ({reason})" if reason else "")
    return f"does not hold under load: {reason or 'no reason recorded'}"


def served_latency_rows(served: Served) -> list[list[str]]:
    rows = []
    for run in sorted(served.latency.values(), key=lambda run: run.concurrency):
        cells = [format_int(run.concurrency), format_int(run.requests)]
        for stats, tails in ((run.ttft_ms, ("p95", "p99")), (run.itl_ms, ("p95",)), (run.tpot_ms, ("p95",)),
                             (run.e2e_ms, ("p95",))):
            cells += [format_ms(stats.p50)] + [tail_text(stats, tail) for tail in tails]
        tput = run.output_tokens_per_s
        cells.append(f"{format_number(tput)} tok/s" if is_number(tput) else DASH)
        rows.append(cells)
    return rows


def served_backend(report: RunReport) -> bool:
    """Whether the run's backend is a serving engine (its formats were scored through servers)."""
    return is_serving_engine(report.settings.backend) or any(fmt.served is not None
                                                              for fmt in report.formats.values())


def backend_note(report: RunReport) -> str:
    """The line under the verdict table when the scores came from a server; '' with the transformers backend."""
    if not served_backend(report):
        return ""
    local = [name for name, fmt in formats_in_order(report)
             if fmt.scores and not (fmt.served is not None and fmt.served.scored)]
    backend = report.settings.backend
    note = f"Scores come from the {serving_engine_title(backend)} server (backend {backend})"
    return note + (f"; {', '.join(local)}: from transformers (not served)." if local else ".")


def served_title(report: RunReport) -> str:
    """The served section's title: "Served by vLLM"."""
    return f"Served by {serving_engine_title(report.settings.backend)}"


def latency_origin(report: RunReport, fmt: FormatResult) -> str:
    """Where the latency table's figures come from, once any format was served; '' otherwise."""
    if all(f.served is None for f in report.formats.values()):
        return ""
    engine = serving_engine_title(report.settings.backend)
    if fmt.served is None:
        return f"{_IN_TRANSFORMERS}; this format was not served by {engine}."
    if fmt.served.latency:
        return f"{_IN_TRANSFORMERS}; served figures are in '{served_title(report)}'."
    return f"{_IN_TRANSFORMERS}; {engine} has no figures for this format (see '{served_title(report)}')."


def capacity_text(report: RunReport, fmt: FormatResult) -> str:
    """One sentence: target GPU, KV room, concurrent sequences, whether it fits; '' when not computed."""
    cap = fmt.vllm_capacity()
    if cap is None:
        return ""
    gib, util = cap.gpu_memory_gib, cap.gpu_memory_utilization
    named = report.settings.capacity.target_gpu if report.settings.capacity is not None else None
    target = with_article(f"{named} ({format_number(gib, 2)} GiB)" if named and is_number(gib) else
                          f"{format_number(gib, 0)} GiB GPU" if is_number(gib) else "target GPU")
    if is_number(util):
        target += f" at {util:.2f} utilization"
    note = f" {cap.note}" if cap.note else ""
    if cap.servable is False:
        return f"On {target}: vLLM cannot serve this format." + note
    text = (
        f"On {target}, max-model-len {format_int(cap.max_model_len)}: "
        f"KV room {format_bytes(cap.kv_room_bytes)}, "
        f"max concurrent sequences {format_int(cap.max_num_seqs)}, "
        f"max batched tokens {format_int(cap.max_num_batched_tokens)}; "
        + ("fits." if cap.fits else "does not fit.")
    )
    return text + note




@dataclass(frozen=True)
class ServingRow:
    """One engine's settings for a format, as every renderer prints them."""

    engine: str  # "vLLM 0.34", "SGLang", "TensorRT-LLM"
    summary: str  # one line: what it holds, or why it cannot serve / does not fit
    command: str  # the launch command; "" when none
    config_yaml: str  # TensorRT-LLM's --config file; "" when none


def serving_caption(report: RunReport, fmt: FormatResult) -> str:
    """'Serving on an L4 (22.49 GiB), weights measured' from the run's target and the plans' memory; 'Serving on
    4 x L4 (22.49 GiB each; tensor parallel 2 x pipeline parallel 2), ...' on several."""
    capacity = report.settings.capacity
    target = capacity.target_gpu if capacity is not None else None
    tp = (capacity.tensor_parallel_size or 1) if capacity is not None else 1
    pp = (capacity.pipeline_parallel_size or 1) if capacity is not None else 1
    plans = (fmt.serving or {}).values()
    memory = next((plan.memory for plan in plans if plan.memory is not None), None)
    size = memory.gpu_memory_bytes if memory is not None else None
    if tp * pp > 1:
        gpu = target or "GPUs"
        each = f"{format_bytes(size)} each; " if is_number(size) else ""
        where = f"{tp * pp} x {gpu} ({each}tensor parallel {tp} x pipeline parallel {pp})"
    else:
        where = f"{target} ({format_bytes(size)})" if target and is_number(size) else target or (
            f"a {format_bytes(size)} GPU" if is_number(size) else "the target GPU")
    if capacity is not None and capacity.target_source == "policy":
        where += ", the policy's serving target"
    sources = ([f"weights {memory.weights_source}", f"activations {memory.activation_source}"] if memory is not None
               else [])
    return f"Serving on {where}" + (f" ({', '.join(sources)})" if sources else "")


def serving_rows(fmt: FormatResult) -> list[ServingRow]:
    """vLLM, SGLang and TensorRT-LLM (in that order, then any other engine) for one format; [] without `serving`
    (reports written before it was kept)."""
    serving = fmt.serving
    if serving is None:
        return []
    order = [e for e in engine_names() if e in serving] + [e for e in serving if e not in engine_names()]
    rows = []
    for engine in order:
        plan = serving[engine]
        title = engine_title(engine) + (f" {plan.engine_version}" if plan.engine_version else "")
        if not plan.servable:
            summary = f"cannot serve it: {plan.reason}" if plan.reason else "cannot serve it"
        elif not plan.fits:
            summary = plan.reason or "does not fit"
        else:
            kv_bytes = plan.memory.kv_cache_bytes if plan.memory is not None else None
            shared = (f" ({format_int(plan.max_concurrency_shared_prefix)} when each shares the "
                      f"{format_int(plan.shared_prefix_tokens)}-token prefix all prompts open with)"
                      if plan.max_concurrency_shared_prefix is not None else "")
            summary = (f"KV cache {format_bytes(kv_bytes)} holds {format_int(plan.kv_tokens)} "
                       f"tokens: {format_int(plan.max_concurrency)} sequences of {format_int(plan.max_model_len)} tokens"
                       f"{shared}; the command runs {format_int(plan.max_num_seqs)} at once")
            summary += plugin_requirement(engine, plan.command)
        rows.append(ServingRow(title, summary, plan.command, plan.config_yaml))
    return rows


def plugin_requirement(engine: str, command: str) -> str:
    """'; needs the vllm-bnb-plugin package beside vLLM' where the command's --quantization comes from a plugin."""
    from harness.capacity.vllm import PLUGIN_METHODS

    words = command.split()
    method = words[words.index("--quantization") + 1] if "--quantization" in words[:-1] else None
    plugin = PLUGIN_METHODS.get(method) if engine == "vllm" else None
    return f"; needs the {plugin} package beside vLLM (its --quantization {method})" if plugin else ""


def vllm_command(fmt: FormatResult) -> str:
    capacity = fmt.vllm_capacity()
    flags = capacity.vllm_flags if capacity is not None else ""
    return f"vllm serve MODEL {' '.join(flags.split())}" if flags else ""


def manifest_summary(manifest: Manifest | None) -> str:
    """'engine: gptqmodel; versions: {...}; recipe: {...}' from an artifact manifest: the keys the file has, in
    its order (the manifest is open-ended: older quantgate versions wrote other keys)."""
    fields = manifest.model_dump(mode="json", exclude_unset=True) if manifest is not None else {}
    if not fields:
        return DASH
    bits = []
    for key, value in fields.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        bits.append(f"{key}: {shown}")
    return "; ".join(bits)


def provenance_items(report: RunReport) -> list[tuple[str, str]]:
    """(label, plain text) lines: model, device, settings, run, environment."""
    model, device, settings, tool = report.model, report.device, report.settings, report.tool
    model_bits = [
        f"source {model.source or DASH}",
        f"path {model.path or DASH}",
        f"fingerprint {model.fingerprint or DASH}",
    ]
    model_bits += [f"{key} {value}" for key, value in (("architecture", model.architecture), ("dtype", model.dtype))
                   if value]
    if is_number(model.num_parameters):
        model_bits.append(f"{format_int(model.num_parameters)} parameters")
    items = [("Model", ", ".join(model_bits))]
    if model.note:
        items.append(("Model note", model.note))
    dev = [device.kind, device.name, format_bytes(device.total_memory_bytes)]
    items.append(("Device", f"{' '.join(d for d in dev if d)}; threads {format_int(device.threads)}"))
    items.append(
        (
            "Settings",
            f"seed {settings.seed}, batch size {settings.batch_size}, "
            f"max items {settings.max_items or 'all'}, bootstrap resamples {settings.resamples}",
        )
    )
    items.append(
        (
            "Run",
            f"{tool.name} {tool.version}, created {report.created_at or DASH}, wall {format_number(report.wall_s)} s",
        )
    )
    return items + cluster_items(report)


def cluster_items(report: RunReport) -> list[tuple[str, str]]:
    """The cluster the formats ran on (--executor ray): its nodes, then each format's node and devices."""
    cluster = report.cluster
    if cluster is None:
        return []
    nodes = "; ".join(f"{n.node} {n.cpus:g} CPU {n.gpus:g} GPU {format_bytes(n.memory_bytes)}" for n in cluster.nodes)
    placed = "; ".join(f"{name} on {p.node}" + (f" GPUs {p.devices}" if p.devices else "")
                       for name, p in cluster.formats.items())
    return [("Cluster", f"{cluster.executor} {cluster.version}, {len(cluster.nodes)} node(s): {nodes}"),
            ("Placement", placed or DASH)]


def environment_items(report: RunReport) -> list[str]:
    return [f"{k} {v}" for k, v in report.environment.items()]


def evalset_rows(report: RunReport) -> list[list[str]]:
    """Evalset, task, language, items, gate, tokenizer, hash, spec."""
    return [[name, spec.task, spec.language or DASH, format_int(spec.n), ", ".join(spec.gate) or DASH,
             spec.tokenizer or DASH, spec.hash or DASH, spec.spec or DASH]
            for name, spec in report.evalsets.items()]


EVALSET_COLUMNS = ("Evalset", "Task", "Language", "Items", "Gate", "Tokenizer", "Hash", "Spec")
ARTIFACT_COLUMNS = ("Format", "Artifact", "Size", "Cached", "Manifest")
CALIBRATION_COLUMNS = ("Format", "Calibration source", "Texts", "Tokens (mean, min)", "Overlap with evaluated items")


def calibration_rows(report: RunReport) -> list[list[str]]:
    """Per format that calibrates: where its texts came from, how many and how long, and what they overlap."""
    return [[name, cal.source or DASH, format_int(cal.texts), f"{format_number(cal.tokens_mean, 0)}, {format_int(cal.tokens_min)}",
             overlap_text(cal.overlap)]
            for name, fmt in formats_in_order(report) if (cal := fmt.calibration) is not None]


def overlap_text(overlap: Overlap | None) -> str:
    if overlap is None:
        return DASH
    share = overlap.calibration_ngram_share
    text = (f"{format_int(overlap.items_overlapping)} of {format_int(overlap.items_total)} items share "
            f"{overlap.ngram}-grams; {format_number(100 * share, 2) if is_number(share) else DASH}% of the "
            "calibration n-grams occur in evaluated items")
    if overlap.items_overlapping and overlap.allowed:
        ids = overlap.overlapping
        more = f", ... {len(ids) - 10} more" if len(ids) > 10 else ""
        text += " (allowed by --allow-calibration-overlap: " + ", ".join(ids[:10]) + more + ")"
    return text


def artifact_rows(report: RunReport) -> list[list[str]]:
    return [[name, artifact.path or DASH, format_bytes(artifact.size_bytes), "yes" if artifact.cached else "no",
             manifest_summary(artifact.manifest)]
            for name, fmt in formats_in_order(report) if (artifact := fmt.artifact) is not None]
