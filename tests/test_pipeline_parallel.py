"""Pipeline parallelism in the capacity plans: the most-loaded stage's weights and KV cache (each engine's own split
of the layers, the embedding on the first stage and the lm_head on the last; shapes.pipeline_stage's bound),
each engine's pipeline-parallel flag, `quantgate plan --pipeline-parallel-size`, and the run's target."""

import json
import math
import random

import pytest

from harness.config import CapacitySettings, RunSpec
from harness.errors import UserError
from harness.formats import known_formats
from harness.capacity import (ENGINES, GPUS, Target, TensorParallelError, Workload, check_sglang_command,
                                      check_trtllm_command, check_vllm_command, gpu_by_name, model_shape,
                                      pipeline_stage, plan_engine, plan_engines, planned_weights_bytes,
                                      weight_format, weights_bytes)
from harness.capacity.memory import (NCCL_BYTES, NON_TORCH_BYTES, NON_TORCH_SINCE_START_BYTES,
                                     kv_bytes_per_sequence, kv_bytes_per_token)
from harness.capacity.shapes import stage_of_range
from harness.capacity.vllm import KNOWN_VERSIONS
from harness.measure.kv import DEMO_CONFIG
from test_model_configs import DEEPSEEK_V2_LITE, GEMMA2_9B, LLAMA3_8B, MIXTRAL_8X7B, QWEN25_7B
from test_planners import _run  # quantgate plan, in process

H100 = gpu_by_name("H100-SXM")
PP_FLAGS = {"vllm": "--pipeline-parallel-size", "sglang": "--pp-size", "trtllm": "--pp_size"}
TP_FLAGS = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size", "trtllm": "--tp_size"}


def _plan(engine, config, fmt="baseline", tp=1, pp=1, gpu=H100, **workload):
    workload.setdefault("max_model_len", 4096)
    return plan_engine(engine, model_shape(config), weight_format(fmt, 128), Target(gpu, tp, pp),
                       Workload(**workload), vllm_version="0.34")


def _embedding_bytes(shape, bytes_per=2):
    return shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2) * bytes_per


# --- the most-loaded stage

def _llama3_8b_parts(fmt="baseline"):
    """(bytes of one decoder layer, of one vocab x hidden matrix, of the final norm) of Llama-3-8B in bf16: its 32
    layers are alike, so a stage's weights are its layers' count x the first plus the matrices and norm it holds."""
    shape = model_shape(LLAMA3_8B)
    matrix, final_norm = shape.vocab * shape.hidden * 2, shape.hidden * 2
    decoder = weights_bytes(shape, weight_format(fmt)) - 2 * matrix - final_norm  # untied: embedding and lm_head
    assert decoder % 32 == 0
    return decoder // 32, matrix, final_norm


def test_llama3_8b_over_two_stages_plans_the_last_stage_of_16_layers():
    shape, fmt = model_shape(LLAMA3_8B), weight_format("baseline")
    layer, matrix, final_norm = _llama3_8b_parts()
    whole = weights_bytes(shape, fmt)
    assert whole == 32 * layer + 2 * matrix + final_norm
    # Every engine splits 32 layers 16/16: the first stage holds the embedding, the last the lm_head and the final
    # norm, so the last is the heavier by the norm; neither holds both vocab x hidden matrices.
    last = 16 * layer + matrix + final_norm
    for engine in ENGINES:
        one, two = _plan(engine, LLAMA3_8B), _plan(engine, LLAMA3_8B, pp=2)
        assert two.memory.weights_bytes == last and one.memory.weights_bytes == whole
        assert one.memory.kv_bytes_per_token == 131_072 and two.memory.kv_bytes_per_token == 65_536
        assert 2 * two.memory.kv_bytes_per_sequence == one.memory.kv_bytes_per_sequence
        assert two.max_concurrency > one.max_concurrency
        assert any("splits the 32 layers 16/16" in note for note in two.notes)
    # the engine-agnostic bound (shapes.pipeline_stage) counts both matrices: one too many
    assert weights_bytes(pipeline_stage(shape, 2), fmt) == last + matrix


