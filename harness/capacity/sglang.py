"""SGLang's launch flags from the memory model (--mem-fraction-static, --max-running-requests, --context-length,
--chunked-prefill-size), and the argument checks SGLang runs on them.

Memory, following python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py::profile_max_num_token (the pool
sized in srt/mem_cache/kv_cache_configurator.py): after loading the weights SGLang gives the KV pool
    rest = free memory after loading - total x (1 - mem_fraction_static)
and free memory after loading = total - weights - CUDA context, so
    mem_fraction_static = (weights + CUDA context + KV pool) / GPU memory.
The rest, total x (1 - mem_fraction_static), must hold the activations at --chunked-prefill-size tokens and the CUDA
graphs; the plan takes the deployment's --mem-fraction-static, else the one SGLang sets itself by GPU memory
(sglang_mem_fraction_static, server_args.py::_handle_gpu_memory_settings), notes when that rest is short of its
estimate, and gives the pool SGLang's formula gives for it. Page size 1: the pool holds pool // cell_size tokens, cell
size = the KV bytes per token (MLA: the latent). Sliding-window and chunked layers (the per-sequence sizing is
_pools) are kept whole in that one pool, except for the models model_config.py::is_hybrid_swa_model names
(GptOssForCausalLM, Llama4ForConditionalGeneration), which get SWAKVPool: full_tokens = pool / (F + r x S) with F, S
the full and sliding layers' bytes per token and r = --swa-full-tokens-ratio (0.8), the sliding pool r x
full_tokens, a sequence holding its whole length in the first and at most window + a prefill chunk in the second
(model_runner_kv_cache_mixin.py::set_num_tokens_hybrid_swa). Hybrid Mamba / linear-attention models
(handle_max_mamba_cache): the rest is split mamba_full_memory_ratio (0.9) : 1 between the recurrent state pool (state
per request in --mamba-ssm-dtype float32, conv bf16) and the KV pool of the attention layers only, and
init_memory caps running requests at the state slots / 3 (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, radix
cache on).
The radix cache (on unless --disable-radix-cache, srt/mem_cache/radix_cache.py) keeps a prefix requests share once,
token by token (page size 1): common.prefix_sharing counts it.
The checks (check_sglang_command) are server_args.py's: chunked_prefill_size % page_size == 0, context_length
within the model's, a --quantization among its QUANTIZATION_CHOICES, the dtype and head split the GPU allows.
Pipeline parallelism: --pp-size (server_args.py's pp_size; alias --pipeline-parallel-size); the memory is the
most-loaded GPU's of SGLang's own split (sglang_pp_layer_partition; the models build the embedding on the first
stage and the final norm and lm_head on the last, a tied lm_head there as its own copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from harness.capacity.common import (DEFAULT_MAX_NUM_SEQS, EnginePlan, MemoryBreakdown, Target, Workload,
                                             device_errors, fixed_costs, fp8_kv_refusal, gib,
                                             half_dtype_note, marlin_shape_problem, needs_half_dtype, parse_flags,
                                             pipeline_note, planned_stage_shape, prefix_sharing, prefix_sharing_note,
                                             quantization_method, render_command, short_of_one_sequence,
                                             with_engine_split)
from harness.capacity.gpus import Gpu, has_capability
from harness.capacity.memory import (WeightFormat, check_split, kv_bytes_per_token,
                                             kv_layer_token_bytes, layer_state_bytes, loaded_stage, weights_bytes)
from harness.capacity.shapes import NO_KV, Attention, ModelShape

PROGRAM = "python -m sglang.launch_server --model-path MODEL"
SOURCE = ("python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py::profile_max_num_token; "
          "srt/mem_cache/kv_cache_configurator.py; srt/server_args.py")
PAGE_SIZE = 1
# The attention projections DP attention splits over tp / dp GPUs (GQA and MLA's; the names shapes.py gives them).
ATTENTION_PROJECTIONS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_a_proj", "q_b_proj",
                                   "kv_a_proj_with_mqa", "kv_b_proj"})
MAX_PREFILL_TOKENS = 16384  # server_args.py's --max-prefill-tokens default: a prefill batch without chunking
# Those of server_args.py's QUANTIZATION_CHOICES a quantgate format maps to.
QUANTIZATION_CHOICES = frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "bitsandbytes", "fp8", "w8a8_int8"})
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
SWA_FULL_TOKENS_RATIO = 0.8  # server_args.py's --swa-full-tokens-ratio default
HYBRID_SWA_TYPES = ("gpt_oss", "llama4", "llama4_text")  # model_config.py::is_hybrid_swa_model's architectures
MAMBA_FULL_MEMORY_RATIO = 0.9  # server_args.py's --mamba-full-memory-ratio default: state pool : KV pool
MAMBA_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO with the radix cache on
MAMBA_SSM_DTYPE_BYTES = 4  # server_args.py's --mamba-ssm-dtype default float32
_FLAGS = {"--model-path", "--tp-size", "--pp-size", "--dp-size", "--enable-dp-attention", "--dtype",
          "--context-length", "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size",
          "--kv-cache-dtype", "--disable-cuda-graph", "--quantization"}


def default_chunked_prefill_size(gpu: Gpu) -> int:
    """server_args.py's default by GPU memory: 2048 under 35 GiB (A10, L4, 4090), 4096 under 60 GiB (A100-40GB,
    L40S), 8192 under 160 GiB, else 16384 (SGLANG_MEMORY_BUCKETS)."""
    return _bucket(gpu)[1]


# server_args.py::_handle_gpu_memory_settings (sgl-project/sglang#10975 and later; the value sglang#29092 found, 0.828
# for Qwen3-32B on an H100): by the GPU's memory in MiB, the default --chunked-prefill-size and cuda_graph_max_bs
# (tp < 4, tp >= 4), then mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3) with reserved (MiB) =
# 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 x 1024 [+ 3 x cuda_graph_max_bs x dp with DP
# attention, + 1.5 x that again above 300] [+ 8 per piecewise CUDA-graph size], at least 10 GiB above 60 GiB.
SGLANG_MEMORY_BUCKETS = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (90, 8192, 256, 512),
                         (160, 8192, 256, 512), (math.inf, 16384, 512, 512))  # (below GiB, chunk, graph bs tp<4, >=4)
RESERVED_FLOOR_MIB = 10 * 1024  # above 60 GiB
MLA_PIECEWISE_MAX_TOKENS = 2048


def _bucket(gpu: Gpu) -> tuple[int, int, int, int]:
    mib = gpu.memory_bytes / 2**20
    return next(bucket for bucket in SGLANG_MEMORY_BUCKETS if mib < bucket[0] * 1024)


def piecewise_graph_sizes(max_tokens: int) -> int:
    """How many token counts server_args.py::_generate_piecewise_cuda_graph_tokens captures up to max_tokens (the
    list of the release sglang#29092 ran: 4..32 by 4, 48..256 by 16, 288..512 by 32, 640..4096 by 128, then by
    256)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(640, 4097, 128),
             *range(4352, max_tokens + 1, 256)]
    return sum(1 for size in sizes if size <= max_tokens)


