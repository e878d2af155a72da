"""vLLM over pipeline stages on GPUs of different sizes (issue #39 item 5): each stage planned on its own GPU with a
VLLM_PP_LAYER_PARTITION split, every worker keeping the smallest stage's block count (get_kv_cache_configs)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness import cli
from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format
from harness.capacity.memory import non_torch_bytes
from harness.capacity.memory import loaded_stage, weights_bytes
from harness.capacity.shapes import pipeline_stages, stage_of_range
from harness.capacity.stages import plan_uneven_vllm
from harness.capacity.vllm_versions import pp_layer_partition
from test_model_configs import LLAMA3_8B

SHAPE = model_shape(LLAMA3_8B)
DEEPSEEK_V3 = Path(__file__).parent / "fixtures" / "checkpoints" / "DeepSeek-V3.json"  # its published config.json
SMALL, LARGE = gpu_by_name("RTX 5070 Ti"), gpu_by_name("RTX 5090")
WORK = Workload(max_model_len=8192)


def test_the_split_follows_the_gpus_and_beats_the_even_one():
    plan = plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, LARGE), 1, WORK, version="0.32")
    assert sum(plan.partition) == SHAPE.layers and plan.partition[0] < plan.partition[1]
    # each stage's figure is its own layers on its own GPU, and vLLM keeps the smallest
    assert plan.kv_tokens == min(stage.plan.kv_tokens for stage in plan.stages)
    for stage, (start, end) in zip(plan.stages, ((0, plan.partition[0]), (plan.partition[0], SHAPE.layers))):
        alone = plan_vllm(stage_of_range(SHAPE, start, end), weight_format("baseline"), Target(stage.gpu), WORK,
                          version="0.32", gpu_memory_utilization=None)
        assert alone.memory.weights_bytes == stage.plan.memory.weights_bytes
    # no neighbouring split holds more: moving a layer either way lowers the smallest stage
    for moved in (-1, 1):
        first = plan.partition[0] + moved
        assert min(_stage_tokens(SMALL, 0, first), _stage_tokens(LARGE, first, SHAPE.layers)) <= plan.kv_tokens
    assert _stage_tokens(SMALL, 0, plan.partition[0]) == plan.stages[0].plan.kv_tokens
    assert plan.even_kv_tokens < plan.kv_tokens
    assert plan.command.startswith(f"VLLM_PP_LAYER_PARTITION={plan.partition[0]},{plan.partition[1]} vllm serve ")
    assert "--pipeline-parallel-size 2" in plan.command


def _stage_tokens(gpu, start, end):
    """One stage alone, with the NCCL buffers of a two-GPU deployment."""
    work = replace(WORK, non_torch_bytes=non_torch_bytes(2, since_start=True))
    return plan_vllm(stage_of_range(SHAPE, start, end), weight_format("baseline"), Target(gpu), work,
                     version="0.32").kv_tokens


def test_an_even_split_is_the_even_plan():
    """Same GPUs, even layers: the per-stage arithmetic gives the most-loaded-stage plan's tokens."""
    plan = plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, SMALL), 1, WORK, version="0.32")
    split = pp_layer_partition(SHAPE.layers, 2, "0.32")
    even = plan_vllm(SHAPE, weight_format("baseline"), Target(SMALL, 1, 2, layer_partition=split), WORK,
                     version="0.32")
    assert plan.partition == split and plan.kv_tokens == even.kv_tokens


def test_v0_pipeline_releases_keep_the_even_plan():
    assert plan_uneven_vllm(SHAPE, weight_format("baseline"), (SMALL, LARGE), 1, WORK, version="0.8.5") is None


@pytest.mark.parametrize(("layers", "pp", "version", "split"), [
    (32, 2, "0.32", (16, 16)), (30, 4, "0.32", (7, 8, 8, 7)), (7, 3, "0.8.5", (2, 3, 2)), (5, 3, "0.11.0", (2, 2, 1)),
    (61, 8, "0.8.0", (7, 7, 8, 8, 8, 8, 8, 7)),  # DeepSeek at PP 8, as sglang#6666 quotes vLLM's split
    (61, 2, "0.7.2", (30, 31)), (61, 4, "0.6.6", (15, 15, 15, 16)), (30, 4, "0.7.3", (7, 7, 7, 9))])
def test_the_even_split_is_the_releases(layers, pp, version, split):
    """get_pp_indices without VLLM_PP_LAYER_PARTITION: from 0.8 one more layer to each of the remainder stages
    before the last (vllm/distributed/utils.py: partitions[-i] += 1 for i in 2 .. remainder + 1, vllm#13839); up to
    0.7 the whole remainder on the last stage."""
    assert pp_layer_partition(layers, pp, version) == split


def test_a_stage_holds_its_own_layers():
    """DeepSeek-V3's first 3 layers are dense and the rest MoE: at vLLM 0.7.2's split (30/31) the first stage holds
    the 3 dense MLPs and 27 layers' experts and the embedding, the last 31 layers' experts, the lm_head and the final
    norm; together the stages are the whole model, and the heaviest is the last."""
    shape = model_shape(json.loads(DEEPSEEK_V3.read_text(encoding="utf-8")))
    first, last = pipeline_stages(shape, pp_layer_partition(shape.layers, 2, "0.7.2"))
    count = {(part, lin.name): lin.count for part, stage in (("first", first), ("last", last))
             for lin in stage.linears}
    assert count["first", "mlp.gate_proj"] == 3 and count["last", "mlp.gate_proj"] == 0
    assert count["first", "experts.gate_proj"] == 27 * 256 and count["last", "experts.gate_proj"] == 31 * 256
    assert (first.embedding_matrices, last.embedding_matrices, first.layers, last.layers) == (1, 1, 30, 31)
    bf16 = weight_format("baseline")
    assert weights_bytes(first, bf16) + weights_bytes(last, bf16) == pytest.approx(weights_bytes(shape, bf16), abs=8)
    assert loaded_stage(shape, bf16, 8, 2, (30, 31)) == last and loaded_stage(shape, bf16, 8, 2, (30, 31), 0) == first


def test_tied_embeddings_are_held_by_both_end_stages():
    """A tied lm_head is its own copy of the embedding on the last stage (vLLM's models build embed_tokens there
    when tie_word_embeddings); a middle stage holds neither."""
    shape = replace(SHAPE, tied_embeddings=True)
    assert [stage.embedding_matrices for stage in pipeline_stages(shape, (10, 12, 10))] == [1, 0, 1]
    assert [stage.embedding_matrices for stage in pipeline_stages(SHAPE, (16, 16))] == [1, 1]
    assert pipeline_stages(SHAPE, (32,)) == (SHAPE,)


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
