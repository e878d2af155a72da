"""vLLM's memory accounting by release (harness.capacity.vllm_versions) against what real vLLM servers logged.

Each real case gives the planner the weights the log printed (Workload.weights_bytes), so what is checked is the
release's accounting: the profile run's token budget and activation peak, non-torch memory, CUDA graphs, the
utilization, blocks and tokens."""

from __future__ import annotations

import pytest

from harness.capacity import Target, Workload, check_vllm_command, model_shape, plan_vllm, weight_format
from harness.capacity.gpus import Gpu
from harness.capacity.memory import (CUDA_GRAPH_BYTES, GIB, NON_TORCH_BYTES, NON_TORCH_SINCE_START_BYTES,
                                     activation_peak_bytes)
from harness.capacity.vllm import KNOWN_VERSIONS, resolve_version
from harness.capacity.vllm_versions import MINORS, canonical, parse_release, release_text, rules_for

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's published config.json (the fields the planner reads)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LLAMA3_8B = dict(LLAMA31_8B, max_position_embeddings=8192, rope_scaling=None)  # meta-llama/Meta-Llama-3-8B
QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct's published config.json
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "hidden_act": "silu", "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "sliding_window": 131072, "use_sliding_window": False,
    "max_window_layers": 28}
RTX_3090 = Gpu("NVIDIA GeForce RTX 3090", int(23.58 * GIB), 8.6)  # total_gpu_memory=23.58GiB in the #10517 log
RTX_4060 = Gpu("NVIDIA GeForce RTX 4060", int(8.00 * GIB), 8.9)  # total_gpu_memory (8.00GiB) in the #13882 log
GPU_80GB = Gpu("80 GB GPU", int(79.22 * GIB), 9.0)  # total_gpu_memory 79.22GiB in vllm-project/vllm#10511
L4 = Gpu("NVIDIA L4", int(22.03 * GIB), 8.9)
H100 = Gpu("NVIDIA H100 80GB HBM3", int(79.19 * GIB), 9.0)
A100 = Gpu("NVIDIA A100-SXM4-80GB", int(79.15 * GIB), 8.0)
B200 = Gpu("NVIDIA B200", int(178.35 * GIB), 10.0)


def _plan(config, gpu, version, length, util=None, weights_gib=None, fmt="baseline", **workload):
    weights = int(weights_gib * GIB) if weights_gib is not None else None
    return plan_vllm(model_shape(config), weight_format(fmt), Target(gpu), Workload(length, weights_bytes=weights,
                                                                                     **workload),
                     version=version, gpu_memory_utilization=util)


# --- real start-up logs, each under the rules of the release that wrote it

@pytest.mark.parametrize("length, logged_tokens, logged_peak_gib", [
    # https://github.com/vllm-project/vllm/issues/10517: "Memory profiling results: total_gpu_memory=23.58GiB ...
    # peak_torch_memory=17.98GiB ... non_torch_memory=0.35GiB kv_cache_size=2.89GiB gpu_memory_utilization=0.90",
    # "# GPU blocks: 1478" (23,648 tokens); at --max-model-len 20000 peak 17.06 GiB, 1952 blocks (31,232 tokens).
    (29000, 23_648, 17.98),
    (20000, 31_232, 17.06),
])
def test_vllm_064_v0_on_an_rtx_3090_matches_its_log(length, logged_tokens, logged_peak_gib):
    plan = _plan(LLAMA31_8B, RTX_3090, "0.6.4", length, util=0.90, weights_gib=14.9888)
    assert plan.token_budget == length  # V0 without chunked prefill profiles max(max_model_len, 2048) tokens
    assert plan.memory.cuda_graph_bytes == 0  # V0 captures graphs after the KV cache
    assert plan.memory.non_torch_bytes == NON_TORCH_BYTES  # 0.6.4 counts all of it, CUDA context included
    peak = (plan.memory.weights_bytes + plan.memory.activation_bytes) / GIB
    assert abs(peak - logged_peak_gib) / logged_peak_gib < 0.01, peak
    assert abs(plan.kv_tokens - logged_tokens) / logged_tokens < 0.10, plan.kv_tokens
    assert plan.kv_tokens % 16 == 0
    # V0 refuses a max_model_len above the KV cache's tokens ("The model's max seq len (29000) is larger than ...")
    assert plan.fits == (plan.kv_tokens >= length) == (length == 20000)