def sglang_mem_fraction_static(gpu: Gpu, tp: int, pp: int = 1, chunk: int | None = None, mla: bool = False,
                               dp_size: int = 1) -> float:
    """The --mem-fraction-static SGLang sets itself when none is given (comment above SGLANG_MEMORY_BUCKETS).

    gpu_mem is the GPU's memory as torch reports it (SGLang reads nvidia-smi's total, about 0.5 GiB more on an H100:
    the value can come out 0.001 lower). Piecewise CUDA graphs are counted on NVIDIA GPUs, as the 0.828 of
    sglang#29092 has them; the ROCm run of sglang#18263 printed 0.911 on an MI355X, the value without them."""
    gpu_mem = gpu.memory_bytes / 2**20
    _, default_chunk, graph_small, graph_large = _bucket(gpu)
    chunk = chunk or default_chunk
    graph_bs = graph_small if tp < 4 else graph_large
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if dp_size > 1:
        reserved += graph_bs * dp_size * 3 + (graph_bs * dp_size * 1.5 if graph_bs > 300 else 0)
    if gpu.vendor == "nvidia":
        reserved += piecewise_graph_sizes(MLA_PIECEWISE_MAX_TOKENS if mla else chunk) * 8
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, RESERVED_FLOOR_MIB)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def sglang_pp_layer_partition(layers: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    """The decoder layers of each pipeline stage, first to last, as SGLang's get_pp_indices gives them without
    SGLANG_PP_LAYER_PARTITION (python/sglang/srt/distributed/utils.py: "the last N partitions will have one extra
    layer, where N = remainder"): layers // pp a stage and one more on each of the last layers % pp stages, the
    last stage included (unlike vLLM from 0.8). The file's first version, adapted from vLLM 0.6.4, put the whole
    remainder on the last stage."""
    pp = pipeline_parallel_size
    if not 1 <= pp <= layers:
        raise ValueError(f"{pp} pipeline stages for {layers} layers: between 1 and the number of layers")
    base, remainder = divmod(layers, pp)
    return tuple(base + (1 if i >= pp - remainder else 0) for i in range(pp))


def plan_sglang(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload) -> EnginePlan:
    """SGLang's flags for `fmt` on `target` (formula in the module docstring)."""
    gpu, tp, length = target.gpu, target.num_gpus, workload.max_model_len
    check_split(shape, tp, target.pipeline_parallel_size)
    target = with_engine_split(target, shape, sglang_pp_layer_partition)
    if workload.dp_attention < 1 or tp % workload.dp_attention:
        raise ValueError(f"--dp-size {workload.dp_attention}: SGLang's DP attention needs a divisor of --tp-size {tp}")
    notes: list[str] = []
    method, refusal = quantization_method(shape, fmt, gpu, tp, "sglang", QUANTIZATION_CHOICES, notes)
    refusal = refusal or fp8_kv_refusal(gpu, workload, "SGLang")
    chunk = workload.max_num_batched_tokens or default_chunked_prefill_size(gpu)
    prefill_tokens = chunk if workload.chunked_prefill else max(length, MAX_PREFILL_TOKENS)
    seq_cap = workload.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    memory, fraction, formula, pools = _memory(shape, fmt, target, workload, prefill_tokens, seq_cap)
    kv_tokens = pools.kv_tokens
    concurrency = memory.kv_cache_bytes // memory.kv_bytes_per_sequence
    fits = concurrency >= 1 and refusal is None and 0 < fraction < 1
    running = min(concurrency, seq_cap)
    sharing = prefix_sharing(memory, shape, target, workload, PAGE_SIZE, sliding=False,
                             attention=planned_stage_shape(shape, fmt, target).attention)
    args: list[tuple[str, str]] = []
    if fits:
        args = _args(shape, gpu, tp, workload, fraction, running, chunk, method, target.pipeline_parallel_size)
        notes += _general_notes(shape, workload, chunk, gpu)
        rest = memory.gpu_memory_bytes - int(fraction * memory.gpu_memory_bytes)
        if rest < memory.activation_bytes + memory.cuda_graph_bytes:
            notes.append(f"SGLang: --mem-fraction-static {fraction:g} leaves {gib(rest)} outside the static pool, "
                         f"less than the activations and CUDA graphs estimated here "
                         f"({gib(memory.activation_bytes + memory.cuda_graph_bytes)}): a lower value is safer")
        notes.append(prefix_sharing_note(sharing, workload, concurrency, running, seq_cap,
                                         "SGLang's radix cache (on by default)",
                                         "the command's --max-running-requests", PAGE_SIZE))
        notes += pipeline_note(shape, target)
    reason = refusal or ("" if fits else _why_not(memory, fraction, kv_tokens, length))
    return EnginePlan(engine="sglang", engine_version="", format=fmt.name, servable=refusal is None, fits=fits,
                      command=render_command(PROGRAM, tuple(args)) if fits else "", args=tuple(args), memory=memory,
                      kv_tokens=kv_tokens, max_concurrency=concurrency, max_num_seqs=running if fits else 0,
                      token_budget=chunk, max_model_len=length, formula=formula, source=SOURCE, notes=tuple(notes),
                      reason=reason, extra={"mem_fraction_static": fraction},
                      shared_prefix_tokens=sharing.tokens if sharing else 0,
                      max_concurrency_shared_prefix=sharing.max_concurrency if sharing else None)


def dp_attention_extra_bytes(shape: ModelShape, fmt: WeightFormat, tp: int, dp: int, pp: int = 1,
                             partition: tuple[int, ...] | None = None, stage: int | None = None) -> int:
    """Bytes a GPU holds beyond the tensor-parallel split under SGLang's DP attention (--enable-dp-attention --dp
    dp): the attention projections are split over attn_tp = tp / dp GPUs (layers/dp_attention.py), the MLP and
    experts over all tp, on the pipeline stage the plan sizes (memory.loaded_stage of the split `partition`).
    Embeddings and lm_head are left as tensor parallelism splits them."""
    if dp <= 1:
        return 0
    part = loaded_stage(shape, fmt, tp, pp, partition, stage)
    projections = tuple(lin for lin in part.linears if lin.name.rsplit(".", 1)[-1] in ATTENTION_PROJECTIONS)
    attention_only = replace(part, linears=projections)

    def linear_bytes(gpus: int) -> int:
        return weights_bytes(attention_only, fmt, gpus) - weights_bytes(replace(attention_only, linears=()), fmt, gpus)

    return linear_bytes(tp // dp) - linear_bytes(tp)


def _memory(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, prefill_tokens: int,
            seq_cap: int) -> tuple[MemoryBreakdown, float, str, Pools]:
    costs = fixed_costs(shape, fmt, target, workload, prefill_tokens, seq_cap)
    tp, total, kv_bytes = costs.tp, costs.total, costs.kv_dtype_bytes
    dp = workload.dp_attention
    weights = costs.weights + dp_attention_extra_bytes(shape, fmt, tp, dp, target.pipeline_parallel_size,
                                                       target.layer_partition, target.planned_stage)
    activation = costs.activation
    context, graphs = costs.non_torch, costs.graphs
    attention = costs.attention
    attn_tp = tp // dp  # KV heads per GPU follow the attention split
    if workload.mem_fraction_static is not None:
        fraction = workload.mem_fraction_static
        chosen = f"mem_fraction_static = {fraction:g} (--mem-fraction-static)"
    else:
        fraction = sglang_mem_fraction_static(target.gpu, tp, target.pipeline_parallel_size, prefill_tokens,
                                              attention.is_mla, dp)
        chosen = f"mem_fraction_static = {fraction:g} (SGLang's own for this GPU, server_args.py)"
    pool = max(int(fraction * total) - weights - context, 0)
    formula = (f"{chosen}; KV pool = {fraction:g} x {gib(total)} - weights {gib(weights)} - CUDA context "
               f"{gib(context)} = {gib(int(fraction * total) - weights - context)}")
    pools = sglang_pools(shape.model_type, attention, pool, workload.max_model_len, kv_bytes, attn_tp,
                         prefill_tokens)
    if pools.note:
        formula += f"; {pools.note}"
    memory = MemoryBreakdown(gpu_memory_bytes=total, weights_bytes=weights, activation_bytes=activation,
                             activation_source=costs.activation_source, weights_source=costs.weights_source,
                             non_torch_bytes=context, cuda_graph_bytes=graphs,
                             headroom_bytes=max(total - int(fraction * total) - activation - graphs, 0),
                             kv_cache_bytes=pool, kv_bytes_per_token=kv_bytes_per_token(attention, kv_bytes,
                                                                                        attn_tp),
                             kv_bytes_per_sequence=pools.per_sequence)
    return memory, fraction, formula, pools


@dataclass(frozen=True)
class Pools:
    """How SGLang divides the pool after the weights (module docstring): the full-attention tokens it holds
    (max_total_num_tokens, what it logs), and the bytes of the pool one running sequence of max_model_len takes
    once the pool is split as SGLang splits it, so that pool // per_sequence is the sequences that run at once."""

    kv_tokens: int
    per_sequence: int
    note: str = ""


def sglang_pools(model_type: str, attention: Attention, pool: int, length: int, kv_dtype_bytes: float, tp: int,
                 prefill_tokens: int) -> Pools:
    """SGLang's pools for a pool of `pool` bytes (module docstring): one token pool of every KV layer's cell, or the
    SWAKVPool's full and sliding pools, and a hybrid model's Mamba state pool beside them."""
    per_layer = kv_layer_token_bytes(attention, kv_dtype_bytes, tp)
    windows = [w for w in attention.windows if w != NO_KV]
    full, sliding = windows.count(None), len(windows) - windows.count(None)
    note = ""
    if model_type in HYBRID_SWA_TYPES and sliding:
        ratio, window = SWA_FULL_TOKENS_RATIO, max(w for w in windows if w is not None)
        cell = per_layer * (full + ratio * sliding)
        # a sequence holds all its tokens in the full pool and at most window + a prefill chunk in the r-times
        # smaller sliding pool: whichever runs out first bounds the sequences
        kv_sequence = cell * max(length, min(length, window + prefill_tokens) / ratio)
        note = (f"SWA pool: {full} full layers x {length:,} tokens and {sliding} sliding layers in a pool "
                f"{ratio:g} x the full one (--swa-full-tokens-ratio)")
    else:
        cell = per_layer * len(windows)  # sliding and chunked layers kept whole
        kv_sequence = cell * length
    state = sum(layer_state_bytes(replace(s, ssm_dtype_bytes=MAMBA_SSM_DTYPE_BYTES), tp) for s in attention.states)
    if not state:
        return Pools(int(pool // cell) if cell else 0, math.ceil(kv_sequence), note)
    kv_share = 1 / (1 + MAMBA_FULL_MEMORY_RATIO)
    slots = int(pool * (1 - kv_share)) // state
    per_sequence = max(kv_sequence / kv_share, MAMBA_SLOTS_PER_REQUEST * state / (1 - kv_share))
    note = ((note + "; " if note else "") +
            f"Mamba state pool {MAMBA_FULL_MEMORY_RATIO:g}/{1 + MAMBA_FULL_MEMORY_RATIO:g} of it: {slots:,} slots of "
            f"{gib(state)}, {slots // MAMBA_SLOTS_PER_REQUEST:,} running requests at most")
    return Pools(int(pool * kv_share // cell) if cell else 0, math.ceil(per_sequence), note)


def _args(shape: ModelShape, gpu: Gpu, tp: int, workload: Workload, fraction: float, running: int, chunk: int,
          method: str | None, pp: int = 1) -> list[tuple[str, str]]:
    args: list[tuple[str, str]] = []
    if tp > 1:
        args.append(("--tp-size", str(tp)))
    if pp > 1:
        args.append(("--pp-size", str(pp)))
    if workload.dp_attention > 1:
        args += [("--dp-size", str(workload.dp_attention)), ("--enable-dp-attention", "")]
    if needs_half_dtype(shape, gpu):
        args.append(("--dtype", "half"))
    args += [("--context-length", str(workload.max_model_len)), ("--mem-fraction-static", f"{fraction:g}"),
             ("--max-running-requests", str(running)),
             ("--chunked-prefill-size", str(chunk) if workload.chunked_prefill else "-1")]
    if workload.kv_cache_dtype == "fp8":
        args.append(("--kv-cache-dtype", "fp8_e4m3"))
    if workload.enforce_eager:
        args.append(("--disable-cuda-graph", ""))
    if method:
        args.append(("--quantization", method))
    return args


def _general_notes(shape: ModelShape, workload: Workload, chunk: int, gpu: Gpu) -> list[str]:
    notes = []
    if workload.chunked_prefill:
        notes.append(f"SGLang prefills in chunks of --chunked-prefill-size {chunk:,} tokens (its default on this GPU: "
                     f"{default_chunked_prefill_size(gpu):,})")
    if needs_half_dtype(shape, gpu):
        notes.append(half_dtype_note(gpu, "SGLang", "--dtype half"))
    if shape.attention.sliding_layers and shape.model_type in HYBRID_SWA_TYPES:
        notes.append(f"SGLang: {shape.attention.sliding_layers} sliding-window layers in its SWA memory pool, "
                     f"{SWA_FULL_TOKENS_RATIO:g} x the full layers' tokens (--swa-full-tokens-ratio)")
    elif shape.attention.sliding_layers:
        notes.append("SGLang: sliding-window layers kept whole in its one token pool, as full attention "
                     "(model_config.py::is_hybrid_swa_model does not give this architecture the SWA pool)")
    if shape.attention.states:
        notes.append(f"SGLang: {len(shape.attention.states)} recurrent layers' state in a Mamba pool "
                     f"{MAMBA_FULL_MEMORY_RATIO:g}:1 beside the KV pool (--mamba-full-memory-ratio), SSM state in "
                     "float32 (--mamba-ssm-dtype); at most a third of its slots run at once")
    return notes


def _why_not(memory: MemoryBreakdown, fraction: float, kv_tokens: int, length: int) -> str:
    if fraction <= 0:
        return (f"does not fit: activations {gib(memory.activation_bytes)}, CUDA graphs and headroom take the whole "
                f"{gib(memory.gpu_memory_bytes)}")
    if memory.kv_cache_bytes <= 0:
        return (f"does not fit: weights {gib(memory.weights_bytes)} and the CUDA context exceed the static part "
                f"({fraction:.2f} x {gib(memory.gpu_memory_bytes)}) that --mem-fraction-static may claim "
                "(SGLang: \"Not enough memory. Please try to increase --mem-fraction-static\")")
    return short_of_one_sequence(memory, kv_tokens, length, "KV pool")


def check_sglang_command(command: str, shape: ModelShape, fmt: WeightFormat, gpu: Gpu) -> list[str]:
    """The start-up checks SGLang runs on a printed launch_server command, as encoded here from server_args.py and
    model_runner (module docstring); an empty list when it would accept it."""
    flags = parse_flags(command, 3)
    errors = [f"{flag}: not a flag this planner prints" for flag in flags if flag not in _FLAGS]
    fraction, length = float(flags["--mem-fraction-static"]), int(flags["--context-length"])
    running, chunk = int(flags["--max-running-requests"]), int(flags["--chunked-prefill-size"])
    if not 0 < fraction < 1:
        errors.append(f"--mem-fraction-static {fraction}: must be in (0, 1)")
    if running < 1 or length < 1:
        errors.append("--max-running-requests and --context-length must be >= 1")
    if chunk > 0 and chunk % PAGE_SIZE:
        errors.append("chunked_prefill_size must be divisible by page_size")
    if chunk == 0 or chunk < -1:
        errors.append(f"--chunked-prefill-size {chunk}: a positive size, or -1 to disable")
    derived = shape.sglang_max_len or shape.max_len  # SGLang's own derivation (shapes.sglang_context_length)
    if derived and length > derived:
        errors.append(f"User-specified context_length ({length}) is greater than the derived context_length "
                      f"({derived})")
    method = flags.get("--quantization")
    if method is None and fmt.bits < 16:
        from harness.capacity.common import scheme_from_checkpoint  # FP8/FP4: read from the checkpoint

        if not scheme_from_checkpoint(fmt, "sglang"):
            errors.append(f"a {fmt.name} checkpoint needs --quantization")
    if method is not None and method not in QUANTIZATION_CHOICES:
        errors.append(f"--quantization {method}: not among SGLang's choices")
    tp = int(flags.get("--tp-size", 1))
    if method and method.endswith("_marlin") and (marlin_shape_problem(shape, fmt, tp) or
                                                  has_capability(gpu, 8.0) is False):
        errors.append(f"--quantization {method}: Marlin cannot take this model on {gpu.name}")
    errors += device_errors(flags, shape, gpu, tp, bf16_message="bf16 on a GPU without bf16: --dtype half",
                            kv_cache_dtypes=KV_CACHE_DTYPES, pp=int(flags.get("--pp-size", 1)))
    return errors