def test_32_layers_over_three_stages_plan_each_engines_heaviest_stage():
    stage = pipeline_stage(model_shape(LLAMA3_8B), 3)
    assert stage.layers == 11 == math.ceil(32 / 3)  # the engine-agnostic bound
    assert {lin.count for lin in stage.linears} == {11}
    assert pipeline_stage(model_shape(LLAMA3_8B), 1) == model_shape(LLAMA3_8B)  # one stage: the model itself
    layer, matrix, final_norm = _llama3_8b_parts()
    per_layer_kv = 4096  # 2 x 8 KV heads x 128 x 2 bytes
    # vLLM 0.8+ 11/11/10 and TensorRT-LLM 11/11/10: the first stage (11 layers and the embedding) is the heaviest
    # (the last: 10 layers, the lm_head and the norm); vLLM 0.7 10/10/12 and SGLang 10/11/11: the last stage.
    expected = {("vllm", "0.34"): (11, 11 * layer + matrix, "11/11/10"),
                ("vllm", "0.7"): (12, 12 * layer + matrix + final_norm, "10/10/12"),
                ("sglang", ""): (11, 11 * layer + matrix + final_norm, "10/11/11"),
                ("trtllm", ""): (11, 11 * layer + matrix, "11/11/10")}
    for (engine, version), (layers, weights, split) in expected.items():
        plan = plan_engine(engine, model_shape(LLAMA3_8B), weight_format("baseline"), Target(H100, 1, 3),
                           Workload(max_model_len=4096), vllm_version=version or "0.34")
        assert plan.memory.kv_bytes_per_token == layers * per_layer_kv, engine
        assert plan.memory.weights_bytes == weights, (engine, version)
        assert any(f"splits the 32 layers {split}" in note for note in plan.notes), (engine, version)


def test_sliding_window_models_keep_the_full_attention_layers_on_the_stage():
    gemma = model_shape(GEMMA2_9B)  # 42 layers alternating sliding (4096) and full attention
    for stages in (2, 3):
        stage = pipeline_stage(gemma, stages)
        assert stage.layers == math.ceil(42 / stages) and stage.attention.sliding_layers == 0
    # Fewer full-attention layers than a stage holds: all of them, then the widest windows.
    types = ["sliding_attention"] * 6 + ["full_attention"] * 2
    mixed = pipeline_stage(model_shape(dict(QWEN25_7B, num_hidden_layers=8, layer_types=types,
                                            use_sliding_window=True, sliding_window=1024)), 2)
    assert mixed.attention.windows.count(None) == 2 and mixed.attention.windows.count(1024) == 2
    # vLLM counts the stage's sliding layers at their window: less KV per sequence than four full layers.
    length = 8192
    assert kv_bytes_per_sequence(mixed.attention, length) < 2 * kv_bytes_per_sequence(
        pipeline_stage(model_shape(dict(QWEN25_7B, num_hidden_layers=8)), 4).attention, length)
    # vLLM's real stage: Gemma 2 alternates sliding (even layers) and full attention, so the 21/21 split's last stage
    # (layers 21-41, the heavier: the lm_head and the final norm) holds 11 full and 10 sliding layers; vLLM 0.34's
    # hybrid allocator groups them 11 a group, the sliding group padded with one empty layer, and at 8,192 tokens a
    # sliding layer keeps them all (window 4,096 plus the 8,192-token prefill budget).
    plan = _plan("vllm", GEMMA2_9B, pp=2, max_model_len=8192)
    windows = model_shape(GEMMA2_9B).attention.windows[21:]
    assert windows.count(None) == 11 and windows.count(4096) == 10
    full_layer = 2 * 8 * 256 * 2  # K and V, 8 KV heads of 256, 2 bytes
    assert plan.memory.kv_bytes_per_sequence == (11 + 11) * full_layer * 8192


def test_moe_experts_scale_with_the_stage_layers():
    mixtral = pipeline_stage(model_shape(MIXTRAL_8X7B), 2)
    counts = {lin.name: lin.count for lin in mixtral.linears}
    assert counts["experts.w1"] == 16 * 8 and counts["router"] == 16 and counts["q_proj"] == 16
    deepseek = model_shape(DEEPSEEK_V2_LITE)  # 27 layers: the first dense, 26 MoE of 64 experts
    stage = {lin.name: lin for lin in pipeline_stage(deepseek, 2).linears}
    assert stage["mlp.gate_proj"].count == 1 and stage["experts.gate_proj"].count == 14 * 64
    assert stage["router"].count == 14 and stage["kv_b_proj"].count == 14
    # An upper bound: the stage may not hold both the dense layer and 14 MoE layers, but never holds more.
    fmt = weight_format("gptq", 128)
    assert weights_bytes(pipeline_stage(deepseek, 2), fmt) < weights_bytes(deepseek, fmt)


