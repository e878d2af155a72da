"""One memory model for every engine planner: weights per format, KV cache per token and per sequence, the
activation peak at an engine's token budget, and the engine overheads as fixed amounts.

All figures are bytes on one GPU: under tensor parallelism (`tp` GPUs) each function gives one GPU's share; under
pipeline parallelism (`pp` stages) the callers pass the most-loaded stage's shape (loaded_stage: the stage of the
engine's split with the most weights, or shapes.pipeline_stage's bound where the split is not known), and
planned_weights_bytes does so itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.formats import FORMAT_SPECS, EngineServing, FormatSpec
from harness.capacity.storage import (LinearStorage, StorageRule, is_expert, rule_for,  # noqa: F401
                                      unconverted_copies, with_storage)
from harness.capacity.shapes import (NO_KV, Attention, LayerState, Linear, ModelShape, pipeline_stage,
                                     pipeline_stages)

GIB = 2**30
MIB = 2**20
FP16_BYTES = 2
KV_DTYPE_BYTES = {"auto": 2, "fp8": 1}  # auto: the model's 16-bit dtype; fp8 (e4m3/e5m2): 1 byte per element

# Memory a GPU holds outside PyTorch's allocator: the CUDA context, cuBLAS/cuDNN workspaces. vLLM measures it at
# start-up and logs it as "non_torch_memory" (0.1-0.6 GiB on one GPU in its memory-profiling log lines); the CUDA
# context alone is 0.3-0.5 GiB on Ampere/Hopper. With tensor or pipeline parallelism NCCL's buffers add to it.
NON_TORCH_BYTES = 512 * MIB
NCCL_BYTES = 256 * MIB
# CUDA-graph pool: vLLM captures decode graphs for batch sizes up to 512 by default and logs "Graph capturing
# finished in N secs, took X GiB" (0.3-1.0 GiB for 7B-70B models; its profile_cudagraph_memory estimate is of the
# same order). SGLang and TensorRT-LLM capture comparable decode graphs. None with --enforce-eager.
CUDA_GRAPH_BYTES = GIB
# Held back where the plan sets the KV cache outright (vLLM 0.34's --kv-cache-memory-bytes, SGLang, TensorRT-LLM):
# allocator fragmentation and what the arithmetic cannot see. vLLM 0.32/0.33's default --gpu-memory-utilization
# 0.92 leaves its own 8% instead.
HEADROOM_BYTES = GIB
# What vLLM measures as non-torch memory when it counts only what the instance allocated after it started (0.6.0-0.6.3,
# 0.6.5 on, V1 0.9.1 on: the CUDA context is in the baseline): cuBLAS/cuDNN workspaces, about 0.03-0.1 GiB on one GPU
# (0.03 GiB logged by vLLM 0.7.3 on an RTX 4060, vllm-project/vllm#13882); NCCL_BYTES more with several GPUs.
NON_TORCH_SINCE_START_BYTES = 128 * MIB
# The sampler's share of a profile run, bytes per (sequence x vocabulary) entry: fp32 logits and their softmax.
SAMPLER_BYTES_PER_LOGIT = 8


class TensorParallelError(ValueError):
    """The model cannot be split over the requested GPUs: its heads over the tensor-parallel degree, or its layers
    over the pipeline-parallel stages."""


@dataclass(frozen=True)
class WeightFormat:
    """How a format stores the weights: `bits` per quantized weight (16/32: unquantized), GPTQ/AWQ's `group_size`
    (None or <= 0: one group per output column), GPTQ's int32 `g_idx` per input channel; and the format's spec,
    which says how each serving engine takes it (serving_on).

    A checkpoint's own quantization_config (harness.capacity.checkpoint) gives `rules` instead: per set of layers
    how each weight is stored (the first rule whose targets match a layer), `unconverted` layers kept 16-bit
    (modules_to_not_convert, ignore lists; paths or "re:REGEX"), and `experts_only` where the method quantizes
    only the MoE experts (vLLM's MXFP4)."""

    name: str
    bits: float
    group_size: int | None = None
    g_idx: bool = False
    spec: FormatSpec | None = field(default=None, compare=False, repr=False)
    rules: tuple[StorageRule, ...] = ()
    unconverted: tuple[str, ...] = ()
    experts_only: bool = False
    description: str = ""

    def label(self) -> str:
        return self.name + (f" g{self.group_size}" if self.group_size and self.bits < 8 else "")

    def serving_on(self, engine: str) -> EngineServing:
        """How `engine` serves this format (FormatSpec.serving_on); without a spec, a 16-bit checkpoint as it is
        and a quantized one not at all."""
        if self.spec is not None:
            return self.spec.serving_on(engine)
        return EngineServing() if self.bits >= 16 else EngineServing(
            refusal=f"no serving engine is known to take the {self.name} checkpoint")

    def storage_of(self, lin: Linear, layers: int) -> list[tuple[int, LinearStorage | None]]:
        """[(copies, storage)] of `lin`'s `count` copies: None for those kept 16-bit (a router, an unconverted
        module, a layer no rule targets); the default GPTQ/AWQ/LLM.int8 storage of `bits` where there are no
        rules."""
        if not lin.quantized:
            return [(lin.count, None)]
        if not self.rules:
            return [(lin.count, _default_storage(self))]
        if self.experts_only and not is_expert(lin):
            return [(lin.count, None)]
        rule = rule_for(self.rules, lin)
        if rule is None:
            return [(lin.count, None)]
        kept = unconverted_copies(self.unconverted, lin, layers)
        return [(copies, storage) for copies, storage in ((lin.count - kept, rule.storage), (kept, None)) if copies]


def _default_storage(fmt: WeightFormat) -> LinearStorage:
    """bits == 8: LLM.int8 / INT8 W8A8 as vLLM holds it, int8 with an fp32 scale per output row; below: GPTQ/AWQ,
    an fp16 scale and a packed zero per group, GPTQ's g_idx."""
    if fmt.bits == 8:
        return LinearStorage(8, "channel", scale_bytes=4)
    grouped = fmt.group_size is not None and fmt.group_size > 0
    return LinearStorage(fmt.bits, "group" if grouped else "channel", fmt.group_size if grouped else None,
                         scale_bytes=FP16_BYTES, zeros=True, g_idx=fmt.g_idx)


def weight_format(name: str, group_size: int | None = None) -> WeightFormat:
    """The storage of a registered format, from its FormatSpec (harness.formats): bits, group size (when the
    format takes one), g_idx."""
    spec = FORMAT_SPECS.get("baseline" if name == "none" else name)
    if spec is None:
        raise ValueError(f"unknown format {name!r} (known: {', '.join(FORMAT_SPECS)})")
    fmt = WeightFormat(spec.name, spec.bits, group_size if spec.grouped else None, g_idx=spec.g_idx, spec=spec)
    return with_storage(fmt)


def kv_heads_per_gpu(attention: Attention, tp: int = 1) -> int:
    """KV heads one GPU holds: kv_heads / tp when tp divides them; 1 when kv_heads divides tp (each head replicated
    on tp / kv_heads GPUs, as vLLM's QKVParallelLinear does); MLA's latent is on every GPU. Engines refuse any other
    split, and attention heads that tp does not divide (TensorParallelError)."""
    if tp < 1:
        raise TensorParallelError(f"--num-gpus {tp}: must be at least 1")
    if attention.heads % tp:
        raise TensorParallelError(f"num_attention_heads {attention.heads} is not divisible by {tp} GPUs "
                                  "(vLLM, SGLang and TensorRT-LLM split attention heads evenly)")
    if attention.is_mla:
        return 1
    if attention.kv_heads % tp == 0:
        return attention.kv_heads // tp
    if tp % attention.kv_heads == 0:
        return 1
    raise TensorParallelError(f"num_key_value_heads {attention.kv_heads} neither divides nor is divisible by {tp} "
                              "GPUs: the KV heads can be neither split nor replicated evenly")


def check_split(shape: ModelShape, tp: int = 1, pp: int = 1) -> None:
    """TensorParallelError unless the heads split over `tp` GPUs (kv_heads_per_gpu) and every one of `pp` pipeline
    stages gets at least one decoder layer."""
    kv_heads_per_gpu(shape.attention, tp)
    for state in shape.attention.states[:1]:
        layer_state_bytes(state, tp)  # recurrent heads and channels must split evenly too
    if not 1 <= pp <= shape.layers:
        raise TensorParallelError(f"pipeline parallel size {pp}: must be between 1 and the model's {shape.layers} "
                                  "layers (each pipeline stage holds at least one layer)")


def kv_split(attention: Attention, tp: int) -> str:
    """How tensor parallelism places the KV cache, in words."""
    per_gpu = kv_heads_per_gpu(attention, tp)
    if attention.is_mla:
        return "MLA latent on every GPU" if tp > 1 else "MLA latent"
    if tp == 1:
        return f"{attention.kv_heads} KV heads"
    if per_gpu * tp == attention.kv_heads:
        return f"{attention.kv_heads} KV heads split, {per_gpu} per GPU"
    return f"{attention.kv_heads} KV heads replicated: 1 per GPU, each on {tp // attention.kv_heads} GPUs"


def kv_layer_token_bytes(attention: Attention, kv_dtype_bytes: float = 2, tp: int = 1) -> float:
    """Bytes one token takes in one layer's KV cache on one GPU.

    GQA: 2 (K and V) x KV heads per GPU x head_dim x bytes. MLA: (kv_lora_rank + qk_rope_head_dim) x bytes.
    """
    if attention.is_mla:
        return attention.latent_dim * kv_dtype_bytes
    return 2 * kv_heads_per_gpu(attention, tp) * attention.head_dim * kv_dtype_bytes


def kv_bytes_per_token(attention: Attention, kv_dtype_bytes: float = 2, tp: int = 1) -> int:
    """KV bytes of one token in every layer with a KV cache on one GPU, as if every such layer attended to it:
    GQA 2 x layers x KV heads x head_dim x bytes; MLA (kv_lora_rank + qk_rope_head_dim) x layers x bytes. A hybrid
    model's recurrent and MLP-only layers keep no KV (Nemotron-Nano-9B-v2: 4 of 56 layers, 16,384 bytes, as vLLM
    logs); their state per sequence is state_bytes_per_sequence."""
    return int(round(attention.kv_layers * kv_layer_token_bytes(attention, kv_dtype_bytes, tp)))


def kv_bytes_per_sequence(attention: Attention, length: int, kv_dtype_bytes: float = 2, tp: int = 1, *,
                          block_size: int = 1, window_extra: int = 0, sliding: bool = True,
                          states: bool = True) -> int:
    """Bytes one running sequence of `length` tokens holds on one GPU: its KV cache and, for a hybrid model, the
    recurrent layers' state (state_bytes_per_sequence; states=False leaves it out).

    KV: sum over layers with a KV cache of (layer token bytes x tokens the layer keeps), each rounded up to whole
    blocks of `block_size` tokens. A full-attention layer keeps all `length` tokens; a sliding-window layer at most
    min(length, sliding_window + window_extra) (vLLM frees the blocks that leave the window; during a chunked
    prefill it holds up to max_num_batched_tokens - 1 more, which the caller passes as window_extra).
    sliding=False counts sliding layers as full attention (an engine that keeps their whole history).
    """
    per_layer = kv_layer_token_bytes(attention, kv_dtype_bytes, tp)
    total = 0.0
    for window in attention.windows:
        if window == NO_KV:
            continue
        kept = length if window is None or not sliding else min(length, window + window_extra)
        total += per_layer * math.ceil(kept / block_size) * block_size
    return int(round(total)) + (state_bytes_per_sequence(attention, tp) if states else 0)


def layer_state_bytes(state: LayerState, tp: int = 1) -> int:
    """Bytes of one recurrent layer's state for one sequence on one GPU, as vLLM's MambaStateShapeCalculator shapes
    it (shapes.LayerState): conv_tokens x conv channels / tp at the conv dtype, plus heads / tp x head_elements at
    the temporal state's dtype. Mamba2 widens n_groups to tp when tp does not divide them (extra_groups_for_head_
    shards). TensorParallelError when tp does not divide the channels or heads (vLLM's divide() asserts)."""
    channels = state.conv_channels
    if state.kind == "mamba2":
        groups = state.n_groups + (0 if state.n_groups % tp == 0 else tp - state.n_groups)
        channels += 2 * groups * state.d_state
    if channels % tp or state.heads % tp:
        raise TensorParallelError(f"the {state.kind} layers' {channels} conv channels and {state.heads} heads do "
                                  f"not split evenly over {tp} GPUs")
    conv = state.conv_tokens * channels // tp * state.conv_dtype_bytes
    return conv + state.heads // tp * state.head_elements * state.ssm_dtype_bytes


def vllm_block_size(attention: Attention, kv_dtype_bytes: float = 2, tp: int = 1, block_size: int = 16) -> int:
    """vLLM's attention block size in tokens: `block_size`, or for a model with recurrent layers the smallest
    multiple of 16 tokens whose page (one layer's K and V) holds one layer's state
    (vllm/platforms/interface.py::_align_hybrid_block_size, logged as "Setting attention block size to N tokens";
    the state is then padded to that page). Qwen3.5-9B on 2 GPUs: 528 tokens, the state padded by 0.76%."""
    if not attention.states or attention.kv_layers == 0:
        return block_size
    state_page = layer_state_bytes(attention.states[0], tp)
    per_token = kv_layer_token_bytes(attention, kv_dtype_bytes, tp)
    return max(block_size, 16 * math.ceil(state_page / (16 * per_token)))


def vllm_sequence_bytes(attention: Attention, length: int, kv_dtype_bytes: float = 2, tp: int = 1, *,
                        block_size: int = 16, window_extra: int = 0, hybrid_allocator: bool = True) -> int:
    """Bytes of vLLM V1's KV cache one running sequence of `length` tokens takes on one GPU, as its KV cache
    manager pages it (vllm/v1/core/kv_cache_utils.py; the hybrid page size from vllm/model_executor/models/
    config.py::HybridAttentionMambaModelConfig).

    Layers are grouped by kind (full attention, each sliding window or attention chunk, recurrent state). With more
    than one kind, every kind is cut into groups of the same number of layers: the fewest layers of any kind, or the
    most when that is under 1.5 x the fewest (1.25 in earlier releases), the last group of a kind padded with empty
    layers (_get_kv_cache_groups_uniform_page_size: Gemma-3-27B's 10 full and 52 sliding layers make groups of 10,
    8 padding layers). A block id holds one page in each of the group-size layers of one group, so it costs group size
    x page bytes. A sequence takes ceil(tokens kept / block_size) blocks in each attention group (a sliding or chunked
    layer keeps at most window + window_extra tokens) and one block in each recurrent-state group (mamba_cache_mode
    "none"). A hybrid Mamba model raises the attention block size to a multiple of 16 tokens whose page holds one
    layer's state, and pads the state to that page (Nemotron-Nano-9B-v2: 1,312 tokens, 4 attention + 27 Mamba layers
    in groups of 4, 32 blocks of 21.5 MB for 32,768 tokens).

    hybrid_allocator=False: vLLM before its hybrid KV cache manager (V0, and V1 before 0.10 or with
    --disable-hybrid-kv-cache-manager: unify_hybrid_kv_cache_specs) keeps every layer of a model that mixes full and
    sliding or chunked attention whole (vLLM 0.8.2 logged Gemma-3-1B's 1,139,728 KV tokens as 34.78 sequences of
    32,768: all 26 layers full), still frees the blocks of a model whose layers all slide, and holds no recurrent
    state in the KV cache (V0's MambaCacheManager reserves max_num_seqs states beside it: state_bytes_per_sequence).
    """
    if not hybrid_allocator:
        kept = [w for w in attention.windows if w != NO_KV]
        mixed = None in kept and any(w is not None for w in kept)
        return kv_bytes_per_sequence(attention, length, kv_dtype_bytes, tp, block_size=block_size,
                                     window_extra=window_extra, sliding=not mixed, states=False)
    per_token = kv_layer_token_bytes(attention, kv_dtype_bytes, tp)
    kinds: dict[object, int] = {}
    for window in attention.windows:
        if window != NO_KV:
            kinds[window] = kinds.get(window, 0) + 1
    block_size = vllm_block_size(attention, kv_dtype_bytes, tp, block_size)
    if attention.states:
        kinds["state"] = len(attention.states)
    if not kinds:
        return 0
    fewest, most = min(kinds.values()), max(kinds.values())
    group = most if most < fewest * 1.5 else fewest
    blocks = 0
    for kind, layers in kinds.items():
        if kind == "state":
            per_group = 1
        else:
            kept = length if kind is None else min(length, int(kind) + window_extra)
            per_group = math.ceil(kept / block_size)
        blocks += math.ceil(layers / group) * per_group
    return int(round(blocks * group * block_size * per_token))


def state_bytes_per_sequence(attention: Attention, tp: int = 1) -> int:
    """The recurrent state one running sequence holds on one GPU, whatever its length: every recurrent layer's
    layer_state_bytes (0 for a model without recurrent layers). Nemotron-Nano-9B-v2: 27 Mamba2 layers of 73,728
    conv bytes (bf16) and 5,242,880 SSM bytes (float32), 143.5 MB a sequence."""
    return sum(layer_state_bytes(state, tp) for state in attention.states)


def shared_prefix_bytes(attention: Attention, shared_tokens: int, kv_dtype_bytes: float = 2, tp: int = 1, *,
                        block_size: int = 1, sliding: bool = True) -> int:
    """KV bytes on one GPU of a prompt prefix that every request shares and a prefix cache stores once: its whole
    blocks of `block_size` tokens (a partial block is each request's own) in every full-attention layer. A
    sliding-window layer drops the prefix once a sequence passes the window, so its copy is not counted as shared
    (sliding=False counts it: an engine that keeps a sliding layer's whole history, as full attention)."""
    shared = shared_tokens // block_size * block_size
    layers = sum(1 for window in attention.windows if window is None or (not sliding and window != NO_KV))
    return int(round(layers * kv_layer_token_bytes(attention, kv_dtype_bytes, tp) * shared))


def parameter_count(shape: ModelShape) -> int:
    """Every parameter: linear weights and biases (every expert), embeddings and lm_head (once if tied), norms."""
    linear = sum(lin.count * (lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0))
                 for lin in shape.linears)
    return linear + _embedding_params(shape) + shape.other_params


