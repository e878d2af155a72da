"""Every architecture transformers can build, planned as the engines allocate it (issue #39, item 4): hybrid models
(KV for the attention layers, a state per running sequence for the Mamba / linear-attention / short-conv layers),
sliding-window and chunked layers per engine, the maximum length vLLM derives, multimodal configs from their text
config plus the vision tower, MLA unchanged.

The configs are the models' published config.json files written out (no hub at test time). A value that could
not be read from the published file itself is marked "reconstructed" with what confirms it.
"""

from __future__ import annotations

import math

import pytest

from harness.capacity import ConfigFieldError, Target, Workload, gpu_by_name, plan_engine, weight_format
from harness.capacity.memory import (GIB, kv_bytes_per_sequence, kv_bytes_per_token, kv_layer_token_bytes,
                                     layer_state_bytes, parameter_count, state_bytes_per_sequence, vllm_block_size,
                                     vllm_sequence_bytes, weights_bytes)
from harness.capacity.meta import model_shape
from harness.capacity.sglang import MAMBA_SLOTS_PER_REQUEST, SWA_FULL_TOKENS_RATIO, sglang_pools
from harness.capacity.shapes import NO_KV, attention_shape, derived_max_len
from harness.capacity.trtllm import max_attention_window

# nvidia/NVIDIA-Nemotron-Nano-9B-v2, https://huggingface.co/nvidia/NVIDIA-Nemotron-Nano-9B-v2/blob/main/config.json
# (the architecture fields; reconstructed from the model card and Megatron's training script for it, and confirmed by
# the two figures vLLM logged for it in https://github.com/vllm-project/vllm/issues/23230: weights 16.5557 GiB, and a
# 33.75 GiB Mamba cache allocation, below).
NEMOTRON_NANO_9B_V2 = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 12, "head_dim": 128, "hidden_dropout": 0.0,
    "hidden_size": 4480, "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "initializer_range": 0.02, "intermediate_size": 15680, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 80,
    "mamba_hidden_act": "silu", "mamba_num_heads": 128, "mamba_proj_bias": False, "max_position_embeddings": 131072,
    "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8,
    "num_attention_heads": 40, "num_hidden_layers": 56, "num_key_value_heads": 8, "num_logits_to_keep": 1,
    "pad_token_id": 0, "rescale_prenorm_residual": True, "residual_in_fp32": False, "rms_norm_eps": 1e-05,
    "sliding_window": None, "ssm_state_size": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_bias": False, "use_cache": True, "use_conv_bias": True, "use_mamba_kernels": True, "vocab_size": 131072,
}

# google/gemma-3-27b-it exactly as published (https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json):
# its text_config leaves vocab_size, max_position_embeddings and the sliding-window pattern to transformers' defaults.
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}

# meta-llama/Llama-3.2-11B-Vision, https://huggingface.co/meta-llama/Llama-3.2-11B-Vision/blob/main/config.json
# (the fields transformers reads; the file repeats transformers' generation defaults in text_config).
LLAMA32_11B_VISION = {
    "architectures": ["MllamaForConditionalGeneration"], "image_token_index": 128256, "model_type": "mllama",
    "text_config": {"cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38], "dropout": 0, "eos_token_id": 128001,
                    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                    "intermediate_size": 14336, "max_position_embeddings": 131072,
                    "model_type": "mllama_text_model", "num_attention_heads": 32, "num_hidden_layers": 40,
                    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                    "use_cache": True, "vocab_size": 128256},
    "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
    "vision_config": {"attention_heads": 16, "hidden_act": "gelu", "hidden_size": 1280, "image_size": 560,
                      "intermediate_layers_indices": [3, 7, 15, 23, 30], "intermediate_size": 5120,
                      "max_num_tiles": 4, "model_type": "mllama_vision_model", "norm_eps": 1e-05,
                      "num_channels": 3, "num_global_layers": 8, "num_hidden_layers": 32, "patch_size": 14,
                      "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
                      "vision_output_dim": 7680},
}

# openai/gpt-oss-20b, https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json (quantization_config left
# out: the weights are another test's subject).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                            "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                            "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}

