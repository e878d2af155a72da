"""The serving-engine planners by name: one entry per engine (its title as written, and the function that plans
it). The report, `quantgate plan` and the schema read this registry; a planner is added by register_planner alone
(harness/capacity/__init__.py registers vLLM, SGLang and TensorRT-LLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class PlannerEntry:
    name: str  # the key in reports and on the command line: "vllm"
    title: str  # as the engine writes its name: "vLLM"
    # (shape, weight format, target, workload, **options) -> EnginePlan; options: vllm_version,
    # gpu_memory_utilization (a planner takes what it uses and ignores the rest)
    plan: Callable[..., Any]


PLANNERS: dict[str, PlannerEntry] = {}


def register_planner(name: str, title: str, plan: Callable[..., Any]) -> None:
    PLANNERS[name] = PlannerEntry(name, title, plan)


def engine_names() -> tuple[str, ...]:
    return tuple(PLANNERS)


def engine_title(name: str) -> str:
    entry = PLANNERS.get(name)
    return entry.title if entry else name