def _embedding_params(shape: ModelShape, tp: int = 1) -> int:
    rows = math.ceil(shape.vocab / tp)  # vocabulary-parallel embedding and lm_head
    return rows * shape.hidden * shape.embedding_matrices


def _per_gpu(linear: Linear, attention: Attention, tp: int) -> tuple[int, int]:
    """(in_features, out_features) of one GPU's share of a linear layer."""
    if tp == 1 or linear.split == "none":
        return linear.in_features, linear.out_features
    if linear.split == "row":
        return math.ceil(linear.in_features / tp), linear.out_features
    if linear.split == "kv":
        return linear.in_features, kv_heads_per_gpu(attention, tp) * attention.head_dim
    return linear.in_features, math.ceil(linear.out_features / tp)


def quantized_linear_bytes(in_features: int, out_features: int, bits: float, group_size: int | None,
                           g_idx: bool = False) -> float:
    """GPTQ/AWQ storage of one linear weight: packed in x out x bits/8, and per group of `group_size` inputs an fp16
    scale and a packed `bits`-wide zero per output column; GPTQ adds an int32 g_idx per input channel."""
    grouped = group_size is not None and group_size > 0
    return LinearStorage(bits, "group" if grouped else "channel", group_size if grouped else None,
                         scale_bytes=FP16_BYTES, zeros=True, g_idx=g_idx).nbytes(in_features, out_features)


