"""The check's printout: one block per directly measured format, the quantgate step's figures and checks, and the
summary table. Sizes and times are formatted by harness.units, with "-" for a figure that is missing."""

from __future__ import annotations

from harness.units import format_bytes, format_ms

MEMORY_FIELDS = ("device", "peak_bytes", "weights_bytes", "weights_bytes_measured", "kv_bytes_per_token",
                 "kv_bytes_per_token_measured", "activation_peak_bytes", "cuda_max_allocated_bytes",
                 "cuda_max_reserved_bytes", "nvml_peak_used_bytes")


def size(value) -> str:
    """Bytes in MiB or GiB: 1.5 * 2**30 -> '1.50 GiB', 512 KiB -> '0.5 MiB', None -> '-'."""
    return format_bytes(value, missing="-", smallest="MiB")


def ms(value, digits: int = 2) -> str:
    """Milliseconds, 2 decimals unless told (decode steps on a GPU take a few): 0.8412 -> '0.84 ms'."""
    return format_ms(value, missing="-", digits=digits)


def params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def render_format(fmt: str, r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"== {fmt}: {'FAILED: ' + r['error'] if 'error' in r else 'skipped: ' + r['skipped']}"
    cap = r["capacity_80gib"]
    rows = [
        f"== {fmt} (loaded in {r['load_s']:.1f} s)",
        f"  {'':40} {'predicted':>12} {'measured':>12}",
        f"  {'weights (allocator after load)':40} {size(r['weights_predicted_bytes']):>12} "
        f"{size(r['weights_allocated_bytes']):>12}   params+buffers {size(r['weights_tensor_bytes'])}",
        f"  {'KV after prefill ' + str(r['batch']) + 'x' + str(r['prompt_len']) + ' (cache tensors)':40} "
        f"{size(r['kv_prefill_predicted_bytes']):>12} {size(r['kv_prefill_tensor_bytes']):>12}",
        f"  {'KV after prefill (allocator delta)':40} {size(r['kv_prefill_predicted_bytes']):>12} "
        f"{size(r['kv_prefill_allocator_delta_bytes']):>12}",
        f"  {'KV after +' + str(r['new_tokens']) + ' tokens (cache tensors)':40} "
        f"{size(r['kv_final_predicted_bytes']):>12} {size(r['kv_final_tensor_bytes']):>12}",
        f"  {'KV bytes per token':40} {r['kv_bytes_per_token_predicted']:>12,} "
        f"{round(r['kv_prefill_tensor_bytes'] / r['prefill_tokens']):>12,}",
        f"  peak allocated {size(r['cuda_max_allocated_bytes'])}, reserved {size(r['cuda_max_reserved_bytes'])}; "
        f"NVML used {size(r['nvml_start_used_bytes'])} -> peak {size(r['nvml_peak_used_bytes'])}; "
        f"activation peak {size(r['activation_peak_bytes'])}",
        f"  batch {r['batch']}: TTFT {ms(r['ttft_ms'], 1)}, TPOT p50 {ms(r['tpot_ms_p50'])} "
        f"(mean {ms(r['tpot_ms_mean'])}); batch 1: TTFT {ms(r['batch1_ttft_ms'], 1)}, "
        f"TPOT p50 {ms(r['batch1_tpot_ms_p50'])}",
        f"  80 GiB GPU @ 0.90, max-model-len {cap['max_model_len']}: {cap['note']}",
        f"    vllm serve MODEL {cap['vllm_flags']}" if cap["vllm_flags"] else "",
    ]
    for c in r["checks"]:
        rows.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: off by {c['off']:.2%} "
                    f"(tolerance {c['tolerance']:.0%})")
    return "\n".join(row for row in rows if row)


def render_summary(results: dict) -> str:
    lines = [f"{'format':<9} {'weights':>10} {'peak alloc':>11} {'NVML peak':>10} {'TPOT b1':>9} {'TPOT b8':>9} "
             f"{'seqs@80G':>9}  checks"]
    lines[0] = lines[0].replace("TPOT b8", f"TPOT b{next((r['batch'] for r in results.values() if 'batch' in r), 8)}")
    for fmt, r in results.items():
        if "error" in r or "skipped" in r:
            lines.append(f"{fmt:<9} {'failed' if 'error' in r else 'skipped'}")
            continue
        ok = all(c["ok"] for c in r["checks"])
        lines.append(f"{fmt:<9} {size(r['weights_allocated_bytes']):>10} {size(r['cuda_max_allocated_bytes']):>11} "
                     f"{size(r['nvml_peak_used_bytes']):>10} {ms(r['batch1_tpot_ms_p50']):>9} "
                     f"{ms(r['tpot_ms_p50']):>9} {r['capacity_80gib']['max_num_seqs']:>9}  "
                     f"{'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def render_quantgate(result: dict) -> str:
    head = f"== quantgate run on the same model ({result['device']}): formats {','.join(result['formats'])}"
    if result["error"]:
        return "\n".join([head, f"  FAILED: {result['error']}", "  [quantgate run output, last lines]",
                          *("    " + line for line in result["log_tail"])])
    rows = [head, f"  {result['command']}",
            f"  exit code {result['exit_code']} in {result['wall_s']:.0f} s (1 = not every format GO: expected of "
            "random weights; verdicts and scores mean nothing here, the figures do)"]
    for fmt, entry in result["report"].items():
        rows.append(f"  -- {fmt}: status {entry['status']}, verdict {entry['verdict']}, "
                    f"compute dtype {entry['compute_dtype']}")
        memory = entry["memory"]
        for name in MEMORY_FIELDS:
            value = memory.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                text = f"{value:,}" if name.startswith("kv_bytes_per_token") else f"{size(value)} ({value:,})"
            else:
                text = "-" if value is None else str(value)
            rows.append(f"    memory.{name:<28} {text}")
        for key, label in (("batch_1", "batch 1"), ("batched", "batched")):
            block = entry["latency"].get(key) or {}
            parts = [f"{metric[:-3].upper()} p50 {ms((block.get(metric) or {}).get('p50'))} "
                     f"p95 {ms((block.get(metric) or {}).get('p95'))}" for metric in ("ttft_ms", "tpot_ms", "e2e_ms")]
            batch = f" (batch size {block.get('batch_size')})" if key == "batched" and block else ""
            rows.append(f"    latency {label}{batch}: " + "; ".join(parts))
        rows.append(f"    capacity.vllm_flags: {(entry['capacity'] or {}).get('vllm_flags') or '-'}")
    for c in result["checks"]:
        rows.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['format']}: {c['name']}" +
                    (f": {c['detail']}" if c["detail"] else ""))
    return "\n".join(rows)
