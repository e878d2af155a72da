"""vLLM 0.7's V0 MLA backends absorb DeepSeek's up-projections into extra 16-bit weights at load
(vllm/attention/backends/mla/utils.py:MLACommonImpl.process_weights_after_loading@v0.7.1-v0.7.3): the planner counts
them in the weights of those releases only (harness.capacity.vllm.vllm_mla_absorbed_bytes)."""

import json
from pathlib import Path

from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format
from harness.capacity.vllm import vllm_mla_absorbed_bytes

CASE = Path(__file__).parent / "fixtures" / "memory_logs" / "vllm-0.7.2-deepseek-coder-v2-lite-awq-80gb.json"


def _lite_shape():
    config = dict(json.loads(CASE.read_text(encoding="utf-8"))["config"])
    config.pop("quantization_config", None)
    return model_shape(config)


def test_absorbed_weights_are_counted_in_vllm_0_7_only():
    shape, bf16 = _lite_shape(), weight_format("baseline")
    # DeepSeek-Coder-V2-Lite: 27 MLA layers, 16 heads, hidden 2048 (no query LoRA), kv_lora_rank 512, rope dim 64
    w_qr, w_q_uk, w_uv_o = 2048 * 16 * 64, 2048 * 16 * 512, 16 * 512 * 2048
    assert vllm_mla_absorbed_bytes(shape, bf16, 1, "0.7.2") == 27 * 2 * (w_qr + w_q_uk + w_uv_o)
    assert vllm_mla_absorbed_bytes(shape, bf16, 2, "0.7.3") == 27 * 2 * (w_qr + w_q_uk + w_uv_o) // 2
    assert vllm_mla_absorbed_bytes(shape, bf16, 1, "0.6.6") == 0  # before V0's MLA backends
    assert vllm_mla_absorbed_bytes(shape, bf16, 1, "0.8.5", pp=2) == 0  # 0.8's V0 MLA no longer absorbs


def test_the_plan_holds_them_as_weights():
    shape, bf16 = _lite_shape(), weight_format("baseline")
    target, work = Target(gpu_by_name("H100"), num_gpus=1), Workload(max_model_len=8192)
    with_absorbed = plan_vllm(shape, bf16, target, work, version="0.7.2").memory
    without = plan_vllm(shape, bf16, target, work, version="0.6.6").memory
    assert with_absorbed.weights_bytes - without.weights_bytes == vllm_mla_absorbed_bytes(shape, bf16, 1, "0.7.2")


def test_a_quantized_kv_b_proj_keeps_its_dequantized_copy():
    shape = _lite_shape()
    config = json.loads(CASE.read_text(encoding="utf-8"))["config"]
    from harness.capacity.checkpoint import checkpoint_format

    awq = checkpoint_format(config, "deepseek-coder-v2-lite-awq")
    bf16 = weight_format("baseline")
    kv_b_copy = 27 * 512 * 16 * (128 + 128) * 2  # kv_lora_rank x heads x (nope + v), 16-bit, every MLA layer
    assert vllm_mla_absorbed_bytes(shape, awq, 1, "0.7.3") - vllm_mla_absorbed_bytes(shape, bf16, 1, "0.7.3") == \
        kv_b_copy