def weights_bytes(shape: ModelShape, fmt: WeightFormat, tp: int = 1) -> int:
    """Bytes of the weights on one GPU as a serving engine holds them.

    bits >= 16: every parameter at bits/8 bytes.
    Quantized: each linear weight as fmt.storage_of says (LinearStorage.nbytes): without rules, bits == 8
      (LLM.int8, bitsandbytes; INT8 W8A8 as vLLM holds it, with its weight_scale in fp32) is 1 byte plus an fp32
      scale per output row, bits < 8 (GPTQ/AWQ) quantized_linear_bytes, every expert included; a checkpoint's rules
      (harness.capacity.checkpoint) give FP8, MXFP4, NVFP4, bitsandbytes 4-bit and compressed-tensors storage and
      the modules it leaves unconverted.
    Embeddings, lm_head, norms, biases and MoE routers stay 16-bit. Tensor parallelism: column-parallel layers keep
    out/tp outputs, row-parallel ones in/tp inputs, K/V projections their KV heads per GPU, embeddings and lm_head
    vocab/tp rows; norms, routers and MLA's down-projections are on every GPU.
    """
    attention = shape.attention
    kept_16bit = _embedding_params(shape, tp) + shape.other_params
    if fmt.bits >= 16:
        linear = sum(lin.count * (i * o + (o if lin.bias else 0))
                     for lin in shape.linears for i, o in [_per_gpu(lin, attention, tp)])
        return int(round((linear + kept_16bit) * fmt.bits / 8))
    linear_bytes = 0.0
    for lin in shape.linears:
        in_features, out_features = _per_gpu(lin, attention, tp)
        if lin.bias:
            kept_16bit += lin.count * out_features
        for copies, storage in fmt.storage_of(lin, shape.layers):
            if storage is None:
                kept_16bit += copies * in_features * out_features
            else:
                linear_bytes += copies * storage.nbytes(in_features, out_features, row=lin.split == "row",
                                                        fused=2 if "gate_up" in lin.name else 1)
    return int(round(linear_bytes + kept_16bit * FP16_BYTES))


