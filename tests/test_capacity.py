"""KV/weights arithmetic from configs, the vLLM capacity plan, and `quantgate plan` (no model is loaded)."""

from __future__ import annotations

import argparse
import json

import pytest

from harness.commands import plan as plan_command
from harness.errors import UserError
from harness.measure.kv import (DEMO_CONFIG, estimate_activation_peak_bytes, estimate_weights_bytes,
                                kv_bytes_per_token, parameter_count)

GIB = 2**30
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False}
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}  # no KV-heads field
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}


# --- KV cache per token: 2 x layers x kv_heads x head_dim x bytes

def test_kv_per_token_smollm2():
    assert kv_bytes_per_token(DEMO_CONFIG) == 2 * 30 * 3 * 64 * 2 == 23_040


def test_kv_per_token_gqa_llama3_8b():
    assert kv_bytes_per_token(LLAMA3_8B) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_kv_per_token_without_gqa_defaults_kv_heads_to_attention_heads():
    assert kv_bytes_per_token(LLAMA2_7B) == 2 * 32 * 32 * 128 * 2 == 524_288


def test_kv_per_token_dtype_and_explicit_head_dim():
    assert kv_bytes_per_token(LLAMA3_8B, kv_dtype_bytes=1) == 65_536  # fp8 KV cache
    # Gemma-style: head_dim given and not hidden/heads (2048/8 would be 256).
    assert kv_bytes_per_token({**LLAMA3_8B, "hidden_size": 2048, "num_attention_heads": 8, "head_dim": 128,
                               "num_key_value_heads": 1}) == 2 * 32 * 1 * 128 * 2


def test_kv_per_token_reads_nested_text_config_and_pretrained_config():
    from transformers import LlamaConfig

    multimodal = {"architectures": ["LlavaForConditionalGeneration"], "text_config": LLAMA3_8B,
                  "vision_config": {"hidden_size": 1024}}
    assert kv_bytes_per_token(multimodal) == 131_072
    config = LlamaConfig(**{k: v for k, v in DEMO_CONFIG.items() if k not in ("architectures", "model_type")})
    assert kv_bytes_per_token(config) == 23_040
    assert parameter_count(config) == 134_515_008


def test_missing_field_names_it():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_bytes_per_token({"hidden_size": 64, "num_attention_heads": 4})


# --- parameters and weights

def test_parameter_counts_match_published_sizes():
    # SmolLM2-135M: embed 49152x576 = 28,311,552 (tied: once); per layer q 576x576 + k,v 576x192 each + o 576x576
    # = 884,736, MLP 3x576x1536 = 2,654,208, 2 norms 1,152 -> 3,540,096 x 30 = 106,202,880; final norm 576.
    assert parameter_count(DEMO_CONFIG) == 28_311_552 + 106_202_880 + 576 == 134_515_008
    assert parameter_count(LLAMA3_8B) == 8_030_261_248
    assert parameter_count(LLAMA2_7B) == 6_738_415_616
    assert parameter_count(QWEN25_05B) == 494_032_768  # Qwen2's q/k/v biases included


def test_weights_bf16_baseline():
    assert estimate_weights_bytes(DEMO_CONFIG, 16) == 269_030_016  # ~269 MB
    assert estimate_weights_bytes(DEMO_CONFIG, 32) == 538_060_032


def test_weights_int8_llm_int8():
    # Linear weights 30 x 3,538,944 = 106,168,320 bytes at 1 byte; fp32 row scales: outputs per layer
    # 576+192+192+576+1536+1536+576 = 5,184 x 4 B x 30 = 622,080; embeddings + norms 28,346,688 x 2 B = 56,693,376.
    assert estimate_weights_bytes(DEMO_CONFIG, 8) == 106_168_320 + 622_080 + 56_693_376


