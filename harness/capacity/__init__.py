"""Serving capacity: one memory model (shapes, memory), per-engine planners (vllm, sglang, trtllm), GPUs by name.

    shape = model_shape(config)                       # ConfigFieldError names a missing field or unknown model_type
    fmt = weight_format("awq", group_size=128)
    target = Target(gpu_by_name("L4"), num_gpus=1)            # pipeline_parallel_size=2: over 2 stages
    plans = plan_engines(shape, fmt, target, Workload(max_model_len=4096))   # {"vllm": EnginePlan, ...}

"""

from __future__ import annotations

from dataclasses import replace

from harness.capacity.advice import what_would_fit
from harness.capacity.common import EnginePlan, MemoryBreakdown, Target, Workload, with_engine_split
from harness.capacity.gpus import GPUS, Gpu, gpu_by_name, gpu_of_size, kernel_support
from harness.capacity.memory import (TensorParallelError, WeightFormat, activation_peak_bytes,
                                             kv_bytes_per_sequence, kv_bytes_per_token, parameter_count,
                                             planned_weights_bytes, weight_format, weights_bytes)
from harness.capacity.meta import model_shape
from harness.capacity.registry import PLANNERS, engine_names, engine_title, register_planner
from harness.capacity.sglang import check_sglang_command, plan_sglang, sglang_pp_layer_partition
from harness.capacity.shapes import ConfigFieldError, ModelShape, attention_shape, pipeline_stage
from harness.capacity.trtllm import check_trtllm_command, plan_trtllm, trtllm_pp_layer_partition
from harness.capacity.vllm import (NEWEST_VERSION, check_vllm_command, plan_vllm, resolve_version,
                                   vllm_split_target)

register_planner("vllm", "vLLM", lambda shape, fmt, target, workload, *, vllm_version=NEWEST_VERSION,
                 gpu_memory_utilization=None, **_: plan_vllm(shape, fmt, target, workload, version=vllm_version,
                                                              gpu_memory_utilization=gpu_memory_utilization))
register_planner("sglang", "SGLang", lambda shape, fmt, target, workload, **_: plan_sglang(shape, fmt, target, workload))
register_planner("trtllm", "TensorRT-LLM",
                 lambda shape, fmt, target, workload, **_: plan_trtllm(shape, fmt, target, workload))
ENGINES = engine_names()  # the built-in engines, in the report's order

__all__ = [
    "ConfigFieldError", "ENGINES", "EnginePlan", "GPUS", "Gpu",
    "MemoryBreakdown", "ModelShape", "Target", "TensorParallelError", "WeightFormat",
    "Workload", "activation_peak_bytes", "attention_shape", "check_sglang_command", "check_trtllm_command",
    "check_vllm_command", "engine_names", "engine_split_target", "engine_title", "gpu_by_name", "gpu_of_size", "kernel_support",
    "kv_bytes_per_sequence", "kv_bytes_per_token", "model_shape", "parameter_count", "plan_engine",
    "pipeline_stage", "plan_engines", "plan_sglang", "planned_weights_bytes", "plan_trtllm", "plan_vllm",
    "register_planner",
    "resolve_version",
    "weight_format", "weights_bytes",
]


def engine_split_target(engine: str, shape: ModelShape, target: Target, vllm_version: str = NEWEST_VERSION) -> Target:
    """`target` with `engine`'s own split of the layers over its pipeline stages, as its planner sizes them (an engine
    registered without one keeps shapes.pipeline_stage's bound)."""
    if engine == "vllm":
        return vllm_split_target(shape, target, vllm_version)
    split = {"sglang": sglang_pp_layer_partition, "trtllm": trtllm_pp_layer_partition}.get(engine)
    return with_engine_split(target, shape, split) if split else target


def plan_engine(engine: str, shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, *,
                vllm_version: str = NEWEST_VERSION, gpu_memory_utilization: float | None = None) -> EnginePlan:
    """One engine's plan (harness.capacity.registry); when it is servable but does not fit, its reason ends
    with what would (re-planned)."""
    if engine not in PLANNERS:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(engine_names())})")
    entry = PLANNERS[engine]

    def planner(s, f, t, w):
        return entry.plan(s, f, t, w, vllm_version=vllm_version, gpu_memory_utilization=gpu_memory_utilization)

    plan = planner(shape, fmt, target, workload)
    if plan.servable and not plan.fits:
        levers = what_would_fit(planner, shape, fmt, target, workload)
        plan = replace(plan, reason=plan.reason + ("; what would: " + ", or ".join(levers) if levers else
                                                   "; nothing planned here fits: a smaller format or model"))
    return plan


def plan_engines(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload,
                 engines: tuple[str, ...] | None = None, **options) -> dict[str, EnginePlan]:
    """plan_engine for each engine (default: every registered one), in order."""
    return {engine: plan_engine(engine, shape, fmt, target, workload, **options)
            for engine in (engines if engines is not None else engine_names())}
