"""The memory model on real published configs: parameter counts against the published sizes, KV per token and per
sequence exactly the formula's, weights per format, tensor-parallel splits, and clear errors for what it cannot count.

The configs are the models' published config.json files, written out (no hub here); tests/test_planners.py uses them
too."""

import math

import pytest

from harness.capacity import (ConfigFieldError, TensorParallelError, attention_shape, kv_bytes_per_sequence,
                                      kv_bytes_per_token, model_shape, parameter_count, weight_format, weights_bytes)
from harness.capacity.memory import activation_peak_bytes, kv_heads_per_gpu, kv_split
from harness.measure.kv import estimate_weights_bytes
from harness.measure.kv import kv_bytes_per_sequence as kv_sequence_from_config
from harness.measure.kv import kv_bytes_per_token as kv_from_config
from harness.measure.kv import parameter_count as count_from_config

GIB = 2**30

# meta-llama/Meta-Llama-3-8B: 8.03B parameters.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}

# Qwen/Qwen2.5-7B: 7.62B parameters (sliding_window is set but use_sliding_window is off).
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
    "vocab_size": 152064,
}

# mistralai/Mixtral-8x7B-v0.1: 46.7B parameters, 8 experts, 2 per token.
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
    "use_cache": True, "vocab_size": 32000,
}

# deepseek-ai/DeepSeek-V2-Lite: 15.7B parameters; MLA (kv_lora_rank 512 + rope 64), 64 routed + 2 shared experts.
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                 "AutoModel": "modeling_deepseek.DeepseekV2Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}

# google/gemma-2-9b: 9.24B parameters; 42 layers alternating sliding-window (4096) and global attention.
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_size": 4096,
    "torch_dtype": "float32", "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 256000,
}

# (config, published parameter count) for each.
PUBLISHED = {
    "Llama-3-8B": (LLAMA3_8B, 8.03e9),
    "Qwen2.5-7B": (QWEN25_7B, 7.62e9),
    "Mixtral-8x7B": (MIXTRAL_8X7B, 46.7e9),
    "DeepSeek-V2-Lite": (DEEPSEEK_V2_LITE, 15.7e9),
    "Gemma-2-9B": (GEMMA2_9B, 9.24e9),
}

PARAMETERS = {  # what the memory model counts, to the parameter (published: PUBLISHED's rounded figures)
    "Llama-3-8B": 8_030_261_248, "Qwen2.5-7B": 7_615_616_512, "Mixtral-8x7B": 46_702_792_704,
    "DeepSeek-V2-Lite": 15_706_484_224, "Gemma-2-9B": 9_241_705_984,
}


# --- parameters

@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_within_one_percent_of_the_published_size(name):
    config, published = PUBLISHED[name]
    counted = parameter_count(model_shape(config))
    assert abs(counted - published) / published < 0.01, f"{name}: {counted:,} vs {published:,.0f}"
    assert counted == PARAMETERS[name] == count_from_config(config)


def test_every_expert_counts():
    # Mixtral per layer: attention 41,943,040 + 8 experts x 3 x 4096 x 14336 = 1,409,286,144 + router 32,768
    # + 2 norms 8,192; x 32 layers, + embeddings and lm_head 2 x 32000 x 4096 + final norm.
    assert parameter_count(model_shape(MIXTRAL_8X7B)) == 32 * (41_943_040 + 1_409_286_144 + 32_768 + 8_192) + \
        2 * 32_000 * 4096 + 4096
    one_expert = dict(MIXTRAL_8X7B, num_local_experts=1)
    assert parameter_count(model_shape(MIXTRAL_8X7B)) > 6 * parameter_count(model_shape(one_expert))


def test_deepseek_counts_mla_shared_experts_and_the_dense_first_layer():
    # Layer 0 is dense (first_k_dense_replace 1): attention 13,763,072 (q 2048x3072, kv_a 2048x576, kv_a_layernorm
    # 512, kv_b 512x4096, o 2048x2048) + norms 4,096 + MLP 3 x 2048 x 10944; layers 1-26: attention + norms +
    # 64 routed experts 3 x 2048 x 1408 each + 2 shared (one MLP of 2816) + router 64 x 2048.
    dense_layer = 13_763_072 + 4_096 + 3 * 2048 * 10944
    moe_layer = 13_763_072 + 4_096 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816 + 64 * 2048
    assert PARAMETERS["DeepSeek-V2-Lite"] == dense_layer + 26 * moe_layer + 2 * 102_400 * 2048 + 2048
    all_dense = dict(DEEPSEEK_V2_LITE, first_k_dense_replace=27)
    assert parameter_count(model_shape(all_dense)) < 0.2 * PARAMETERS["DeepSeek-V2-Lite"]


