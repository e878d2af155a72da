"""vLLM over pipeline stages on GPUs of different sizes (issue #39 item 5): each stage planned on its own GPU with a
VLLM_PP_LAYER_PARTITION split, every worker keeping the smallest stage's block count (get_kv_cache_configs)."""

import json
from dataclasses import replace

import pytest

from harness import cli
from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format
from harness.capacity.memory import non_torch_bytes
from harness.capacity.shapes import pipeline_stage, stage_of_layers
from harness.capacity.stages import _even_partition, plan_uneven_vllm
from test_model_configs import LLAMA3_8B

SHAPE = model_shape(LLAMA3_8B)
SMALL, LARGE = gpu_by_name("RTX 5070 Ti"), gpu_by_name("RTX 5090")
WORK = Workload(max_model_len=8192)


def test_the_split_follows_the_gpus_and_beats_the_even_one():
    plan = plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, LARGE), 1, WORK, version="0.32")
    assert sum(plan.partition) == SHAPE.layers and plan.partition[0] < plan.partition[1]
    # each stage's figure is its own layers on its own GPU, and vLLM keeps the smallest
    assert plan.kv_tokens == min(stage.plan.kv_tokens for stage in plan.stages)
    for stage in plan.stages:
        alone = plan_vllm(stage_of_layers(SHAPE, stage.layers), weight_format("baseline"), Target(stage.gpu), WORK,
                          version="0.32", gpu_memory_utilization=None)
        assert alone.memory.weights_bytes == stage.plan.memory.weights_bytes
    # no neighbouring split holds more: moving a layer either way lowers the smallest stage
    for moved in (-1, 1):
        first = plan.partition[0] + moved
        assert min(_stage_tokens(SMALL, first), _stage_tokens(LARGE, SHAPE.layers - first)) <= plan.kv_tokens
    assert _stage_tokens(SMALL, plan.partition[0]) == plan.stages[0].plan.kv_tokens
    assert plan.even_kv_tokens < plan.kv_tokens
    assert plan.command.startswith(f"VLLM_PP_LAYER_PARTITION={plan.partition[0]},{plan.partition[1]} vllm serve ")
    assert "--pipeline-parallel-size 2" in plan.command


def _stage_tokens(gpu, kept):
    """One stage alone, with the NCCL buffers of a two-GPU deployment."""
    work = replace(WORK, non_torch_bytes=non_torch_bytes(2, since_start=True))
    return plan_vllm(stage_of_layers(SHAPE, kept), weight_format("baseline"), Target(gpu), work,
                     version="0.32").kv_tokens


def test_an_even_split_is_the_even_plan():
    """Same GPUs, even layers: the per-stage arithmetic gives the most-loaded-stage plan's tokens."""
    plan = plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, SMALL), 1, WORK, version="0.32")
    even = plan_vllm(SHAPE, weight_format("baseline"), Target(SMALL, 1, 2), WORK, version="0.32")
    assert plan.partition == _even_partition(SHAPE.layers, 2) and plan.kv_tokens == even.kv_tokens
    assert stage_of_layers(SHAPE, SHAPE.layers // 2) == pipeline_stage(SHAPE, 2)


def test_v0_pipeline_releases_keep_the_even_plan():
    assert plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, LARGE), 1, WORK, version="0.8.5") is None


@pytest.mark.parametrize(("layers", "pp", "split"), [(32, 2, (16, 16)), (30, 4, (7, 8, 8, 7)), (7, 3, (2, 3, 2)), (5, 3, (2, 2, 1))])
def test_the_even_split_is_vllms(layers, pp, split):
    """get_pp_indices without VLLM_PP_LAYER_PARTITION: one more layer to each of the remainder stages before the
    last (vllm/distributed/utils.py: partitions[-i] += 1 for i in 2 .. remainder + 1)."""
    assert _even_partition(layers, pp) == split


def test_plan_prints_the_partition(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA3_8B))
    assert cli.main(["plan", "--model", str(config), "--format", "awq", "--engine", "vllm", "--target-gpu",
                     "RTX 5070 Ti,RTX 5090", "--max-model-len", "8192", "--json"]) == 0
    staged = json.loads(capsys.readouterr().out)["formats"]["awq"]["pipeline_stages"]
    assert [s["gpu"] for s in staged["stages"]] == ["RTX-5070-Ti", "RTX-5090"]
    assert staged["command"].startswith("VLLM_PP_LAYER_PARTITION=") and staged["kv_tokens"] > \
        staged["even_split_kv_tokens"]
    assert cli.main(["plan", "--model", str(config), "--format", "awq", "--engine", "vllm", "--target-gpu",
                     "RTX 5070 Ti,RTX 5090", "--max-model-len", "8192"]) == 0
    assert "vllm over uneven pipeline stages: VLLM_PP_LAYER_PARTITION=" in capsys.readouterr().out
