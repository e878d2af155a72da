"""The settings a run had, in any engine's syntax: command lines (`vllm serve`, `python -m sglang.launch_server`,
`text-generation-launcher`, `trtllm-serve`, `docker run -e ...`), vLLM's `non-default args: {...}`, SGLang's
`ServerArgs(...)`, TGI's `Args { ... }`, Python keyword arguments (`LLM(max_model_len=4096)`), environment variables
(`PYTORCH_CUDA_ALLOC_CONF=...`), and `--flags` given to diagnose. Each engine's name for a setting maps to one key
(`--tp`, `--tp-size`, `--num-shard`, `tensor_parallel_size` -> tensor_parallel_size), so every reader sees what is
already in place whatever the syntax."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from harness.flags import command_words, flag_pairs


@dataclass(frozen=True)
class Setting:
    value: object
    line: int  # 1-based log line; 0: given to diagnose (--flags, --version)


# every spelling (dashes and underscores folded to "_", lower case) -> the one key the readers use
ALIASES = {
    "max_model_len": "max_model_len", "context_length": "max_model_len", "max_seq_len": "max_seq_len",
    "max_total_tokens": "max_total_tokens", "max_input_tokens": "max_input_tokens",
    "max_input_length": "max_input_tokens", "max_batch_prefill_tokens": "max_batch_prefill_tokens",
    "max_batch_total_tokens": "max_batch_total_tokens", "max_batch_size": "max_batch_size",
    "gpu_memory_utilization": "gpu_memory_utilization", "mem_fraction_static": "mem_fraction_static",
    "vllm_gpu_memory_utilization": "gpu_memory_utilization",  # a trainer's share for its colocated vLLM (TRL, ms-swift)
    "cuda_memory_fraction": "cuda_memory_fraction",
    "kv_cache_free_gpu_memory_fraction": "kv_cache_free_gpu_memory_fraction",
    "free_gpu_memory_fraction": "kv_cache_free_gpu_memory_fraction",
    "tensor_parallel_size": "tensor_parallel_size", "tp": "tensor_parallel_size", "tp_size": "tensor_parallel_size",
    "num_shard": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype", "enforce_eager": "enforce_eager", "disable_cuda_graph": "disable_cuda_graph",
    "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "max_rolling_batch_size": "max_num_seqs",  # DJL LMI's name for the engine's running batch (vLLM's max_num_seqs)
    "eager_mode": "enforce_eager",  # LMDeploy's PytorchEngineConfig(eager_mode=True): no CUDA graphs
    "max_running_requests": "max_running_requests", "chunked_prefill_size": "chunked_prefill_size",
    "max_prefill_tokens": "max_prefill_tokens", "max_prefill": "max_prefill_tokens",
    "cuda_graph_max_bs": "cuda_graph_max_bs", "cuda_graph_sizes": "cuda_graph_sizes",
    "cuda_graph_capture_sizes": "cuda_graph_sizes", "max_num_tokens": "max_num_tokens",
    "quantization": "quantization", "quantize": "quantization", "dtype": "dtype", "block_size": "block_size",
    "enable_chunked_prefill": "enable_chunked_prefill", "max_logprobs": "max_logprobs",
    "max_lora_rank": "max_lora_rank", "max_loras": "max_loras", "enable_lora": "enable_lora",
    "limit_mm_per_prompt": "limit_mm_per_prompt", "cpu_offload_gb": "cpu_offload_gb",
    "batch_size": "batch_size", "per_device_train_batch_size": "batch_size", "train_batch_size": "batch_size",
    "micro_batch_size": "batch_size", "train_micro_batch_size_per_gpu": "batch_size",
    "per_device_eval_batch_size": "batch_size", "eval_batch_size": "batch_size",
    "gradient_checkpointing": "gradient_checkpointing", "activation_checkpointing": "gradient_checkpointing",
    "model": "model", "model_path": "model",
    "model_id": "model", "max_new_tokens": "max_new_tokens", "max_length": "max_length",
    "cutoff_len": "max_length", "max_seq_length": "max_length", "max_source_length": "max_length",
    "pytorch_cuda_alloc_conf": "pytorch_cuda_alloc_conf", "pytorch_alloc_conf": "pytorch_cuda_alloc_conf",
    "cuda_visible_devices": "cuda_visible_devices", "vllm_use_v1": "vllm_use_v1",
}
SWITCHES = {"enforce_eager", "disable_cuda_graph", "enable_chunked_prefill", "enable_lora", "gradient_checkpointing"}
TEXT_VALUES = {"kv_cache_dtype", "quantization", "dtype", "model", "pytorch_cuda_alloc_conf", "cuda_visible_devices",
               "cuda_graph_sizes", "limit_mm_per_prompt", "vllm_use_v1"}

_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_KWARG = re.compile(r"\b([A-Za-z_]\w*)\s*=\s*(\"[^\"]*\"|'[^']*'|\[[^\]]*\]|Some\([^)]*\)|[\w.:/+-]+)")
_RUST_FIELD = re.compile(r"\b([a-z_]\w*): (\"[^\"]*\"|Some\([^)]*\)|None|[\w.:/+-]+)")
# lines that name settings as advice, not as what the run had (PyTorch's OOM message suggests expandable_segments)
_ADVICE = re.compile(r"out of memory|avoid fragmentation|Please try|Try increasing|try (?:lowering|reducing|setting)|"
                     r"You need to decrease|consider (?:increasing|decreasing|setting|lowering)", re.I)
_SHORT_TP = re.compile(r"(?:^|\s)-tp[ =](\d+)")
# vLLM's hint once CUDA-graph memory is profiled ("--gpu-memory-utilization=0.95 is equivalent to 0.9325 without CUDA
# graph profiling"), often wrapped after the flag: the value named is advice, not the run's setting
_EQUIVALENT = re.compile(r"is equivalent to [\d.]+\s+without CUDA graph", re.I)
# a person's words for a batch size in place ("set batch_size 1", "even with batch size 1", "tried batch size of 2")
_SAID_BATCH = re.compile(r"\b(?:set|setting|use|using|with|tried|already|even)\b[^.\n]{0,20}?\bbatch[ _-]?size"
                         r"(?:\s*(?:of|to|is|=|:))?\s*(\d+)\b", re.I)

# a share stated in words ("at util 0.9 the server OOMs", "with gpu memory utilization 0.95")
_SAID_UTILIZATION = re.compile(r"\b(?:at|with|using|set to|default)\s+(?:gpu[ _-]?memory[ _-]?)?util(?:i[sz]ation)?"
                               r"\s*(?:of|=|:)?\s*(0?\.\d+|1\.0)\b", re.I)


_RANGE = re.compile(r"^(\d*\.\d+)\s*[-–~]\s*\d*\.\d+\b")


def key_of(name: str) -> str | None:
    key = name.strip().lstrip("-").replace("-", "_").lower()
    key = key[len("option."):] if key.startswith("option.") else key  # LMI's serving.properties
    if key not in ALIASES and "." in key:
        key = key.rsplit(".", 1)[1]  # a recipe's config path (NeMo's distributed.activation_checkpointing): its key
    return ALIASES.get(key)


def settings_in(text: str) -> dict[str, Setting]:
    """Every setting the log shows, the first spelling of each kept (a start-up line before any later echo)."""
    found: dict[str, Setting] = {}

    def put(name: str, raw: object, number: int) -> None:
        key = key_of(str(name))
        if key is None or key in found:
            return
        value = _value(key, raw)
        if value is not None:
            found[key] = Setting(value, number)

    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if len(line) > 20000:
            line = line[:20000]
        if "batch" in line.lower() and not _ADVICE.search(line) and (said := _SAID_BATCH.search(line)):
            put("batch_size", said.group(1), number)
        if "util" in line.lower() and not _ADVICE.search(line) and (said := _SAID_UTILIZATION.search(line)):
            put("gpu_memory_utilization", said.group(1), number)
        if _EQUIVALENT.search(line + " " + (lines[number][:200] if number < len(lines) else "")):
            continue
        if not ("--" in line or "=" in line or "Args {" in line or ": Some(" in line or "-tp" in line
                or "non-default" in line):
            continue
        if _ADVICE.search(line):
            continue
        if (match := _NON_DEFAULT.search(line)):
            try:
                args = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                args = {}
            for name, raw in (args.items() if isinstance(args, dict) else ()):
                put(name, raw, number)
            continue
        if "--" in line:
            for flag, raw in flag_pairs(command_words(line)):
                put(flag, raw if raw else True, number)
        if (match := _SHORT_TP.search(line)):
            put("tp", match.group(1), number)
        if "=" in line:
            for name, raw in _KWARG.findall(line):
                put(name, raw, number)
        if "Args {" in line or ": Some(" in line:
            for name, raw in _RUST_FIELD.findall(line):
                put(name, raw, number)
    return found


def settings_given(flags: str) -> dict[str, Setting]:
    """--flags as diagnose was given them: any engine's flags, KEY=VALUE environment variables, or key=value."""
    return {key: Setting(s.value, 0) for key, s in settings_in(flags).items()}


