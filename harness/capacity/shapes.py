"""A model's shapes from its config.json: attention (GQA or MLA, sliding-window and chunked layers), the recurrent
layers of a hybrid model (Mamba, gated DeltaNet, KDA, lightning attention, short conv: a state per sequence) and
every linear layer.

Written out here (model_type): dense Llama-style decoders (llama, mistral, qwen2, qwen2_vl, qwen3, gemma,
gemma2), Mixtral (every expert), DeepSeek-V2/V3 (MLA attention, routed and shared experts, the first
`first_k_dense_replace` layers dense): counted without importing torch, and cross-checked in the tests against
the model transformers builds. Any other architecture is counted from that model, built on the meta device
(meta.py: Gemma 3, Qwen3-MoE, gpt-oss, Phi-3, Llama 4, ...). A missing field, or a config transformers cannot
build, raises ConfigFieldError naming the field: never a silent dense count. Works on config.json read as a dict,
on a transformers PretrainedConfig, and on multimodal configs through their nested `text_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

# GPT-2/Falcon-style spellings of the same fields.
_ALIASES = {
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd", "d_model"),
}
_MOE_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_intermediate_size")
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen2_vl", "qwen3", "gemma", "gemma2")
MOE_TYPES = ("mixtral", "deepseek_v2", "deepseek_v3")
KNOWN_TYPES = DENSE_TYPES + MOE_TYPES
_NORMS_PER_LAYER = {"gemma2": 4}  # Gemma-2: pre/post attention and pre/post feed-forward RMSNorms; others 2
_TIED_BY_DEFAULT = ("gemma", "gemma2")  # transformers' config classes default tie_word_embeddings to True for these


class ConfigFieldError(ValueError):
    """A field of the model's config is missing or unusable; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}' {problem}")
        self.field = field


NO_KV = 0  # Attention.windows entry of a layer that keeps no KV cache (Mamba, linear attention, short conv, MLP only)


@dataclass(frozen=True)
class LayerState:
    """The state one recurrent layer keeps per running sequence, whatever its length, as vLLM's
    MambaStateShapeCalculator (vllm/model_executor/layers/mamba/mamba_utils.py) shapes it: a convolution state of
    `conv_tokens` (conv_kernel - 1) x conv channels, and a temporal (SSM / delta-rule) state of `heads` x
    `head_elements`. Tensor parallelism divides the conv channels and the heads.

    kind: "mamba2" (conv channels = intermediate + 2 x n_groups x d_state, n_groups widened to tp when tp does not
    divide them; temporal heads x head_dim x d_state), "mamba1" (conv intermediate; temporal intermediate x d_state),
    "gated_deltanet" (conv 2 x key heads x key dim + value heads x value dim; temporal value heads x value dim x key
    dim), "kda" (Kimi Linear: conv 3 x heads x head_dim, temporal heads x head_dim^2 in float32), "linear_attention"
    (MiniMax lightning attention: no conv, heads x head_dim^2), "short_conv" (conv only, hidden channels). Bytes per
    element: the conv state in the model's dtype, the temporal state in the engine's mamba_ssm_cache_dtype (float32
    for Nemotron-H by default).
    """

    kind: str
    conv_channels: int  # mamba2: the intermediate part only (the groups' part is added per tp)
    conv_tokens: int
    heads: int
    head_elements: int
    conv_dtype_bytes: int = 2
    ssm_dtype_bytes: int = 2
    n_groups: int = 0
    d_state: int = 0


@dataclass(frozen=True)
class Attention:
    """What the KV cache stores per token and layer, and what recurrent layers keep per sequence.

    GQA: K and V of `kv_heads` heads of `head_dim`. MLA (DeepSeek): one latent of `latent_dim` =
    kv_lora_rank + qk_rope_head_dim, shared by all heads (kv_heads 1, head_dim 0). `windows[i]` is decoder layer i's
    sliding window (or attention chunk) in tokens, None for full attention, NO_KV (0) for a layer without attention.
    `states`: one LayerState per recurrent layer of a hybrid model (Mamba, gated DeltaNet, short conv), a constant
    per running sequence.
    """

    heads: int
    kv_heads: int
    head_dim: int
    latent_dim: int
    windows: tuple[int | None, ...]
    states: tuple[LayerState, ...] = ()

    @property
    def layers(self) -> int:
        return len(self.windows)

    @property
    def kv_layers(self) -> int:
        """Layers that keep a KV cache (all of them but a hybrid model's recurrent and MLP-only layers)."""
        return sum(1 for w in self.windows if w != NO_KV)

    @property
    def is_mla(self) -> bool:
        return self.latent_dim > 0

    @property
    def sliding_layers(self) -> int:
        return sum(1 for w in self.windows if w is not None and w != NO_KV)


