"""What every renderer reads out of report.json and samples.jsonl, in one place.

report.json is produced by the pipeline (harness/report/schema.py is the contract); the
renderers only read it. Fields a failed format could not measure are null, so every
accessor here tolerates missing data instead of raising.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.errors import UserError
from harness.report import schema
from harness.report.schema import RunReport
from harness.report.units import (DASH, dig, fmt_bytes, fmt_delta_interval, fmt_int, fmt_ms, fmt_num, fmt_signed,
                                  is_number)

VERDICTS = ("GO", "NO-GO", "INCONCLUSIVE", "BASELINE")

# "How to read a verdict": (term, explanation), rendered by both Markdown and HTML
LEGEND = (
    ("GO", "means every gated metric's 95% interval of (candidate − baseline) lies above −margin on enough "
     "evidence (at least min_items items, and a set that could detect a drop of the margin), every floor holds "
     "and every memory/latency budget holds."),
    ("NO-GO", "means an interval lies wholly below −margin, a floor or budget fails, or the format did not run "
     "(its error is shown)."),
    ("INCONCLUSIVE", "means the data cannot tell: an interval straddles −margin, the set is too small, or the "
     "metric cannot tell formats apart. Add items; MDE is the smallest drop this evalset could detect."),
    ("Deltas", "are paired item by item on a 0–100 scale: −1.2 [−3.0, +0.5] is the mean change and its 95% "
     "interval; ✓ pass, ✗ fail, ? inconclusive."),
    ("Memory", "is the peak of each format's own process on the device named in its section; BASELINE is the "
     "reference every candidate is compared with."),
)


@dataclass(frozen=True)
class GatedScore:
    evalset: str
    metric: str
    score: dict[str, Any]  # the scores.<evalset>.<metric> entry as written by decide


VERDICT_COLUMNS = ("Format", "Verdict", "Peak memory", "Weights", "TPOT p50", "Gated metrics: delta [95% CI]",
                   "vLLM flags")


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


def verdict_rows(report: dict[str, Any]) -> list[VerdictRow]:
    return [_verdict_row(report, index, name, fmt) for index, (name, fmt) in enumerate(formats_in_order(report))]


def _verdict_row(report: dict[str, Any], index: int, name: str, fmt: dict[str, Any]) -> VerdictRow:
    memory = fmt.get("memory") or {}
    peak = fmt_bytes(memory.get("peak_bytes"))
    if peak != DASH and memory.get("device"):
        peak += f" ({memory['device']})"
    tpot = dig(fmt, "latency", "batch_1", "tpot_ms", "p50") or dig(fmt, "latency", "tpot_ms", "p50")
    baseline = fmt.get("role") == "baseline"
    gated = [GatedFigure(f"{gs.evalset}/{gs.metric}", fmt_num(gs.score.get("value")) if baseline
                         else fmt_delta_interval(gs.score), "" if baseline else str(gs.score.get("status") or ""))
             for gs in gated_scores(report, fmt)]
    error = (fmt.get("error") or "no error recorded") if fmt.get("status") == "failed" else None
    return VerdictRow(index, name, baseline, verdict_of(fmt), peak, fmt_bytes(memory.get("weights_bytes")), fmt_ms(tpot),
                      error, gated, str(dig(fmt, "capacity", "vllm_flags") or ""))


@dataclass(frozen=True)
class Phrase:
    """A piece of a sentence the renderers print: `data` (a format name, the producer's words) is escaped by the
    renderer, template text is not; `strong` pieces are bold."""

    text: str
    strong: bool = False
    data: bool = False


NO_RECOMMENDATION = "no candidate format is GO; keep serving the baseline"


def recommendation_sentence(report: dict[str, Any]) -> list[Phrase]:
    """'Recommendation: ship FORMAT: WHY. Runner-up: NAME.', built once for both renderers."""
    rec = report.get("recommendation") or {}
    choice, why, runner_up = rec.get("format"), str(rec.get("why") or ""), rec.get("runner_up")
    phrases = [Phrase("Recommendation:", strong=True)]
    if choice:
        phrases += [Phrase(" ship "), Phrase(str(choice), strong=True, data=True)]
        phrases += [Phrase(": "), Phrase(why, data=True)] if why else [Phrase(".")]
    else:
        phrases += [Phrase(" "), Phrase(why, data=True) if why else Phrase(NO_RECOMMENDATION)]
    if runner_up:
        phrases += [Phrase(" Runner-up: "), Phrase(str(runner_up), data=True), Phrase(".")]
    return phrases


def load_samples(path: Path) -> list[dict[str, Any]]:
    """Per-item records; a missing file means no items (e.g. every format failed)."""
    if not path.is_file():
        return []
    samples: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{line_no}: not valid JSON ({exc.msg}); re-run `quantgate run` to rewrite it") from exc
            if not isinstance(record, dict):
                raise UserError(f"{path}:{line_no}: expected one JSON object per line")
            samples.append(record)
    return samples


def samples_path(run_dir: Path, report: dict[str, Any]) -> Path:
    name = report.get("samples") or "samples.jsonl"
    return run_dir / str(name)


def formats_in_order(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Baseline first, then the order the run was asked for, then anything else."""
    formats: dict[str, Any] = report.get("formats") or {}
    requested = [f for f in (report.get("settings") or {}).get("formats") or [] if f in formats]
    order = requested + [f for f in formats if f not in requested]
    order.sort(key=lambda name: 0 if (formats[name] or {}).get("role") == "baseline" else 1)  # stable
    return [(name, formats[name]) for name in order]


def ordered_format_names(report: RunReport) -> list[str]:
    """formats_in_order for a parsed report: baseline first, then the order the run was asked for."""
    requested = [f for f in report.settings.formats if f in report.formats]
    order = requested + [f for f in report.formats if f not in requested]
    return sorted(order, key=lambda name: 0 if report.formats[name].role == "baseline" else 1)  # stable


def baseline_name(report: dict[str, Any]) -> str | None:
    for name, fmt in formats_in_order(report):
        if fmt.get("role") == "baseline":
            return name
    return None


def candidates(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, fmt) for name, fmt in formats_in_order(report) if fmt.get("role") != "baseline"]


