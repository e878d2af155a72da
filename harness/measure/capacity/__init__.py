"""Serving capacity: one memory model (shapes, memory), per-engine planners (vllm, sglang, trtllm), GPUs by name.

    shape = model_shape(config)                       # ConfigFieldError names a missing field or unknown model_type
    fmt = weight_format("awq", group_size=128)
    target = Target(gpu_by_name("L4"), num_gpus=1)            # pipeline_parallel_size=2: over 2 stages
    plans = plan_engines(shape, fmt, target, Workload(max_model_len=4096))   # {"vllm": EnginePlan, ...}

"""

from __future__ import annotations

from dataclasses import replace

from harness.measure.capacity.advice import what_would_fit
from harness.measure.capacity.common import EnginePlan, MemoryBreakdown, Target, Workload
from harness.measure.capacity.gpus import GPUS, Gpu, gpu_by_name, gpu_of_size, kernel_support
from harness.measure.capacity.memory import (TensorParallelError, WeightFormat, activation_peak_bytes,
                                             kv_bytes_per_sequence, kv_bytes_per_token, parameter_count,
                                             planned_weights_bytes, weight_format, weights_bytes)
from harness.measure.capacity.sglang import check_sglang_command, plan_sglang
from harness.measure.capacity.shapes import ConfigFieldError, ModelShape, attention_shape, model_shape, pipeline_stage
from harness.measure.capacity.trtllm import check_trtllm_command, plan_trtllm
from harness.measure.capacity.vllm import NEWEST_VERSION, check_vllm_command, plan_vllm, resolve_version

ENGINES = ("vllm", "sglang", "trtllm")

__all__ = [
    "ConfigFieldError", "ENGINES", "EnginePlan", "GPUS", "Gpu",
    "MemoryBreakdown", "ModelShape", "Target", "TensorParallelError", "WeightFormat",
    "Workload", "activation_peak_bytes", "attention_shape", "check_sglang_command", "check_trtllm_command",
    "check_vllm_command", "gpu_by_name", "gpu_of_size", "kernel_support",
    "kv_bytes_per_sequence", "kv_bytes_per_token", "model_shape", "parameter_count", "plan_engine",
    "pipeline_stage", "plan_engines", "plan_sglang", "planned_weights_bytes", "plan_trtllm", "plan_vllm",
    "resolve_version",
    "weight_format", "weights_bytes",
]


def plan_engine(engine: str, shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, *,
                vllm_version: str = NEWEST_VERSION, gpu_memory_utilization: float | None = None) -> EnginePlan:
    """One engine's plan; when it is servable but does not fit, its reason ends with what would (re-planned)."""
    if engine == "vllm":
        def planner(s, f, t, w):
            return plan_vllm(s, f, t, w, version=vllm_version, gpu_memory_utilization=gpu_memory_utilization)
    elif engine == "sglang":
        planner = plan_sglang
    elif engine == "trtllm":
        planner = plan_trtllm
    else:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    plan = planner(shape, fmt, target, workload)
    if plan.servable and not plan.fits:
        levers = what_would_fit(planner, shape, fmt, target, workload)
        plan = replace(plan, reason=plan.reason + ("; what would: " + ", or ".join(levers) if levers else
                                                   "; nothing planned here fits: a smaller format or model"))
    return plan


def plan_engines(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload,
                 engines: tuple[str, ...] = ENGINES, **options) -> dict[str, EnginePlan]:
    """plan_engine for each engine, in order."""
    return {engine: plan_engine(engine, shape, fmt, target, workload, **options) for engine in engines}
