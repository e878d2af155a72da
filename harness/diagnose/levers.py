"""Each suggested change names one lever (a normalized id, as the failure corpus records the fix its thread
confirmed: "max_model_len_down", "free_other_process", ...), and a change is dropped when its setting is already in
place or when it would lower what the user set higher (TP, an fp8 KV cache, eager mode, a lower utilization), and a
change the log says was tried without success goes last."""

from __future__ import annotations

import re

from harness.diagnose.records import Change
from harness.diagnose.settings import Setting, expandable_segments, fp8_kv, is_on, number

_SWITCHES = ("enforce_eager", "disable_cuda_graph", "enable_chunked_prefill", "gradient_checkpointing")


def _row(pattern: str, lever: str, key: str | None = None,
         direction: str | None = None) -> tuple[str, str, str | None, str]:
    """A lever's row: the pattern on a change's setting, the lever id, the setting key it moves and the direction.
    Unless given, key and direction follow from the id: "max_num_seqs_down" moves max_num_seqs down, a switch
    (enforce_eager) turns itself on, an action (free_other_process, quantize_smaller) moves no setting."""
    if direction is None:
        stem, _, suffix = lever.rpartition("_")
        if suffix in ("down", "up", "?", "fp8"):
            key, direction = key or stem, suffix
        elif lever in _SWITCHES:
            key, direction = key or lever, "on"
        else:
            direction = ""
    return pattern, lever, key, direction