def _value(key: str, raw: object) -> object | None:
    if isinstance(raw, str):
        raw = raw.strip().strip("\"'").rstrip(",;)")
        if raw.startswith("Some("):
            raw = raw[5:].rstrip(")").strip("\"'")
        if raw in ("None", "null", "") or raw.startswith("$"):
            return None  # unset, or a shell variable the log does not expand ("--model-id $model")
    if key in SWITCHES:
        if isinstance(raw, bool):
            return raw
        text = str(raw).lower()
        return True if text in ("true", "1", "yes") else False if text in ("false", "0", "no") else None
    if key in TEXT_VALUES:
        return str(raw)
    if key == "batch_size" and str(raw).lower().startswith("auto"):
        return str(raw)  # lm-eval's "auto" / "auto:4": detected by the tool, a setting of its own
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return raw
    if (tried := _RANGE.match(str(raw))):
        return float(tried.group(1))  # "0.90-0.94": values tried, every one of them at least the lowest
    try:
        return int(str(raw))
    except ValueError:
        try:
            return float(str(raw))
        except ValueError:
            return None


def merged(log: dict[str, Setting], given: dict[str, Setting]) -> dict[str, Setting]:
    """The log's settings, with what diagnose was given filling the gaps (the log wins)."""
    return {**given, **log}