def gate_metrics(report: dict[str, Any], evalset: str) -> list[str]:
    """The metrics the verdict gates on for this evalset (spec `gate`), else its first metric."""
    spec = (report.get("evalsets") or {}).get(evalset) or {}
    gate = [m for m in spec.get("gate") or [] if isinstance(m, str)]
    if gate:
        return gate
    metrics = [m for m in spec.get("metrics") or [] if isinstance(m, str)]
    return metrics[:1]


def iter_scores(fmt: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for evalset, metrics in (fmt.get("scores") or {}).items():
        if not isinstance(metrics, dict):
            continue
        for metric, score in metrics.items():
            if isinstance(score, dict):
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


def score_rows(fmt: dict[str, Any]) -> list[ScoreRow]:
    """Every score of one format, gated metrics first (they decide the verdict)."""
    scores = sorted(iter_scores(fmt), key=lambda s: 0 if s[2].get("gated") else 1)
    return [ScoreRow(evalset, metric, bool(score.get("gated")), fmt_num(score.get("value")), fmt_int(score.get("n")),
                     fmt_delta_interval(score), fmt_num(score.get("margin")), fmt_num(score.get("mde")),
                     fmt_num(score.get("p_value"), 3), str(score.get("method") or DASH), str(score.get("status") or ""))
            for evalset, metric, score in scores]


def gated_scores(report: dict[str, Any], fmt: dict[str, Any]) -> list[GatedScore]:
    """Scores marked gated by decide; for the baseline (never marked) the spec's gate metrics."""
    marked = [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if s.get("gated")]
    if marked:
        return marked
    return [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if m in gate_metrics(report, e)]


def verdict_of(fmt: dict[str, Any]) -> str:
    verdict = fmt.get("verdict")
    return verdict if verdict in VERDICTS else "NO-GO" if fmt.get("status") == "failed" else str(verdict or "?")


# --- plain-text figures shared by the Markdown and HTML renderers (they escape them) --------

LATENCY_COLUMNS = ("Run", "Requests", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "E2E p50", "E2E p95", "Throughput")


@dataclass(frozen=True)
class MemoryRow:
    label: str
    value: str
    is_peak: bool = False


def largest_batch_kv(memory: dict[str, Any]) -> tuple[float | None, int | None]:
    """KV bytes held at the largest measured batch (measured; else predicted per token x tokens), and its tokens."""
    tokens = (memory.get("largest_batch") or {}).get("tokens")
    measured, per_token = memory.get("kv_bytes_largest_batch"), memory.get("kv_bytes_per_token")
    if is_number(measured):
        return measured, tokens
    return (per_token * tokens if is_number(per_token) and is_number(tokens) else None), tokens


def memory_rows(fmt: dict[str, Any]) -> list[MemoryRow]:
    """Weights / KV / activations / peak, then the raw device figures that exist; [] if nothing was measured."""
    memory = fmt.get("memory") or {}
    if not any(is_number(memory.get(k)) for k in ("peak_bytes", "weights_bytes", "activation_peak_bytes")):
        return []
    kv_at_largest, tokens = largest_batch_kv(memory)
    rows = [
        MemoryRow("Weights", _with_measured(memory, "weights_bytes")),
        MemoryRow("KV cache per token", _with_measured(memory, "kv_bytes_per_token")),
    ]
    if is_number(kv_at_largest) and is_number(tokens):
        rows.append(MemoryRow(f"KV cache at largest batch ({fmt_int(tokens)} tokens)", fmt_bytes(kv_at_largest)))
    rows.append(MemoryRow("Activation peak", fmt_bytes(memory.get("activation_peak_bytes"))))
    rows.append(MemoryRow("Peak", fmt_bytes(memory.get("peak_bytes")), is_peak=True))
    for key, label in (
        ("rss_peak_bytes", "Peak RSS"),
        ("cuda_max_allocated_bytes", "torch.cuda max allocated"),
        ("cuda_max_reserved_bytes", "torch.cuda max reserved"),
        ("nvml_peak_used_bytes", "NVML peak used (nvidia-smi)"),
    ):
        if is_number(memory.get(key)):
            rows.append(MemoryRow(label, fmt_bytes(memory[key])))
    return rows


def _with_measured(memory: dict[str, Any], key: str) -> str:
    value = fmt_bytes(memory.get(key))
    measured = memory.get(f"{key}_measured")
    if is_number(measured) and measured != memory.get(key):
        value += f" (measured {fmt_bytes(measured)})"
    return value


def memory_caption(fmt: dict[str, Any]) -> str:
    memory = fmt.get("memory") or {}
    caption = f"Memory on {memory.get('device') or 'unknown device'}"
    return caption + (f"; peak is {memory['figures']}" if memory.get("figures") else "")


TIMELINE_LABELS = {"rss_bytes": "RSS", "nvml_used_bytes": "NVML used", "cuda_allocated_bytes": "allocated",
                   "cuda_reserved_bytes": "reserved"}


def memory_timeline(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """The format's memory.timeline when it has points (reports before it was kept have none)."""
    timeline = (fmt.get("memory") or {}).get("timeline")
    return timeline if isinstance(timeline, dict) and timeline.get("points") else None


def timeline_peak_text(fmt: dict[str, Any]) -> str:
    """'peak RSS 1.42 GiB at 12.3 s (generate:en_faq)', each sampled figure's peak '; '-joined on a GPU
    ('peak NVML used ... ; peak allocated ...'); '' without a timeline."""
    timeline = memory_timeline(fmt)
    if timeline is None:
        return ""
    peaks = timeline.get("peaks") or {}
    parts = []
    for field in timeline.get("fields") or list(peaks):
        peak = peaks.get(field)
        if not isinstance(peak, dict) or not is_number(peak.get("bytes")):
            continue
        text = f"peak {TIMELINE_LABELS.get(field, field)} {fmt_bytes(peak['bytes'])}"
        if is_number(peak.get("t_s")):
            text += f" at {peak['t_s']:.1f} s"
        if peak.get("stage"):
            text += f" ({peak['stage']})"
        parts.append(text)
    return "; ".join(parts)


def latency_run(fmt: dict[str, Any], which: str) -> dict[str, Any] | None:
    """'batch_1' (falling back to the top-level copies) or 'batched'."""
    latency = fmt.get("latency") or {}
    if which == "batched":
        run = latency.get("batched")
    else:
        run = latency.get("batch_1") or {k: latency[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms") if latency.get(k)}
    if not isinstance(run, dict):
        return None
    # a format that never ran still carries {"p50": null, ...} placeholders
    measured = any(is_number(v) for stats in run.values() if isinstance(stats, dict) for v in stats.values())
    return run if measured else None


def latency_rows(fmt: dict[str, Any]) -> list[list[str]]:
    rows = []
    for which in ("batch_1", "batched"):
        run = latency_run(fmt, which)
        if not run:
            continue
        label = "batch 1" if which == "batch_1" else f"batch {fmt_int(run.get('batch_size'))}"
        cells = [label, fmt_int(run.get("requests") or (run.get("ttft_ms") or {}).get("count"))]
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            stats = run.get(key) or {}
            cells += [fmt_ms(stats.get("p50")), p95_text(stats)]
        tput = run.get("throughput_tok_s")
        cells.append(f"{fmt_num(tput)} tok/s" if is_number(tput) else DASH)
        rows.append(cells)
    return rows


def p95_text(stats: dict[str, Any]) -> str:
    """The p95, or 'max of N: X' when N requests are too few for a 95th percentile."""
    return tail_text(stats, "p95")


def tail_text(stats: dict[str, Any], key: str) -> str:
    """A tail percentile (`key`: 'p95', 'p99'), or 'max of N: X' when N requests are too few for it."""
    from harness.measure.latency import P95_MIN_REQUESTS

    count = stats.get("count")
    if is_number(count) and 0 < count < P95_MIN_REQUESTS:
        if is_number(stats.get("max")):
            return f"max of {fmt_int(count)}: {fmt_ms(stats['max'])}"
        return f"{key} of only {fmt_int(count)}: {fmt_ms(stats.get(key))}"  # a report from before "max" was kept
    return fmt_ms(stats.get(key))


def latency_caption(fmt: dict[str, Any]) -> str:
    latency = fmt.get("latency") or {}
    extra = []
    if is_number(latency.get("threads")):
        extra.append(f"{latency['threads']} thread(s)")
    if is_number(latency.get("warmup_requests")):
        extra.append(f"{latency['warmup_requests']} warm-up requests")
    return f"Latency on {latency.get('device') or 'unknown device'}" + (f" ({', '.join(extra)})" if extra else "")


# --- served by vLLM (report["formats"][NAME]["served"]; settings.backend "vllm") ---------------------

SERVED_TITLE = "Served by vLLM"
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


def backend_of(report: dict[str, Any]) -> str:
    """settings.backend; reports before it was kept ran transformers."""
    return str(dig(report, "settings", "backend") or "transformers")


def served_of(fmt: dict[str, Any]) -> dict[str, Any] | None:
    served = fmt.get("served")
    return served if isinstance(served, dict) else None


def served_views(report: dict[str, Any]) -> list[ServedView]:
    """Every format with a `served` block, in report order; [] when none has one (no section then)."""
    return [served_view(name, served) for name, fmt in formats_in_order(report)
            if (served := served_of(fmt)) is not None]


def served_view(name: str, served: dict[str, Any]) -> ServedView:
    lines = [("vLLM", served_engine_text(served))]
    kernels = [str(k) for k in served.get("kernels") or []]
    if kernels or served.get("status") == "ok":
        lines.append(("Kernels", ", ".join(kernels) or "none named in vLLM's log"))
    if isinstance(served.get("kv_cache"), dict):
        lines.append(("KV cache", served_kv_text(served["kv_cache"])))
    if isinstance(served.get("saturation"), dict):
        lines.append(("Saturation", saturation_text(served["saturation"])))
    lines.append(("Scores", "from this server" if served.get("scored") is True else "from transformers"))
    return ServedView(name, str(served.get("status") or "?"), str(served.get("reason") or ""), lines,
                      served_latency_rows(served), str(served.get("command") or ""))


def served_engine_text(served: dict[str, Any]) -> str:
    """'vLLM 0.32.0 from project environment .venv-vllm; started in 41.2 s; peak RSS 1.20 GiB; log PATH'."""
    version, source, endpoint = served.get("version"), str(served.get("source") or DASH), served.get("endpoint")
    parts = [f"{ENGINE_TITLES.get(str(served.get('engine')), 'vLLM')} {version or '(version unknown)'} from {source}"
             + (f" at {endpoint}" if endpoint and str(endpoint) not in source else "")]
    if is_number(served.get("startup_s")):
        parts.append(f"started in {fmt_num(served['startup_s'])} s")
    if is_number(served.get("rss_peak_bytes")):
        parts.append(f"peak RSS {fmt_bytes(served['rss_peak_bytes'])}")
    if served.get("log"):
        parts.append(f"log {served['log']}")
    return "; ".join(parts)


def served_kv_text(kv: dict[str, Any]) -> str:
    """'predicted 46,592 tokens vs vLLM's 46,592 tokens (error +0.0%), max concurrency 45.50 predicted vs 45.50
    vLLM at 1,024 tokens'; then the block size and vLLM's KV memory."""
    error = kv.get("relative_error")
    text = (f"predicted {fmt_int(kv.get('predicted_tokens'))} tokens vs vLLM's {fmt_int(kv.get('vllm_tokens'))} "
            f"tokens (error {fmt_signed(100 * error) + '%' if is_number(error) else DASH}), max concurrency "
            f"{fmt_num(kv.get('predicted_max_concurrency'), 2)} predicted vs "
            f"{fmt_num(kv.get('vllm_max_concurrency'), 2)} vLLM at {fmt_int(kv.get('max_model_len'))} tokens")
    extra = [f"{fmt_int(kv['block_size'])}-token blocks"] if is_number(kv.get("block_size")) else []
    if is_number(kv.get("vllm_kv_memory_gib")):
        extra.append(f"vLLM's KV memory {fmt_num(kv['vllm_kv_memory_gib'], 2)} GiB")
    return text + (f" ({', '.join(extra)})" if extra else "")


def saturation_text(saturation: dict[str, Any]) -> str:
    """'holds under load (REASON)' or 'does not hold under load: REASON'."""
    reason = str(saturation.get("reason") or "")
    if saturation.get("holds") is True:
        return "holds under load" + (f" ({reason})" if reason else "")
    return f"does not hold under load: {reason or 'no reason recorded'}"


def served_latency_rows(served: dict[str, Any]) -> list[list[str]]:
    runs = [run for run in (served.get("latency") or {}).values() if isinstance(run, dict)]
    runs.sort(key=lambda run: run["concurrency"] if is_number(run.get("concurrency")) else 0)
    rows = []
    for run in runs:
        cells = [fmt_int(run.get("concurrency")), fmt_int(run.get("requests"))]
        for key, tails in (("ttft_ms", ("p95", "p99")), ("itl_ms", ("p95",)), ("tpot_ms", ("p95",)),
                           ("e2e_ms", ("p95",))):
            stats = run.get(key) if isinstance(run.get(key), dict) else {}
            cells += [fmt_ms(stats.get("p50"))] + [tail_text(stats, tail) for tail in tails]
        tput = run.get("output_tokens_per_s")
        cells.append(f"{fmt_num(tput)} tok/s" if is_number(tput) else DASH)
        rows.append(cells)
    return rows


def backend_note(report: dict[str, Any]) -> str:
    """The line under the verdict table when the scores came from vLLM; '' with the transformers backend."""
    if backend_of(report) != "vllm":
        return ""
    local = [name for name, fmt in formats_in_order(report)
             if fmt.get("scores") and (served_of(fmt) or {}).get("scored") is not True]
    note = "Scores come from the vLLM server (backend vllm)"
    return note + (f"; {', '.join(local)}: from transformers (not served)." if local else ".")


def latency_origin(report: dict[str, Any], fmt: dict[str, Any]) -> str:
    """Where the latency table's figures come from, once any format was served; '' otherwise."""
    if not any(served_of(f) is not None for _, f in formats_in_order(report)):
        return ""
    served = served_of(fmt)
    if served is None:
        return f"{_IN_TRANSFORMERS}; this format was not served by vLLM."
    if served.get("latency"):
        return f"{_IN_TRANSFORMERS}; served figures are in '{SERVED_TITLE}'."
    return f"{_IN_TRANSFORMERS}; vLLM has no figures for this format (see '{SERVED_TITLE}')."


def capacity_text(fmt: dict[str, Any]) -> str:
    """One sentence: target GPU, KV room, concurrent sequences, whether it fits; '' when not computed."""
    cap = fmt.get("capacity") or {}
    if not cap:
        return ""
    gib, util = cap.get("gpu_memory_gib"), cap.get("gpu_memory_utilization")
    target = f"{fmt_num(gib, 0)} GiB GPU" if is_number(gib) else "target GPU"
    if is_number(util):
        target += f" at {util:.2f} utilization"
    fits = cap.get("fits")
    if cap.get("servable") is False:
        return f"On a {target}: vLLM cannot serve this format." + (f" {cap['note']}" if cap.get("note") else "")
    text = (
        f"On a {target}, max-model-len {fmt_int(cap.get('max_model_len'))}: "
        f"KV room {fmt_bytes(cap.get('kv_room_bytes'))}, "
        f"max concurrent sequences {fmt_int(cap.get('max_num_seqs'))}, "
        f"max batched tokens {fmt_int(cap.get('max_num_batched_tokens'))}; "
        + ("fits." if fits is True else "does not fit." if fits is False else "fit unknown.")
    )
    return text + (f" {cap['note']}" if cap.get("note") else "")


ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


@dataclass(frozen=True)
class ServingRow:
    """One engine's settings for a format, as every renderer prints them."""

    engine: str  # "vLLM 0.34", "SGLang", "TensorRT-LLM"
    summary: str  # one line: what it holds, or why it cannot serve / does not fit
    command: str  # the launch command; "" when none
    config_yaml: str  # TensorRT-LLM's --config file; "" when none


def serving_caption(report: dict[str, Any], fmt: dict[str, Any]) -> str:
    """'Serving on an L4 (22.49 GiB), weights measured' from the run's target and the plans' memory."""
    target = dig(report, "settings", "capacity", "target_gpu")
    plans = [p for p in (fmt.get("serving") or {}).values() if isinstance(p, dict)]
    memory = next((p["memory"] for p in plans if isinstance(p.get("memory"), dict)), {})
    size = memory.get("gpu_memory_bytes")
    where = f"{target} ({fmt_bytes(size)})" if target and is_number(size) else target or (
        f"a {fmt_bytes(size)} GPU" if is_number(size) else "the target GPU")
    sources = [f"weights {memory[k]}" if k == "weights_source" else f"activations {memory[k]}"
               for k in ("weights_source", "activation_source") if isinstance(memory.get(k), str)]
    return f"Serving on {where}" + (f" ({', '.join(sources)})" if sources else "")


def serving_rows(fmt: dict[str, Any]) -> list[ServingRow]:
    """vLLM, SGLang and TensorRT-LLM (in that order, then any other engine) for one format; [] without `serving`
    (reports written before it was kept)."""
    serving = fmt.get("serving")
    if not isinstance(serving, dict):
        return []
    order = [e for e in ENGINE_TITLES if e in serving] + [e for e in serving if e not in ENGINE_TITLES]
    rows = []
    for engine in order:
        plan = serving[engine]
        if not isinstance(plan, dict):
            continue
        version = plan.get("engine_version")
        title = ENGINE_TITLES.get(engine, engine) + (f" {version}" if version else "")
        reason = str(plan.get("reason") or "")
        if plan.get("servable") is False:
            summary = f"cannot serve it: {reason}" if reason else "cannot serve it"
        elif plan.get("fits") is False:
            summary = reason or "does not fit"
        else:
            memory = plan.get("memory") or {}
            held, seqs = plan.get("max_concurrency"), plan.get("max_num_seqs")
            summary = (f"KV cache {fmt_bytes(memory.get('kv_cache_bytes'))} holds {fmt_int(plan.get('kv_tokens'))} "
                       f"tokens: {fmt_int(held)} sequences of {fmt_int(plan.get('max_model_len'))} tokens; the "
                       f"command runs {fmt_int(seqs)} at once")
        rows.append(ServingRow(title, summary, str(plan.get("command") or ""), str(plan.get("config_yaml") or "")))
    return rows


def vllm_command(fmt: dict[str, Any]) -> str:
    flags = (fmt.get("capacity") or {}).get("vllm_flags")
    return f"vllm serve MODEL {' '.join(str(flags).split())}" if flags else ""


def manifest_summary(manifest: Any) -> str:
    """'engine: gptqmodel; versions: {...}; recipe: {...}' from an artifact manifest."""
    if not isinstance(manifest, dict) or not manifest:
        return DASH
    bits = []
    for key, value in manifest.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        bits.append(f"{key}: {shown}")
    return "; ".join(bits)


def provenance_items(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, plain text) lines: model, device, settings, run, environment."""
    model = report.get("model") or {}
    device = report.get("device") or {}
    settings = report.get("settings") or {}
    tool = report.get("tool") or {}
    model_bits = [
        f"source {model.get('source') or DASH}",
        f"path {model.get('path') or DASH}",
        f"fingerprint {model.get('fingerprint') or DASH}",
    ]
    model_bits += [f"{key} {model[key]}" for key in ("architecture", "dtype") if model.get(key)]
    if is_number(model.get("num_parameters")):
        model_bits.append(f"{fmt_int(model['num_parameters'])} parameters")
    items = [("Model", ", ".join(model_bits))]
    if model.get("note"):
        items.append(("Model note", str(model["note"])))
    dev = [str(device.get("kind") or DASH), str(device.get("name") or "")]
    if is_number(device.get("total_memory_bytes")):
        dev.append(fmt_bytes(device["total_memory_bytes"]))
    items.append(("Device", f"{' '.join(d for d in dev if d)}; threads {fmt_int(device.get('threads'))}"))
    items.append(
        (
            "Settings",
            f"seed {settings.get('seed', DASH)}, batch size {settings.get('batch_size', DASH)}, "
            f"max items {settings.get('max_items') or 'all'}, bootstrap resamples {settings.get('resamples', DASH)}",
        )
    )
    items.append(
        (
            "Run",
            f"{tool.get('name') or 'quantgate'} {tool.get('version') or ''}, "
            f"created {report.get('created_at') or DASH}, wall {fmt_num(report.get('wall_s'))} s",
        )
    )
    return items


def environment_items(report: dict[str, Any]) -> list[str]:
    return [f"{k} {v}" for k, v in (report.get("environment") or {}).items()]


def evalset_rows(report: dict[str, Any]) -> list[list[str]]:
    """Evalset, task, language, items, gate, tokenizer, hash, spec."""
    rows = []
    for name, spec in (report.get("evalsets") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        rows.append(
            [
                str(name),
                str(spec.get("task") or DASH),
                str(spec.get("language") or DASH),
                fmt_int(spec.get("n")),
                ", ".join(str(g) for g in spec.get("gate") or []) or DASH,
                str(spec.get("tokenizer") or DASH),
                str(spec.get("hash") or DASH),
                str(spec.get("spec") or DASH),
            ]
        )
    return rows


EVALSET_COLUMNS = ("Evalset", "Task", "Language", "Items", "Gate", "Tokenizer", "Hash", "Spec")
ARTIFACT_COLUMNS = ("Format", "Artifact", "Size", "Cached", "Manifest")
CALIBRATION_COLUMNS = ("Format", "Calibration source", "Texts", "Tokens (mean, min)", "Overlap with evaluated items")


def calibration_rows(report: dict[str, Any]) -> list[list[str]]:
    """Per format that calibrates: where its texts came from, how many and how long, and what they overlap."""
    rows = []
    for name, fmt in formats_in_order(report):
        cal = fmt.get("calibration")
        if not isinstance(cal, dict):
            continue
        rows.append([name, str(cal.get("source") or DASH), fmt_int(cal.get("texts")),
                     f"{fmt_num(cal.get('tokens_mean'), 0)}, {fmt_int(cal.get('tokens_min'))}",
                     overlap_text(cal.get("overlap"))])
    return rows


def overlap_text(overlap: Any) -> str:
    if not isinstance(overlap, dict):
        return DASH
    share = overlap.get("calibration_ngram_share")
    text = (f"{fmt_int(overlap.get('items_overlapping'))} of {fmt_int(overlap.get('items_total'))} items share "
            f"{overlap.get('ngram', 13)}-grams; {fmt_num(100 * share, 2) if is_number(share) else DASH}% of the "
            "calibration n-grams occur in evaluated items")
    if overlap.get("items_overlapping") and overlap.get("allowed"):
        ids = list(overlap.get("overlapping") or [])
        more = f", ... {len(ids) - 10} more" if len(ids) > 10 else ""
        text += " (allowed by --allow-calibration-overlap: " + ", ".join(ids[:10]) + more + ")"
    return text


def artifact_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, fmt in formats_in_order(report):
        artifact = fmt.get("artifact") or {}
        if not artifact:
            continue
        cached = artifact.get("cached")
        rows.append(
            [
                name,
                str(artifact.get("path") or DASH),
                fmt_bytes(artifact.get("size_bytes")),
                "yes" if cached is True else "no" if cached is False else DASH,
                manifest_summary(artifact.get("manifest")),
            ]
        )
    return rows


def load_report(run_dir: Path) -> RunReport:
    """RUN_DIR/report.json (or that file itself), parsed; every problem a one-line UserError."""
    run_dir = Path(run_dir)
    path = run_dir if run_dir.name == "report.json" and run_dir.is_file() else run_dir / "report.json"
    if not path.parent.is_dir():
        raise UserError(f"{path.parent}: no such directory; pass the output directory of `quantgate run`")
    if not path.is_file():
        raise UserError(
            f"{path}: not found; pass the output directory of `quantgate run` (it holds report.json and samples.jsonl)"
        )
    return schema.load_report(path)