# --- KV cache: per token exactly the formula's

@pytest.mark.parametrize("name, expected", [
    ("Llama-3-8B", 2 * 32 * 8 * 128 * 2),  # 2 (K, V) x layers x KV heads x head_dim x bytes
    ("Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),
    ("Mixtral-8x7B", 2 * 32 * 8 * 128 * 2),
    ("DeepSeek-V2-Lite", (512 + 64) * 27 * 2),  # MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes
    ("Gemma-2-9B", 2 * 42 * 8 * 256 * 2),  # explicit head_dim 256, not 3584 / 16
])
def test_kv_bytes_per_token(name, expected):
    config = PUBLISHED[name][0]
    assert kv_bytes_per_token(attention_shape(config)) == expected == kv_from_config(config)
    assert kv_bytes_per_token(attention_shape(config), kv_dtype_bytes=1) == expected // 2  # fp8 KV cache


def test_gemma2_sliding_layers_hold_at_most_the_window():
    attention = attention_shape(GEMMA2_9B)
    assert attention.sliding_layers == 21
    assert attention.windows[:4] == (4096, None, 4096, None)  # even layers slide (transformers' layer_types)
    per_layer = 2 * 8 * 256 * 2
    # Up to the window every layer holds every token; past it the 21 sliding layers keep 4096.
    assert kv_bytes_per_sequence(attention, 2048) == 42 * per_layer * 2048
    assert kv_bytes_per_sequence(attention, 8192) == per_layer * (21 * 8192 + 21 * 4096) == 2_113_929_216
    assert kv_sequence_from_config(GEMMA2_9B, 8192) == 2_113_929_216
    assert kv_bytes_per_sequence(attention, 8192, sliding=False) == 42 * per_layer * 8192
    # vLLM: a chunked prefill holds up to max_num_batched_tokens - 1 more in a sliding layer; blocks round up.
    assert kv_bytes_per_sequence(attention, 8192, window_extra=2047, block_size=16) == per_layer * (
        21 * 8192 + 21 * 6144)


def test_layer_types_and_qwen_sliding_switch():
    assert attention_shape(QWEN25_7B).sliding_layers == 0  # sliding_window given, use_sliding_window off
    on = attention_shape(dict(QWEN25_7B, use_sliding_window=True, max_window_layers=20, sliding_window=4096))
    assert on.windows == (None,) * 20 + (4096,) * 8
    typed = dict(GEMMA2_9B, layer_types=["full_attention"] * 40 + ["sliding_attention"] * 2)
    assert attention_shape(typed).sliding_layers == 2
    assert attention_shape(dict(MIXTRAL_8X7B, sliding_window=4096)).sliding_layers == 32  # Mistral-style: all


def test_derived_max_len_follows_rope_scaling():
    assert model_shape(LLAMA3_8B).max_len == 8192
    assert model_shape(DEEPSEEK_V2_LITE).max_len == 4096 * 40  # YaRN: original_max_position_embeddings x factor
    assert model_shape(dict(LLAMA3_8B, rope_scaling={"rope_type": "llama3", "factor": 8.0})).max_len == 8192


# --- weights per format

def test_weights_per_format():
    shape = model_shape(MIXTRAL_8X7B)
    baseline = weights_bytes(shape, weight_format("baseline"))
    int8 = weights_bytes(shape, weight_format("int8"))
    gptq = weights_bytes(shape, weight_format("gptq", 128))
    awq = weights_bytes(shape, weight_format("awq", 128))
    assert baseline == 2 * PARAMETERS["Mixtral-8x7B"]
    assert 0.5 < int8 / baseline < 0.52  # 1 byte + fp32 row scales; embeddings, routers, norms 16-bit
    assert 22.5 * GIB < gptq < 23.5 * GIB  # every expert at 4 bits + fp16 scales and packed zeros per 128
    assert gptq - awq == 32 * 4 * (8 * (4096 + 4096 + 14336) + 3 * 4096 + 4096)  # GPTQ's int32 g_idx per input
    assert gptq == estimate_weights_bytes(MIXTRAL_8X7B, 4, 128, fmt="gptq")


def test_quantized_layer_storage_formula():
    # Llama-3-8B q_proj at 4 bits, group 128: packed 4096 x 4096 / 2 + 32 groups x 4096 fp16 scales + 32 x 4096
    # packed 4-bit zeros; the whole model minus the 16-bit embeddings, lm_head and norms is that per linear.
    shape = model_shape(LLAMA3_8B)
    embeddings_and_norms = (2 * 128_256 * 4096 + 32 * 2 * 4096 + 4096) * 2
    per_layer = 0
    for i, o in ((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336), (14336, 4096)):
        groups = math.ceil(i / 128)
        per_layer += i * o / 2 + groups * o * 2 + groups * o / 2
    assert weights_bytes(shape, weight_format("awq", 128)) == int(32 * per_layer + embeddings_and_norms)


# --- tensor parallelism

def test_tensor_parallel_splits_weights_and_kv_heads():
    shape = model_shape(LLAMA3_8B)
    norms = 32 * 2 * 4096 + 4096
    assert weights_bytes(shape, weight_format("baseline"), tp=2) == ((PARAMETERS["Llama-3-8B"] - norms) // 2 + norms) * 2
    attention = shape.attention
    assert kv_heads_per_gpu(attention, 2) == 4 and kv_bytes_per_token(attention, tp=2) == 65_536
    assert kv_heads_per_gpu(attention, 16) == 1  # 8 KV heads on 16 GPUs: each replicated twice
    assert "replicated" in kv_split(attention, 16) and "split, 4 per GPU" in kv_split(attention, 2)
    with pytest.raises(TensorParallelError, match="num_attention_heads 32"):
        kv_heads_per_gpu(attention, 3)
    qwen = attention_shape(QWEN25_7B)
    with pytest.raises(TensorParallelError, match="num_key_value_heads 4"):
        kv_heads_per_gpu(qwen, 7)  # 28 heads split 7 ways, but 4 KV heads can be neither split nor replicated
    mla = attention_shape(DEEPSEEK_V2_LITE)
    assert kv_bytes_per_token(mla, tp=4) == kv_bytes_per_token(mla) == 31_104  # the latent is on every GPU


# --- activations

def test_activation_estimate_uses_the_experts_a_token_visits():
    mixtral = model_shape(MIXTRAL_8X7B)  # 2 experts of 14336 per token
    # the forward over 8,192 tokens, where the MLP of the 2 visited experts is widest (it outweighs the sampler)
    assert activation_peak_bytes(mixtral, 8192, 256) == 8192 * (3 * 4096 + 3 * 2 * 14336) * 2
    deepseek = model_shape(DEEPSEEK_V2_LITE)  # 6 routed + 2 shared of 1408 > the dense layer's 10944
    assert deepseek.mlp_width == 8 * 1408
    assert activation_peak_bytes(mixtral, 8192, tp=2) < activation_peak_bytes(mixtral, 8192)


# --- what it cannot count is an error naming the field, never a silent dense count

@pytest.mark.parametrize("config, field", [
    (dict(LLAMA3_8B, model_type="not_a_model"), "model_type"),  # an architecture transformers does not know
    ({k: v for k, v in LLAMA3_8B.items() if k != "model_type"}, "model_type"),
    (dict(LLAMA3_8B, num_local_experts=8), "num_local_experts"),  # dense model_type with experts
    ({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"}, "num_local_experts"),
    ({k: v for k, v in DEEPSEEK_V2_LITE.items() if k != "n_routed_experts"}, "n_routed_experts"),
    ({k: v for k, v in DEEPSEEK_V2_LITE.items() if k != "qk_nope_head_dim"}, "qk_nope_head_dim"),
    (dict(GEMMA2_9B, layer_types=["linear_attention"] * 42), "layer_types"),
    (dict(LLAMA3_8B, num_hidden_layers="many"), "num_hidden_layers"),
])
def test_unknown_architecture_or_missing_field_names_the_field(config, field):
    with pytest.raises(ConfigFieldError, match=f"field '{field}'") as caught:
        model_shape(config)
    assert caught.value.field == field


def test_kv_needs_no_known_architecture():
    # KV per token needs only the attention fields: an unknown model_type still gets it.
    assert kv_from_config(dict(LLAMA3_8B, model_type="some_new_llama")) == 131_072
    # The run report's KV figure never fails on a layer type the planners refuse: it counts it as full attention.
    assert kv_from_config(dict(GEMMA2_9B, layer_types=["linear_attention"] * 42)) == 344_064