# Qwen/Qwen3-Next-80B-A3B-Instruct, https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json:
# gated DeltaNet layers with full attention every 4th (full_attention_interval; the file has no layer_types).
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

# Qwen/Qwen3.5-9B's text_config, the fields vLLM sizes the state and KV with (reconstructed; confirmed by what vLLM
# logged for it on 2 GPUs in https://github.com/vllm-project/vllm/pull/37467: "Setting attention block size to 528
# tokens" and "Padding mamba page size by 0.76%", which fix the GDN state with its float32 mamba_ssm_dtype).
QWEN35_9B_TEXT = {
    "model_type": "qwen3_5_text", "hidden_size": 4096, "num_hidden_layers": 32, "full_attention_interval": 4,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16",
}

# CohereForAI/c4ai-command-r7b-12-2024, https://huggingface.co/CohereForAI/c4ai-command-r7b-12-2024/blob/main/
# config.json: three sliding-window layers to one global (sliding_window_pattern 4, no layer_types).
COMMAND_R7B = {
    "architectures": ["Cohere2ForCausalLM"], "attention_bias": False, "hidden_size": 4096, "head_dim": 128,
    "intermediate_size": 14336, "logit_scale": 0.25, "max_position_embeddings": 8192, "model_type": "cohere2",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 50000,
    "sliding_window": 4096, "sliding_window_pattern": 4, "torch_dtype": "bfloat16", "vocab_size": 256000,
}

L40S = gpu_by_name("L40S")
H100 = gpu_by_name("H100")


@pytest.fixture(scope="module")
def nemotron():
    return model_shape(NEMOTRON_NANO_9B_V2)


@pytest.fixture(scope="module")
def gemma3():
    return model_shape(GEMMA3_27B)


def _plan(engine, shape, gpu=H100, fmt="baseline", **workload):
    return plan_engine(engine, shape, weight_format(fmt), Target(gpu, 1), Workload(**workload))


# --- hybrid models: KV for the attention layers, a state per running sequence for the others

def test_nemotron_h_keeps_kv_in_4_of_56_layers_and_a_mamba_state_per_sequence(nemotron):
    attention = nemotron.attention
    assert (attention.layers, attention.kv_layers, len(attention.states)) == (56, 4, 27)
    assert kv_bytes_per_token(attention) == 16_384  # what vLLM logs for it, not 14x that
    state = attention.states[0]
    # vLLM 0.10.1 (V0) allocated the SSM state of max_num_seqs 256 sequences at once: "Tried to allocate 33.75 GiB"
    # (https://github.com/vllm-project/vllm/issues/23230): 256 x 27 layers x 128 heads x 80 x 128 x float32.
    assert 256 * len(attention.states) * state.heads * state.head_elements * state.ssm_dtype_bytes == 33.75 * GIB
    # the conv state beside it: (conv_kernel - 1) x (intermediate + 2 x n_groups x d_state) in bf16
    assert layer_state_bytes(state) == 3 * (128 * 80 + 2 * 8 * 128) * 2 + 128 * 80 * 128 * 4
    assert state_bytes_per_sequence(attention) == 27 * 5_316_608
    # "what fits" counts it: one 32k sequence is its attention KV and its state
    assert kv_bytes_per_sequence(attention, 32_768) == 32_768 * 16_384 + 27 * 5_316_608
    # "Model loading took 16.5557 GiB" (the same log): 8.89 B parameters in bf16
    assert weights_bytes(nemotron, weight_format("baseline")) / GIB == pytest.approx(16.5557, rel=0.001)
    assert nemotron.max_len == 131_072
    # the Mamba layers' depthwise conv weights stay 16-bit parameters, not a 4-bit "expert" linear
    assert not any("conv1d" in linear.name for linear in nemotron.linears)


def test_tensor_parallel_splits_the_state_as_vllm_shards_it(nemotron):
    state = nemotron.attention.states[0]
    # heads and conv channels halve on two GPUs; 8 groups split evenly
    assert layer_state_bytes(state, tp=2) == layer_state_bytes(state) // 2
    # one group on two GPUs is replicated (extra_groups_for_head_shards): the conv keeps 2 groups' channels
    one_group = attention_shape(dict(NEMOTRON_NANO_9B_V2, n_groups=1)).states[0]
    assert layer_state_bytes(one_group, tp=2) == 3 * (128 * 80 + 2 * 2 * 128) // 2 * 2 + 64 * 80 * 128 * 4


