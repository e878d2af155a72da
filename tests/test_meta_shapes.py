"""Architectures counted from the model transformers builds on the meta device (harness/capacity/meta.py),
with the configs of transformers' own config classes (no hub): the hand-written shapes cross-check it where both
exist, and the parameter total must be what the built model holds."""

from __future__ import annotations

import pytest

from harness.capacity import weight_format, weights_bytes
from harness.capacity.meta import meta_shape, model_shape
from harness.capacity.shapes import attention_shape, config_fields, written_shape

HAND_WRITTEN = ["llama", "qwen2", "qwen3", "mixtral", "gemma2", "deepseek_v3"]
NEW = ["gemma3_text", "qwen3_moe", "gpt_oss", "phi3", "llama4_text"]


def _fields(model_type: str) -> dict:
    from transformers import AutoConfig

    return config_fields(AutoConfig.for_model(model_type))


def _params(shape) -> int:
    return weights_bytes(shape, weight_format("baseline")) // 2  # 16-bit: two bytes a parameter


def _built_params(model_type: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", HAND_WRITTEN)
def test_meta_count_agrees_with_the_hand_written_shape(model_type):
    fields = _fields(model_type)
    hand, meta = written_shape(fields), meta_shape(fields)
    assert model_shape(fields) == hand  # the written-out count is the one used
    assert _params(meta) == pytest.approx(_params(hand), rel=1e-6)
    assert (meta.experts, meta.experts_per_token, meta.mlp_width) == (hand.experts, hand.experts_per_token,
                                                                      hand.mlp_width)
    assert meta.attention == hand.attention
    assert weights_bytes(meta, weight_format("awq", 128)) == pytest.approx(
        weights_bytes(hand, weight_format("awq", 128)), rel=0.002)


@pytest.mark.parametrize("model_type", NEW)
def test_architectures_without_a_hand_written_shape_are_counted(model_type):
    shape = model_shape(_fields(model_type))
    assert _params(shape) == _built_params(model_type)
    # 4-bit linears; the embeddings stay 16-bit (Gemma 3: 262k x 2304 of its 2.6 B parameters)
    assert weights_bytes(shape, weight_format("awq", 128)) < 0.5 * weights_bytes(shape, weight_format("baseline"))
    if model_type in ("qwen3_moe", "gpt_oss", "llama4_text"):
        assert shape.experts > 1 and shape.experts_per_token >= 1
        assert any(not lin.quantized and lin.split == "none" for lin in shape.linears)  # the router stays 16-bit


def test_attention_layouts_from_the_config():
    gemma3 = attention_shape(_fields("gemma3_text"))
    assert gemma3.sliding_layers == 22 and gemma3.layers == 26  # five sliding layers to one full
    fields = _fields("llama4_text")
    llama4 = attention_shape(fields)
    assert {w for w in llama4.windows if w is not None} == {fields["attention_chunk_size"]}
    assert llama4.sliding_layers == fields["layer_types"].count("chunked_attention")


def test_plan_counts_gemma3_and_qwen3_moe_configs(tmp_path, capsys):
    from transformers import AutoConfig

    from harness import cli

    for model_type in ("gemma3_text", "qwen3_moe"):
        AutoConfig.for_model(model_type).save_pretrained(tmp_path / model_type)
        assert cli.main(["plan", "--model", str(tmp_path / model_type / "config.json"), "--target-gpu", "L4"]) == 0
        out = capsys.readouterr().out
        assert f"({model_type})" in out and "awq g128" in out and "cannot count" not in out


def test_plan_reads_a_gguf_files_config_as_run_does(demo_cache, demo_checkpoint, capsys):
    """`plan --model x.gguf`: the config transformers reads from the GGUF metadata (the demo's own source file)."""
    from harness import cli

    gguf = demo_cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert cli.main(["plan", "--model", str(gguf), "--target-gpu", "L4", "--format", "baseline"]) == 0
    out = capsys.readouterr().out
    assert "(GGUF metadata)" in out and "134.5M parameters" in out and "30 layers" in out