def loaded_stage(shape: ModelShape, fmt: WeightFormat, tp: int = 1, pp: int = 1,
                 partition: tuple[int, ...] | None = None, stage: int | None = None) -> ModelShape:
    """The most-loaded GPU's pipeline stage of `pp`: with the engine's split (`partition`, layers per stage), the
    stage whose weights on `tp` GPUs are the largest (then the one with the most KV layers), each stage counted
    from its own layers (shapes.pipeline_stages), or the stage numbered `stage` (0: the first, the driver's);
    without a split, shapes.pipeline_stage's bound."""
    if pp == 1:
        return shape
    if partition is None:
        return pipeline_stage(shape, pp)
    if len(partition) != pp:
        raise ValueError(f"a split over {len(partition)} stages for pipeline parallel size {pp}")
    stages = pipeline_stages(shape, partition)
    if stage is not None:
        return stages[stage]
    return max(stages, key=lambda part: (weights_bytes(part, fmt, tp), part.attention.kv_layers))


def planned_weights_bytes(shape: ModelShape, fmt: WeightFormat, tp: int = 1,
                          measured: int | None = None, pp: int = 1,
                          partition: tuple[int, ...] | None = None, stage: int | None = None) -> tuple[int, str]:
    """(weights on the most-loaded GPU, where the figure comes from): the estimate of weights_bytes for `shape`'s
    most-loaded pipeline stage of `pp` (loaded_stage, with the engine's split `partition` where given; `stage`: that
    stage of it) on `tp` GPUs, or a measured figure.

    `measured` is the weights of one whole copy (no tensor or pipeline parallelism), as a run measures them; on
    `tp` x `pp` GPUs it is split as the estimate splits: measured x weights_bytes(stage, tp) / weights_bytes(whole, 1).
    """
    part = loaded_stage(shape, fmt, tp, pp, partition, stage)
    if measured is None:
        return weights_bytes(part, fmt, tp), "estimated from the config"
    if tp == 1 and pp == 1:
        return int(measured), "measured"
    whole = weights_bytes(shape, fmt, 1)
    return int(round(measured * weights_bytes(part, fmt, tp) / whole)) if whole else int(measured), "measured"