def test_weights_gptq_and_awq_4bit_group_64():
    # Per layer at 4 bits, group 64: q (576->576): packed 165,888 + 9 groups x 576 fp16 scales 10,368 + packed
    # zeros 2,592 + int32 g_idx 2,304 = 181,152; k, v (576->192): 61,920 each; o: 181,152; gate, up (576->1536):
    # 479,232 each; down (1536->576, 24 groups): 442,368 + 27,648 + 6,912 + 6,144 = 483,072. Sum 1,927,680 x 30.
    gptq = estimate_weights_bytes(DEMO_CONFIG, 4, 64, fmt="gptq")
    assert gptq == 1_927_680 * 30 + 56_693_376 == 114_523_776
    # AWQ stores no g_idx: 6 x 2,304 + 6,144 = 19,968 bytes per layer less.
    assert estimate_weights_bytes(DEMO_CONFIG, 4, 64, fmt="awq") == gptq - 19_968 * 30


def test_weights_shrink_with_format():
    bf16 = estimate_weights_bytes(LLAMA3_8B, 16)
    int8 = estimate_weights_bytes(LLAMA3_8B, 8)
    gptq = estimate_weights_bytes(LLAMA3_8B, 4, 128, fmt="gptq")
    assert bf16 == 2 * 8_030_261_248
    assert 0.5 < int8 / bf16 < 0.6  # embeddings and lm_head stay 16-bit
    assert 5.2 * GIB < gptq < 5.5 * GIB  # published 4-bit GPTQ Llama-3-8B checkpoints are ~5.7 GB


def test_activation_estimate_scales_with_tokens():
    # The larger of the forward, 8192 x (3 x 4096 + 3 x 14336) x 2 = 905,969,664, and the sampler,
    # 256 x 128,256 x 8 + 256 x 4096 x 2 = 264,765,440 (they do not overlap).
    assert estimate_activation_peak_bytes(LLAMA3_8B, 8192) == 905_969_664
    assert estimate_activation_peak_bytes(LLAMA3_8B, 512) == 264_765_440
    assert estimate_activation_peak_bytes(LLAMA3_8B, 16384) > estimate_activation_peak_bytes(LLAMA3_8B, 8192)


# --- capacity plan

def _run_plan(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="quantgate")
    plan_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_plan_demo_json(capsys):
    code, out = _run_plan(["--model", "demo", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["model"]["num_parameters"] == 134_515_008
    assert result["kv_bytes_per_token"] == 23_040
    assert list(result["formats"]) == ["baseline", "int8", "gptq", "awq", "w8a8"]
    assert result["formats"]["baseline"]["weights_bytes"] == 269_030_016
    assert result["formats"]["gptq"]["group_size"] == 64  # 576 inputs: 128 does not divide them
    assert result["formats"]["awq"]["capacity"]["vllm_flags"].endswith("--quantization awq")
    assert result["formats"]["w8a8"]["capacity"]["vllm_flags"].endswith("--quantization compressed-tensors")
    assert result["formats"]["baseline"]["capacity"]["max_model_len"] == 4096


def test_plan_table_from_config_file_and_directory(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    code, out = _run_plan(["--model", str(tmp_path / "config.json"), "--format", "gptq", "--group-size", "128",
                           "--gpu-memory-gib", "24", "--activation-gib", "2"], capsys)
    assert code == 0
    assert "gptq g128" in out and "vllm serve MODEL" in out and "--quantization gptq" in out
    code, out = _run_plan(["--model", str(tmp_path), "--format", "baseline", "--gpu-memory-gib", "16"], capsys)
    assert code == 0  # planning only: not fitting is reported, not an error
    assert "NO" in out and "does not fit" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "/no/such/place/config.json"], "no such file"),
    (["--format", "fp4"], "unknown format"),
    (["--gpu-memory-utilization", "1.2"], "must be in"),
    (["--max-model-len", "100000"], "max_position_embeddings"),
    (["--format", "gptq", "--group-size", "100"], "group size 100"),
])
def test_plan_bad_input_is_a_user_error(argv, message, capsys):
    with pytest.raises(UserError, match=message):
        _run_plan(argv, capsys)


def test_plan_directory_without_config_and_bad_json(tmp_path, capsys):
    with pytest.raises(UserError, match="directory has no config.json"):
        _run_plan(["--model", str(tmp_path)], capsys)
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="not a readable JSON config"):
        _run_plan(["--model", str(tmp_path)], capsys)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}), encoding="utf-8")
    with pytest.raises(UserError, match="num_attention_heads|num_hidden_layers"):
        _run_plan(["--model", str(tmp_path)], capsys)
