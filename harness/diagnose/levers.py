"""Each suggested change names one lever (a normalized id, as the failure corpus records the fix its thread
confirmed: "max_model_len_down", "free_other_process", ...), and a change is dropped when its setting is already in
place or when it would lower what the user set higher (TP, an fp8 KV cache, eager mode, a lower utilization)."""

from __future__ import annotations

import re

from harness.diagnose.records import Change
from harness.diagnose.settings import Setting, expandable_segments, fp8_kv, is_on, number

# (pattern on the change's setting, lever id, the setting key it moves, its direction)
_LEVERS: tuple[tuple[str, str, str | None, str], ...] = (
    (r"^stop the other|^free the gpu|other process", "free_other_process", None, ""),
    (r"expandable_segments", "expandable_segments", "pytorch_cuda_alloc_conf", "on"),
    (r"^--enforce-eager", "enforce_eager", "enforce_eager", "on"),
    (r"^--disable-cuda-graph\b", "disable_cuda_graph", "disable_cuda_graph", "on"),
    (r"^--cuda-graph-max-bs", "cuda_graph_max_bs_down", "cuda_graph_max_bs", "down"),
    (r"^--cuda-graph-sizes|cudagraph_capture_sizes|capture sizes", "cuda_graph_sizes_down", "cuda_graph_sizes", "down"),
    (r"^--max-model-len|^--context-length", "max_model_len_down", "max_model_len", "down"),
    (r"^--max-total-tokens|^--max_total_token", "max_total_tokens_down", "max_total_tokens", "down"),
    (r"^--max-input-tokens|^--max-input-length", "max_input_tokens_down", "max_input_tokens", "down"),
    (r"^--max[-_]seq[-_]len", "max_seq_len_down", "max_seq_len", "down"),
    (r"^--max-batch-prefill-tokens", "max_batch_prefill_tokens_down", "max_batch_prefill_tokens", "down"),
    (r"^--max-batch-total-tokens", "max_batch_total_tokens_down", "max_batch_total_tokens", "down"),
    (r"^--max[-_]num[-_]tokens", "max_num_tokens_down", "max_num_tokens", "down"),
    (r"^--max[-_]batch[-_]size", "max_batch_size_down", "max_batch_size", "down"),
    (r"^--gpu-memory-utilization \d", "gpu_memory_utilization_?", "gpu_memory_utilization", "?"),
    (r"^--mem-fraction-static \d", "mem_fraction_static_?", "mem_fraction_static", "?"),
    (r"^--cuda-memory-fraction \d", "cuda_memory_fraction_?", "cuda_memory_fraction", "?"),
    (r"free_gpu_memory_fraction \d", "kv_cache_free_gpu_memory_fraction_?", "kv_cache_free_gpu_memory_fraction", "?"),
    (r"^--enable-chunked-prefill", "enable_chunked_prefill", "enable_chunked_prefill", "on"),
    (r"^--max-num-batched-tokens", "max_num_batched_tokens_down", "max_num_batched_tokens", "down"),
    (r"^--max-num-seqs", "max_num_seqs_down", "max_num_seqs", "down"),
    (r"^--max-running-requests", "max_running_requests_down", "max_running_requests", "down"),
    (r"^--chunked-prefill-size", "chunked_prefill_size_down", "chunked_prefill_size", "down"),
    (r"^--kv-cache-dtype|kv_cache_config\.dtype|--kv_cache_dtype", "kv_cache_dtype_fp8", "kv_cache_dtype", "fp8"),
    (r"^quantize|--quantize", "quantize_smaller", None, ""),
    (r"^--num-shard", "num_shard_up", "tensor_parallel_size", "up"),
    (r"^--tensor-parallel-size|^--tp\b|^--tp-size|^--tp_size", "tensor_parallel_up", "tensor_parallel_size", "up"),
    (r"^--max-logprobs", "max_logprobs_down", "max_logprobs", "down"),
    (r"^--max-lora-rank", "max_lora_rank_down", "max_lora_rank", "down"),
    (r"^--max-loras", "max_loras_down", "max_loras", "down"),
    (r"^--limit-mm-per-prompt", "limit_mm_per_prompt_down", "limit_mm_per_prompt", "down"),
    (r"^--cpu-offload-gb", "cpu_offload", "cpu_offload_gb", "up"),
    (r"batch size|per_device_train_batch_size|^--batch[-_]size|lower the tokens per step", "batch_size_down",
     "batch_size", "down"),
    (r"gradient.checkpointing", "gradient_checkpointing", "gradient_checkpointing", "on"),
    (r"8-bit optimizer|adamw_8bit|optimizer state", "optimizer_state_down", None, ""),
    (r"max_new_tokens|max_length|shorter (inputs|sequences|prompts)|sequence length", "max_model_len_down",
     "max_length", "down"),
    (r"empty_cache", "empty_cache", None, ""),
    (r"larger gpu|bigger gpu", "larger_gpu", None, ""),
    (r"another replica", "more_replicas", None, ""),
    (r"pass the log|give the|--model|--target-gpu", "more_information", None, ""),
)