def activation_peak_bytes(shape: ModelShape, tokens: int, seqs: int = 256, act_dtype_bytes: int = 2,
                          tp: int = 1, sampler_bytes_per_logit: int = SAMPLER_BYTES_PER_LOGIT) -> int:
    """Peak of an engine's profile run over `tokens` tokens (its token budget) and `seqs` sampled rows, estimated
    from the config: the larger of the forward pass, tokens x (3 x hidden + 3 x mlp_width / tp) x bytes, and the
    sampler, seqs x vocab x sampler_bytes_per_logit (with the last hidden states still held).

    The MLP is the widest point of the forward: the fused gate/up output (2 x mlp_width) and the activated product
    (mlp_width) exist together while the residual stream, the layer input and the normed input (3 x hidden) are live.
    mlp_width is intermediate_size for a dense MLP, and for MoE the experts one token visits (num_experts_per_tok x
    expert width + the shared experts). The sampler runs after the forward has freed its buffers, so the two peaks
    do not add up. Checked against vLLM 0.6.4's logged profile peaks (RTX 3090, Llama-3.1-8B, vllm-project/vllm
    #10517): 2.07 GiB at 20,000 tokens and 2.99 GiB at 29,000, i.e. 110.6 kB a token, where this gives 110,592 B.
    """
    forward = tokens * (3 * shape.hidden + 3 * math.ceil(shape.mlp_width / tp)) * act_dtype_bytes
    sampler = seqs * shape.vocab * sampler_bytes_per_logit + seqs * shape.hidden * act_dtype_bytes
    return int(max(forward, sampler))


def workload_non_torch(workload, gpus: int = 1) -> int:
    """The workload's measured non-torch memory per GPU if it has one (--capacity-overhead-gib), else the estimate
    for a deployment over `gpus` GPUs."""
    return workload.non_torch_bytes if workload.non_torch_bytes is not None else non_torch_bytes(gpus)


def non_torch_bytes(gpus: int = 1, since_start: bool = False) -> int:
    """CUDA context and non-torch allocations on one GPU: NON_TORCH_BYTES, plus NCCL_BYTES when the deployment spans
    more than one GPU (`gpus`: tensor x pipeline parallel size). since_start: only what the instance allocated after
    its CUDA context existed (NON_TORCH_SINCE_START_BYTES), as vLLM counts it in most releases (vllm_versions)."""
    return (NON_TORCH_SINCE_START_BYTES if since_start else NON_TORCH_BYTES) + (NCCL_BYTES if gpus > 1 else 0)


def cuda_graph_bytes(enforce_eager: bool = False) -> int:
    """The CUDA-graph pool on one GPU: CUDA_GRAPH_BYTES, none when graphs are off (--enforce-eager)."""
    return 0 if enforce_eager else CUDA_GRAPH_BYTES


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"KV cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[kv_cache_dtype]