def test_measured_weights_split_as_the_estimate_splits():
    shape, fmt = model_shape(LLAMA3_8B), weight_format("awq", 128)
    measured = 6 * 2**30
    split, source = planned_weights_bytes(shape, fmt, 2, measured, pp=2)
    ratio = weights_bytes(pipeline_stage(shape, 2), fmt, 2) / weights_bytes(shape, fmt)
    assert source == "measured" and split == round(measured * ratio)
    assert planned_weights_bytes(shape, fmt, 1, measured) == (measured, "measured")


# --- the engines' commands

@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_prints_its_pipeline_flag_and_accepts_it(engine):
    plan = _plan(engine, LLAMA3_8B, fmt="awq", pp=2)
    assert plan.fits and plan.arg(PP_FLAGS[engine]) == "2" and f"{PP_FLAGS[engine]} 2" in plan.command
    assert plan.arg(TP_FLAGS[engine]) is None
    assert _plan(engine, LLAMA3_8B, fmt="awq").arg(PP_FLAGS[engine]) is None  # one stage: no flag
    assert _check(engine, plan, model_shape(LLAMA3_8B), weight_format("awq", 128)) == []


def test_tensor_and_pipeline_parallel_combine():
    for engine in ENGINES:
        plan = _plan(engine, LLAMA3_8B, fmt="awq", tp=2, pp=2)
        assert plan.arg(TP_FLAGS[engine]) == "2" and plan.arg(PP_FLAGS[engine]) == "2"
        assert plan.memory.kv_bytes_per_token == 131_072 // 4  # 4 KV heads per GPU, 16 layers
        context = NON_TORCH_SINCE_START_BYTES if engine == "vllm" else NON_TORCH_BYTES  # vllm_versions
        assert plan.memory.non_torch_bytes == context + NCCL_BYTES
        assert any("4 GPUs: tensor parallel 2 x pipeline parallel 2" in note for note in plan.notes)
        assert _check(engine, plan, model_shape(LLAMA3_8B), weight_format("awq", 128)) == []
    shape, fmt = model_shape(LLAMA3_8B), weight_format("awq", 128)
    assert _plan("vllm", LLAMA3_8B, fmt="awq", tp=2, pp=2).memory.weights_bytes == weights_bytes(
        stage_of_range(shape, 16, 32), fmt, 2)  # the last stage's 16 layers, lm_head and norm, over 2 GPUs
    assert Target(H100, 2, 2).total_gpus == 4
    # Pipeline parallel alone still needs NCCL between the stages.
    assert _plan("vllm", LLAMA3_8B, pp=2).memory.non_torch_bytes == NON_TORCH_SINCE_START_BYTES + NCCL_BYTES


def test_more_stages_than_layers_is_refused_and_the_checks_catch_it():
    with pytest.raises(TensorParallelError, match="between 1 and the model's 30 layers"):
        _plan("vllm", DEMO_CONFIG, pp=31)
    plan = _plan("vllm", LLAMA3_8B, pp=2)
    command = plan.command.replace("--pipeline-parallel-size 2", "--pipeline-parallel-size 33")
    assert any("32 layers" in e for e in check_vllm_command(command, model_shape(LLAMA3_8B),
                                                            weight_format("baseline"), H100, "0.34"))


def _check(engine, plan, shape, fmt, gpu=H100):
    """The engine's own argument checks on the plan's command."""
    if engine == "vllm":
        return check_vllm_command(plan.command, shape, fmt, gpu, plan.engine_version)
    if engine == "sglang":
        return check_sglang_command(plan.command, shape, fmt, gpu)
    return check_trtllm_command(plan.command, plan.config_yaml, shape, gpu)


