"""What every engine planner takes (target, workload) and gives (an EnginePlan), and what they share: the
--quantization value and kernel choice, the dtype a GPU needs, commands as flags."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from harness.flags import flag_pairs
from harness.formats import EngineServing
from harness.capacity.gpus import BF16_MIN_CC, FP8_MIN_CC, KERNEL_MIN_CC, MARLIN_MIN_CC, Gpu, has_capability
from harness.units import format_bytes
from harness.capacity.memory import (TensorParallelError, WeightFormat, activation_peak_bytes,
                                             check_split, cuda_graph_bytes, kv_dtype_bytes, kv_heads_per_gpu,
                                             loaded_stage, planned_weights_bytes, shared_prefix_bytes,
                                             workload_non_torch)
from harness.capacity.registry import engine_title
from harness.capacity.shapes import Attention, ModelShape, pipeline_stage

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's and our cap on concurrent sequences unless --max-num-seqs says otherwise
# vLLM's marlin_utils: output width per GPU divisible by GPTQ_MARLIN_MIN_THREAD_N, input width by _MIN_THREAD_K.
MARLIN_MIN_THREAD_N, MARLIN_MIN_THREAD_K = 64, 128
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)


@dataclass(frozen=True)
class Target:
    """`num_gpus` x `pipeline_parallel_size` GPUs of one kind: each pipeline stage's layers split over `num_gpus`
    (the tensor-parallel degree); the plans size the most-loaded GPU of the engine's own split of the layers
    (with_engine_split; shapes.pipeline_stage's bound where no split is known)."""

    gpu: Gpu
    num_gpus: int = 1  # tensor-parallel degree
    pipeline_parallel_size: int = 1  # pipeline stages
    # the decoder layers of each stage as the engine splits them (vLLM: vllm_versions.pp_layer_partition); None:
    # the engine's split is not modelled and the most-loaded stage is bounded (shapes.pipeline_stage)
    layer_partition: tuple[int, ...] | None = None
    planned_stage: int | None = None  # with a layer_partition, plan this stage's GPU (0: the first); None: the heaviest

    @property
    def total_gpus(self) -> int:
        """GPUs the deployment takes: tensor x pipeline parallel size (vLLM needs that many available)."""
        return self.num_gpus * self.pipeline_parallel_size


@dataclass(frozen=True)
class Workload:
    """What the deployment asks for. None: the engine's own default."""

    max_model_len: int
    max_num_batched_tokens: int | None = None  # vLLM's token budget, SGLang's chunked prefill, TRT-LLM's max_num_tokens
    max_num_seqs: int | None = None  # cap on concurrent sequences (default DEFAULT_MAX_NUM_SEQS)
    kv_cache_dtype: str = "auto"  # auto (the model's 16-bit dtype) or fp8
    chunked_prefill: bool = True
    enforce_eager: bool = False  # no CUDA graphs
    # A measured activation peak per GPU: from a profile forward of activation_tokens tokens over
    # activation_sequences sequences (harness.measure.profile), which each planner scales to its own token budget
    # (measured_activation); without activation_tokens, a figure at the engine's budget, used as it is.
    activation_bytes: int | None = None
    activation_tokens: int | None = None
    activation_sequences: int | None = None
    # Measured weights of one whole copy (as a run loads them, 16-bit serving size); None: estimated from the config.
    # Under tensor and pipeline parallelism it is split as the estimate splits (memory.planned_weights_bytes).
    weights_bytes: int | None = None
    # Measured CUDA context + non-torch memory per GPU (what vLLM logs as non_torch_memory); None: the estimate
    # memory.non_torch_bytes.
    non_torch_bytes: int | None = None
    # Tokens that open every request alike (a system prompt, few-shot examples): the engines' prefix caches (on by
    # default in all three) keep their whole blocks once. 0: none counted.
    shared_prefix_tokens: int = 0
    shared_prefix_source: str = ""  # where the figure comes from, for the note ("--shared-prefix-tokens", ...)
    # Memory flags a deployment already sets (None: the engine's own default, or the plan's choice):
    # SGLang's --mem-fraction-static; TensorRT-LLM's kv_cache_free_gpu_mem_fraction and max_tokens_in_paged_kv_cache.
    mem_fraction_static: float | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    max_tokens_in_paged_kv_cache: int | None = None
    # SGLang's --enable-dp-attention --dp N: attention (its weights and KV heads) over tp / N GPUs, the rest over tp.
    dp_attention: int = 1


@dataclass(frozen=True)
class MemoryBreakdown:
    """One GPU's memory under an engine plan, bytes. kv_cache_bytes = what the engine's formula leaves for KV."""

    gpu_memory_bytes: int
    weights_bytes: int
    activation_bytes: int
    # "estimated from the config", "measured (profile forward of N tokens over S sequences[, scaled ...])", or
    # "measured" (a figure given without the tokens it was measured at)
    activation_source: str
    non_torch_bytes: int
    cuda_graph_bytes: int
    headroom_bytes: int  # memory the plan leaves unclaimed
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    weights_source: str = "estimated from the config"  # or "measured" (Workload.weights_bytes)

    @property
    def fixed_bytes(self) -> int:
        """What comes before the KV cache: weights, activations, non-torch memory and CUDA graphs."""
        return self.weights_bytes + self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes


def with_engine_split(target: Target, shape: ModelShape, split: Callable[[int, int], tuple[int, ...]]) -> Target:
    """`target` with the engine's own decoder layers per pipeline stage, split(layers, pipeline stages), where it
    runs pipeline parallel and gives no split of its own (an explicit VLLM_PP_LAYER_PARTITION, a stage's plan):
    every plan then sizes the engine's most-loaded real stage."""
    if target.pipeline_parallel_size == 1 or target.layer_partition is not None:
        return target
    return replace(target, layer_partition=split(shape.layers, target.pipeline_parallel_size))


def planned_stage_shape(shape: ModelShape, fmt: WeightFormat, target: Target) -> ModelShape:
    """The part of the model the planned GPU holds: the whole model, or its pipeline stage (memory.loaded_stage:
    the target's split's heaviest stage or its planned_stage; shapes.pipeline_stage's bound without a split)."""
    return loaded_stage(shape, fmt, target.num_gpus, target.pipeline_parallel_size, target.layer_partition,
                        target.planned_stage)


def pipeline_note(shape: ModelShape, target: Target) -> list[str]:
    """The note of a pipeline-parallel plan, the same for every engine ([] without pipeline parallelism)."""
    pp = target.pipeline_parallel_size
    if pp == 1:
        return []
    deployment = f"pipeline parallel over {pp} stages ({target.total_gpus} GPUs: tensor parallel {target.num_gpus} x " \
                 f"pipeline parallel {pp})"
    if target.layer_partition is not None:
        split = "/".join(map(str, target.layer_partition))
        which = "the most-loaded GPU's stage" if target.planned_stage is None else f"stage {target.planned_stage}"
        return [f"{deployment}: the engine splits the {shape.layers} layers {split}; the figures are {which}'s, its "
                "own layers' weights and KV cache (the embedding on the first stage, the lm_head on the last)"]
    kept = pipeline_stage(shape, pp).layers
    largest = " (those with the largest KV: full attention first)" if shape.attention.sliding_layers else ""
    return [f"{deployment}: the figures are the most-loaded GPU's, {kept} of {shape.layers} layers' weights "
            f"and KV cache{largest} and, conservatively, both the embedding and the lm_head"]


@dataclass(frozen=True)
class PrefixSharing:
    """What a shared prompt prefix, kept once by an engine's prefix cache, does to one plan."""

    tokens: int  # the workload's shared prefix (capped below max_model_len)
    shared_bytes: int  # KV of its whole blocks, stored once
    max_concurrency: int  # sequences of max_model_len that fit with it (the plan's max_concurrency without)


def prefix_sharing(memory: MemoryBreakdown, shape: ModelShape, target: Target, workload: Workload, block_size: int,
                   *, sliding: bool = True, attention: Attention | None = None) -> PrefixSharing | None:
    """The plan's concurrency when every request opens with the workload's shared prefix: the KV cache holds the
    prefix's whole blocks once and each sequence's own tokens beside them,
        n = (KV - shared) // (one sequence - shared).
    None without a shared prefix, or one shorter than a block (nothing is shared then)."""
    tokens = min(workload.shared_prefix_tokens, workload.max_model_len - 1)
    if attention is None:  # the most-loaded GPU's layers
        attention = pipeline_stage(shape, target.pipeline_parallel_size).attention
    shared = shared_prefix_bytes(attention, tokens, kv_dtype_bytes(workload.kv_cache_dtype), target.num_gpus,
                                 block_size=block_size, sliding=sliding)
    if tokens <= 0 or shared <= 0:
        return None
    if memory.kv_cache_bytes < memory.kv_bytes_per_sequence:
        return PrefixSharing(tokens, shared, 0)
    return PrefixSharing(tokens, shared,
                         (memory.kv_cache_bytes - shared) // (memory.kv_bytes_per_sequence - shared))


def prefix_sharing_note(sharing: PrefixSharing | None, workload: Workload, concurrency: int, command_sets: int,
                        cap: int, cache: str, setting: str, block_size: int) -> str:
    """The plan's note on prefix caching (`cache` names the engine's, with its default): what the workload's shared
    prefix adds to the concurrency, or that none was counted."""
    if sharing is None:
        shared = (f"the workload's shared prefix ({workload.shared_prefix_tokens:,} tokens) is shorter than one "
                  f"{block_size}-token block, so nothing is shared" if workload.shared_prefix_tokens > 0 else
                  "no shared prefix was counted (--shared-prefix-tokens gives one)")
        return (f"{cache} keeps a prefix that requests share (a system prompt, few-shot examples) once; {shared}, "
                "and every sequence's KV counts in full")
    source = f" ({workload.shared_prefix_source})" if workload.shared_prefix_source else ""
    blocks = sharing.tokens // block_size
    kept = ("token by token" if block_size == 1 else
            f"{blocks:,} whole {block_size}-token block{'s' if blocks != 1 else ''}")
    note = (f"{cache} keeps the {sharing.tokens:,} tokens every request opens with{source} once, {kept}, "
            f"{gib(sharing.shared_bytes)}: {sharing.max_concurrency:,} sequences of {workload.max_model_len:,} "
            f"tokens fit when every request shares them, {concurrency:,} when none does")
    higher = min(sharing.max_concurrency, cap)
    if higher > command_sets:
        return (note + f"; {setting} {command_sets:,} assumes none does, which holds for any traffic; "
                f"{higher:,} when all traffic opens with this prefix")
    return note + f"; {setting} {command_sets:,} is reached either way"


def short_of_one_sequence(memory: MemoryBreakdown, kv_tokens: int, length: int, cache: str = "KV cache") -> str:
    """The reason when the KV cache exists but holds less than one sequence of `length` tokens."""
    return (f"does not fit: the {cache} gets {gib(memory.kv_cache_bytes)} ({kv_tokens:,} tokens), less than one "
            f"sequence of {length:,} tokens ({gib(memory.kv_bytes_per_sequence)})")


@dataclass(frozen=True)
class EnginePlan:
    """One engine's settings for one format on one target, and the numbers behind them.

    servable False: the engine cannot serve this format on this target at all (reason says why); fits False: it
    could, but not even one sequence of max_model_len fits (reason says why and what would). command is empty then.
    """

    engine: str  # vllm, sglang, trtllm
    engine_version: str  # the rules followed, e.g. "0.34"; "" where not versioned
    format: str
    servable: bool
    fits: bool
    command: str
    args: tuple[tuple[str, str], ...]  # (flag, value) in print order; value "" for a bare flag
    memory: MemoryBreakdown | None
    kv_tokens: int
    max_concurrency: int  # sequences of max_model_len the KV cache holds
    max_num_seqs: int  # what the command sets (vLLM --max-num-seqs, SGLang --max-running-requests, TRT max_batch_size)
    token_budget: int
    max_model_len: int
    formula: str  # the engine's KV formula with this plan's numbers
    source: str  # the engine file the planner follows
    notes: tuple[str, ...] = ()
    reason: str = ""
    config_yaml: str = ""  # TensorRT-LLM: settings its CLI has no flag for (pass with --config)
    gpu_memory_utilization: float | None = None  # vLLM's, when the command sets it
    extra: dict = field(default_factory=dict)
    shared_prefix_tokens: int = 0  # the workload's shared prefix, tokens (0: none counted)
    # Sequences of max_model_len the KV cache holds when every request opens with that prefix, kept once by the
    # engine's prefix cache; None without a shared prefix. max_concurrency counts every sequence in full.
    max_concurrency_shared_prefix: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def arg(self, flag: str) -> str | None:
        return dict(self.args).get(flag)


def render_command(program: str, args: tuple[tuple[str, str], ...]) -> str:
    return " ".join([program, *(f"{flag} {shlex.quote(value)}" if value else flag for flag, value in args)])


def parse_flags(command: str, program_words: int) -> dict[str, str]:
    """--flag value pairs of a printed command after its first `program_words` words ("" for a bare flag)."""
    try:
        return dict(flag_pairs(shlex.split(command)[program_words:], strict=True))
    except ValueError as exc:
        raise ValueError(f"{exc} in {command!r}") from None


def floor2(value: float) -> float:
    """Round down to two decimals (a fraction flag that must not claim more than computed)."""
    return math.floor(round(value * 10000, 6) / 100) / 100


def gib(size: float) -> str:
    """A plan's sizes: GiB from a tenth of one ('0.50 GiB'), MiB below."""
    return format_bytes(size, smallest="MiB", from_fraction=0.1)


def needs_half_dtype(shape: ModelShape, gpu: Gpu) -> bool:
    """A bf16 (or unspecified, hence bf16) checkpoint on a GPU without bf16: the engines refuse it unless told fp16."""
    dtype = str(shape.torch_dtype or "bfloat16")
    return dtype in ("bfloat16", "bf16") and has_capability(gpu, BF16_MIN_CC) is False


def half_dtype_note(gpu: Gpu, engine: str, setting: str) -> str:
    return (f"{engine}: {setting}: {gpu.name} has no bf16 (compute capability {gpu.compute_capability:.1f} < "
            f"{BF16_MIN_CC:.1f}), so the bf16 checkpoint runs in fp16; judge it in fp16 too (fp16 can overflow)")


def fp8_kv_refusal(gpu: Gpu, workload: Workload, engine: str) -> str | None:
    """Why an fp8 KV cache cannot be planned on this GPU (None: it can, or the GPU is unknown)."""
    if workload.kv_cache_dtype == "fp8" and has_capability(gpu, FP8_MIN_CC) is False:
        return (f"{engine}: an fp8 KV cache needs compute capability {FP8_MIN_CC} (FP8); {gpu.name} has "
                f"{gpu.compute_capability:.1f}: use --kv-cache-dtype auto")
    return None


def marlin_shape_problem(shape: ModelShape, fmt: WeightFormat, tp: int) -> str | None:
    """Why vLLM/SGLang's Marlin kernels cannot take this model's 4-bit layers (None: they can).

    vllm/model_executor/layers/quantization/utils/marlin_utils.py::verify_marlin_supports_shape: per GPU, output
    width divisible by 64, input width by 128 and, when grouped, by the group size; group size -1, 32, 64 or 128.
    """
    group = fmt.group_size if fmt.group_size and fmt.group_size > 0 else -1
    if group not in MARLIN_GROUP_SIZES:
        return f"group size {group} (Marlin takes {', '.join(map(str, MARLIN_GROUP_SIZES[1:]))} or per-column)"
    for lin in shape.linears:
        if not lin.quantized:
            continue
        inputs = lin.in_features // tp if lin.split == "row" else lin.in_features
        if lin.split == "kv":
            outputs = kv_heads_per_gpu(shape.attention, tp) * shape.attention.head_dim
        else:
            outputs = lin.out_features // tp if lin.split == "column" else lin.out_features
        if outputs % MARLIN_MIN_THREAD_N or inputs % MARLIN_MIN_THREAD_K or (group > 0 and inputs % group):
            by_group = f" and by the group size {group}" if group > 0 else ""
            return (f"{lin.name} is {inputs} x {outputs} per GPU (Marlin needs inputs divisible by "
                    f"{MARLIN_MIN_THREAD_K}{by_group}, outputs by {MARLIN_MIN_THREAD_N})")
    return None


def quantization_method(shape: ModelShape, fmt: WeightFormat, gpu: Gpu, tp: int, key: str, methods: frozenset[str],
                        notes: list[str], version: str = "") -> tuple[str | None, str | None]:
    """(--quantization value or None, why engine `key` cannot serve the format here or None), from how the format
    says the engine takes it (WeightFormat.serving_on): a 16-bit checkpoint needs no value; the format's own refusal
    (at `version`), or a value the engine does not have (`methods`), makes it unservable; else kernel_method
    chooses. The format's note and the kernel choice's go to `notes`."""
    if fmt.bits >= 16:
        return None, None
    engine = engine_title(key)
    release = None
    if version:  # the engine release's own support for the scheme (EngineServing.since and its fallback's)
        from harness.capacity.vllm_versions import parse_release

        release = parse_release(version)
        release += (99,) * (len(release) == 2)  # a minor alone means its newest release, as rules_for reads it
    serving = fmt.serving_on(key).at(release, engine, fmt.name)
    if serving.refusal:
        return None, serving.refusal_at(version)
    if serving.quantization is None:  # the engine reads the scheme from the checkpoint's quantization_config
        from harness.capacity.checkpoint import block_split_problem

        why = capability_refusal(serving, gpu, engine, fmt.name, version)
        if why:
            return None, why
        split = block_split_problem(shape, fmt, tp)
        if split:
            return None, (f"{engine}: {split}; serve it on a tensor-parallel size that keeps whole blocks, or with "
                          "expert parallelism (vLLM --enable-expert-parallel), which quantgate does not plan")
        if serving.note:
            notes.append(serving.note)
        tier = capability_tier(serving, gpu, engine)
        if tier:
            notes.append(tier)
        return None, None
    if serving.quantization not in methods:
        return None, f"{engine} {version}".strip() + f" has no --quantization {serving.quantization}"
    if serving.note:
        notes.append(serving.note)
    method, note = kernel_method(shape, fmt, serving, gpu, tp, engine, marlin_capability(key, release))
    if method is None:
        return None, note
    if note:
        notes.append(note)
    return method, None


def scheme_from_checkpoint(fmt: WeightFormat, engine: str) -> bool:
    """Whether `engine` takes this quantized format with no --quantization flag, reading the scheme from the
    checkpoint's quantization_config (FP8, NVFP4, MXFP4: harness.formats)."""
    serving = fmt.serving_on(engine)
    return fmt.bits < 16 and serving.quantization is None and serving.refusal is None


def capability_refusal(serving: EngineServing, gpu: Gpu, engine: str, format_name: str,
                       version: str = "") -> str | None:
    """Why the engine's kernels for a format read from the checkpoint do not run on this GPU (None: they do, or
    the GPU is unknown): below serving.min_capability (the native kernels' or the weight-only fallback's, as
    engine release `version` has them: EngineServing.at), and what a newer release adds (serving.later)."""
    minimum = serving.min_capability
    if minimum is None or has_capability(gpu, minimum) is not False:
        return None
    fallback = (f"; its {serving.fallback} needs {minimum:.1f}" if serving.fallback and serving.native_capability
                else "")
    native = serving.native_capability or minimum
    later = f"; {serving.later}" if serving.later else ""
    return (f"{gpu.name} has compute capability {gpu.compute_capability:.1f}; {f'{engine} {version}'.strip()}'s "
            f"{format_name} kernels need {native:.1f}{fallback}{later}")


def capability_tier(serving: EngineServing, gpu: Gpu, engine: str) -> str | None:
    """A note when the GPU runs the format through the engine's weight-only fallback rather than natively."""
    native = serving.native_capability
    if not native or not serving.fallback:
        return None
    if has_capability(gpu, native) is False:
        return (f"{engine} on {gpu.name} (compute capability {gpu.compute_capability:.1f} < {native:.1f}): "
                f"{serving.fallback}, weights stay quantized, activations 16-bit; memory as planned, slower than "
                "the native kernels")
    if has_capability(gpu, native) is None:
        return f"{engine}: natively on compute capability {native:.1f}+, else {serving.fallback} (--target-gpu says)"
    return None


# vLLM's 4-bit Marlin (gptq_marlin, awq_marlin) runs from compute capability 7.5 (Turing) since 0.14
# (quantization/utils/marlin_utils.py query_marlin_supported_quant_types: `< 75` at v0.14.0, `< 80` at v0.13.0).
VLLM_TURING_MARLIN_SINCE = (0, 14)
TURING_MARLIN_CC = 7.5


def marlin_capability(key: str, release: tuple[int, ...] | None) -> float:
    """The compute capability engine `key`'s 4-bit Marlin kernels need at `release` (None: the newest)."""
    if key == "vllm" and (release is None or release >= VLLM_TURING_MARLIN_SINCE):
        return TURING_MARLIN_CC
    return MARLIN_MIN_CC


def kernel_method(shape: ModelShape, fmt: WeightFormat, serving: EngineServing, gpu: Gpu, tp: int,
                  engine: str, marlin_min_cc: float = MARLIN_MIN_CC) -> tuple[str | None, str | None]:
    """The --quantization value on this GPU (serving.quantization or its Marlin variant) and a note (None: nothing
    to say); (None, why) when none of its kernels runs on the GPU (KERNEL_MIN_CC).

    With a Marlin variant (gptq_marlin, awq_marlin), Marlin is the fast path on compute capability >= marlin_min_cc
    (8.0; 7.5 in vLLM from 0.14) when the shapes allow it; naming plain gptq/awq there forces the slower kernel.
    Plain AWQ needs 7.5, plain GPTQ 6.0 (vLLM's get_min_capability()). An unknown GPU gets the plain name, which
    every CUDA GPU from those capabilities runs.
    """
    method = serving.quantization
    minimum = serving.min_capability or KERNEL_MIN_CC.get(method, 0.0)
    if not serving.marlin:
        if has_capability(gpu, minimum) is False:
            return None, _kernels_need(gpu, engine, method, minimum)
        return method, None
    marlin = has_capability(gpu, marlin_min_cc)
    if marlin is None:
        return method, (f"{engine}: --quantization {method} runs on any CUDA GPU of compute capability "
                        f"{minimum:.1f}+; on {marlin_min_cc:.1f}+ {method}_marlin is the fast path (--target-gpu "
                        "picks it)")
    problem = marlin_shape_problem(shape, fmt, tp)
    if marlin and problem is None:
        return f"{method}_marlin", (f"{engine}: {method}_marlin, the Marlin 4-bit kernel (compute capability "
                                    f"{marlin_min_cc:.1f}+)")
    if not has_capability(gpu, minimum):
        return None, _kernels_need(gpu, engine, method, minimum)
    why = problem if marlin else f"Marlin needs compute capability {marlin_min_cc:.1f}"
    return method, f"{engine}: plain {method} kernel, not Marlin: {why}"


def _kernels_need(gpu: Gpu, engine: str, method: str, minimum: float) -> str:
    return (f"{gpu.name} has compute capability {gpu.compute_capability:.1f}; {engine}'s {method} kernels need "
            f"{minimum:.1f}")


@dataclass(frozen=True)
class FixedCosts:
    """One GPU's memory before the KV cache, where every engine planner starts, bytes: the weights, the activation
    peak at the engine's token budget (measured, else estimated from the config), the CUDA context and non-torch
    memory, the CUDA-graph pool. Under pipeline parallelism, of the most-loaded GPU: `attention` is its stage's
    layers' (planned_stage_shape), which the KV cache helpers take."""

    tp: int
    attention: Attention
    total: int  # the GPU's memory
    kv_dtype_bytes: float
    weights: int
    weights_source: str
    activation: int
    activation_source: str
    non_torch: int
    graphs: int


def fixed_costs(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, tokens: int,
                seq_cap: int) -> FixedCosts:
    """`shape` is the whole model's; the weights and the KV cache's layers are those of the most-loaded pipeline
    stage (the activation peak is one layer's at a time, and the sampler's, so the whole model's)."""
    tp, pp = target.num_gpus, target.pipeline_parallel_size
    weights, weights_source = planned_weights_bytes(shape, fmt, tp, workload.weights_bytes, pp=pp,
                                                    partition=target.layer_partition, stage=target.planned_stage)
    if workload.activation_bytes is not None:
        activation, activation_source = measured_activation(workload, tokens)
    else:
        activation = activation_peak_bytes(shape, tokens, min(seq_cap, tokens), tp=tp)
        activation_source = "estimated from the config"
    stage = planned_stage_shape(shape, fmt, target)
    return FixedCosts(tp, stage.attention, target.gpu.memory_bytes, kv_dtype_bytes(workload.kv_cache_dtype),
                      weights, weights_source, activation, activation_source,
                      workload_non_torch(workload, target.total_gpus), cuda_graph_bytes(workload.enforce_eager))


def measured_activation(workload: Workload, tokens: int) -> tuple[int, str]:
    """(the workload's measured activation peak at an engine's token budget of `tokens`, where it comes from).

    A profile forward measured at workload.activation_tokens is used as it is at that budget and scaled linearly to
    any other: the buffers that dominate a forward (the MLP's gate/up output and activated product, the residual
    stream, norms and attention projections) hold a fixed number of bytes per token, so the peak is proportional
    to the tokens of the forward. The sampler's logits (one row per sequence) are not, so the scaled figure is an
    approximation there. Without activation_tokens the figure is taken to be at the budget already ("measured")."""
    measured = int(workload.activation_bytes)
    at = workload.activation_tokens
    if not at:
        return measured, "measured"
    over = f" over {workload.activation_sequences:,} sequences" if workload.activation_sequences else ""
    source = f"profile forward of {at:,} tokens{over}"
    if at == tokens:
        return measured, f"measured ({source})"
    return int(round(measured * tokens / at)), f"measured ({source}, scaled linearly to {tokens:,} tokens)"


def device_errors(flags: dict[str, str], shape: ModelShape, gpu: Gpu, tp: int, *, bf16_message: str,
                  kv_cache_dtypes: tuple[str, ...], pp: int = 1) -> list[str]:
    """What every engine refuses on a device: KV heads that do not split over `tp`, more pipeline stages `pp` than
    layers, bf16 on a GPU without it, a KV cache dtype it does not know (`kv_cache_dtypes`, the engine's own list) or
    cannot run."""
    errors = []
    try:
        check_split(shape, tp, pp)
    except TensorParallelError as exc:
        errors.append(str(exc))
    if needs_half_dtype(shape, gpu) and flags.get("--dtype") not in ("half", "float16"):
        errors.append(bf16_message)
    kv_dtype = flags.get("--kv-cache-dtype", "auto")
    if kv_dtype not in kv_cache_dtypes:
        errors.append(f"--kv-cache-dtype {kv_dtype}: not one of {', '.join(kv_cache_dtypes)}")
    elif kv_dtype != "auto" and has_capability(gpu, FP8_MIN_CC) is False:
        errors.append(f"--kv-cache-dtype {kv_dtype} needs compute capability {FP8_MIN_CC}")
    return errors

