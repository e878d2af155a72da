"""Memory arithmetic from a model's config alone: KV cache per token, weights per format, an activation estimate.

Nothing here loads weights. Works on a transformers PretrainedConfig or on config.json read as a dict, and on
multimodal configs through their nested `text_config`. Covers Llama/Qwen2/Mistral-style decoders (the shapes
quantgate serves); MoE or MLA models would need their own arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

# SmolLM2-135M-Instruct's config.json (the demo model): 134,515,008 parameters, 23,040 KV bytes per token in bf16.
DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

# GPT-2/Falcon-style spellings of the same fields.
_ALIASES = {
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd", "d_model"),
}

FP16_BYTES = 2


def text_config(config: Any) -> dict[str, Any]:
    """The language model's fields as a dict: `text_config` of a multimodal config, else the config itself."""
    fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    nested = fields.get("text_config")
    if hasattr(nested, "to_dict"):
        nested = nested.to_dict()
    if isinstance(nested, dict) and nested:
        return {**fields, **nested}
    return fields


def _int(fields: dict[str, Any], name: str) -> int:
    for key in (name, *_ALIASES.get(name, ())):
        if fields.get(key) is not None:
            return int(fields[key])
    raise ValueError(f"model config has no '{name}'; is this a decoder-only language model's config.json?")


def head_dim(fields: dict[str, Any]) -> int:
    if fields.get("head_dim"):
        return int(fields["head_dim"])
    return _int(fields, "hidden_size") // _int(fields, "num_attention_heads")


def num_kv_heads(fields: dict[str, Any]) -> int:
    value = fields.get("num_key_value_heads")
    return int(value) if value else _int(fields, "num_attention_heads")


def kv_bytes_per_token(config: Any, kv_dtype_bytes: float = 2) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element."""
    fields = text_config(config)
    layers = _int(fields, "num_hidden_layers")
    return int(round(2 * layers * num_kv_heads(fields) * head_dim(fields) * kv_dtype_bytes))


def _linear_shapes(fields: dict[str, Any]) -> list[tuple[int, int, bool]]:
    """(in_features, out_features, has_bias) of every linear layer in one decoder layer."""
    hidden = _int(fields, "hidden_size")
    q_width = _int(fields, "num_attention_heads") * head_dim(fields)
    kv_width = num_kv_heads(fields) * head_dim(fields)
    intermediate = int(fields.get("intermediate_size") or 4 * hidden)
    # Qwen2 has q/k/v biases without saying so in its config; Llama/Mistral say attention_bias.
    qkv_bias = bool(fields.get("attention_bias", fields.get("model_type") in ("qwen2", "qwen2_vl")))
    o_bias = bool(fields.get("attention_bias", False)) and fields.get("model_type") not in ("qwen2", "qwen2_vl")
    mlp_bias = bool(fields.get("mlp_bias", False))
    return [
        (hidden, q_width, qkv_bias), (hidden, kv_width, qkv_bias), (hidden, kv_width, qkv_bias),
        (q_width, hidden, o_bias),
        (hidden, intermediate, mlp_bias), (hidden, intermediate, mlp_bias), (intermediate, hidden, mlp_bias),
    ]


def _embedding_params(fields: dict[str, Any]) -> int:
    """Input embeddings plus lm_head (once if tied)."""
    embed = _int(fields, "vocab_size") * _int(fields, "hidden_size")
    tied = bool(fields.get("tie_word_embeddings", False))
    return embed if tied else 2 * embed


def _norm_params(fields: dict[str, Any]) -> int:
    hidden = _int(fields, "hidden_size")
    return _int(fields, "num_hidden_layers") * 2 * hidden + hidden  # two RMSNorms per layer, one final


def parameter_count(config: Any) -> int:
    """Parameters of a Llama/Qwen2/Mistral-style decoder (SmolLM2-135M: 134,515,008; Llama-3-8B: 8,030,261,248)."""
    fields = text_config(config)
    per_layer = sum(i * o + (o if bias else 0) for i, o, bias in _linear_shapes(fields))
    return _int(fields, "num_hidden_layers") * per_layer + _embedding_params(fields) + _norm_params(fields)


def _quantized_linear_bytes(in_features: int, out_features: int, bits: float, group_size: int | None,
                            with_g_idx: bool) -> float:
    """GPTQ/AWQ storage: packed weights + per group an fp16 scale and a packed `bits`-wide zero per output column."""
    groups = math.ceil(in_features / group_size) if group_size and group_size > 0 else 1
    packed = in_features * out_features * bits / 8
    scales = groups * out_features * FP16_BYTES
    zeros = groups * out_features * bits / 8
    g_idx = in_features * 4 if with_g_idx else 0  # GPTQ's int32 group index per input channel
    return packed + scales + zeros + g_idx


def estimate_weights_bytes(config: Any, bits: float, group_size: int | None = None, *, fmt: str | None = None) -> int:
    """Bytes of the weights as a serving engine holds them, for one quantization scheme.

    bits >= 16: every parameter at bits/8 bytes (the bf16/fp16 baseline; 32 for fp32).
    bits == 8: LLM.int8 (bitsandbytes): linear weights 1 byte plus an fp32 scale per output row; embeddings,
      lm_head and norms stay 16-bit.
    otherwise: GPTQ/AWQ-style grouped quantization of the decoder's linear layers (group_size None or <= 0: one
      group per column); embeddings, lm_head, norms and biases stay 16-bit. fmt="gptq" also counts GPTQ's g_idx.
    """
    fields = text_config(config)
    if bits >= 16:
        return int(round(parameter_count(fields) * bits / 8))
    layers = _int(fields, "num_hidden_layers")
    kept_16bit = _embedding_params(fields) + _norm_params(fields)
    linear_bytes = 0.0
    for in_features, out_features, bias in _linear_shapes(fields):
        if bias:
            kept_16bit += layers * out_features
        if bits == 8:
            linear_bytes += layers * (in_features * out_features + out_features * 4)
        else:
            linear_bytes += layers * _quantized_linear_bytes(in_features, out_features, bits, group_size,
                                                             with_g_idx=fmt == "gptq")
    return int(round(linear_bytes + kept_16bit * FP16_BYTES))


def estimate_activation_peak_bytes(config: Any, max_num_batched_tokens: int, max_num_seqs: int = 256,
                                   act_dtype_bytes: int = 2) -> int:
    """Rough peak of a serving engine's forward pass over `max_num_batched_tokens` tokens (vLLM's profile run).

    The MLP is the widest point: while the residual stream and the layer input (2 x hidden) are live, the fused
    gate/up output (2 x intermediate) and the activated product (intermediate) exist together, so we count
    tokens x (4 x hidden + 3 x intermediate) x 2 bytes (the 2 extra hidden widths cover attention's q/k/v and
    output buffers). The sampler adds fp32 logits for one token per sequence, twice (logits and softmax):
    max_num_seqs x vocab x 4 x 2. Llama-3-8B at 8192 tokens: about 1.2 GiB, the order vLLM's profiler reports.
    """
    fields = text_config(config)
    hidden = _int(fields, "hidden_size")
    intermediate = int(fields.get("intermediate_size") or 4 * hidden)
    forward = max_num_batched_tokens * (4 * hidden + 3 * intermediate) * act_dtype_bytes
    sampler = max_num_seqs * _int(fields, "vocab_size") * 4 * 2
    return int(forward + sampler)
