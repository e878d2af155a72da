"""vLLM's V0 engine splits the KV cache over its pipeline stages' virtual engines (vllm/worker/cache_engine.py@v0.8.5):
one sequence gets blocks // pipeline_parallel_size, which the plan's token count and its fit check follow."""

from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_v0_pipeline_stages_split_the_kv_cache():
    shape, bf16 = model_shape(LLAMA_8B), weight_format("baseline")
    work = Workload(max_model_len=8192)
    stages = Target(gpu_by_name("L40S"), num_gpus=1, pipeline_parallel_size=2)
    v0 = plan_vllm(shape, bf16, stages, work, version="0.8.5")  # V1 took PP only with Ray before 0.9: V0
    per_block = v0.memory.kv_bytes_per_token * 16
    assert v0.kv_tokens == v0.memory.kv_cache_bytes // per_block // 2 * 16
    v1 = plan_vllm(shape, bf16, stages, work, version="0.9.0")
    assert v1.kv_tokens == v1.memory.kv_cache_bytes // (v1.memory.kv_bytes_per_token * 16) * 16
