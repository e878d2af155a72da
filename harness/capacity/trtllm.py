"""TensorRT-LLM's trtllm-serve settings from the memory model (kv_cache_config.free_gpu_memory_fraction,
max_batch_size, max_num_tokens, max_seq_len), and the argument checks TensorRT-LLM runs on them.

Memory, following docs/source/reference/memory.md and tensorrt_llm/commands/serve.py: once the weights and the
runtime buffers (activations at max_num_tokens, CUDA graphs) are allocated, the KV cache takes
    KV = free_gpu_memory_fraction x (GPU memory - weights - runtime buffers - CUDA context)
(default 0.9). The plan takes fraction = min(0.95, floor2((free - headroom) / free)), so that a fixed headroom stays
free, and the KV cache that gives, in blocks of tokens_per_block (32) tokens. Sliding-window and chunked layers:
TensorRT-LLM sizes each layer's cache by kv_cache_config.max_attention_window (default: max_seq_len for every layer,
i.e. full attention); the plan writes the model's per-layer windows there (its --config YAML, as a pattern the engine
repeats over the layers), so a sliding layer holds at most window + one block of tokens and the pool is split
between the window sizes (variable sliding window attention). A hybrid model's Mamba layers keep their state per
sequence beside the KV (MambaHybridCacheManager, one state per max_batch_size slot). KV cache block reuse
(KvCacheConfig.enable_block_reuse, on by default) keeps the whole blocks of a prefix requests share once:
common.prefix_sharing counts it.
The checks (check_trtllm_command) are tensorrt_llm/llmapi/llm_args.py's: 0 < free_gpu_memory_fraction <= 1,
max_batch_size <= max_num_tokens, bf16 needs SM 80, max_seq_len within the model's; and max_num_tokens >=
max_seq_len unless --enable_chunked_prefill (a longer prompt is never scheduled otherwise).
Pipeline parallelism: --pp_size (serve.py's alias of --pipeline_parallel_size, the LLM API's
pipeline_parallel_size); the memory is the most-loaded GPU's of TensorRT-LLM's own split (trtllm_pp_layer_partition,
the embedding on the first stage, the lm_head on the last: the PyTorch backend's DecoderModel.__pp_init__ removes the
weights of every other module, and with tied embeddings the last stage keeps embed_tokens as the lm_head's weight).
"""

from __future__ import annotations

from harness.capacity.common import (DEFAULT_MAX_NUM_SEQS, EnginePlan, MemoryBreakdown, Target, Workload,
                                             fixed_costs, floor2, fp8_kv_refusal, gib, half_dtype_note,
                                             needs_half_dtype, parse_flags, pipeline_note, planned_stage_shape,
                                             prefix_sharing, prefix_sharing_note, render_command,
                                             short_of_one_sequence, with_engine_split)
from harness.capacity.gpus import FP8_MIN_CC, Gpu, has_capability
from harness.capacity.memory import (HEADROOM_BYTES, TensorParallelError, WeightFormat, check_split,
                                             kv_bytes_per_sequence, kv_bytes_per_token)
from harness.capacity.shapes import NO_KV, ModelShape

PROGRAM = "trtllm-serve MODEL"
SOURCE = "docs/source/reference/memory.md; tensorrt_llm/commands/serve.py; tensorrt_llm/llmapi/llm_args.py"
TOKENS_PER_BLOCK = 32  # KvCacheConfig's default
DEFAULT_MAX_NUM_TOKENS = 8192  # BuildConfig's default max_num_tokens
MAX_FRACTION = 0.95
EXTRA_CONFIG = "trtllm-extra.yaml"
_FLAGS = {"--backend", "--tp_size", "--pp_size", "--max_batch_size", "--max_num_tokens", "--max_seq_len",
          "--kv_cache_free_gpu_memory_fraction", "--enable_chunked_prefill", "--config"}