def number(settings: dict[str, Setting], key: str) -> float | None:
    setting = settings.get(key)
    return float(setting.value) if setting is not None and isinstance(setting.value, (int, float)) else None


def is_on(settings: dict[str, Setting], key: str) -> bool:
    setting = settings.get(key)
    return setting is not None and setting.value is True


def fp8_kv(settings: dict[str, Setting]) -> bool:
    setting = settings.get("kv_cache_dtype")
    return setting is not None and str(setting.value).lower().startswith(("fp8", "int8", "nvfp4", "fp4"))


def expandable_segments(settings: dict[str, Setting]) -> bool:
    setting = settings.get("pytorch_cuda_alloc_conf")
    return setting is not None and "expandable_segments:true" in str(setting.value).lower().replace(" ", "")


# more than one GPU visible or named: CUDA_VISIBLE_DEVICES with several ids, a GPU or rank numbered above 0, "4x T4",
# "2 GPUs", an nvidia-smi table's second row, "each card"
_SEVERAL_GPUS = re.compile(r"CUDA_VISIBLE_DEVICES[\"']?\s*[=:]\s*[\"']?\d+\s*,\s*\d+|\bGPU [1-9]\d*\b|\bcuda:[1-9]|"
                           r"\brank[= ][1-9]|^\|\s+[1-9]\s+NVIDIA|\b[2-9]\s*[x×]\s*(?:NVIDIA\s+)?(?:[A-Z]+\d|RTX|GPU)|"
                           r"\b(?:[2-9]|1[0-6])\s*(?:GPUs|cards)\b|\beach (?:card|GPU)\b|每张卡|多卡", re.I | re.M)


def several_gpus(text: str, settings: dict[str, Setting]) -> bool:
    """The log or the flags show more than one GPU on the machine (visible or named)."""
    visible = settings.get("cuda_visible_devices")
    if visible is not None and "," in str(visible.value):
        return True
    return bool(_SEVERAL_GPUS.search(text))

