"""report.md: the verdicts, paste-ready for a change review.

Order: verdict table, recommendation, how to read a verdict, per format (reasons,
scores, memory, latency, capacity, worst regressions), provenance. The whole file
stays under 64 KiB (change-review comments are capped around there): when the input
is large, excerpts shrink, then regression rows go, then long lists are cut; the
verdict table is always kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.report.regressions import RegressionGroup, worst_regressions
from harness.report.units import (
    DASH,
    clip,
    dig,
    excerpt,
    fmt_bytes,
    fmt_delta_interval,
    fmt_int,
    fmt_ms,
    fmt_num,
    fmt_signed,
    is_number,
)
from harness.report.view import formats_in_order, gated_scores, iter_scores, verdict_of

MAX_BYTES = 64 * 1024
_TRUNCATED_NOTE = "\n\n_Report truncated to stay under 64 KiB; report.json and report.html hold everything._\n"

LEGEND = (
    "- **GO**: for every gated metric the 95% interval of (candidate − baseline) lies above −margin, "
    "every floor holds and every memory/latency budget holds.",
    "- **NO-GO**: an interval lies wholly below −margin, a floor or budget fails, or the format did not run "
    "(its error is shown).",
    "- **INCONCLUSIVE**: an interval straddles −margin; the data cannot tell. Add items: MDE is the smallest drop "
    "this evalset could detect.",
    "- Deltas are paired item by item on a 0–100 scale: `−1.2 [−3.0, +0.5]` is the mean change and its 95% "
    "interval; ✓ pass, ✗ fail, ? inconclusive.",
    "- Memory is the peak of each format's own process on the device named in its section; **BASELINE** is the "
    "reference every candidate is compared with.",
)

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


def md_code(text: Any) -> str:
    """Our own text (flags, hashes) as inline code; pipes still escaped for tables."""
    body = str(text).replace("`", "'").replace("|", "\\|")
    return f"`{' '.join(body.split())}`" if body else DASH


def render_markdown(report: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    groups = worst_regressions(report, samples, limit=max(layout.rows_per_group for layout in _LAYOUTS))
    text = ""
    for layout in _LAYOUTS:
        text = _render(report, groups, layout)
        if len(text.encode("utf-8")) < MAX_BYTES:
            return text
    return _hard_cut(text)


def _hard_cut(text: str) -> str:
    """Last resort for absurd inputs: keep the head (verdict table first) and cut at a line end."""
    budget = MAX_BYTES - len(_TRUNCATED_NOTE.encode("utf-8")) - 16
    head = text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")
    return head[: head.rfind("\n") + 1 or len(head)].rstrip() + _TRUNCATED_NOTE


def _render(report: dict[str, Any], groups: list[RegressionGroup], layout: _Layout) -> str:
    parts = [
        _title(report),
        _verdict_table(report, layout),
        _recommendation(report),
        "**How to read a verdict**\n\n" + "\n".join(LEGEND),
    ]
    for name, fmt in formats_in_order(report):
        parts.append(_format_section(report, name, fmt, groups, layout))
    parts.append(_provenance(report, layout))
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(report: dict[str, Any]) -> str:
    model = dig(report, "model", "source") or dig(report, "model", "path") or "model"
    when = report.get("created_at") or ""
    return f"# quantgate: {md_inline(clip(model, 120))}" + (f" ({md_inline(when)})" if when else "")


# --- verdict table -------------------------------------------------------------------------


def _verdict_table(report: dict[str, Any], layout: _Layout) -> str:
    rows = [
        "| Format | Verdict | Peak memory | Weights | TPOT p50 | Gated metrics: delta [95% CI] | vLLM flags |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, fmt in formats_in_order(report):
        verdict = verdict_of(fmt)
        shown = verdict if verdict == "BASELINE" else f"**{verdict}**"
        memory = fmt.get("memory") or {}
        peak = fmt_bytes(memory.get("peak_bytes"))
        if peak != DASH and memory.get("device"):
            peak += f" ({memory['device']})"
        tpot = fmt_ms(dig(fmt, "latency", "batch_1", "tpot_ms", "p50") or dig(fmt, "latency", "tpot_ms", "p50"))
        flags = dig(fmt, "capacity", "vllm_flags")
        cells = [
            md_cell(name),
            shown,
            peak,
            fmt_bytes(memory.get("weights_bytes")),
            tpot,
            _gated_cell(report, fmt, layout),
            md_code(clip(flags, layout.cell_chars)) if flags else DASH,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _gated_cell(report: dict[str, Any], fmt: dict[str, Any], layout: _Layout) -> str:
    entries: list[tuple[int, str]] = []
    baseline = fmt.get("role") == "baseline"
    for gs in gated_scores(report, fmt):
        label = f"{gs.evalset}/{gs.metric}"
        if baseline:
            entries.append((1, f"{md_cell(label)} {fmt_num(gs.score.get('value'))}"))
        else:
            status = gs.score.get("status")
            mark = _STATUS_MARK.get(status or "", "")
            text = f"{md_cell(label)} {fmt_delta_interval(gs.score)}" + (f" {mark}" if mark else "")
            entries.append((0 if status in ("fail", "inconclusive") else 1, text))
    if fmt.get("status") == "failed":
        entries.insert(0, (0, "failed: " + md_cell(clip(fmt.get("error") or "no error recorded", layout.cell_chars))))
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


def _recommendation(report: dict[str, Any]) -> str:
    rec = report.get("recommendation") or {}
    choice = rec.get("format")
    why = md_inline(rec.get("why") or "")
    if choice:
        line = f"**Recommendation:** ship **{md_inline(choice)}**" + (f": {why}" if why else ".")
    else:
        line = "**Recommendation:** no candidate format is GO; keep the baseline" + (f": {why}" if why else ".")
    if rec.get("runner_up"):
        line += f" Runner-up: {md_inline(rec['runner_up'])}."
    return line


# --- per-format sections -------------------------------------------------------------------


def _format_section(
    report: dict[str, Any], name: str, fmt: dict[str, Any], groups: list[RegressionGroup], layout: _Layout
) -> str:
    parts = [f"## {md_inline(name)}: {verdict_of(fmt)}"]
    if fmt.get("status") == "failed":
        parts.append(f"**Failed:** {md_inline(clip(fmt.get('error') or 'no error recorded', 2 * layout.cell_chars))}")
    reasons = [r for r in fmt.get("reasons") or [] if r]
    if reasons:
        parts.append("**Reasons**\n\n" + _bullets([md_inline(clip(r, layout.cell_chars)) for r in reasons], layout))
    parts += [
        _scores_table(fmt, layout),
        _memory_table(fmt),
        _latency_table(fmt),
        _capacity(fmt),
    ]
    if fmt.get("role") != "baseline":
        parts += [_regressions(group, layout) for group in groups if group.candidate == name]
    return "\n\n".join(p for p in parts if p)


def _bullets(items: list[str], layout: _Layout) -> str:
    shown = items[: layout.list_items]
    lines = [f"- {item}" for item in shown]
    if len(items) > len(shown):
        lines.append(f"- … {len(items) - len(shown)} more in report.json")
    return "\n".join(lines)


def _scores_table(fmt: dict[str, Any], layout: _Layout) -> str:
    scores = list(iter_scores(fmt))
    if not scores:
        return ""
    baseline = fmt.get("role") == "baseline"
    if baseline:
        rows = ["| Evalset | Metric | Score | n |", "|---|---|---|---|"]
    else:
        rows = [
            "| Evalset | Metric | Score | Delta [95% CI] | Margin | MDE | p | Status |",
            "|---|---|---|---|---|---|---|---|",
        ]
    # gated metrics first: they decide the verdict
    scores.sort(key=lambda s: 0 if s[2].get("gated") else 1)
    for evalset, metric, score in scores[: layout.list_items]:
        metric_cell = f"**{md_cell(metric)}**" if score.get("gated") else md_cell(metric)
        head = [md_cell(evalset), metric_cell, fmt_num(score.get("value"))]
        if baseline:
            rows.append("| " + " | ".join(head + [fmt_int(score.get("n"))]) + " |")
            continue
        margin = score.get("margin")
        rows.append(
            "| "
            + " | ".join(
                head
                + [
                    fmt_delta_interval(score),
                    fmt_num(margin) if is_number(margin) else DASH,
                    fmt_num(score.get("mde")),
                    fmt_num(score.get("p_value"), 3),
                    md_cell(score.get("status") or DASH),
                ]
            )
            + " |"
        )
    if len(scores) > layout.list_items:
        rows.append(f"\n… {len(scores) - layout.list_items} more scores in report.json")
    return "**Scores** (gated metrics in bold)\n\n" + "\n".join(rows)


def _memory_table(fmt: dict[str, Any]) -> str:
    memory = fmt.get("memory") or {}
    if not any(is_number(v) for v in memory.values()):
        return ""
    kv = memory.get("kv_bytes_per_token")
    tokens = memory.get("largest_batch_tokens")
    rows = [
        ("Weights", _with_measured(memory, "weights_bytes")),
        ("KV cache per token", _with_measured(memory, "kv_bytes_per_token")),
        (
            f"KV cache at largest batch ({fmt_int(tokens)} tokens)",
            fmt_bytes(kv * tokens) if is_number(kv) and is_number(tokens) else DASH,
        ),
        ("Activation peak", fmt_bytes(memory.get("activation_peak_bytes"))),
        ("**Peak**", f"**{fmt_bytes(memory.get('peak_bytes'))}**"),
    ]
    for key, label in (
        ("rss_peak_bytes", "Peak RSS"),
        ("cuda_max_allocated_bytes", "torch.cuda max allocated"),
        ("cuda_max_reserved_bytes", "torch.cuda max reserved"),
        ("nvml_peak_used_bytes", "NVML peak used (nvidia-smi)"),
    ):
        if is_number(memory.get(key)):
            rows.append((label, fmt_bytes(memory[key])))
    where = md_inline(memory.get("device") or "unknown device")
    figure = memory.get("figures")
    caption = f"**Memory** on {where}" + (f"; peak is {md_inline(figure)}" if figure else "")
    return caption + "\n\n| Figure | Bytes |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def _with_measured(memory: dict[str, Any], key: str) -> str:
    value = fmt_bytes(memory.get(key))
    measured = memory.get(f"{key}_measured")
    if is_number(measured) and measured != memory.get(key):
        value += f" (measured {fmt_bytes(measured)})"
    return value


def _latency_table(fmt: dict[str, Any]) -> str:
    latency = fmt.get("latency") or {}
    runs = []
    batch_1 = latency.get("batch_1") or (
        {k: latency[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms") if k in latency} or None
    )
    if batch_1:
        runs.append(("batch 1", batch_1))
    batched = latency.get("batched")
    if batched:
        runs.append((f"batch {fmt_int(batched.get('batch_size'))}", batched))
    if not runs:
        return ""
    rows = [
        "| Run | TTFT p50 | TTFT p95 | TPOT p50 | TPOT p95 | E2E p50 | E2E p95 | Throughput |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, run in runs:
        cells = [label]
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            cells += [fmt_ms(dig(run, key, "p50")), fmt_ms(dig(run, key, "p95"))]
        tput = run.get("throughput_tok_s")
        cells.append(f"{fmt_num(tput)} tok/s" if is_number(tput) else DASH)
        rows.append("| " + " | ".join(cells) + " |")
    where = md_inline(latency.get("device") or "unknown device")
    extra = []
    if is_number(latency.get("threads")):
        extra.append(f"{latency['threads']} thread(s)")
    if is_number(latency.get("warmup_requests")):
        extra.append(f"{latency['warmup_requests']} warm-up requests")
    caption = f"**Latency** on {where}" + (f" ({', '.join(extra)})" if extra else "")
    return caption + "\n\n" + "\n".join(rows)


def _capacity(fmt: dict[str, Any]) -> str:
    cap = fmt.get("capacity") or {}
    if not cap:
        return ""
    gib, util = cap.get("gpu_memory_gib"), cap.get("gpu_memory_utilization")
    target = f"{fmt_num(gib, 0)} GiB GPU" if is_number(gib) else "target GPU"
    if is_number(util):
        target += f" at {util:.2f} utilization"
    fits = cap.get("fits")
    line = (
        f"**Capacity** on a {target}, max-model-len {fmt_int(cap.get('max_model_len'))}: "
        f"KV room {fmt_bytes(cap.get('kv_room_bytes'))}, "
        f"max concurrent sequences {fmt_int(cap.get('max_num_seqs'))}, "
        f"max batched tokens {fmt_int(cap.get('max_num_batched_tokens'))}; "
        + ("fits." if fits is True else "**does not fit**." if fits is False else "fit unknown.")
    )
    if cap.get("note"):
        line += f" {md_inline(cap['note'])}"
    if cap.get("vllm_flags"):
        line += f"\n\n    vllm serve MODEL {' '.join(str(cap['vllm_flags']).split())}"
    return line


def _regressions(group: RegressionGroup, layout: _Layout) -> str:
    head = (
        f"**Worst regressions: {md_inline(group.evalset)}** ({md_inline(group.metric)}; "
        f"{group.regressed} of {group.compared} items dropped)"
    )
    if not group.rows:
        return head + "\n\nNo item scored lower than the baseline."
    if layout.rows_per_group == 0:
        return head + "\n\n_Rows left out to keep this report under 64 KiB; see report.html._"
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
                    _excerpt_cell(reg.prompt, layout.excerpt_chars),
                    _excerpt_cell(reg.baseline_output, layout.excerpt_chars),
                    _excerpt_cell(reg.candidate_output, layout.excerpt_chars),
                    f"{fmt_num(reg.baseline_score)} → {fmt_num(reg.candidate_score)} ({fmt_signed(reg.change)})",
                ]
            )
            + " |"
        )
    left_out = min(len(group.rows), group.regressed) - min(len(group.rows), layout.rows_per_group)
    if left_out > 0:
        rows.append(f"\n_{left_out} more rows left out to keep this report under 64 KiB._")
    return head + "\n\n" + "\n".join(rows)


def _excerpt_cell(text: str, limit: int) -> str:
    return md_cell(excerpt(text, limit)) if text else "_(empty)_"


# --- provenance ----------------------------------------------------------------------------


def _provenance(report: dict[str, Any], layout: _Layout) -> str:
    model = report.get("model") or {}
    device = report.get("device") or {}
    settings = report.get("settings") or {}
    tool = report.get("tool") or {}
    lines = ["## Provenance", ""]
    model_bits = [
        f"source {md_inline(model.get('source') or DASH)}",
        f"path {md_code(clip(model.get('path'), layout.cell_chars)) if model.get('path') else DASH}",
        f"fingerprint {md_code(model.get('fingerprint')) if model.get('fingerprint') else DASH}",
    ]
    for key in ("architecture", "dtype"):
        if model.get(key):
            model_bits.append(f"{key} {md_inline(model[key])}")
    if is_number(model.get("num_parameters")):
        model_bits.append(f"{fmt_int(model['num_parameters'])} parameters")
    lines.append("- **Model:** " + ", ".join(model_bits))
    if model.get("note"):
        lines.append(f"- **Model note:** {md_inline(clip(model['note'], 2 * layout.cell_chars))}")
    dev = [md_inline(device.get("kind") or DASH), md_inline(device.get("name") or "")]
    if is_number(device.get("total_memory_bytes")):
        dev.append(fmt_bytes(device["total_memory_bytes"]))
    lines.append(f"- **Device:** {' '.join(d for d in dev if d)}; threads {fmt_int(device.get('threads'))}")
    lines.append(
        f"- **Settings:** seed {md_inline(settings.get('seed', DASH))}, batch size "
        f"{md_inline(settings.get('batch_size', DASH))}, max items {md_inline(settings.get('max_items') or 'all')}, "
        f"bootstrap resamples {md_inline(settings.get('resamples', DASH))}"
    )
    lines.append(
        f"- **Run:** {md_inline(tool.get('name') or 'quantgate')} {md_inline(tool.get('version') or '')}, "
        f"created {md_inline(report.get('created_at') or DASH)}, wall {fmt_num(report.get('wall_s'))} s"
    )
    env = report.get("environment") or {}
    if env:
        items = [f"{md_inline(k)} {md_inline(clip(v, 60))}" for k, v in env.items()]
        shown = items[: 2 * layout.list_items]
        more = f", … {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        lines.append("- **Environment:** " + ", ".join(shown) + more)
    lines += _evalset_table(report, layout)
    lines += _artifact_table(report, layout)
    return "\n".join(lines)


def _evalset_table(report: dict[str, Any], layout: _Layout) -> list[str]:
    evalsets = report.get("evalsets") or {}
    if not evalsets:
        return []
    rows = [
        "",
        "| Evalset | Task | Language | Items | Gate | Tokenizer | Hash | Spec |",
        "|---|---|---|---|---|---|---|---|",
    ]
    items = list(evalsets.items())
    for name, spec in items[: layout.list_items]:
        spec = spec or {}
        rows.append(
            "| "
            + " | ".join(
                [
                    md_cell(name),
                    md_cell(spec.get("task") or DASH),
                    md_cell(spec.get("language") or DASH),
                    fmt_int(spec.get("n")),
                    md_cell(", ".join(str(g) for g in spec.get("gate") or []) or DASH),
                    md_cell(clip(spec.get("tokenizer") or DASH, 60)),
                    md_code(clip(spec.get("hash"), 80)) if spec.get("hash") else DASH,
                    md_cell(clip(spec.get("spec") or DASH, 80)),
                ]
            )
            + " |"
        )
    if len(items) > layout.list_items:
        rows.append(f"\n… {len(items) - layout.list_items} more evalsets in report.json")
    return rows


def _artifact_table(report: dict[str, Any], layout: _Layout) -> list[str]:
    rows = ["", "| Format | Artifact | Size | Cached | Manifest |", "|---|---|---|---|---|"]
    for name, fmt in formats_in_order(report):
        artifact = fmt.get("artifact") or {}
        if not artifact:
            continue
        cached = artifact.get("cached")
        rows.append(
            "| "
            + " | ".join(
                [
                    md_cell(name),
                    md_code(clip(artifact.get("path"), 100)) if artifact.get("path") else DASH,
                    fmt_bytes(artifact.get("size_bytes")),
                    "yes" if cached is True else "no" if cached is False else DASH,
                    md_cell(clip(manifest_summary(artifact.get("manifest")), layout.cell_chars)),
                ]
            )
            + " |"
        )
    return rows if len(rows) > 3 else []


def manifest_summary(manifest: Any) -> str:
    """'engine gptqmodel 7.6.0; recipe {"bits": 4, ...}' from an artifact manifest."""
    if not isinstance(manifest, dict) or not manifest:
        return DASH
    bits = []
    for key, value in manifest.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        bits.append(f"{key}: {shown}")
    return "; ".join(bits)