def test_no_pipeline_parallel_command_violates_the_engines_checks():
    rng = random.Random(21)
    checked = 0
    for _ in range(120):
        config = rng.choice([LLAMA3_8B, QWEN25_7B, MIXTRAL_8X7B, DEEPSEEK_V2_LITE, GEMMA2_9B, DEMO_CONFIG])
        shape = model_shape(config)
        fmt = weight_format(rng.choice(known_formats()), rng.choice([64, 128, None]))
        gpu, tp, pp = rng.choice(GPUS), rng.choice([1, 2, 4]), rng.choice([2, 3, 4, 8])
        length = min(rng.choice([1000, 4096, 32768]), shape.max_len or 32768)
        version = rng.choice(KNOWN_VERSIONS)
        try:
            plans = plan_engines(shape, fmt, Target(gpu, tp, pp), Workload(length), vllm_version=version)
        except TensorParallelError:
            continue
        for engine, plan in plans.items():
            if not plan.command:
                continue
            assert plan.arg(PP_FLAGS[engine]) == str(pp)
            errors = _check(engine, plan, shape, fmt, gpu)
            assert errors == [], f"{plan.command}\n{errors}"
            checked += 1
    assert checked >= 100


# --- quantgate plan, quantgate run


def test_plan_pipeline_parallel_size_flag(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    base = ["--model", str(config), "--target-gpu", "L4", "--format", "awq", "--json"]
    _, one = _run(base, capsys)
    code, two = _run([*base, "--num-gpus", "2", "--pipeline-parallel-size", "2"], capsys)
    one, two = json.loads(one), json.loads(two)
    assert code == 0 and "pipeline_parallel_size" not in one["target"]
    assert two["target"]["pipeline_parallel_size"] == 2 and two["target"]["pipeline_stage_layers"] == 16
    assert two["kv_bytes_per_token"] * 4 == one["kv_bytes_per_token"]
    engines = two["formats"]["awq"]["engines"]
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in engines["vllm"]["command"]
    assert "--tp-size 2 --pp-size 2" in engines["sglang"]["command"]
    assert "--tp_size 2 --pp_size 2" in engines["trtllm"]["command"]
    _, text = _run([*base[:-1], "--pipeline-parallel-size", "2"], capsys)
    assert "target: 2 (tensor parallel 1 x pipeline parallel 2) x L4" in text and "16 of 32 layers" in text
    with pytest.raises(UserError, match="--pipeline-parallel-size 33: pipeline parallel size 33: must be between"):
        _run([*base, "--pipeline-parallel-size", "33"], capsys)
    with pytest.raises(UserError, match="--pipeline-parallel-size 0: must be a positive number"):
        _run([*base, "--pipeline-parallel-size", "0"], capsys)


def test_the_plans_header_shows_the_planned_engines_own_stage(tmp_path, capsys):
    """32 layers over 3 stages: vLLM 0.7 puts the remainder on the last stage (10, 10, 12), from 0.8 one layer each
    on the stages before the last (11, 11, 10); the header's layers and KV per token are the planned stage's."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    base = ["--model", str(config), "--target-gpu", "H100", "--pipeline-parallel-size", "3", "--json"]
    stages = {}
    for version in ("0.7.3", "0.8.5"):
        _, out = _run([*base, "--vllm-version", version], capsys)
        stages[version] = json.loads(out)
    per_layer = stages["0.8.5"]["kv_bytes_per_token"] // 11
    assert stages["0.7.3"]["target"]["pipeline_stage_layers"] == 12
    assert stages["0.8.5"]["target"]["pipeline_stage_layers"] == 11
    assert stages["0.7.3"]["kv_bytes_per_token"] == 12 * per_layer
    _, out = _run([*base, "--engine", "sglang"], capsys)
    assert json.loads(out)["target"]["pipeline_stage_layers"] == 11  # SGLang: 10, 11, 11


def test_the_run_plans_for_its_tensor_and_pipeline_parallel_gpus():
    spec = RunSpec(tensor_parallel_size=2, pipeline_parallel_size=2,
                   capacity=CapacitySettings(target_gpu="L4"))
    target = spec.capacity.target(spec.tensor_parallel_size, spec.pipeline_parallel_size)
    assert (target.gpu.name, target.num_gpus, target.pipeline_parallel_size) == ("L4", 2, 2)
    default = RunSpec().capacity.target()
    assert (default.num_gpus, default.pipeline_parallel_size, default.total_gpus) == (1, 1, 1)


def test_the_gpu_launch_takes_the_pipeline_flag_once():
    from harness.runtime.vllm.launch_plan import gpu_launch

    plan = _plan("vllm", LLAMA3_8B, fmt="awq", tp=2, pp=2)
    words = " ".join(gpu_launch(plan, dtype="bfloat16", seed=0, parallel=(2, 2), max_num_seqs=None).args)
    assert words.count("--pipeline-parallel-size 2") == 1 and words.count("--tensor-parallel-size 2") == 1


def test_kv_per_token_of_the_stage_is_the_layers_share():
    shape = model_shape(LLAMA3_8B)
    for stages in (2, 4, 8):
        assert kv_bytes_per_token(pipeline_stage(shape, stages).attention) * stages == kv_bytes_per_token(
            shape.attention)


def test_the_report_says_how_many_gpus_the_plans_are_for():
    from harness.report.schema import parse_report
    from harness.report.view import serving_caption
    from test_capacity_policy import _report_with_serving

    report = _report_with_serving()
    report["settings"]["capacity"].update(tensor_parallel_size=2, pipeline_parallel_size=2)
    parsed = parse_report(json.loads(json.dumps(report)), "report.json")
    caption = serving_caption(parsed, parsed.formats["gptq"])
    assert caption.startswith("Serving on 4 x L4 (22.03 GiB each; tensor parallel 2 x pipeline parallel 2)")
    report["settings"]["capacity"].update(tensor_parallel_size=1, pipeline_parallel_size=1)
    parsed = parse_report(json.loads(json.dumps(report)), "report.json")
    assert serving_caption(parsed, parsed.formats["gptq"]).startswith("Serving on L4 (22.03 GiB) (weights")


def test_each_engine_splits_the_layers_as_its_source_does():
    from harness.capacity.sglang import sglang_pp_layer_partition
    from harness.capacity.trtllm import trtllm_pp_layer_partition
    from harness.capacity.vllm_versions import pp_layer_partition

    # SGLang's get_pp_indices (python/sglang/srt/distributed/utils.py): "the last N partitions will have one extra
    # layer, where N = remainder", the last stage included.
    assert sglang_pp_layer_partition(3, 2) == (1, 2)
    assert sglang_pp_layer_partition(32, 3) == (10, 11, 11)
    assert sglang_pp_layer_partition(61, 4) == (15, 15, 15, 16)  # DeepSeek-V3's 61 layers
    # TensorRT-LLM's Mapping.pp_layers (tensorrt_llm/mapping.py): torch.tensor_split(torch.arange(num_layers),
    # pp_size), "If num_layers % pp_size = n != 0, first n ranks get one extra layer".
    assert trtllm_pp_layer_partition(5, 3) == (2, 2, 1)
    assert trtllm_pp_layer_partition(32, 3) == (11, 11, 10)
    assert trtllm_pp_layer_partition(61, 4) == (16, 15, 15, 15)
    # vLLM from 0.8 (vllm/distributed/utils.py get_pp_indices): the remainder before the last stage.
    assert pp_layer_partition(61, 4, "0.8.5") == (15, 15, 16, 15)
    for split in (sglang_pp_layer_partition, trtllm_pp_layer_partition):
        assert split(32, 1) == (32,) and split(32, 4) == (8, 8, 8, 8)
        with pytest.raises(ValueError, match="between 1 and the number of layers"):
            split(4, 5)


def test_an_explicit_split_is_planned_as_given():
    """A target that names its split (VLLM_PP_LAYER_PARTITION, a stage of the uneven planner) keeps it."""
    layer, matrix, final_norm = _llama3_8b_parts()
    target = Target(H100, 1, 2, layer_partition=(20, 12))
    for engine in ENGINES:
        plan = plan_engine(engine, model_shape(LLAMA3_8B), weight_format("baseline"), target,
                           Workload(max_model_len=4096), vllm_version="0.34")
        assert plan.memory.weights_bytes == 20 * layer + matrix and plan.memory.kv_bytes_per_token == 20 * 4096
