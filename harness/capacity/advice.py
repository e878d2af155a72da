"""What would make a plan that does not fit fit: each suggestion re-planned with the same planner, never guessed."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from harness.capacity.common import EnginePlan, Target, Workload
from harness.capacity.gpus import FP8_MIN_CC, gpu_of_size, has_capability, larger_gpus
from harness.capacity.memory import GIB, TensorParallelError, WeightFormat
from harness.capacity.shapes import ModelShape

Planner = Callable[[ModelShape, WeightFormat, Target, Workload], EnginePlan]
MIN_USEFUL_LEN = 256  # a shorter max-model-len is no deployment anyone asked for


def what_would_fit(planner: Planner, shape: ModelShape, fmt: WeightFormat, target: Target,
                   workload: Workload) -> list[str]:
    """Changes that make the plan fit, each checked by re-planning: a shorter --max-model-len, an fp8 KV cache, more
    GPUs of this kind (tensor parallel), a larger GPU from the table, the GPU memory that would do."""
    def fits(t: Target = target, w: Workload = workload) -> bool:
        try:
            return planner(shape, fmt, t, w).fits
        except TensorParallelError:
            return False

    suggestions = []
    longest = _longest_fitting_len(lambda n: fits(w=replace(workload, max_model_len=n)), workload.max_model_len)
    if longest >= MIN_USEFUL_LEN:
        suggestions.append(f"--max-model-len {longest}")
    if workload.kv_cache_dtype == "auto" and has_capability(target.gpu, FP8_MIN_CC) is not False and fits(
            w=replace(workload, kv_cache_dtype="fp8")):
        suggestions.append("--kv-cache-dtype fp8")
    more = next((n for n in (2, 4, 8) if n > target.num_gpus and fits(t=replace(target, num_gpus=n))), None)
    if more:
        pp = target.pipeline_parallel_size
        how = (f"tensor parallel on {more} x" if pp == 1 else
               f"tensor parallel {more} x pipeline parallel {pp} on {more * pp} x")
        suggestions.append(f"--num-gpus {more} ({how} {target.gpu.name})")
    bigger = next((g for g in sorted(larger_gpus(target.gpu), key=lambda g: g.memory_bytes)
                   if fits(t=replace(target, gpu=g))), None)
    if bigger:
        suggestions.append(f"one {bigger.name} ({bigger.nominal})")
    needed = _memory_needed(lambda size: fits(t=replace(target, gpu=gpu_of_size(size / GIB, like=_like(target)))))
    if needed is not None:
        per = " per GPU" if target.total_gpus > 1 else ""
        suggestions.append(f"{needed / GIB:.1f} GiB of GPU memory{per} at these settings")
    return suggestions


def _like(target: Target):
    return target.gpu if target.gpu.compute_capability is not None else None


def _longest_fitting_len(fits_at: Callable[[int], bool], length: int) -> int:
    """The longest max_model_len below `length` that fits (0: none does); fitting shrinks as the length grows."""
    low, high = 0, length - 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits_at(middle):
            low = middle
        else:
            high = middle - 1
    return low if low and fits_at(low) else 0


def _memory_needed(fits_with: Callable[[int], bool], ceiling: int = 4096 * GIB) -> int | None:
    """The least GPU memory (to 0.1 GiB) that fits; None when even `ceiling` does not."""
    if not fits_with(ceiling):
        return None
    low, high = 0, ceiling
    while high - low > GIB // 10:
        middle = (low + high) // 2
        if fits_with(middle):
            high = middle
        else:
            low = middle
    return high