def test_vllm_pages_a_hybrid_as_its_hybrid_allocator_does(nemotron):
    attention = nemotron.attention
    # the attention block grows to the smallest multiple of 16 tokens whose 4,096-byte-a-token page holds a state
    assert vllm_block_size(attention) == 1312 == 16 * math.ceil(5_316_608 / (16 * 4096))
    # 4 attention + 27 Mamba layers in groups of 4 (7 Mamba groups, one padding layer); a block costs 4 pages; a
    # 32k sequence takes ceil(32768 / 1312) = 25 attention blocks and one block per Mamba group
    assert vllm_sequence_bytes(attention, 32_768) == (25 + 7) * 4 * 1312 * 4096
    # Qwen3.5-9B on 2 GPUs: vLLM logged 528 tokens and a 0.76% padding of the state
    qwen35 = attention_shape(QWEN35_9B_TEXT)
    page = vllm_block_size(qwen35, tp=2) * kv_layer_token_bytes(qwen35, tp=2)
    state = layer_state_bytes(qwen35.states[0], tp=2)
    assert vllm_block_size(qwen35, tp=2) == 528 and round(100 * (page - state) / state, 2) == 0.76


def test_every_hybrid_family_gets_its_attention_layers_and_state():
    from transformers import AutoConfig

    from harness.capacity.shapes import config_fields

    qwen3_next = attention_shape(QWEN3_NEXT_80B)
    assert (qwen3_next.kv_layers, len(qwen3_next.states)) == (12, 36)
    assert kv_bytes_per_token(qwen3_next) == 12 * 2 * 2 * 256 * 2
    # gated DeltaNet: conv (2 x 16 key heads x 128 + 32 value heads x 128) x 3, state 32 x 128 x 128, bf16
    assert layer_state_bytes(qwen3_next.states[0]) == (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2
    jamba = attention_shape(config_fields(AutoConfig.for_model("jamba")))  # attention every 8th layer from the 5th
    assert [i for i, w in enumerate(jamba.windows) if w != NO_KV] == [4, 12, 20, 28]
    assert jamba.states[0].kind == "mamba1" and layer_state_bytes(jamba.states[0]) == 8192 * (3 + 16) * 2
    falcon = attention_shape(config_fields(AutoConfig.for_model("falcon_h1")))  # attention and Mamba2 in each layer
    assert falcon.kv_layers == len(falcon.states) == falcon.layers
    granite = config_fields(AutoConfig.for_model("granitemoehybrid", layer_types=["mamba"] * 3 + ["attention"],
                                                 num_hidden_layers=4))
    assert (attention_shape(granite).kv_layers, len(attention_shape(granite).states)) == (1, 3)
    lfm2 = attention_shape(dict(config_fields(AutoConfig.for_model("lfm2")), full_attn_idxs=[2, 5], layer_types=None))
    assert lfm2.kv_layers == 2 and layer_state_bytes(lfm2.states[0]) == 2 * 2560 * 2  # conv_L_cache 3: 2 tokens


def test_linear_attention_families_mla_hybrids_and_shared_attention():
    from transformers import AutoConfig

    from harness.capacity.shapes import config_fields

    # Kimi Linear: MLA in the full layers (the latent only), KDA state in float32 (vLLM's kda_state_dtype)
    kimi = attention_shape(dict(config_fields(AutoConfig.for_model("kimi_linear")), layer_types=None,
                                linear_attn_config={"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                                                    "kda_layers": [], "num_heads": 32, "head_dim": 128,
                                                    "short_conv_kernel_size": 4}))
    assert kimi.is_mla and (kimi.kv_layers, len(kimi.states)) == (7, 20)  # 1-based layer numbers
    assert kv_bytes_per_token(kimi) == 7 * 576 * 2
    assert layer_state_bytes(kimi.states[0]) == 3 * (3 * 32 * 128) * 2 + 32 * 128 * 128 * 4
    # MiniMax-Text-01's attn_type_list: lightning attention keeps heads x head_dim^2, no conv
    minimax = attention_shape(dict(config_fields(AutoConfig.for_model("minimax")), layer_types=None,
                                   attn_type_list=[0] * 7 + [1]))
    assert (minimax.kv_layers, len(minimax.states)) == (1, 7) and minimax.states[0].conv_tokens == 0
    # Zamba2: every layer has Mamba2; the hybrid ones add the shared attention block's KV
    zamba = attention_shape(config_fields(AutoConfig.for_model("zamba2")))
    assert len(zamba.states) == zamba.layers and zamba.kv_layers == zamba.layers // 6


def test_a_hybrid_pipeline_stage_is_bounded_by_its_layers(nemotron):
    from harness.capacity.shapes import pipeline_stage

    stage = pipeline_stage(nemotron, 2)
    assert stage.layers == 28 and stage.attention.kv_layers == 4  # the stage with the most KV: all 4 attention
    assert len(stage.attention.states) == 27  # an upper bound, as for the linears: at most 28 layers have one


def test_sglang_splits_a_hybrid_pool_between_mamba_state_and_kv(nemotron):
    plan = _plan("sglang", nemotron, max_model_len=32_768)
    pools = sglang_pools("nemotron_h", nemotron.attention, plan.memory.kv_cache_bytes, 32_768, 2, 1, 8192)
    state = 27 * 5_316_608  # --mamba-ssm-dtype float32, conv bf16
    slots = int(plan.memory.kv_cache_bytes * 0.9 / 1.9) // state
    assert plan.max_concurrency <= slots // MAMBA_SLOTS_PER_REQUEST
    assert plan.kv_tokens == pools.kv_tokens == int(plan.memory.kv_cache_bytes / 1.9 // 16_384)
    assert plan.max_concurrency <= plan.kv_tokens // 32_768


def test_a_recurrent_layer_of_an_unknown_family_is_one_line_naming_the_field():
    config = dict(QWEN3_NEXT_80B, model_type="some_new_hybrid")
    with pytest.raises(ConfigFieldError, match="field 'layer_types' has recurrent .* model_type 'some_new_hybrid'"):
        attention_shape(config)
    with pytest.raises(ConfigFieldError, match="field 'layer_types' has 'retention'"):
        attention_shape(dict(GPT_OSS_20B, layer_types=["retention"] * 24))
    # the run report's KV figure still gets an upper bound: such layers as full attention
    assert kv_bytes_per_token(attention_shape(config, strict=False)) == 48 * 2 * 2 * 256 * 2


# --- sliding windows and chunked attention, as each engine allocates them

def test_gemma3_as_published_slides_five_layers_in_six(gemma3):
    attention = gemma3.attention
    assert (attention.layers, attention.sliding_layers) == (62, 52)
    assert [i for i, w in enumerate(attention.windows) if w is None][:3] == [5, 11, 17]
    per_layer = 2 * 16 * 128 * 2
    one = kv_bytes_per_sequence(attention, 32_768)
    assert one == per_layer * (10 * 32_768 + 52 * 1024)
    assert round(one / GIB, 2) == 2.91  # about 2.9 GiB a 32k sequence, not 15.5
    assert kv_bytes_per_sequence(attention, 32_768, sliding=False) / GIB == pytest.approx(15.5)


def test_each_engine_sizes_gemma3s_sliding_layers_as_it_allocates_them(gemma3):
    attention, per_layer = gemma3.attention, 8192
    # vLLM: groups of 10 layers (10 full, 52 sliding: 6 groups, 8 padding layers); a sliding group keeps the window
    # and a prefill chunk (max_memory_usage_bytes: window - 1 + max_num_batched_tokens)
    assert vllm_sequence_bytes(attention, 32_768, window_extra=8191) == \
        (2048 + 6 * math.ceil((1024 + 8191) / 16)) * 10 * 16 * per_layer
    # SGLang gives Gemma 3 no SWA pool (model_config.py::is_hybrid_swa_model): every layer keeps all tokens
    sglang = _plan("sglang", gemma3, max_model_len=32_768)
    assert sglang.memory.kv_bytes_per_sequence == 62 * 32_768 * per_layer
    # TensorRT-LLM: the plan gives kv_cache_config.max_attention_window per layer, a sliding layer keeps its window
    # and one 32-token block
    trtllm = _plan("trtllm", gemma3, max_model_len=32_768)
    assert "max_attention_window: [1024, 1024, 1024, 1024, 1024, 32768]" in trtllm.config_yaml
    assert trtllm.memory.kv_bytes_per_sequence == per_layer * (10 * 32_768 + 52 * 1056)
    assert trtllm.max_concurrency > sglang.max_concurrency * 4


def test_vllm_before_its_hybrid_kv_cache_manager_keeps_mixed_sliding_layers_whole():
    import json
    from pathlib import Path

    # vLLM 0.8.2 on Gemma-3-1B (https://github.com/vllm-project/vllm/issues/14696): "GPU KV cache size: 1,139,728
    # tokens" and "Maximum concurrency for 32,768 tokens per request: 34.78x" = 1,139,728 / 32,768: every one of the
    # 26 layers keeps all 32,768 tokens (sliding_window 512 in 22 of them notwithstanding)
    case = json.loads((Path(__file__).parent / "fixtures/memory_logs/vllm-0.8.2-gemma-3-1b-it.json").read_text())
    attention = attention_shape(case["config"])
    assert (attention.layers, attention.sliding_layers) == (26, 22)
    kv_memory = case["logged"]["kv_tokens"] * kv_bytes_per_token(attention)
    before = vllm_sequence_bytes(attention, 32_768, window_extra=8191, hybrid_allocator=False)
    assert before == 26 * 32_768 * 2 * 256 * 2
    assert round(kv_memory / before, 2) == case["logged"]["max_concurrency"] == 34.78
    # from 0.10 the sliding layers keep window + a prefill chunk: 4 full layers and 22 short ones (groups of 4)
    after = vllm_sequence_bytes(attention, 32_768, window_extra=8191)
    assert after == (2048 + 6 * math.ceil((512 + 8191) / 16)) * 4 * 16 * 1024 and after < before / 2.5
    # a model whose layers all slide (Mistral-7B-v0.1) frees blocks either way
    mistral = attention_shape({"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096})
    assert vllm_sequence_bytes(mistral, 32_768, hybrid_allocator=False) == vllm_sequence_bytes(mistral, 32_768)


def test_gpt_oss_alternates_128_token_windows_and_sglang_pools_them():
    attention = attention_shape(GPT_OSS_20B)
    assert attention.windows[:4] == (128, None, 128, None) and attention.sliding_layers == 12
    assert kv_bytes_per_token(attention) == 24 * 2 * 8 * 64 * 2
    per_layer = 2 * 8 * 64 * 2
    # half the layers keep 128 tokens (+ the chunk in vLLM): about half the bytes of full attention a sequence
    assert vllm_sequence_bytes(attention, 131_072, window_extra=2047) == \
        (8192 + math.ceil((128 + 2047) / 16)) * 12 * 16 * per_layer
    # SGLang's SWAKVPool for GptOssForCausalLM: cell = full + 0.8 x sliding layers; the full pool binds
    pools = sglang_pools("gpt_oss", attention, 40 * GIB, 131_072, 2, 1, 8192)
    cell = per_layer * (12 + SWA_FULL_TOKENS_RATIO * 12)
    assert pools.kv_tokens == int(40 * GIB // cell) and pools.per_sequence == math.ceil(cell * 131_072)
    assert max_attention_window(model_shape(GPT_OSS_20B), 131_072) == [128, 131_072]


def test_cohere2_and_llama4_layer_patterns():
    cohere = attention_shape(COMMAND_R7B)
    assert cohere.sliding_layers == 24 and cohere.windows[3] is None and cohere.windows[:3] == (4096,) * 3
    from transformers import AutoConfig

    from harness.capacity.shapes import config_fields

    scout_text = {k: v for k, v in config_fields(AutoConfig.for_model("llama4_text")).items() if k != "layer_types"}
    scout_text.update(num_hidden_layers=48, attention_chunk_size=8192, no_rope_layers=[])  # as Scout publishes it
    llama4 = attention_shape(scout_text)
    assert llama4.sliding_layers == 36 and {w for w in llama4.windows if w} == {8192}
    assert all(llama4.windows[i] is None for i in range(3, 48, 4))  # every 4th layer: no RoPE, full attention


# --- the maximum length vLLM derives

@pytest.mark.parametrize("config, expected", [
    (GEMMA3_27B, 131_072),  # Gemma 3: vLLM skips the rope factor (8, linear): 131,072 already includes it
    (GPT_OSS_20B, 131_072),  # YaRN: original_max_position_embeddings 4,096 x factor 32
    (LLAMA32_11B_VISION, 131_072),  # llama3 scaling is already in max_position_embeddings
    (NEMOTRON_NANO_9B_V2, 131_072),
    (dict(COMMAND_R7B, seq_length=4096), 4096),  # the smallest of the length keys vLLM reads
])
def test_max_length_as_vllm_derives_it(config, expected):
    from harness.capacity.meta import multimodal_shape

    if "text_config" in config:
        assert multimodal_shape(config).max_len == expected
    else:
        assert derived_max_len(config) == expected


def test_sglang_derives_its_own_context_length(gemma3):
    from harness.capacity.shapes import sglang_context_length

    # hf_transformers_utils.get_context_length: Gemma 3's linear factor 8 applies; YaRN with
    # original_max_position_embeddings and llama3 scaling do not
    assert gemma3.sglang_max_len == 1_048_576 and gemma3.max_len == 131_072
    assert sglang_context_length(GPT_OSS_20B) == 131_072
    assert sglang_context_length(LLAMA32_11B_VISION["text_config"]) == 131_072
    assert sglang_context_length(dict(COMMAND_R7B, seq_length=4096)) == 4096  # the first key in SGLang's order


# --- multimodal models from their text config plus the vision tower

def test_multimodal_models_plan_from_the_text_config_and_the_vision_tower(gemma3):
    from harness.capacity.checkpoint import plan_config
    from harness.capacity.shapes import config_fields

    assert parameter_count(gemma3) / 1e9 == pytest.approx(27.43, abs=0.01)  # google/gemma-3-27b-it: 27.4 B
    # `quantgate plan` hands over the text fields merged over the top level: the same model
    assert model_shape(plan_config(GEMMA3_27B)) == model_shape(config_fields(GEMMA3_27B)) == gemma3
    mllama = model_shape(LLAMA32_11B_VISION)  # refused before: no text config on the meta device
    assert parameter_count(mllama) / 1e9 == pytest.approx(10.67, abs=0.01)  # Llama-3.2-11B-Vision: 10.6 B
    # 32 self-attention layers cache the text; the 8 cross-attention layers attend to the image's K/V
    assert mllama.attention.kv_layers == 32 and kv_bytes_per_token(mllama.attention) == 131_072
    # the vision tower's linears stay 16-bit and split over tensor-parallel GPUs as vLLM shards them: 2 x A10 logged
    # "Loading model weights took 10.0714 GB" a GPU (https://github.com/vllm-project/vllm/issues/10034)
    from harness.capacity.memory import planned_weights_bytes

    vision = [linear for linear in mllama.linears if linear.name.startswith("vision.")]
    assert vision and not any(linear.quantized for linear in vision)
    assert planned_weights_bytes(mllama, weight_format("baseline"), 2)[0] / GIB == pytest.approx(10.0714, rel=0.01)
    # one GPU: "Loading model weights took 19.9073 GB" (https://github.com/vllm-project/vllm/issues/8879)
    assert weights_bytes(mllama, weight_format("baseline")) / GIB == pytest.approx(19.9073, rel=0.005)


# --- MLA stays exact

def test_mla_kv_is_unchanged():
    deepseek_v3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
                   "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168}
    attention = attention_shape(deepseek_v3)
    assert kv_bytes_per_token(attention) == 61 * 576 * 2 == 70_272  # what vLLM logs for DeepSeek-V3 in bf16
    assert kv_bytes_per_sequence(attention, 4096, tp=8) == 61 * 576 * 2 * 4096  # the latent on every GPU
    assert vllm_sequence_bytes(attention, 4096) == 61 * 576 * 2 * 4096
