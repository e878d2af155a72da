"""Pipeline stages on GPUs of different sizes (`--target-gpu 'RTX 5070 Ti,RTX 5090'`), planned per stage for vLLM.

vLLM gives each pipeline stage a contiguous run of layers, evenly unless VLLM_PP_LAYER_PARTITION lists the count per
stage (vllm/distributed/utils.py:get_pp_indices). Each worker profiles its own GPU and sizes its own KV cache for its
own layers; the engine then gives every worker the smallest worker's block count (vllm/v1/core/kv_cache_utils.py:
get_kv_cache_configs, "Change the num_blocks of each worker to the smallest among all workers"). So a split puts
fewer layers on the smaller GPU until the stages' token counts meet: the plan here tries splits and keeps the one whose
smallest stage holds the most tokens.

Each stage is planned as a one-stage deployment of its own layers on its own GPU (shapes.stage_of_range: the
embedding on the first stage, the lm_head on the last; the sampler is counted on every stage: at most one logits
buffer too many a stage). vLLM's extensible KV cache (0.34, no utilization given) sizes
--kv-cache-memory-bytes, one figure for every worker whatever its layers; the uneven plan sets the utilization
instead (the release's 0.92 before it), so each worker's share follows its own GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.capacity.common import EnginePlan, Target, Workload, render_command
from harness.capacity.gpus import Gpu
from harness.capacity.memory import WeightFormat, non_torch_bytes
from harness.capacity.shapes import ModelShape, stage_of_range, stage_ranges
from harness.capacity.vllm import PROGRAM, plan_vllm
from harness.capacity.vllm_versions import engine_rules, pp_layer_partition, rules_for

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
UNEVEN_UTILIZATION = 0.92  # vLLM's default gpu_memory_utilization from 0.20 to 0.33


@dataclass(frozen=True)
class StagePlan:
    gpu: Gpu
    layers: int
    plan: EnginePlan  # this stage's layers alone on its GPU


@dataclass(frozen=True)
class UnevenPipelinePlan:
    """vLLM over pipeline stages of different GPUs with a layer split chosen for them."""

    partition: tuple[int, ...]
    stages: tuple[StagePlan, ...]
    kv_tokens: int  # every worker's, the smallest stage's (vLLM unifies the block count)
    max_concurrency: int
    fits: bool
    command: str  # "VLLM_PP_LAYER_PARTITION=a,b vllm serve MODEL ..."; "" when nothing fits
    even_kv_tokens: int | None  # the same GPUs split evenly, for comparison (None: an even split does not fit)
    notes: tuple[str, ...]
    reason: str = ""


def plan_uneven_vllm(shape: ModelShape, fmt: WeightFormat, stages: tuple[Gpu, ...], tp: int, workload: Workload, *,
                     version: str, gpu_memory_utilization: float | None = None) -> UnevenPipelinePlan | None:
    """The per-stage plan over `stages` (one GPU kind a stage, tensor-parallel `tp` within it); None where the
    release plans pipeline parallelism with other rules than one stage's (V0 before 0.9), which the stage-by-stage
    arithmetic here does not follow: the even plan on the smallest GPU stands there."""
    pp, layers = len(stages), shape.layers
    if pp < 2 or pp > layers:
        return None
    rules, release, _ = rules_for(version)
    if engine_rules(release, pp)[0] != engine_rules(release, 1)[0]:
        return None
    notes: list[str] = []
    utilization = gpu_memory_utilization
    if utilization is None and rules.default_utilization is None:
        utilization = UNEVEN_UTILIZATION
        notes.append(f"vLLM {release}: --gpu-memory-utilization {UNEVEN_UTILIZATION:g} set: its extensible KV cache "
                     "would size one --kv-cache-memory-bytes for every stage, whatever its GPU and layers")
    if workload.non_torch_bytes is None:  # the NCCL buffers of a deployment over tp x pp GPUs, on every stage
        workload = replace(workload, non_torch_bytes=non_torch_bytes(
            tp * pp, since_start=rules.non_torch == "since start"))
    cache: dict[tuple[int, int, int], EnginePlan] = {}

    def stage_plan(index: int, split: tuple[int, ...]) -> EnginePlan:
        start, end = stage_ranges(split)[index]
        if (index, start, end) not in cache:
            cache[index, start, end] = plan_vllm(stage_of_range(shape, start, end), fmt, Target(stages[index], tp),
                                                 workload, version=version, gpu_memory_utilization=utilization)
        return cache[index, start, end]

    def stage_tokens(index: int, split: tuple[int, ...]) -> int:
        return stage_plan(index, split).kv_tokens

    partition = _best_partition(layers, [gpu.memory_bytes for gpu in stages], stage_tokens)
    plans = tuple(StagePlan(stages[i], kept, stage_plan(i, partition)) for i, kept in enumerate(partition))
    even = pp_layer_partition(layers, pp, release)
    even_tokens = min(stage_tokens(i, even) for i in range(pp))
    binding = min(plans, key=lambda stage: stage.plan.kv_tokens).plan
    kv_tokens = binding.kv_tokens
    concurrency = min(stage.plan.max_concurrency for stage in plans)
    refusal = next((stage.plan.reason for stage in plans if not stage.plan.servable), "")
    fits = not refusal and all(stage.plan.fits for stage in plans) and concurrency >= 1
    command = ""
    if fits:
        args = list(binding.args)
        at = next((i + 1 for i, (flag, _) in enumerate(args) if flag == "--tensor-parallel-size"), 0)
        args.insert(at, ("--pipeline-parallel-size", str(pp)))
        command = f"{PARTITION_ENV}={','.join(map(str, partition))} " + render_command(PROGRAM, tuple(args))
    reason = refusal or ("" if fits else next((stage.plan.reason for stage in plans if not stage.plan.fits), ""))
    notes.append(f"vLLM: {PARTITION_ENV} splits the {layers} layers {'/'.join(map(str, partition))} over "
                 + " + ".join(gpu.name for gpu in stages) + "; each worker sizes its own KV cache and vLLM keeps the "
                 f"smallest worker's block count ({kv_tokens:,} tokens here; an even split: "
                 + (f"{even_tokens:,})" if even_tokens > 0 else "nothing fits)"))
    return UnevenPipelinePlan(partition=partition, stages=plans, kv_tokens=kv_tokens, max_concurrency=concurrency,
                              fits=fits, command=command, even_kv_tokens=even_tokens if even_tokens > 0 else None,
                              notes=tuple(notes), reason=reason)


def _best_partition(layers: int, weights: list[int], stage_tokens) -> tuple[int, ...]:
    """The split whose smallest stage holds the most KV tokens (stage_tokens(index, split) -> that stage's tokens):
    start in proportion to the GPUs' memory, then move one layer at a time from the stage that binds to the stage
    with the most room while that raises the smallest stage's tokens."""
    pp, total = len(weights), sum(weights)
    counts = [max(1, round(layers * w / total)) for w in weights]
    while sum(counts) > layers:
        counts[counts.index(max(counts))] -= 1
    while sum(counts) < layers:
        counts[weights.index(max(weights))] += 1

    def smallest(split: list[int]) -> int:
        return min(stage_tokens(i, tuple(split)) for i in range(pp))

    best = smallest(counts)
    for _ in range(layers * pp):
        room = [stage_tokens(i, tuple(counts)) for i in range(pp)]
        source = room.index(min(room))
        if counts[source] == 1:
            break
        improved = False
        for sink in sorted((i for i in range(pp) if i != source), key=lambda i: -room[i]):
            candidate = list(counts)
            candidate[source] -= 1
            candidate[sink] += 1
            tokens = smallest(candidate)
            if tokens > best:
                counts, best, improved = candidate, tokens, True
                break
        if not improved:
            break
    return tuple(counts)
