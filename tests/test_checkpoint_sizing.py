"""A checkpoint's own quantization_config sizes its weights (harness/capacity/checkpoint.py), checked against what
vLLM logged loading it ("Model loading took X GiB" / "Loading model weights took X GB", the bytes torch allocated
for the weights), and the FP8/FP4 formats' serving flags.

Ground truth: the start-up logs of tests/fixtures/memory_logs (each with its source link and the model's config),
and the figures issue #39 recorded (Qwen3-30B-A3B-FP8 29.09 GiB) with the published configs in
tests/fixtures/checkpoints. Weights must be within 3% of what was logged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_engines, weight_format, weights_bytes
from harness.capacity.checkpoint import (MXFP4_PADDING, checkpoint_format, checkpoint_format_at, module_matches,
                                         plan_config)
from harness.capacity.memory import LinearStorage
from harness.capacity.shapes import Linear, pipeline_stages
from harness.capacity.vllm import vllm_mla_absorbed_bytes
from harness.capacity.vllm_versions import pp_layer_partition
from harness.commands import plan as plan_command
from harness.errors import UserError
from harness.formats import check_format_names
from harness.quant_config import read_quantization

from test_memory_logs import KNOWN_FAILURES, QWQ_DYNAMIC_SKIP

GIB = 2**30
FIXTURES = Path(__file__).parent / "fixtures"
CHECKPOINTS = FIXTURES / "checkpoints"
LOGS = sorted((FIXTURES / "memory_logs").glob("*.json"))
TOLERANCE = 0.03

# How vLLM held the MXFP4 experts in each logged run, from the log itself (MXFP4_PADDING says what each pads).
MXFP4_BACKEND = {
    "vllm-0.10.1-gpt-oss-120b-h100-marlin": "marlin",  # marlin_utils_fp4 warning in the log
    "vllm-0.10.1-gpt-oss-20b-rtx3090": "unpadded",  # the first gpt-oss image, 0.10.1+gptoss
    "vllm-0.14.1-gpt-oss-120b-h100": "triton",  # "[mxfp4.py:165] Using Triton backend"
    "vllm-0.19.0-gpt-oss-20b-a100": "marlin",  # A100 (8.0): no native FP4, Marlin
}
# bitsandbytes double quantization: vLLM 0.7's loader kept the checkpoint's 8-bit absmax (the log's 5.20 GiB is
# that storage; fp32 absmax would be 5.45); today's BitsAndBytesModelLoader._dequantize_dq makes it fp32 at load.
KEEPS_DOUBLE_QUANT = {"vllm-0.7.3-qwen25-7b-bnb4-rtx4060"}
# Logged runs whose weights the planner is known to miss, each with its measured cause: tests/test_memory_logs.py's
# strict xfails (one list, so a fix there is a fix here).
KNOWN_GAPS = {case for case, checks in KNOWN_FAILURES.items() if "weights" in checks}


def _quantized_logs() -> list[dict]:
    cases = []
    for path in LOGS:
        case = json.loads(path.read_text())
        config = case.get("config") or {}
        quant = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
        if quant and case.get("logged", {}).get("weights_gib") and case["id"] not in KNOWN_GAPS:
            cases.append(case)
    return cases


def _predicted_gib(config: dict, tp: int = 1, pp: int = 1, version: str | None = None, **options) -> float:
    """The checkpoint's weights on one GPU, with what vLLM `version` adds at load (V0 0.7's absorbed MLA weights);
    under pipeline parallelism the driver's (the first stage of the release's split, whose line the logs quote)."""
    fmt = checkpoint_format(config, **options)
    shape = model_shape(plan_config(config))
    if pp == 1:
        absorbed = vllm_mla_absorbed_bytes(shape, fmt, tp, version) if version else 0
        return (weights_bytes(shape, fmt, tp) + absorbed) / GIB
    partition = pp_layer_partition(shape.layers, pp, version)
    driver = pipeline_stages(shape, partition)[0]
    return (weights_bytes(driver, fmt, tp) + vllm_mla_absorbed_bytes(shape, fmt, tp, version, pp, partition, 0)) / GIB


def _checkpoint(name: str) -> dict:
    return json.loads((CHECKPOINTS / f"{name}.json").read_text())


@pytest.mark.parametrize("case", _quantized_logs(), ids=lambda case: case["id"])
def test_quantized_checkpoints_weigh_what_vllm_logged(case):
    options = {"undo_double_quant": case["id"] not in KEEPS_DOUBLE_QUANT}
    if case["id"] in MXFP4_BACKEND:
        options["mxfp4"] = MXFP4_BACKEND[case["id"]]
    predicted = _predicted_gib(case["config"], case.get("tp") or 1, case.get("pp") or 1, case["engine_version"],
                               **options)
    logged = case["logged"]["weights_gib"]
    assert predicted == pytest.approx(logged, rel=TOLERANCE), f"{case['id']} ({case['source']})"


def test_the_corpus_has_the_quantized_cases_this_file_relies_on():
    ids = {case["id"] for case in _quantized_logs()}
    assert set(MXFP4_BACKEND) | KEEPS_DOUBLE_QUANT <= ids


def test_qwen3_30b_a3b_fp8_block_scaled_weighs_what_vllm_logged():
    # issue #39: vLLM logged 29.09 GiB for Qwen/Qwen3-30B-A3B-FP8 (bf16 sizing gave 56.9)
    config = _checkpoint("Qwen3-30B-A3B-FP8")
    fmt = checkpoint_format(config)
    assert fmt.name == "fp8-block" and fmt.rules[0].storage.block == (128, 128)
    assert _predicted_gib(config) == pytest.approx(29.09, rel=TOLERANCE)
    bf16 = weights_bytes(model_shape(plan_config(config)), weight_format("baseline")) / GIB
    assert bf16 == pytest.approx(56.9, rel=0.01)


def test_gpt_oss_20b_quantizes_only_its_experts():
    config = _checkpoint("gpt-oss-20b")
    fmt = checkpoint_format(config, mxfp4="unpadded")
    shape = model_shape(plan_config(config))
    kept = {lin.name for lin in shape.linears for copies, storage in fmt.storage_of(lin, shape.layers)
            if storage is None}
    assert kept == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.router"}
    # vllm-project/vllm#22331: 12.8848 GiB (bf16 sizing: 39 GiB)
    assert weights_bytes(shape, fmt) / GIB == pytest.approx(12.8848, rel=TOLERANCE)
    # the padding vLLM's backend gives the experts follows the GPU
    assert checkpoint_format(config, compute_capability=8.0).rules[0].storage.pad == MXFP4_PADDING["marlin"]
    assert checkpoint_format(config, compute_capability=9.0).rules[0].storage.pad == MXFP4_PADDING["triton"]
    assert checkpoint_format(config, compute_capability=10.0).rules[0].storage.pad == MXFP4_PADDING["flashinfer"]


def test_bnb_4bit_double_quant_as_stored_and_as_todays_vllm_holds_it():
    config = _checkpoint("Qwen2.5-7B-Instruct-bnb-4bit")
    stored = _predicted_gib(config, undo_double_quant=False)
    today = _predicted_gib(config)
    assert stored == pytest.approx(5.2032, rel=TOLERANCE)  # vllm-project/vllm#13882, vLLM 0.7.3
    # fp32 absmax per 64 weights instead of 8-bit: 4 - (1 + 4/256) bytes more per 64 quantized weights
    linear = sum(lin.count * lin.in_features * lin.out_features
                 for lin in model_shape(plan_config(config)).linears if lin.quantized)
    assert (today - stored) * GIB == pytest.approx(linear / 64 * (4 - 1 - 4 / 256), rel=1e-6)


def test_deepseek_v3_fp8_fits_on_eight_h200():
    config = _checkpoint("DeepSeek-V3")
    shape, fmt = model_shape(plan_config(config)), checkpoint_format(config)
    assert fmt.name == "fp8-block"
    per_gpu = weights_bytes(shape, fmt, 8) / GIB
    assert 75 < per_gpu < 82  # 671B at one byte plus fp32 128x128 scales and bf16 embeddings, over 8 GPUs
    plans = plan_engines(shape, fmt, Target(gpu_by_name("H200"), 8), Workload(max_model_len=32768))
    assert plans["vllm"].servable and plans["vllm"].fits, plans["vllm"].reason
    assert plans["vllm"].arg("--quantization") is None
    # DeepSeek's own fp8 quant_method (Fp8Config with weight_block_size) loads from vLLM 0.6.6, where the
    # compressed-tensors block scheme waited for 0.11.0: the plan follows the checkpoint's method
    early = plan_engines(shape, fmt, Target(gpu_by_name("H200"), 8), Workload(max_model_len=32768),
                         vllm_version="0.6.5")["vllm"]
    assert not early.servable and "0.6.6" in early.reason, early.reason
    assert plan_engines(shape, fmt, Target(gpu_by_name("H200"), 8), Workload(max_model_len=32768),
                        vllm_version="0.7.3")["vllm"].servable


def test_storage_of_each_scheme_per_weight():
    in_f, out_f = 4096, 4096
    n = in_f * out_f
    assert LinearStorage(8, "block", block=(128, 128), scale_bytes=4).nbytes(in_f, out_f) == n + 32 * 32 * 4
    assert LinearStorage(8, "tensor", scale_bytes=4).nbytes(in_f, out_f) == n + 4
    nvfp4 = checkpoint_format({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                                       "group_size": 16}}).rules[0].storage
    assert nvfp4.nbytes(in_f, out_f) == n / 2 + n / 16 + 2 * 4  # fp8 scale per 16, two fp32 global scales
    assert weight_format("mxfp4").rules[0].storage.nbytes(in_f, out_f) == n / 2 + n / 32
    gptq = checkpoint_format({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                      "sym": True, "desc_act": False}}).rules[0].storage
    assert gptq.nbytes(in_f, out_f) == n / 2 + 32 * out_f * 2  # Marlin drops the zeros and g_idx
    awq = checkpoint_format({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                                     "zero_point": True, "version": "gemm"}}).rules[0].storage
    assert awq.nbytes(in_f, out_f) == n / 2 + 32 * out_f * 2 + 32 * out_f / 2


def test_compressed_tensors_groups_targets_and_ignore():
    quant = {"quant_method": "compressed-tensors", "format": "mixed", "ignore": ["lm_head", "re:.*mlp.gate$"],
             "config_groups": {
                 "attn": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float",
                                                                        "strategy": "channel", "symmetric": True}},
                 "rest": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy":
                                                             "tensor_group", "group_size": 16, "symmetric": True},
                          "input_activations": {"num_bits": 4, "type": "float", "dynamic": "local"}}}}
    fmt = checkpoint_format({"quantization_config": quant})
    q = Linear("self_attn.q_proj", 1024, 1024, 1)
    up = Linear("mlp.up_proj", 1024, 4096, 1)
    router = Linear("router", 1024, 64, 1, split="none")
    assert fmt.storage_of(q, 1)[0][1].bits == 8
    assert fmt.storage_of(up, 1)[0][1].group_size == 16
    assert fmt.storage_of(router, 1) == [(1, None)]  # ignored by 're:.*mlp.gate$'
    assert module_matches("model.layers.*.self_attn", q) and not module_matches("model.layers.*.self_attn", up)


def test_modules_listed_layer_by_layer_keep_their_share():
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128],
             "modules_to_not_convert": [f"model.layers.{i}.mlp.down_proj" for i in range(3)]}
    fmt = checkpoint_format({"quantization_config": quant})
    down = Linear("mlp.down_proj", 4096, 1024, 12, split="row")
    assert fmt.storage_of(down, 12)[1] == (3, None)  # 3 of 12 layers stay 16-bit


def test_modelopt_hf_quant_config_beside_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                            "exclude_modules": ["lm_head"]}}))
    fmt = checkpoint_format_at(str(tmp_path), {"model_type": "llama"})
    assert fmt.name == "nvfp4" and fmt.bits == 4


def test_an_unknown_method_is_one_line_naming_it():
    with pytest.raises(UserError, match="quant_method 'hqq'") as caught:
        checkpoint_format({"quantization_config": {"quant_method": "hqq", "nbits": 4}})
    assert "\n" not in str(caught.value)


def test_plan_only_formats_are_refused_by_run_with_one_line():
    with pytest.raises(UserError, match="planned only") as caught:
        check_format_names(["int8", "mxfp4"], "--formats")
    assert "\n" not in str(caught.value)


def _plan(argv, capsys) -> dict:
    parser = argparse.ArgumentParser(prog="quantgate")
    plan_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv, "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_sizes_a_checkpoint_by_its_own_quantization_config(capsys):
    result = _plan(["--model", str(CHECKPOINTS / "Qwen3-30B-A3B-FP8.json"), "--target-gpu", "H100-SXM"], capsys)
    assert list(result["formats"]) == ["fp8-block"]
    entry = result["formats"]["fp8-block"]
    assert entry["weights_bytes"] / GIB == pytest.approx(29.09, rel=TOLERANCE)
    vllm = entry["engines"]["vllm"]
    assert vllm["fits"] and "--quantization" not in vllm["command"]  # vLLM reads fp8 from the checkpoint


def test_fp8_on_gpus_by_compute_capability(capsys):
    model = str(CHECKPOINTS / "Qwen3-30B-A3B-FP8.json")
    # vLLM 0.13: Marlin ran from 8.0 only (from 0.14/0.16 on 7.5 too: tests/test_format_versions.py)
    t4 = _plan(["--model", model, "--target-gpu", "T4", "--num-gpus", "4", "--vllm-version", "0.13"],
               capsys)["formats"]["fp8-block"]
    assert not t4["engines"]["vllm"]["servable"] and "7.5" in t4["engines"]["vllm"]["reason"]
    a100 = _plan(["--model", model, "--target-gpu", "A100-80GB"], capsys)["formats"]["fp8-block"]
    assert a100["engines"]["vllm"]["servable"]
    assert any("Marlin" in note for note in a100["engines"]["vllm"]["notes"])
    assert not a100["engines"]["trtllm"]["servable"]  # no FP8 fallback below 8.9


def test_plan_format_fp8_and_nvfp4_for_a_bf16_model(capsys):
    result = _plan(["--model", "demo", "--format", "baseline,fp8,nvfp4", "--target-gpu", "H100-SXM"], capsys)
    sizes = {name: entry["weights_bytes"] for name, entry in result["formats"].items()}
    assert sizes["nvfp4"] < sizes["fp8"] < sizes["baseline"]
    assert result["formats"]["fp8"]["engines"]["vllm"]["servable"]
    nvfp4_notes = result["formats"]["nvfp4"]["engines"]["vllm"]["notes"]
    fallback = "weights stay quantized, activations 16-bit"
    assert any(fallback in note for note in nvfp4_notes)  # Hopper: no FP4 tensor cores, Marlin W4A16
    b200 = _plan(["--model", "demo", "--format", "nvfp4", "--target-gpu", "B200"], capsys)
    assert not any(fallback in note for note in b200["formats"]["nvfp4"]["engines"]["vllm"]["notes"])


def test_a_candidate_checkpoint_is_planned_at_its_stored_size():
    from harness.candidates import ExternalCheckpoint

    quant = _checkpoint("Qwen3-30B-A3B-FP8")["quantization_config"]
    candidate = ExternalCheckpoint("hub-fp8", Path("."), Path("."), "x", read_quantization(quant, "test"), quant)
    fmt = candidate.weight_format()
    assert fmt.name == "hub-fp8" and candidate.kind == "fp8-block"
    assert fmt.serving_on("vllm").quantization is None
    shape = model_shape(plan_config(_checkpoint("Qwen3-30B-A3B-FP8")))
    assert weights_bytes(shape, fmt) / GIB == pytest.approx(29.09, rel=TOLERANCE)


def test_block_fp8_experts_cut_inside_a_block_are_refused():
    # Qwen3-235B-A22B-FP8 at tensor parallel 8: 1,536 / 8 = 192 expert outputs per GPU against 128-wide blocks
    config = _checkpoint("Qwen3-235B-A22B-FP8")
    shape, fmt = model_shape(plan_config(config)), checkpoint_format(config)
    plans = plan_engines(shape, fmt, Target(gpu_by_name("H100-SXM"), 8), Workload(max_model_len=8192))
    assert not plans["vllm"].servable and "192 outputs per GPU" in plans["vllm"].reason
    assert plans["vllm"].reason.count("\n") == 0
    four = plan_engines(shape, fmt, Target(gpu_by_name("H100-SXM"), 4), Workload(max_model_len=8192))
    assert four["vllm"].servable  # 384 per GPU: whole blocks


# bitsandbytes' llm_int8_skip_modules as vLLM matches them (harness/capacity/bnb_skip.py); QWQ_DYNAMIC_SKIP: the
# published entries of unsloth's dynamic QwQ-32B export (tests/test_memory_logs.py).


def _tiny_qwen2(skip: list[str] | None, layers: int = 8) -> dict:
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1024,
            "intermediate_size": 4096, "num_hidden_layers": layers, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                    "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                                    "llm_int8_skip_modules": skip}}


def test_vllm_keeps_a_skip_list_s_module_paths_16_bit_from_0_7_3():
    """vllm/model_executor/layers/quantization/bitsandbytes.py, is_layer_skipped_bnb. To v0.7.2 (lines 131-137):
        # Check if any of the skip modules exactly matches any component
        return any(module_name in components for module_name in llm_int8_skip_modules)
    from v0.7.3 (131-145; the same at v0.8.5, 132-146; vllm-project/vllm#12974) also:
        # Allow certain layers to not be quantized
        set_components = set(".".join(components[:i + 1]) for i in range(len(components)))
        prefix_check = len(set_llm_int8_skip_modules & set_components) != 0
    over the prefixes vLLM builds: models/qwen2.py@v0.8.5 prefix=f"{prefix}.qkv_proj", f"{prefix}.gate_up_proj"."""
    from harness.capacity.bnb_skip import is_layer_skipped_bnb

    entries = ["lm_head", "model.layers.0.self_attn", "model.layers.4.mlp"]
    assert not is_layer_skipped_bnb("model.layers.0.self_attn.qkv_proj", entries, (0, 7, 2))
    assert is_layer_skipped_bnb("model.layers.0.self_attn.qkv_proj", entries, (0, 7, 3))
    for prefix in ("model.layers.0.self_attn.o_proj", "model.layers.4.mlp.gate_up_proj",
                   "model.layers.4.mlp.down_proj"):
        assert is_layer_skipped_bnb(prefix, entries, (0, 8, 5)), prefix
    for prefix in ("model.layers.0.mlp.gate_up_proj", "model.layers.14.mlp.gate_up_proj",
                   "model.layers.40.self_attn.qkv_proj"):
        assert not is_layer_skipped_bnb(prefix, entries, (0, 8, 5)), prefix
    assert is_layer_skipped_bnb("model.layers.3.mlp.gate_up_proj", ["mlp"], (0, 7, 2))  # a whole component
    # a path to a module vLLM fuses is no prefix of the fused one, at any release
    assert not is_layer_skipped_bnb("model.layers.4.mlp.gate_up_proj", ["model.layers.4.mlp.gate_proj"])


def test_the_qwq_dynamic_export_loads_on_0_8_5_with_every_listed_module_16_bit():
    from harness.capacity.bnb_skip import vllm_load_problem

    # whole modules (self_attn, mlp): the fused qkv_proj / gate_up_proj are kept with them, as the checkpoint keeps
    # q/k/v and gate/up, so vLLM holds exactly the checkpoint's 16-bit linears
    assert vllm_load_problem(QWQ_DYNAMIC_SKIP, 64, (0, 8, 5)) is None
    assert vllm_load_problem(QWQ_DYNAMIC_SKIP, 64) is None
    before = vllm_load_problem(QWQ_DYNAMIC_SKIP, 64, (0, 7, 2))
    assert before and "model.layers.0.self_attn.q_proj 16-bit" in before and "quantizes" in before
    leaf = vllm_load_problem(["model.layers.3.mlp.gate_proj"], 64, (0, 8, 5))
    assert leaf and "model.layers.3.mlp.gate_up_proj" in leaf


def test_a_dynamic_bnb_checkpoint_is_served_by_vllm_from_0_7_3_only():
    from harness.capacity.vllm import plan_vllm

    config = _tiny_qwen2(["lm_head", "model.layers.0.self_attn", "model.layers.1.mlp"])
    shape, fmt = model_shape(plan_config(config)), checkpoint_format(config)
    target, work = Target(gpu_by_name("RTX 4090")), Workload(max_model_len=4096)
    for version in ("0.6.6", "0.7.2"):  # the patch release decides: 0.7.2 is a 0.7 minor, yet refuses it
        old = plan_vllm(shape, fmt, target, work, version=version)
        assert not old.servable and "0.7.3 is the first release" in old.reason, version
    assert plan_vllm(shape, fmt, target, work, version="0.7.3").servable
    assert plan_vllm(shape, fmt, target, work, version="0.8.5").servable
    assert plan_vllm(shape, checkpoint_format(_tiny_qwen2(None)), target, work, version="0.6.6").servable
    fused = checkpoint_format(_tiny_qwen2(["model.layers.1.mlp.up_proj"]))
    refused = plan_vllm(shape, fused, target, work, version="0.8.5")
    assert not refused.servable and "gate_up_proj" in refused.reason and refused.reason.count("\n") == 0


def test_a_pipeline_stage_holds_the_16_bit_modules_of_its_own_layers():
    # the MLPs of layers 0-3 kept 16-bit: all on the first of two 4-layer stages, none on the second
    config = _tiny_qwen2([f"model.layers.{i}.mlp" for i in range(4)])
    shape, fmt = model_shape(plan_config(config)), checkpoint_format(config)
    plain = checkpoint_format(_tiny_qwen2(None))
    first, second = pipeline_stages(shape, (4, 4))
    mlp_params = sum(lin.in_features * lin.out_features for lin in shape.linears if lin.name.startswith("mlp."))
    extra = weights_bytes(shape, fmt) - weights_bytes(shape, plain)
    assert extra == pytest.approx(4 * mlp_params * (2 - 0.5 - 4 / 64))  # 16-bit over nf4 with an fp32 absmax per 64
    assert weights_bytes(first, fmt) - weights_bytes(first, plain) == extra
    assert weights_bytes(second, fmt) == weights_bytes(second, plain)