def trtllm_pp_layer_partition(layers: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    """The decoder layers of each pipeline stage, first to last, as TensorRT-LLM's Mapping.pp_layers gives them
    without an explicit pp_partition (tensorrt_llm/mapping.py: torch.tensor_split(torch.arange(num_layers),
    pp_size), "If num_layers % pp_size = n != 0, first n ranks get one extra layer"): layers // pp a stage and one
    more on each of the first layers % pp stages. (Older releases gave every rank num_layers // pp_size layers.)"""
    pp = pipeline_parallel_size
    if not 1 <= pp <= layers:
        raise ValueError(f"{pp} pipeline stages for {layers} layers: between 1 and the number of layers")
    base, remainder = divmod(layers, pp)
    return tuple(base + (1 if i < remainder else 0) for i in range(pp))


def plan_trtllm(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload) -> EnginePlan:
    """trtllm-serve's flags (PyTorch backend) for `fmt` on `target` (formula in the module docstring)."""
    gpu, tp, length = target.gpu, target.num_gpus, workload.max_model_len
    check_split(shape, tp, target.pipeline_parallel_size)
    target = with_engine_split(target, shape, trtllm_pp_layer_partition)
    notes: list[str] = []
    refusal = _refusal(fmt, notes, gpu) or fp8_kv_refusal(gpu, workload, "TensorRT-LLM")
    tokens, chunked = _token_budget(workload, notes)
    seq_cap = workload.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    memory, fraction, formula = _memory(shape, fmt, target, workload, tokens, seq_cap)
    per_block = memory.kv_bytes_per_token * TOKENS_PER_BLOCK
    kv_tokens = memory.kv_cache_bytes // per_block * TOKENS_PER_BLOCK if per_block else 0  # 0: no attention layer
    concurrency = memory.kv_cache_bytes // memory.kv_bytes_per_sequence
    fits = concurrency >= 1 and refusal is None and fraction > 0
    batch = min(concurrency, seq_cap)
    if batch > tokens:
        notes.append(f"TensorRT-LLM: max_batch_size lowered from {batch:,} to max_num_tokens {tokens:,} "
                     "(llm_args.py: max_batch_size should be <= max_num_tokens)")
        batch = tokens
    sharing = prefix_sharing(memory, shape, target, workload, TOKENS_PER_BLOCK, sliding=False,
                             attention=planned_stage_shape(shape, fmt, target).attention)
    args: list[tuple[str, str]] = []
    yaml = _config_yaml(shape, gpu, workload, fraction)
    if fits:
        args = _args(tp, batch, tokens, length, fraction, chunked, bool(yaml), target.pipeline_parallel_size)
        notes += _general_notes(shape, gpu, yaml)
        notes.append(prefix_sharing_note(sharing, workload, concurrency, batch, min(seq_cap, tokens),
                                         "TensorRT-LLM's KV cache block reuse (kv_cache_config."
                                         "enable_block_reuse, on by default)", "the command's --max_batch_size",
                                         TOKENS_PER_BLOCK))
        notes += pipeline_note(shape, target)
    reason = refusal or ("" if fits else _why_not(memory, kv_tokens, length))
    return EnginePlan(engine="trtllm", engine_version="", format=fmt.name, servable=refusal is None, fits=fits,
                      command=render_command(PROGRAM, tuple(args)) if fits else "", args=tuple(args), memory=memory,
                      kv_tokens=kv_tokens, max_concurrency=concurrency, max_num_seqs=batch if fits else 0,
                      token_budget=tokens, max_model_len=length, formula=formula, source=SOURCE, notes=tuple(notes),
                      reason=reason, config_yaml=yaml if fits else "",
                      extra={"free_gpu_memory_fraction": fraction},
                      shared_prefix_tokens=sharing.tokens if sharing else 0,
                      max_concurrency_shared_prefix=sharing.max_concurrency if sharing else None)


def _refusal(fmt: WeightFormat, notes: list[str], gpu=None) -> str | None:
    """Why TensorRT-LLM cannot take the format's checkpoint (WeightFormat.serving_on); its caveat goes to `notes`.
    It has no --quantization flag: it reads the quantization from its own checkpoint layout."""
    if fmt.bits >= 16:
        return None
    serving = fmt.serving_on("trtllm")
    if serving.note:
        notes.append(serving.note)
    if serving.refusal is None and serving.quantization is None and gpu is not None:
        from harness.capacity.common import capability_refusal  # FP8/FP4 kernels by compute capability

        return capability_refusal(serving, gpu, "TensorRT-LLM", fmt.name)
    return serving.refusal_at()


def _token_budget(workload: Workload, notes: list[str]) -> tuple[int, bool]:
    """(max_num_tokens, whether --enable_chunked_prefill is needed): a prompt longer than max_num_tokens is never
    scheduled without chunked prefill, which trtllm-serve leaves off by default."""
    tokens = workload.max_num_batched_tokens or DEFAULT_MAX_NUM_TOKENS
    if tokens >= workload.max_model_len:
        return tokens, False
    if workload.chunked_prefill:
        notes.append(f"TensorRT-LLM: --enable_chunked_prefill, since max_num_tokens {tokens:,} is below max_seq_len "
                     f"{workload.max_model_len:,} (trtllm-serve leaves chunked prefill off)")
        return tokens, True
    notes.append(f"TensorRT-LLM: max_num_tokens raised from {tokens:,} to max_seq_len {workload.max_model_len:,}: "
                 "without chunked prefill a longer prompt is never scheduled")
    return workload.max_model_len, False


def _memory(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, tokens: int,
            seq_cap: int) -> tuple[MemoryBreakdown, float, str]:
    costs = fixed_costs(shape, fmt, target, workload, tokens, seq_cap)
    tp, total, kv_bytes = costs.tp, costs.total, costs.kv_dtype_bytes
    weights, activation = costs.weights, costs.activation
    context, graphs = costs.non_torch, costs.graphs
    free = total - weights - activation - graphs - context
    if workload.kv_cache_free_gpu_memory_fraction is not None:
        fraction = workload.kv_cache_free_gpu_memory_fraction
    else:
        fraction = min(MAX_FRACTION, max(floor2((free - HEADROOM_BYTES) / free), 0.0)) if free > 0 else 0.0
    kv = max(int(fraction * free), 0)
    formula = (f"KV = free_gpu_memory_fraction {fraction:g} x ({gib(total)} - weights {gib(weights)} - activations "
               f"{gib(activation)} - CUDA graphs {gib(graphs)} - CUDA context {gib(context)} = free {gib(free)}) = "
               f"{gib(kv)}")
    attention = costs.attention
    per_token = kv_bytes_per_token(attention, kv_bytes, tp)
    capped = workload.max_tokens_in_paged_kv_cache
    if capped is not None and per_token and -(-capped // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK * per_token < kv:
        # KvCacheConfig: with both free_gpu_memory_fraction and max_tokens set, the smaller is used; max_tokens is
        # rounded up to whole blocks ("Allocated 52.51 GiB for max tokens in paged KV cache (860320)" for 860,308)
        kv = int(-(-capped // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK * per_token)
        formula += f"; max_tokens {capped:,} is smaller: {gib(kv)} (whole blocks of {TOKENS_PER_BLOCK})"
    memory = MemoryBreakdown(gpu_memory_bytes=total, weights_bytes=weights, activation_bytes=activation,
                             activation_source=costs.activation_source, weights_source=costs.weights_source,
                             non_torch_bytes=context, cuda_graph_bytes=graphs, headroom_bytes=max(free - kv, 0),
                             kv_cache_bytes=kv, kv_bytes_per_token=per_token,
                             kv_bytes_per_sequence=kv_bytes_per_sequence(attention, workload.max_model_len, kv_bytes,
                                                                         tp, block_size=TOKENS_PER_BLOCK,
                                                                         window_extra=TOKENS_PER_BLOCK))
    return memory, fraction, formula


def _config_yaml(shape: ModelShape, gpu: Gpu, workload: Workload, fraction: float) -> str:
    """Settings trtllm-serve has no flag for, as its --config YAML (empty when none are needed)."""
    lines = []
    if needs_half_dtype(shape, gpu):
        lines.append("dtype: float16")
    windows = max_attention_window(shape, workload.max_model_len)
    capped = workload.max_tokens_in_paged_kv_cache
    if workload.kv_cache_dtype == "fp8" or windows or capped:
        lines += ["kv_cache_config:", f"  free_gpu_memory_fraction: {fraction:.2f}"]
        if capped:  # KvCacheConfig.max_tokens: the smaller of it and the fraction's room is allocated
            lines.append(f"  max_tokens: {capped}")
        if workload.kv_cache_dtype == "fp8":
            lines.append("  dtype: fp8")
        if windows:
            lines.append(f"  max_attention_window: [{', '.join(str(w) for w in windows)}]")
    if workload.enforce_eager:
        lines.append("cuda_graph_config: null")
    return "\n".join(lines)


def max_attention_window(shape: ModelShape, max_seq_len: int) -> list[int]:
    """kv_cache_config.max_attention_window for a model with sliding-window or chunked layers: each layer's window
    (max_seq_len for full attention), as the shortest pattern TensorRT-LLM repeats over the layers to give them all;
    [] for a model whose layers all attend in full. Layers without a KV cache (a hybrid's Mamba layers) are not
    attention layers there and are left out."""
    windows = [min(w, max_seq_len) if w is not None else max_seq_len
               for w in shape.attention.windows if w != NO_KV]
    if not shape.attention.sliding_layers:
        return []
    period = next(p for p in range(1, len(windows) + 1)
                  if all(windows[i] == windows[i % p] for i in range(len(windows))))
    return windows[:period]


def _args(tp: int, batch: int, tokens: int, length: int, fraction: float, chunked: bool,
          extra: bool, pp: int = 1) -> list[tuple[str, str]]:
    args = [("--backend", "pytorch")]
    if tp > 1:
        args.append(("--tp_size", str(tp)))
    if pp > 1:
        args.append(("--pp_size", str(pp)))
    args += [("--max_batch_size", str(batch)), ("--max_num_tokens", str(tokens)), ("--max_seq_len", str(length)),
             ("--kv_cache_free_gpu_memory_fraction", f"{fraction:g}")]
    if chunked:
        args.append(("--enable_chunked_prefill", ""))
    if extra:
        args.append(("--config", EXTRA_CONFIG))
    return args


def _general_notes(shape: ModelShape, gpu: Gpu, yaml: str) -> list[str]:
    notes = ["TensorRT-LLM: kv_cache_config.free_gpu_memory_fraction is a fraction of the memory free after the "
             "weights and runtime buffers, not of the GPU (memory.md)"]
    if yaml:
        notes.append(f"TensorRT-LLM: {EXTRA_CONFIG} holds what trtllm-serve has no flag for: "
                     + "; ".join(line.strip() for line in yaml.splitlines()))
    if needs_half_dtype(shape, gpu):
        notes.append(half_dtype_note(gpu, "TensorRT-LLM", "dtype: float16"))
    if shape.attention.sliding_layers:
        notes.append(f"TensorRT-LLM: {shape.attention.sliding_layers} sliding-window layers hold at most their "
                     "window (+ one block) through kv_cache_config.max_attention_window in the --config YAML; "
                     "without it TensorRT-LLM keeps every layer's whole history")
    return notes


def _why_not(memory: MemoryBreakdown, kv_tokens: int, length: int) -> str:
    fixed = memory.fixed_bytes
    if memory.kv_cache_bytes <= 0:
        return (f"does not fit: weights {gib(memory.weights_bytes)}, runtime buffers and the CUDA context "
                f"({gib(fixed)} in all) leave less than the {gib(HEADROOM_BYTES)} headroom of "
                f"{gib(memory.gpu_memory_bytes)} free")
    return short_of_one_sequence(memory, kv_tokens, length)


def check_trtllm_command(command: str, config_yaml: str, shape: ModelShape, gpu: Gpu) -> list[str]:
    """The checks TensorRT-LLM runs on a printed trtllm-serve command and its --config YAML, as encoded here from
    llm_args.py and serve.py (module docstring); an empty list when it would accept them."""
    flags = parse_flags(command, 2)
    errors = [f"{flag}: not a flag this planner prints" for flag in flags if flag not in _FLAGS]
    fraction = float(flags["--kv_cache_free_gpu_memory_fraction"])
    batch, tokens, length = (int(flags[f]) for f in ("--max_batch_size", "--max_num_tokens", "--max_seq_len"))
    if not 0 < fraction <= 1:
        errors.append(f"free_gpu_memory_fraction {fraction}: must be in (0, 1]")
    if min(batch, tokens, length) < 1:
        errors.append("max_batch_size, max_num_tokens and max_seq_len must be >= 1")
    if batch > tokens:
        errors.append(f"max_batch_size [{batch}] should be less than or equal to max_num_tokens [{tokens}]")
    if tokens < length and "--enable_chunked_prefill" not in flags:
        errors.append(f"max_num_tokens {tokens} < max_seq_len {length} without --enable_chunked_prefill")
    if shape.max_len and length > shape.max_len:
        errors.append(f"max_seq_len {length} exceeds the model's {shape.max_len}")
    if flags.get("--backend") != "pytorch":
        errors.append("--backend: planned for the pytorch backend")
    try:
        check_split(shape, int(flags.get("--tp_size", 1)), int(flags.get("--pp_size", 1)))
    except TensorParallelError as exc:
        errors.append(str(exc))
    if needs_half_dtype(shape, gpu) and "dtype: float16" not in config_yaml:
        errors.append("Pre SM 80 GPUs do not support bfloat16")
    if "dtype: fp8" in config_yaml and has_capability(gpu, FP8_MIN_CC) is False:
        errors.append(f"an fp8 KV cache needs compute capability {FP8_MIN_CC}")
    if bool(config_yaml) != ("--config" in flags):
        errors.append("--config and its YAML go together")
    return errors
