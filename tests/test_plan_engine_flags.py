"""`quantgate plan` takes the memory settings a deployment already has for SGLang and TensorRT-LLM (issue #39: the
planner's Workload fields reach the command line), and refuses values no engine accepts."""

import json

import pytest

from harness import cli
from test_model_configs import LLAMA3_8B


@pytest.fixture()
def llama_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return str(path)


def _plan(capsys, config, *flags):
    assert cli.main(["plan", "--model", config, "--format", "baseline", "--target-gpu", "H100", "--json",
                     *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _engine(result, name):
    return result["formats"]["baseline"]["engines"][name]


def test_sglang_takes_the_fraction_given_and_dp_attention(capsys, llama_config):
    own = _engine(_plan(capsys, llama_config, "--engine", "sglang", "--num-gpus", "4"), "sglang")
    given = _engine(_plan(capsys, llama_config, "--engine", "sglang", "--num-gpus", "4",
                          "--mem-fraction-static", "0.6"), "sglang")
    assert "--mem-fraction-static 0.6" in given["command"]
    assert given["memory"]["kv_cache_bytes"] < own["memory"]["kv_cache_bytes"]
    dp = _engine(_plan(capsys, llama_config, "--engine", "sglang", "--num-gpus", "4", "--dp-size", "4"), "sglang")
    assert "--dp-size 4 --enable-dp-attention" in dp["command"]
    # attention weights (and KV heads) replicated over the DP groups: more weights a GPU than plain TP 4
    assert dp["memory"]["weights_bytes"] > own["memory"]["weights_bytes"]


def test_trtllm_takes_the_fraction_and_max_tokens_given(capsys, llama_config):
    own = _engine(_plan(capsys, llama_config, "--engine", "trtllm"), "trtllm")
    given = _engine(_plan(capsys, llama_config, "--engine", "trtllm", "--kv-cache-free-gpu-memory-fraction",
                          "0.5", "--max-tokens-in-paged-kv-cache", "100000"), "trtllm")
    assert "--kv_cache_free_gpu_memory_fraction 0.5" in given["command"]
    assert given["memory"]["kv_cache_bytes"] < own["memory"]["kv_cache_bytes"]
    capped = _engine(_plan(capsys, llama_config, "--engine", "trtllm", "--max-tokens-in-paged-kv-cache", "4096"),
                     "trtllm")
    per_token = capped["memory"]["kv_bytes_per_token"]
    assert capped["memory"]["kv_cache_bytes"] == 4096 * per_token  # whole blocks of 32: 4,096 is 128 of them
    assert "max_tokens: 4096" in json.dumps(capped)


@pytest.mark.parametrize(("flags", "message"), [
    (["--mem-fraction-static", "1.2"], "--mem-fraction-static 1.2: must be a share"),
    (["--kv-cache-free-gpu-memory-fraction", "0"], "--kv-cache-free-gpu-memory-fraction 0.0: must be a share"),
    (["--dp-size", "3", "--num-gpus", "4"], "--dp-size 3: SGLang's DP attention needs a divisor of --num-gpus 4"),
    (["--max-tokens-in-paged-kv-cache", "-5"], "--max-tokens-in-paged-kv-cache -5: must be a positive number"),
])
def test_values_no_engine_takes_are_refused(capsys, llama_config, flags, message):
    assert cli.main(["plan", "--model", llama_config, "--target-gpu", "H100", *flags]) == 2
    assert message in capsys.readouterr().err