_LEVERS: tuple[tuple[str, str, str | None, str], ...] = (
    _row(r"^stop the other|^free the gpu|other process", "free_other_process"),
    _row(r"expandable_segments", "expandable_segments", "pytorch_cuda_alloc_conf", "on"),
    _row(r"^--enforce-eager", "enforce_eager"),
    _row(r"^--disable-cuda-graph\b", "disable_cuda_graph"),
    _row(r"^--cuda-graph-max-bs", "cuda_graph_max_bs_down"),
    _row(r"^--cuda-graph-sizes|cudagraph_capture_sizes|capture sizes", "cuda_graph_sizes_down"),
    _row(r"^--max-model-len|^--context-length", "max_model_len_down"),
    _row(r"^--max-total-tokens|^--max_total_token", "max_total_tokens_down"),
    _row(r"^--max-input-tokens|^--max-input-length", "max_input_tokens_down"),
    _row(r"^--max[-_]seq[-_]len", "max_seq_len_down"),
    _row(r"^--max-batch-prefill-tokens", "max_batch_prefill_tokens_down"),
    _row(r"^--max-batch-total-tokens", "max_batch_total_tokens_down"),
    _row(r"^--max[-_]num[-_]tokens", "max_num_tokens_down"),
    _row(r"^--max[-_]batch[-_]size", "max_batch_size_down"),
    _row(r"^--gpu-memory-utilization \d|^gpu_memory_utilization=\d", "gpu_memory_utilization_?"),
    _row(r"^--mem-fraction-static \d", "mem_fraction_static_?"),
    _row(r"^--cuda-memory-fraction \d", "cuda_memory_fraction_?"),
    _row(r"free_gpu_memory_fraction \d", "kv_cache_free_gpu_memory_fraction_?"),
    _row(r"^--enable-chunked-prefill", "enable_chunked_prefill"),
    _row(r"^--max-num-batched-tokens|^max_num_batched_tokens=", "max_num_batched_tokens_down"),
    _row(r"^--max-num-seqs|^max_num_seqs=", "max_num_seqs_down"),
    _row(r"^--max-running-requests", "max_running_requests_down"),
    _row(r"^--chunked-prefill-size", "chunked_prefill_size_down"),
    _row(r"^--max-prefill-tokens", "max_prefill_tokens_down"),
    _row(r"^--kv-cache-dtype|kv_cache_config\.dtype|--kv_cache_dtype", "kv_cache_dtype_fp8"),
    _row(r"cache_examples_on_gpu\s*=\s*False|low_gpu_mem_usage\s*=\s*True|offload_hessians\s*=\s*True|"
         r"cache_block_outputs\s*=\s*False", "calibration_cache_on_cpu", None, ""),
    _row(r"^quantize|--quantize", "quantize_smaller"),
    _row(r"^--num-shard", "num_shard_up", "tensor_parallel_size"),
    _row(r"^--tensor-parallel-size|^--tp\b|^--tp-size|^--tp_size", "tensor_parallel_up", "tensor_parallel_size"),
    _row(r"^--max-logprobs", "max_logprobs_down"),
    _row(r"^--max-lora-rank", "max_lora_rank_down"),
    _row(r"^--max-loras", "max_loras_down"),
    _row(r"^--limit-mm-per-prompt", "limit_mm_per_prompt_down"),
    _row(r"^--cpu-offload-gb", "cpu_offload", "cpu_offload_gb", "up"),
    # fixes no engine setting names, each with its own id so that grading never counts a catch-all "other" as right
    _row(r"flash[-_ ]?attn|flash_attention|attn_implementation|\bsdpa\b|(?:attn|attention)[-_ ]backend",
         "attention_kernel"),
    _row(r"max_pixels|image resolution|fewer image tiles", "image_resolution_down", None, ""),
    _row(r"runs? in half precision|^drop --no-half|torch_dtype=torch\.b?float16|^load (?:it |the model )?in "
         r"(?:bf16|bfloat16|fp16|float16)\b", "half_precision", None, ""),
    _row(r"map_location", "map_location"),
    _row(r"\bupgrade\b", "upgrade"),
    _row(r"batch size|per_device_train_batch_size|^--batch[-_]size|lower the tokens per step", "batch_size_down"),
    _row(r"gradient.checkpointing", "gradient_checkpointing"),
    _row(r"8-bit optimizer|adamw_8bit|optimizer state", "optimizer_state_down", None, ""),
    _row(r"max_new_tokens|max_length|shorter (inputs|sequences|prompts)|sequence length", "max_model_len_down",
         "max_length"),
    _row(r"empty_cache", "empty_cache"),
    _row(r"larger gpu|bigger gpu", "larger_gpu"),
    _row(r"another replica", "more_replicas"),
    _row(r"pass the log|give the|--model|--target-gpu", "more_information"),
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
    if current is not None and current <= 0 and lever.endswith("_down"):
        return False  # no size to lower from: the tool chooses it (a batch size of 0 = auto), or none is set
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


# Changes the log says were already tried without success ("lowering gpu_memory_utilization to 0.5 still OOM'ed",
# "修改了max_model_len等都没用": changing max_model_len did not help) go after the others: an engineer does not answer
# a report with the change it says it made. They stay in the list (the report may have tried too little of it).

# one statement: a sentence, or a line (a code comment wraps over several '#' lines: joined first)
_STATEMENT = re.compile(r"(?<=[.!?。；;])\s+|\n")
_DID_NOT_HELP = re.compile(r"\bstill (?:OOM|out of memory|fail|crash|error|get|got|hit|run(?:s)? out|no\b|the same)|"
                           r"no luck|did(?:n't| not) (?:help|work|fix|solve)|does(?:n't| not) help|not working|"
                           r"without success|to no avail|same error|都没用|没用|无效|不行|仍然|依然", re.I)
_LOWER = re.compile(r"lower|reduc|decreas|\bdown\b|smaller|降低|减小|调小|改小", re.I)
_RAISE = re.compile(r"rais|increas|\bup\b|higher|larger|提高|增大|调大|改大", re.I)
# (the setting's words, the lever lowering it, the lever raising it)
_SETTINGS = (
    (r"gpu[_ -]?memory[_ -]?utili[sz]ation|gpu_memory_utilization", "gpu_memory_utilization_down",
     "gpu_memory_utilization_up"),
    (r"max[_ -]?model[_ -]?len|max[_ -]?seq[_ -]?len(?!_to_capture)|context length", "max_model_len_down", None),
    (r"max[_ -]?num[_ -]?seqs", "max_num_seqs_down", None),
    (r"max[_ -]?num[_ -]?batched[_ -]?tokens", "max_num_batched_tokens_down", None),
    (r"batch[_ -]?size", "batch_size_down", None),
    (r"mem[_ -]?fraction[_ -]?static", "mem_fraction_static_down", "mem_fraction_static_up"),
    (r"enforce[_ -]?eager|eager mode", "enforce_eager", "enforce_eager"),
)


_COMMENT_WRAP = re.compile(r"\n[+ -]?\s*#\s*")  # a comment's next line (in a diff too): the same statement


def tried_levers(text: str) -> set[str]:
    """The levers the log says were tried and did not help."""
    tried: set[str] = set()
    for statement in _STATEMENT.split(_COMMENT_WRAP.sub(" ", text)):
        if not _DID_NOT_HELP.search(statement):
            continue
        for words, down, up in _SETTINGS:
            if not re.search(words, statement, re.I):
                continue
            lowered, raised = bool(_LOWER.search(statement)), bool(_RAISE.search(statement))
            if lowered or not raised:
                tried.add(down)
            if up and (raised or not lowered):
                tried.add(up)
    return tried


def untried_first(changes: tuple[Change, ...], text: str) -> tuple[Change, ...]:
    tried = tried_levers(text)
    if not tried:
        return changes
    fresh = tuple(c for c in changes if c.lever not in tried)
    return fresh + tuple(c for c in changes if c.lever in tried) if fresh else changes
