"""Memory arithmetic from a model's config alone: KV cache per token, weights per format, an activation estimate.

Nothing here loads weights. A thin face over the memory model in harness.capacity (shapes.py, memory.py),
taking a transformers PretrainedConfig or config.json read as a dict (multimodal configs through their nested
`text_config`). Dense decoders, MoE (every expert counted) and MLA are covered; an architecture the memory model
cannot count raises ConfigFieldError (a ValueError) naming the field.
"""

from __future__ import annotations

from typing import Any

from harness.capacity.memory import FP16_BYTES, WeightFormat
from harness.capacity.memory import activation_peak_bytes as _activation_peak_bytes
from harness.capacity.memory import kv_bytes_per_sequence as _kv_bytes_per_sequence
from harness.capacity.memory import kv_bytes_per_token as _kv_bytes_per_token
from harness.capacity.memory import parameter_count as _parameter_count
from harness.capacity.memory import weights_bytes
from harness.capacity.meta import model_shape
from harness.capacity.shapes import ConfigFieldError, attention_shape, config_fields, head_dim, num_kv_heads

__all__ = ["DEMO_CONFIG", "FP16_BYTES", "ConfigFieldError", "estimate_activation_peak_bytes",
           "estimate_weights_bytes", "head_dim", "kv_bytes_per_sequence", "kv_bytes_per_token", "num_kv_heads",
           "parameter_count", "text_config"]

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

text_config = config_fields


def kv_bytes_per_token(config: Any, kv_dtype_bytes: float = 2) -> int:
    """KV bytes of one token in every layer, as vLLM/SGLang store it: GQA 2 (K and V) x layers x KV heads x head_dim
    x bytes; MLA (kv_lora_rank + qk_rope_head_dim) x layers x bytes. Sliding-window layers count in full here (see
    kv_bytes_per_sequence), and so do layer types the memory model does not plan (an upper bound, not an error: the
    run report calls this for any model it measured)."""
    return _kv_bytes_per_token(attention_shape(config, strict=False), kv_dtype_bytes)


def kv_bytes_per_sequence(config: Any, length: int, kv_dtype_bytes: float = 2) -> int:
    """KV bytes of one sequence of `length` tokens: a sliding-window layer holds at most sliding_window of them."""
    return _kv_bytes_per_sequence(attention_shape(config), length, kv_dtype_bytes)


def parameter_count(config: Any) -> int:
    """All parameters, every expert included (SmolLM2-135M: 134,515,008; Llama-3-8B: 8,030,261,248)."""
    return _parameter_count(model_shape(config))


def estimate_weights_bytes(config: Any, bits: float, group_size: int | None = None, *, fmt: str | None = None) -> int:
    """Bytes of the weights as a serving engine holds them, for one quantization scheme.

    bits >= 16: every parameter at bits/8 bytes (the bf16/fp16 baseline; 32 for fp32).
    bits == 8: LLM.int8 (bitsandbytes) and INT8 W8A8 (compressed-tensors, as vLLM holds it): linear weights 1 byte
      plus an fp32 scale per output row; embeddings, lm_head and norms stay 16-bit.
    otherwise: GPTQ/AWQ-style grouped quantization of the linear layers (group_size None or <= 0: one group per
      column); embeddings, lm_head, norms, biases and MoE routers stay 16-bit. fmt="gptq" also counts GPTQ's g_idx.
    """
    name = "baseline" if bits >= 16 else "int8" if bits == 8 else (fmt or "4bit")
    return weights_bytes(model_shape(config), WeightFormat(name, bits, group_size, g_idx=fmt == "gptq"))


def estimate_activation_peak_bytes(config: Any, max_num_batched_tokens: int, max_num_seqs: int = 256,
                                   act_dtype_bytes: int = 2) -> int:
    """Rough peak of a serving engine's forward pass over `max_num_batched_tokens` tokens (vLLM's profile run):
    tokens x (4 x hidden + 3 x MLP width) x 2 bytes plus fp32 sampler logits, max_num_seqs x vocab x 4 x 2
    (harness.capacity.memory.activation_peak_bytes). Llama-3-8B at 8192 tokens: about 1.2 GiB."""
    return _activation_peak_bytes(model_shape(config), max_num_batched_tokens, max_num_seqs, act_dtype_bytes)