def test_vllm_065_counts_non_torch_memory_since_the_instance_started():
    """https://github.com/vllm-project/vllm/pull/10511 (first released in 0.6.5), `vllm serve
    meta-llama/Meta-Llama-3-8B` on a 79.22 GiB GPU: weights 14.96 GiB, PyTorch activation peak 1.26 GiB,
    available_kv_cache_memory 53.29 GiB (non_torch_memory 1.79 GiB there)."""
    plan = _plan(LLAMA3_8B, GPU_80GB, "0.6.5", 8192, util=0.90, weights_gib=14.96)
    assert plan.token_budget == 8192 and plan.memory.non_torch_bytes == NON_TORCH_SINCE_START_BYTES
    assert abs(plan.memory.activation_bytes / GIB - 1.26) / 1.26 < 0.05  # the sampler's sort over 256 x vocab
    assert abs(plan.memory.kv_cache_bytes / GIB - 53.29) / 53.29 < 0.10


def test_vllm_073_v0_bnb_on_an_rtx_4060_does_not_fit_as_logged():
    """https://github.com/vllm-project/vllm/issues/13882, V0 engine v0.7.3, --max-model-len 4096
    --gpu-memory-utilization 0.70: "model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation
    peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB", "# cuda blocks: 0"."""
    plan = _plan(QWEN25_7B, RTX_4060, "0.7.3", 4096, util=0.70, weights_gib=5.2032)
    assert rules_for("0.7.3")[0].engine == "V0" and plan.token_budget == 4096
    assert abs(plan.memory.activation_bytes / GIB - 1.42) / 1.42 < 0.10
    assert plan.kv_tokens == 0 and not plan.fits
    logged_room = 0.70 * 8.00 - 5.20 - 0.03 - 1.42
    planned_room = 0.70 * 8.00 - (plan.memory.weights_bytes + plan.memory.activation_bytes
                                  + plan.memory.non_torch_bytes) / GIB
    assert abs(planned_room - logged_room) < 0.15, planned_room


# --- the rules, release by release

def test_every_minor_from_06_is_known_and_patch_versions_are_taken():
    assert KNOWN_VERSIONS[0] == "0.6" and KNOWN_VERSIONS[-1] == "0.34" and "0.15" not in KNOWN_VERSIONS
    for minor in MINORS:
        assert rules_for(release_text(minor))[2] == ""
    assert parse_release("0.10.1.1") == (0, 10, 1, 1) and parse_release("v0.33.1+cu130") == (0, 33, 1)
    assert parse_release("0.6.4.post1") == (0, 6, 4)
    assert canonical("0.6.4.post1") == "0.6.4" and canonical("0.33.1") == "0.33" and canonical("0.9.1") == "0.9.1"
    assert rules_for("0.6.4")[0] != rules_for("0.6.5")[0]  # the accounting changed inside 0.6
    with pytest.raises(ValueError, match="expected a version like"):
        parse_release("nightly")


@pytest.mark.parametrize("asked, planned", [("0.5.4", "0.6"), ("0.15.1", "0.14"), ("0.40", "0.34"), ("1.0", "0.34")])
def test_an_unknown_release_is_planned_with_the_nearest_and_says_so(asked, planned):
    plan = _plan(LLAMA31_8B, L4, asked, 4096)
    assert plan.engine_version == planned
    assert any(f"vLLM {asked} is not a release quantgate has the rules of" in note for note in plan.notes)
    assert resolve_version(asked)[0] == planned and "the nearest" in resolve_version(asked)[1]


def test_cuda_graphs_are_subtracted_from_020_only():
    for version in ("0.6.4", "0.7", "0.8", "0.10.1.1", "0.17", "0.18", "0.19"):
        plan = _plan(LLAMA31_8B, L4, version, 4096)
        assert plan.memory.cuda_graph_bytes == 0, version
        assert any("does not subtract CUDA graphs" in note for note in plan.notes), version
    assert any("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1" in n for n in _plan(LLAMA31_8B, L4, "0.18", 4096).notes)
    for version in ("0.20", "0.28", "0.33", "0.34"):
        assert _plan(LLAMA31_8B, L4, version, 4096).memory.cuda_graph_bytes == CUDA_GRAPH_BYTES, version
    assert _plan(LLAMA31_8B, L4, "0.33", 4096, enforce_eager=True).memory.cuda_graph_bytes == 0


def test_default_utilization_and_non_torch_scope_by_release():
    expected = {"0.6.3": (0.9, NON_TORCH_SINCE_START_BYTES), "0.6.4": (0.9, NON_TORCH_BYTES),
                "0.6.5": (0.9, NON_TORCH_SINCE_START_BYTES), "0.8.0": (0.9, NON_TORCH_BYTES),
                "0.9.0": (0.9, NON_TORCH_BYTES), "0.9.1": (0.9, NON_TORCH_SINCE_START_BYTES),
                "0.19": (0.9, NON_TORCH_SINCE_START_BYTES), "0.20": (0.92, NON_TORCH_SINCE_START_BYTES)}
    for version, (util, non_torch) in expected.items():
        plan = _plan(LLAMA31_8B, L4, version, 4096)
        assert plan.gpu_memory_utilization == util and plan.arg("--gpu-memory-utilization") == f"{util:g}", version
        assert plan.memory.non_torch_bytes == non_torch, version
    newest = _plan(LLAMA31_8B, L4, "0.34", 4096)  # extensible KV cache: the plan sets the bytes outright
    assert newest.gpu_memory_utilization is None and int(newest.arg("--kv-cache-memory-bytes")) > 0