@dataclass(frozen=True)
class Linear:
    """`count` copies, across the whole model, of one in_features x out_features linear weight.

    split says how tensor parallelism divides it: "column" (outputs), "row" (inputs), "kv" (K/V projections: by KV
    heads, replicated when there are fewer KV heads than GPUs), "none" (every GPU holds all of it).
    quantized=False: GPTQ/AWQ/LLM.int8 keep it 16-bit (MoE routers). `layers`: how many decoder layers hold it (0:
    every layer), for a model whose layers differ (DeepSeek's dense first layers and MoE layers); the `count` copies
    are spread evenly over them. `at`: those layers' indices in the whole model (0-based), where known, so that a
    pipeline stage holds the copies of its own layers (stage_of_range); empty with `layers` set: not placed (a
    vision tower's, counted whole on every stage).
    """

    name: str
    in_features: int
    out_features: int
    count: int
    bias: bool = False
    split: str = "column"
    quantized: bool = True
    layers: int = 0
    at: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    hidden: int
    vocab: int
    tied_embeddings: bool
    attention: Attention
    linears: tuple[Linear, ...]
    other_params: int  # per-layer norms and MoE routing biases, and the final norm (hidden): 16-bit, on every GPU
    mlp_width: int  # widest MLP activation per token: intermediate_size, or experts per token x expert width + shared
    experts: int = 0  # routed experts per MoE layer; 0 for a dense model
    experts_per_token: int = 0
    max_len: int | None = None  # the longest max_model_len the config allows (derived_max_len)
    sglang_max_len: int | None = None  # the longest --context-length SGLang derives (sglang_context_length)
    torch_dtype: str | None = None
    # vocab x hidden matrices held: None for the whole model (the embedding and lm_head, one if tied); a pipeline
    # stage's own (stage_of_range: the embedding on the first stage, the lm_head on the last)
    vocab_matrices: int | None = None

    @property
    def embedding_matrices(self) -> int:
        """The vocab x hidden matrices this shape holds (embedding, lm_head)."""
        if self.vocab_matrices is not None:
            return self.vocab_matrices
        return 1 if self.tied_embeddings else 2

    @property
    def layers(self) -> int:
        return self.attention.layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


def pipeline_stage(shape: ModelShape, stages: int) -> ModelShape:
    """The most-loaded GPU's part of the model under pipeline parallelism over `stages` stages, as a ModelShape the
    memory model sizes as it sizes a whole model (stages == 1: `shape` itself).

    The engines give each stage a contiguous run of at most ceil(L / stages) of the L decoder layers (vLLM's
    get_pp_indices gives an uneven split's extra layers to the stages before the last). The stage kept here holds:
    - ceil(L / stages) layers' linear weights: a linear on every layer keeps count / L copies per layer (every
      expert of an MoE layer among them); one that only some layers hold (Linear.layers: DeepSeek's dense first
      MLPs, its MoE layers' experts) counts min(ceil(L / stages), those layers) of them, an upper bound where a stage
      cannot hold the most of each kind at once;
    - those layers' norms (in proportion) and the final norm;
    - the attention of the ceil(L / stages) layers with the largest KV cache: full attention first, then the widest
      sliding windows;
    - the embedding and lm_head whole, and the vocabulary unchanged: the first stage holds the embedding and the
      last the lm_head, which of them is the most loaded depends on the engine's split, so both are counted
      (conservative: at most one vocab x hidden matrix too many). Activations (hidden size, MLP width, the
      sampler's logits) are those of the whole model.
    """
    layers = shape.layers
    if stages == 1:
        return shape
    if not 1 <= stages <= layers:
        raise ValueError(f"{stages} pipeline stages for {layers} layers: between 1 and the number of layers")
    return stage_of_layers(shape, math.ceil(layers / stages))


def stage_of_layers(shape: ModelShape, kept: int) -> ModelShape:
    """A pipeline stage holding `kept` of the decoder layers, counted as pipeline_stage counts its most-loaded
    stage (the layers with the largest KV cache, the embedding and lm_head whole); a split the engine is told
    (vLLM's VLLM_PP_LAYER_PARTITION) gives stages of different sizes."""
    layers = shape.layers
    if not 1 <= kept <= layers:
        raise ValueError(f"a stage of {kept} layers of {layers}: between 1 and the number of layers")
    if kept == layers:
        return shape
    linears = tuple(replace(lin, count=lin.count // (lin.layers or layers) * min(kept, lin.layers or layers),
                            layers=min(kept, lin.layers) if lin.layers else 0, at=()) for lin in shape.linears)
    windows, states = shape.attention.windows, shape.attention.states
    largest = sorted(range(layers), key=lambda i: (windows[i] == NO_KV, windows[i] is not None,
                                                   -(windows[i] or 0)))[:kept]
    # a hybrid stage's recurrent layers: at most `kept` of them (an upper bound, as for the linears)
    attention = replace(shape.attention, windows=tuple(windows[i] for i in sorted(largest)),
                        states=states[:kept])
    per_layer_params = shape.other_params - shape.hidden  # all but the final norm is per layer
    other = math.ceil(per_layer_params * kept / layers) + shape.hidden
    return replace(shape, attention=attention, linears=linears, other_params=other)


