"""Which fidelity tasks a format's worker runs, and where their results live (the pipeline's side).

The baseline's worker writes one reference per evalset, keyed by the baseline generation it continues; every
other format's worker compares against a reference that exists, keyed by its artifact, the run's evaluation
settings and that reference. When fidelity cannot be measured, `note` says why in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.cache import cache_dir, read_json, stable_hash
from harness.fidelity import TOP_K, VERSION
from harness.jobs import FidelityTask


@dataclass(frozen=True)
class FidelityPlan:
    tasks: tuple[FidelityTask, ...]
    results: dict[str, str]  # evalset -> path of the format's comparison (compare) or reference (baseline)
    note: str | None = None  # why fidelity is not measured for this format; None when it is


def reference_key(baseline_generation_key: str) -> str:
    return stable_hash({"generation": baseline_generation_key, "top_k": TOP_K, "version": VERSION})


def reference_path(baseline_generation_key: str) -> Path:
    return cache_dir("results") / f"fidelity-reference-{reference_key(baseline_generation_key)}.npz"


def plan_reference(baseline_generations: dict[str, str], generation_paths: dict[str, str],
                   prompt_ids: dict[str, list[tuple[str, tuple[int, ...]]]], reusable) -> FidelityPlan:
    """The baseline: a reference per evalset it does not have yet. baseline_generations: evalset -> generation key."""
    tasks, results = [], {}
    for evalset, generation_key in baseline_generations.items():
        path = reference_path(generation_key)
        results[evalset] = str(path)
        if not (reusable(path) and path.is_file()):
            tasks.append(FidelityTask(evalset, reference_key(generation_key), "reference", str(path),
                                      generation_path=generation_paths[evalset], items=tuple(prompt_ids[evalset])))
    return FidelityPlan(tuple(tasks), results)


def plan_comparison(artifact_key: str, settings: dict, baseline_generations: dict[str, str], reusable) -> FidelityPlan:
    """Another format: a comparison per evalset whose reference exists and whose comparison is not cached."""
    tasks, results = [], {}
    missing = []
    for evalset, generation_key in baseline_generations.items():
        reference = reference_path(generation_key)
        key = stable_hash({"artifact": artifact_key, "settings": settings, "reference": reference_key(generation_key)})
        path = cache_dir("results") / f"fidelity-{key}.json"
        results[evalset] = str(path)
        if reusable(path) and isinstance(read_json(path), dict):
            continue
        if not reference.is_file():
            missing.append(evalset)
            continue
        tasks.append(FidelityTask(evalset, key, "compare", str(reference), result_path=str(path)))
    note = (f"no baseline reference yet for {', '.join(missing)} (the baseline has not finished)" if missing
            else None)
    return FidelityPlan(tuple(tasks), results, note)