def test_token_budget_follows_the_engine_and_the_gpu():
    # V0: the whole max_model_len (at least 2048); chunked prefill, on by itself only above 32,768 tokens, at 512
    # (0.6.0-0.6.4) or 2048 (0.6.5 on)
    assert _plan(LLAMA31_8B, H100, "0.6.4", 1024).token_budget == 2048
    assert _plan(LLAMA31_8B, H100, "0.6.4", 32768).token_budget == 32768
    assert _plan(LLAMA31_8B, H100, "0.6.4", 65536).token_budget == 512
    assert _plan(LLAMA31_8B, H100, "0.7", 65536).token_budget == 2048
    # V1 `vllm serve`: 2048, 8192 on big GPUs (by name H100/H200 in 0.8.0-0.8.4, >= 70 GiB from 0.8.5, A100s
    # excluded from 0.9.0), 16384 on >= 160 GiB from 0.28
    budgets = {(gpu.name, version): _plan(LLAMA31_8B, gpu, version, 65536).token_budget
               for gpu in (L4, H100, A100, B200) for version in ("0.8.0", "0.8.5", "0.9", "0.27", "0.28")}
    assert {version: budgets[L4.name, version] for version in ("0.8.0", "0.9", "0.28")} == dict.fromkeys(
        ("0.8.0", "0.9", "0.28"), 2048)
    assert budgets[H100.name, "0.8.0"] == budgets[H100.name, "0.28"] == 8192
    assert budgets[A100.name, "0.8.0"] == 2048 and budgets[A100.name, "0.8.5"] == 8192
    assert budgets[A100.name, "0.9"] == 2048
    assert budgets[B200.name, "0.8.0"] == 2048 and budgets[B200.name, "0.27"] == 8192
    assert budgets[B200.name, "0.28"] == 16384
    # the activation estimate is taken at that budget, with the release's sampler
    plan = _plan(LLAMA31_8B, L4, "0.20", 4096)
    assert plan.memory.activation_bytes == activation_peak_bytes(model_shape(LLAMA31_8B), 2048, 256,
                                                                 sampler_bytes_per_logit=16)


def test_v0_prints_enable_chunked_prefill_when_its_budget_is_below_the_length():
    plan = _plan(LLAMA31_8B, H100, "0.6.5", 16384, max_num_batched_tokens=4096)
    assert plan.command and plan.arg("--enable-chunked-prefill") == ""
    fmt = weight_format("baseline")
    assert check_vllm_command(plan.command, model_shape(LLAMA31_8B), fmt, H100, "0.6.5") == []
    v1 = _plan(LLAMA31_8B, H100, "0.20", 16384, max_num_batched_tokens=4096)
    assert v1.arg("--enable-chunked-prefill") is None  # V1 always chunks


def test_kv_tokens_are_whole_blocks_of_the_kv_room():
    plan = _plan(LLAMA31_8B, H100, "0.10.1.1", 8192)
    assert plan.kv_tokens == plan.memory.kv_cache_bytes // (131_072 * 16) * 16
    assert plan.source.startswith("vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory@v0.9.1")


def test_max_num_seqs_defaults_to_1024_where_the_budget_is_big():
    """vllm/engine/arg_utils.py@v0.8.5.post1 on: 1024 sequences with the >= 70 GiB budget, 256 below it (and in
    V0, and in 0.8.0-0.8.4); the profile's sampler runs over that many rows."""
    assert _plan(LLAMA31_8B, H100, "0.20", 256).arg("--max-num-seqs") == "1024"
    assert _plan(LLAMA31_8B, Gpu("NVIDIA L40S", int(44.40 * GIB), 8.9), "0.20", 256).arg("--max-num-seqs") == "256"
    assert _plan(LLAMA31_8B, H100, "0.8.0", 256).arg("--max-num-seqs") == "256"
    assert _plan(LLAMA31_8B, H100, "0.6.5", 256).arg("--max-num-seqs") == "256"
    assert _plan(LLAMA31_8B, H100, "0.20", 256, max_num_seqs=64).arg("--max-num-seqs") == "64"