def stage_of_range(shape: ModelShape, start: int, end: int) -> ModelShape:
    """The pipeline stage holding decoder layers start..end-1, as the engine builds it (vLLM's make_layers: the
    layers of get_pp_indices' range; the embedding on the first stage, the final norm and lm_head on the last, a
    tied lm_head there as its own copy of the embedding). A linear placed by layer (Linear.at) counts the copies of
    the stage's own layers; one on every layer count / L a layer; one not placed (Linear.layers without `at`) is
    bounded as stage_of_layers bounds it. Recurrent states: at most one a layer, as stage_of_layers counts them."""
    layers = shape.layers
    if not 0 <= start < end <= layers:
        raise ValueError(f"a stage of layers {start}..{end - 1} of {layers}: a non-empty range within the model")
    if (start, end) == (0, layers):
        return shape
    kept = end - start

    def staged(lin: Linear) -> Linear:
        if lin.at:
            own = tuple(i for i in lin.at if start <= i < end)
            return replace(lin, count=lin.count // len(lin.at) * len(own), layers=len(own), at=own)
        if not lin.layers:  # on every layer: the stage's own, placed (a skip list's layer-indexed entries count here)
            return replace(lin, count=lin.count // layers * kept, layers=kept, at=tuple(range(start, end)))
        return replace(lin, count=lin.count // lin.layers * min(kept, lin.layers), layers=min(kept, lin.layers))

    first, last = start == 0, end == layers
    per_layer_params = shape.other_params - shape.hidden  # all but the final norm is per layer
    attention = replace(shape.attention, windows=shape.attention.windows[start:end],
                        states=shape.attention.states[:kept])
    return replace(shape, attention=attention, linears=tuple(staged(lin) for lin in shape.linears),
                   other_params=math.ceil(per_layer_params * kept / layers) + (shape.hidden if last else 0),
                   vocab_matrices=(1 if first else 0) + (1 if last and not (first and shape.tied_embeddings) else 0))


def stage_ranges(partition: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Each stage's (start, end) decoder layers from the layers per stage (get_pp_indices' partitions)."""
    bounds = [0]
    for count in partition:
        bounds.append(bounds[-1] + count)
    return tuple(zip(bounds, bounds[1:]))


def pipeline_stages(shape: ModelShape, partition: tuple[int, ...]) -> tuple[ModelShape, ...]:
    """Every pipeline stage's part of the model, for a split of `partition` layers per stage (stage_of_range)."""
    if sum(partition) != shape.layers or min(partition, default=0) < 1:
        raise ValueError(f"a split of {shape.layers} layers as {partition}: positive counts adding up to them")
    return tuple(stage_of_range(shape, start, end) for start, end in stage_ranges(partition))


def config_fields(config: Any) -> dict[str, Any]:
    """The language model's fields as a dict: `text_config` of a multimodal config over the top level, else the config."""
    fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    nested = fields.get("text_config")
    if hasattr(nested, "to_dict"):
        nested = nested.to_dict()
    if isinstance(nested, dict) and nested:
        return {**fields, **nested}
    return fields


def positive_int(fields: dict[str, Any], name: str, default: int | None = None) -> int:
    """fields[name] (or an alias) as a positive integer; ConfigFieldError naming the field otherwise."""
    value = next((fields[key] for key in (name, *_ALIASES.get(name, ())) if fields.get(key) is not None), None)
    if value is None:
        if default is not None:
            return default
        raise ConfigFieldError(name, "is missing; is this a decoder-only language model's config.json?")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or int(value) != value:
        raise ConfigFieldError(name, f"is {value!r}, not a positive integer")
    return int(value)


def _count(fields: dict[str, Any], name: str) -> int:
    """A count that may be 0 or absent (n_shared_experts, first_k_dense_replace)."""
    return positive_int(fields, name) if fields.get(name) else 0


def head_dim(fields: dict[str, Any]) -> int:
    if fields.get("head_dim"):
        return positive_int(fields, "head_dim")
    return positive_int(fields, "hidden_size") // positive_int(fields, "num_attention_heads")


def num_kv_heads(fields: dict[str, Any]) -> int:
    return positive_int(fields, "num_key_value_heads", default=positive_int(fields, "num_attention_heads"))


def attention_shape(config: Any, *, strict: bool = True) -> Attention:
    """The KV-relevant shape: needs no known architecture, only the attention fields (and a hybrid model's recurrent
    fields). strict=False counts layer types it does not know, and recurrent layers whose state it cannot size, as
    full attention (an upper bound) instead of raising."""
    fields = config_fields(config)
    kinds = layer_kinds(fields)
    layers = len(kinds) if kinds is not None else positive_int(fields, "num_hidden_layers")
    heads = positive_int(fields, "num_attention_heads")
    windows = layer_windows(fields, layers, strict=strict)
    recurrent = sum(1 for kind in kinds or () if kind in ("recurrent", "hybrid"))
    states: tuple[LayerState, ...] = ()
    if recurrent:
        try:
            states = (recurrent_state(fields),) * recurrent
        except ConfigFieldError:
            if strict:
                raise
            # a state it cannot size: those layers count as full attention, an upper bound as for unknown kinds
            windows = tuple(None if kind in ("recurrent", "hybrid") else window
                            for kind, window in zip(kinds or (), windows))
    if fields.get("kv_lora_rank"):
        latent = positive_int(fields, "kv_lora_rank") + positive_int(fields, "qk_rope_head_dim")
        return Attention(heads=heads, kv_heads=1, head_dim=0, latent_dim=latent, windows=windows, states=states)
    return Attention(heads=heads, kv_heads=num_kv_heads(fields), head_dim=head_dim(fields), latent_dim=0,
                     windows=windows, states=states)


# What each spelling of a layer's kind means: attention of some kind, a recurrent layer (a state per sequence, no
# KV), attention and a recurrent mixer side by side ("hybrid": Falcon-H1), or an MLP/MoE-only layer (neither).
_KIND_NAMES = {"full_attention": "full_attention", "attention": "full_attention", "*": "full_attention",
               "sliding_attention": "sliding_attention", "chunked_attention": "chunked_attention",
               "linear_attention": "recurrent", "mamba": "recurrent", "mamba2": "recurrent", "conv": "recurrent",
               "M": "recurrent", "mlp": "mlp", "moe": "mlp", "-": "mlp", "E": "mlp", "hybrid": "hybrid",
               "cross_attention": "cross_attention"}


def layer_kinds(fields: dict[str, Any]) -> tuple[str, ...] | None:
    """Each decoder layer's kind (full_attention, sliding_attention, chunked_attention, recurrent, hybrid, mlp,
    cross_attention, or a spelling this planner does not know, kept as written), from whichever field the config
    spells it with; None when the config names no per-layer kinds (every layer then attends, windows per
    layer_windows).

    `layer_types` (Gemma 2/3, gpt-oss, Cohere 2, Qwen3-Next, Granite 4 hybrid, LFM2), `layers_block_type`,
    Nemotron-H's `hybrid_override_pattern` (M Mamba2, * attention, - MLP, E MoE), Qwen3-Next's
    `full_attention_interval` (gated DeltaNet layers between), Jamba's attention every
    `attn_layer_period` layers from `attn_layer_offset`, LFM2's `full_attn_idxs`, Falcon-H1 (attention and Mamba2 in
    every layer), Gemma 3 / Cohere 2's `sliding_window_pattern` (one full-attention layer in that many: the published
    configs have it where transformers' own would write layer_types), Llama 4's chunked layers (`no_rope_layers`,
    default three in four), Mllama's `cross_attention_layers`.
    """
    model_type = str(fields.get("model_type") or "")
    types = fields.get("layer_types") or fields.get("layers_block_type")
    if types is not None and not isinstance(types, list):
        raise ConfigFieldError("layer_types", "should list one layer type per layer")
    if types:
        return tuple(_KIND_NAMES.get(str(kind), str(kind)) for kind in types)
    pattern = fields.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return tuple(_KIND_NAMES.get(char, char) for char in pattern)
    linear = fields.get("linear_attn_config")
    if isinstance(linear, dict) and isinstance(linear.get("full_attn_layers"), list):  # Kimi Linear: 1-based
        full = set(linear["full_attn_layers"])
        return tuple("full_attention" if i + 1 in full else "recurrent"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    if isinstance(fields.get("attn_type_list"), list):  # MiniMax-Text-01: 1 softmax attention, 0 lightning
        return tuple("full_attention" if kind == 1 else "recurrent" for kind in fields["attn_type_list"])
    if isinstance(fields.get("attn_layer_indices"), list) or model_type == "bamba":  # Bamba: none given, all Mamba
        full = set(fields.get("attn_layer_indices") or ())
        return tuple("full_attention" if i in full else "recurrent"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    if fields.get("attn_layer_period"):  # Jamba
        layers = positive_int(fields, "num_hidden_layers")
        period, offset = positive_int(fields, "attn_layer_period"), int(fields.get("attn_layer_offset") or 0)
        return tuple("full_attention" if i % period == offset else "recurrent" for i in range(layers))
    if fields.get("full_attention_interval") and fields.get("linear_num_value_heads"):  # Qwen3-Next as published
        every = positive_int(fields, "full_attention_interval")
        return tuple("full_attention" if (i + 1) % every == 0 else "recurrent"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    if model_type == "falcon_h1":
        return ("hybrid",) * positive_int(fields, "num_hidden_layers")
    if isinstance(fields.get("full_attn_idxs"), list):  # LFM2 without layer_types
        full = set(fields["full_attn_idxs"])
        return tuple("full_attention" if i in full else "recurrent"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    every = fields.get("sliding_window_pattern") or fields.get("_sliding_window_pattern")
    if every and fields.get("sliding_window"):
        every = positive_int({"sliding_window_pattern": every}, "sliding_window_pattern")
        return tuple("sliding_attention" if (i + 1) % every else "full_attention"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    if model_type.startswith("llama4") and fields.get("attention_chunk_size"):
        layers = positive_int(fields, "num_hidden_layers")
        rope = fields.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        return tuple("chunked_attention" if rope[i] else "full_attention" for i in range(layers))
    if isinstance(fields.get("cross_attention_layers"), list):  # Mllama's text model
        cross = set(fields["cross_attention_layers"])
        return tuple("cross_attention" if i in cross else "full_attention"
                     for i in range(positive_int(fields, "num_hidden_layers")))
    return None


def layer_windows(fields: dict[str, Any], layers: int, *, strict: bool = True) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention; NO_KV: a layer without a KV cache).

    The kinds of layer_kinds when the config gives them; otherwise Gemma-2 alternates, sliding on even layers;
    Qwen2/Qwen3 slide only with use_sliding_window, on layers from max_window_layers on; Mistral/Mixtral with a
    sliding_window slide on every layer; any other model is counted as full attention on every layer (an upper bound
    on its KV cache). Mllama's cross-attention layers hold the image tokens' K/V, not the text's: NO_KV here.
    """
    window, model_type = fields.get("sliding_window"), fields.get("model_type")
    kinds = layer_kinds(fields)
    if kinds is not None:
        if len(kinds) != layers:
            raise ConfigFieldError("layer_types", f"should list one attention type per layer ({layers})")
        known = {"full_attention", "sliding_attention", "chunked_attention", "recurrent", "hybrid", "mlp",
                 "cross_attention"}
        unknown = sorted(set(kinds) - known)
        if unknown and strict:
            raise ConfigFieldError("layer_types", f"has {unknown[0]!r}: quantgate plans full, sliding and chunked "
                                                  "attention, Mamba, linear attention and short-conv layers only")
        if "sliding_attention" in kinds:
            window = positive_int(fields, "sliding_window")
        # chunked local attention (Llama 4) keeps at most one chunk of keys: vLLM sizes it as a window of the chunk
        chunk = positive_int(fields, "attention_chunk_size") if "chunked_attention" in kinds else None
        sized = {"sliding_attention": window, "chunked_attention": chunk, "recurrent": NO_KV, "mlp": NO_KV,
                 "cross_attention": NO_KV}
        return tuple(sized.get(kind) for kind in kinds)
    if not window:
        return (None,) * layers
    window = positive_int(fields, "sliding_window")
    if model_type == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(layers))
    if model_type in ("qwen2", "qwen2_vl", "qwen3"):
        if not fields.get("use_sliding_window"):
            return (None,) * layers
        first = int(fields.get("max_window_layers") or 0)
        return tuple(window if i >= first else None for i in range(layers))
    if model_type in ("mistral", "mixtral"):
        return (window,) * layers
    return (None,) * layers


def _dtype_bytes(name: Any) -> int:
    return 4 if str(name).replace("torch.", "") in ("float32", "float") else 2


def recurrent_state(fields: dict[str, Any]) -> LayerState:
    """The state per sequence of one recurrent layer of this hybrid model, with the fields vLLM's model class reads
    (get_mamba_state_shape_from_config) and its dtypes (get_mamba_state_dtype_from_config: the conv state in the
    model's dtype; the temporal state in mamba_ssm_cache_dtype, "auto" = the model's, except Nemotron-H whose
    NemotronHForCausalLMConfig defaults it to float32, and Qwen3.5 whose config's mamba_ssm_dtype vLLM takes).
    ConfigFieldError for a model type whose state is not written out here."""
    model_type = str(fields.get("model_type") or "")
    model_bytes = _dtype_bytes(fields.get("torch_dtype") or fields.get("dtype") or "bfloat16")
    ssm = fields.get("mamba_ssm_cache_dtype") or fields.get("mamba_ssm_dtype")  # Qwen3.5 writes the latter
    ssm_bytes = _dtype_bytes(ssm) if ssm and ssm != "auto" else model_bytes
    hidden = positive_int(fields, "hidden_size")
    if model_type == "nemotron_h":
        heads, dim = positive_int(fields, "mamba_num_heads"), positive_int(fields, "mamba_head_dim")
        return LayerState("mamba2", heads * dim, positive_int(fields, "conv_kernel") - 1, heads,
                          dim * positive_int(fields, "ssm_state_size"), model_bytes,
                          _dtype_bytes(ssm) if ssm and ssm != "auto" else 4,
                          n_groups=positive_int(fields, "n_groups"), d_state=positive_int(fields, "ssm_state_size"))
    if model_type in ("granitemoehybrid", "bamba", "falcon_h1"):
        heads, dim = positive_int(fields, "mamba_n_heads"), positive_int(fields, "mamba_d_head")
        expand = fields.get("mamba_expand") or 2
        intermediate = (positive_int(fields, "mamba_d_ssm") if fields.get("mamba_d_ssm")
                        else int(expand * hidden))
        d_state = positive_int(fields, "mamba_d_state")
        return LayerState("mamba2", intermediate, positive_int(fields, "mamba_d_conv") - 1, heads, dim * d_state,
                          model_bytes, ssm_bytes, n_groups=positive_int(fields, "mamba_n_groups", default=1),
                          d_state=d_state)
    if model_type == "zamba2":
        heads, dim = positive_int(fields, "n_mamba_heads"), positive_int(fields, "mamba_headdim")
        d_state = positive_int(fields, "mamba_d_state")
        return LayerState("mamba2", int((fields.get("mamba_expand") or 2) * hidden),
                          positive_int(fields, "mamba_d_conv") - 1, heads, dim * d_state, model_bytes, ssm_bytes,
                          n_groups=positive_int(fields, "mamba_ngroups", default=1), d_state=d_state)
    if model_type == "kimi_linear":  # KDA: conv of q, k, v; recurrent state heads x d x d, always float32
        linear = fields.get("linear_attn_config") or {}
        heads = positive_int(linear, "num_heads") if linear else positive_int(fields, "linear_num_heads")
        dim = positive_int(linear, "head_dim") if linear else positive_int(fields, "linear_head_dim")
        kernel = (positive_int(linear, "short_conv_kernel_size") if linear
                  else positive_int(fields, "linear_conv_kernel_dim"))
        return LayerState("kda", 3 * heads * dim, kernel - 1, heads, dim * dim, model_bytes, 4)
    if model_type.startswith("minimax") and model_type != "minimax_m2":  # lightning attention: no conv
        heads, dim = positive_int(fields, "num_attention_heads"), head_dim(fields)
        return LayerState("linear_attention", 0, 0, heads, dim * dim, model_bytes, model_bytes)
    if model_type == "jamba":
        intermediate = int(positive_int(fields, "mamba_expand") * hidden)
        return LayerState("mamba1", intermediate, positive_int(fields, "mamba_d_conv") - 1, intermediate,
                          positive_int(fields, "mamba_d_state"), model_bytes, ssm_bytes)
    if model_type.startswith(("qwen3_next", "qwen3_5")):
        k_heads, v_heads = positive_int(fields, "linear_num_key_heads"), positive_int(fields, "linear_num_value_heads")
        k_dim, v_dim = positive_int(fields, "linear_key_head_dim"), positive_int(fields, "linear_value_head_dim")
        return LayerState("gated_deltanet", 2 * k_heads * k_dim + v_heads * v_dim,
                          positive_int(fields, "linear_conv_kernel_dim") - 1, v_heads, v_dim * k_dim, model_bytes,
                          ssm_bytes)
    if model_type.startswith("lfm2"):
        channels = positive_int(fields, "conv_dim") if fields.get("conv_dim") else hidden
        return LayerState("short_conv", channels, positive_int(fields, "conv_L_cache") - 1, 0, 0, model_bytes,
                          ssm_bytes)
    raise ConfigFieldError("layer_types", f"has recurrent (Mamba / linear-attention / conv) layers, whose state per "
                                          f"sequence quantgate does not know for model_type {model_type!r} (known: "
                                          "nemotron_h, jamba, falcon_h1, granitemoehybrid, bamba, zamba2, "
                                          "qwen3_next, qwen3_5, kimi_linear, minimax, lfm2)")


# vLLM's ModelConfig._get_and_verify_max_len reads the smallest of these.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_sequence_length", "max_seq_length", "seq_len")


def derived_max_len(fields: dict[str, Any]) -> int | None:
    """The longest max_model_len vLLM accepts for this config (vllm/config/model.py::_get_and_verify_max_len).

    The smallest of the length keys vLLM reads, times the RoPE scaling factor where the scaling is not already in
    it (YaRN: original_max_position_embeddings x factor); llama3, longrope and su scaling are already counted, and
    so is Gemma 3's (vLLM skips the factor for any model_type containing "gemma3": its 131,072 is already scaled).
    """
    limits = [int(fields[key]) for key in _MAX_LEN_KEYS if isinstance(fields.get(key), (int, float))
              and not isinstance(fields.get(key), bool) and fields[key] > 0]
    if not limits:
        return None
    limit = min(limits)
    rope = fields.get("rope_scaling") or fields.get("rope_parameters")
    if "gemma3" in str(fields.get("model_type") or ""):
        return limit
    if isinstance(rope, dict) and rope.get("factor"):
        kind = rope.get("rope_type") or rope.get("type")
        if kind not in ("su", "longrope", "llama3", "default", "mrope"):
            base = rope.get("original_max_position_embeddings", limit) if kind == "yarn" else limit
            return int(int(base) * float(rope["factor"]))
    return limit


# SGLang's hf_transformers_utils.CONTEXT_LENGTH_KEYS: the first of these present is the context length.
_SGLANG_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def sglang_context_length(fields: dict[str, Any]) -> int | None:
    """The context length SGLang derives (srt/utils/hf_transformers_utils.py::get_context_length): the first of its
    length keys, times the rope_scaling factor unless the scaling names original_max_position_embeddings or is
    llama3. Unlike vLLM it does rescale Gemma 3 (131,072 x 8 = 1,048,576) and it does not rescale YaRN."""
    limit = next((fields[key] for key in _SGLANG_LENGTH_KEYS if fields.get(key) is not None), None)
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit <= 0:
        return None
    rope = fields.get("rope_scaling") or fields.get("rope_parameters")
    factor = 1.0
    if isinstance(rope, dict) and rope:
        factor = float(rope.get("factor") or 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1.0
    return int(factor * limit)


def written_shape(config: Any) -> ModelShape:
    """Every linear layer, the norms and the attention of an architecture written out here (KNOWN_TYPES; the module
    docstring); meta.model_shape counts any other from the model transformers builds."""
    fields = config_fields(config)
    attention = attention_shape(fields)
    model_type = fields.get("model_type")
    if not model_type:
        raise ConfigFieldError("model_type", f"is missing; quantgate counts {', '.join(KNOWN_TYPES)}")
    if model_type not in KNOWN_TYPES:
        raise ConfigFieldError("model_type", f"is {model_type!r}, not one of the architectures written out here "
                                             f"({', '.join(KNOWN_TYPES)}); meta.model_shape counts it")
    if model_type in DENSE_TYPES:
        moe = next((name for name in _MOE_FIELDS if fields.get(name)), None)
        if moe:
            raise ConfigFieldError(moe, f"is set, but model_type {model_type!r} is counted as a dense model: "
                                        "its experts would be missed")
        return _dense(fields, attention, model_type)
    if model_type == "mixtral":
        return _mixtral(fields, attention)
    return _deepseek(fields, attention, model_type)


def _common(fields: dict[str, Any], attention: Attention, model_type: str, **shape: Any) -> ModelShape:
    return ModelShape(model_type=model_type, hidden=positive_int(fields, "hidden_size"),
                      vocab=positive_int(fields, "vocab_size"),
                      tied_embeddings=bool(fields.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
                      attention=attention,
                      max_len=derived_max_len(fields), sglang_max_len=sglang_context_length(fields),
                      torch_dtype=fields.get("torch_dtype") or fields.get("dtype"),
                      **shape)


def _gqa_linears(fields: dict[str, Any], attention: Attention, model_type: str) -> list[Linear]:
    hidden, layers = positive_int(fields, "hidden_size"), attention.layers
    q_width, kv_width = attention.heads * attention.head_dim, attention.kv_heads * attention.head_dim
    # Qwen2 has q/k/v biases without saying so in its config; Llama/Mistral say attention_bias.
    qwen2 = model_type in ("qwen2", "qwen2_vl")
    qkv_bias = bool(fields.get("attention_bias", qwen2))
    o_bias = bool(fields.get("attention_bias", False)) and not qwen2
    return [Linear("q_proj", hidden, q_width, layers, qkv_bias, "column"),
            Linear("k_proj", hidden, kv_width, layers, qkv_bias, "kv"),
            Linear("v_proj", hidden, kv_width, layers, qkv_bias, "kv"),
            Linear("o_proj", q_width, hidden, layers, o_bias, "row")]


def _mlp(name: str, hidden: int, width: int, count: int, bias: bool = False,
         at: tuple[int, ...] = ()) -> list[Linear]:
    """A gated MLP (gate, up: hidden -> width; down: width -> hidden), `count` copies over the layers `at` (empty:
    every layer)."""
    return [Linear(f"{name}.gate_proj", hidden, width, count, bias, "column", layers=len(at), at=at),
            Linear(f"{name}.up_proj", hidden, width, count, bias, "column", layers=len(at), at=at),
            Linear(f"{name}.down_proj", width, hidden, count, bias, "row", layers=len(at), at=at)]


def _norms(fields: dict[str, Any], layers: int, per_layer: int) -> int:
    hidden = positive_int(fields, "hidden_size")
    return layers * per_layer * hidden + hidden  # per-layer RMSNorms and the final one


def _dense(fields: dict[str, Any], attention: Attention, model_type: str) -> ModelShape:
    hidden, layers = positive_int(fields, "hidden_size"), attention.layers
    intermediate = positive_int(fields, "intermediate_size", default=4 * hidden)
    linears = _gqa_linears(fields, attention, model_type) + _mlp(
        "mlp", hidden, intermediate, layers, bool(fields.get("mlp_bias", False)))
    norms = _norms(fields, layers, _NORMS_PER_LAYER.get(model_type, 2))
    if model_type == "qwen3":
        norms += layers * 2 * attention.head_dim  # q_norm and k_norm over each head
    return _common(fields, attention, model_type, linears=tuple(linears), other_params=norms,
                   mlp_width=intermediate)


def _mixtral(fields: dict[str, Any], attention: Attention) -> ModelShape:
    hidden, layers = positive_int(fields, "hidden_size"), attention.layers
    experts, top_k = positive_int(fields, "num_local_experts"), positive_int(fields, "num_experts_per_tok")
    width = positive_int(fields, "intermediate_size")
    linears = _gqa_linears(fields, attention, "mixtral") + [
        Linear("experts.w1", hidden, width, layers * experts, split="column"),
        Linear("experts.w3", hidden, width, layers * experts, split="column"),
        Linear("experts.w2", width, hidden, layers * experts, split="row"),
        Linear("router", hidden, experts, layers, split="none", quantized=False)]
    return _common(fields, attention, "mixtral", linears=tuple(linears), other_params=_norms(fields, layers, 2),
                   mlp_width=top_k * width, experts=experts, experts_per_token=top_k)


def _deepseek(fields: dict[str, Any], attention: Attention, model_type: str) -> ModelShape:
    """DeepSeek-V2/V3: MLA projections, then a dense MLP in the first `first_k_dense_replace` layers and in layers
    off `moe_layer_freq`, and in the others `n_routed_experts` experts plus `n_shared_experts` shared ones (one MLP
    of n_shared_experts x moe_intermediate_size) and a router. V3's MTP layer is not counted (vLLM does not load it
    for plain serving)."""
    hidden, layers, heads = positive_int(fields, "hidden_size"), attention.layers, attention.heads
    nope, rope = positive_int(fields, "qk_nope_head_dim"), positive_int(fields, "qk_rope_head_dim")
    v_dim, kv_rank = positive_int(fields, "v_head_dim"), positive_int(fields, "kv_lora_rank")
    q_rank = _count(fields, "q_lora_rank")
    qk = nope + rope
    linears = ([Linear("q_a_proj", hidden, q_rank, layers, split="none"),
                Linear("q_b_proj", q_rank, heads * qk, layers)] if q_rank else
               [Linear("q_proj", hidden, heads * qk, layers)])
    linears += [Linear("kv_a_proj_with_mqa", hidden, kv_rank + rope, layers, split="none"),
                Linear("kv_b_proj", kv_rank, heads * (nope + v_dim), layers),
                Linear("o_proj", heads * v_dim, hidden, layers, split="row")]
    norms = _norms(fields, layers, 2) + layers * (kv_rank + q_rank)  # kv_a_layernorm, q_a_layernorm
    routed, width = positive_int(fields, "n_routed_experts"), positive_int(fields, "moe_intermediate_size")
    shared, top_k = _count(fields, "n_shared_experts"), positive_int(fields, "num_experts_per_tok")
    first_dense, freq = _count(fields, "first_k_dense_replace"), positive_int(fields, "moe_layer_freq", default=1)
    moe_at = tuple(i for i in range(layers) if i >= first_dense and i % freq == 0)
    dense_at = tuple(i for i in range(layers) if i not in moe_at)
    moe_layers, dense_layers = len(moe_at), len(dense_at)
    dense_width = positive_int(fields, "intermediate_size") if dense_layers else 0
    if dense_layers:
        linears += _mlp("mlp", hidden, dense_width, dense_layers, at=dense_at)
    linears += _mlp("experts", hidden, width, moe_layers * routed, at=moe_at)
    if shared:
        linears += _mlp("shared_experts", hidden, shared * width, moe_layers, at=moe_at)
    linears.append(Linear("router", hidden, routed, moe_layers, split="none", quantized=False, layers=moe_layers,
                          at=moe_at))
    if model_type == "deepseek_v3":
        norms += moe_layers * routed  # the router's e_score_correction_bias
    return _common(fields, attention, model_type, linears=tuple(linears), other_params=norms,
                   mlp_width=max(dense_width, (top_k + shared) * width), experts=routed, experts_per_token=top_k)