# the engines' defaults, for the direction of a fraction suggested where the log does not show the value in place
_DEFAULTS = {"gpu_memory_utilization_?": 0.9, "mem_fraction_static_?": 0.88, "kv_cache_free_gpu_memory_fraction_?": 0.9,
             "cuda_memory_fraction_?": 1.0}


def lever_of(change: Change | str, current: float | None = None) -> str:
    """The lever id of a change ("--max-model-len 8192" -> "max_model_len_down"). A fraction setting's direction
    comes from the value in place (current) when there is one, else from the change's own words."""
    setting = change if isinstance(change, str) else change.setting
    for pattern, lever, _, direction in _LEVERS:
        if re.search(pattern, setting, re.I):
            if direction != "?":
                return lever
            value = _first_number(setting)
            current = current if current is not None else _DEFAULTS.get(lever)
            if current is not None and value is not None and value != current:
                return lever.replace("?", "up" if value > current else "down")
            words = setting if isinstance(change, str) else f"{setting} {change.effect}"
            return lever.replace("?", "down" if re.search(r"\blower|less|leaves more|down\b", words, re.I) else "up")
    return "other"


def with_levers(changes: list[Change] | tuple[Change, ...], settings: dict[str, Setting]) -> tuple[Change, ...]:
    """The changes with their lever ids, without those already in place or that lower what the user set higher,
    and without a second change of the same lever."""
    kept: list[Change] = []
    seen: set[str] = set()
    for change in changes:
        key = _key_of(change.setting)
        current = number(settings, key) if key else None
        lever = change.lever or lever_of(change, current)
        if lever in seen or in_place(change, lever, settings):
            continue
        seen.add(lever)
        kept.append(Change(change.setting, change.effect, lever))
    return tuple(kept)


def in_place(change: Change, lever: str, settings: dict[str, Setting]) -> bool:
    value = _first_number(change.setting)
    if lever == "expandable_segments":
        return expandable_segments(settings)
    if lever in ("enforce_eager", "disable_cuda_graph"):
        return is_on(settings, "enforce_eager") or is_on(settings, "disable_cuda_graph")
    if lever == "kv_cache_dtype_fp8":
        return fp8_kv(settings)
    if lever in ("enable_chunked_prefill", "gradient_checkpointing"):
        return is_on(settings, lever)
    key = _key_of(change.setting)
    current = number(settings, key) if key else None
    if current is not None and value is None and lever.endswith("_down") and current <= 1:
        return True  # "lower the batch size" where it is already 1
    if current is None or value is None:
        return False
    if lever.endswith("_down"):
        return value >= current
    if lever.endswith("_up"):
        return value <= current
    return False


def _key_of(setting: str) -> str | None:
    for pattern, _, key, _ in _LEVERS:
        if re.search(pattern, setting, re.I):
            return key
    return None


def _first_number(text: str) -> float | None:
    match = re.search(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?![\w])", text)
    return float(match.group(1).replace(",", "")) if match else None
