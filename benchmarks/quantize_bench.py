"""Benchmark 4: quantgate's GPTQ and AWQ stages vs GPTQModel called directly, back to back per format.

Runs in the cache of the demo runs (benchmark 3), whose cold run already paid GPTQModel's one-off CPU packing
kernel build (quantgate keeps that build directory inside its cache), so neither side pays it here. The direct
call gets the recipe quantgate recorded in the artifact's manifest, the calibration texts the pipeline wrote to
stages/<fmt>/calibration.json, and exactly the environment quantgate gives its quantize worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import child_env, run_child, say


@dataclass
class QuantizeBench:
    format: str
    calibration_texts: int
    quantgate_stage_s: float  # the pipeline's stage: calibration file, worker process, quantization, sealed artifact
    quantgate_stage_cpu_s: float
    quantgate_inner_s: float  # inside the worker: the quantizer's load + quantize + save (manifest quantize_seconds)
    direct_s: float  # the direct process, start to exit
    direct_cpu_s: float
    direct_inner_s: float  # load + quantize + save inside it


def run_quantize_bench(fmt: str, cache: Path, max_items: int, calibration_samples: int, threads: int,
                       work: Path) -> QuantizeBench:
    env = {**child_env(), "QUANTGATE_CACHE": str(cache)}
    say(f"quantize: quantgate's {fmt} stage (max-items {max_items}, {calibration_samples} calibration samples)")
    ours = run_child("benchmarks.quantgate_quantize_side", {
        "format": fmt, "model": "demo", "out_dir": str(work / f"run-{fmt}"), "max_items": max_items,
        "calibration_samples": calibration_samples, "threads": threads}, work / fmt, base_env=env)
    texts = ours.result["calibration_texts"]
    say(f"quantize: {fmt} stage {ours.result['stage_s']:.1f}s wall, {ours.result['stage_cpu_s']:.1f}s CPU; now GPTQModel "
        f"directly on the same {texts} texts")
    direct = run_child("benchmarks.gptqmodel_direct", {
        "source_path": ours.result["source_path"], "recipe": ours.result["recipe"],
        "calibration_path": ours.result["calibration_path"], "out_dir": str(work / f"direct-{fmt}"),
        "threads": threads}, work / fmt,
        base_env={**env, **ours.result["worker_env"]})  # what the quantgate side's worker got
    say(f"quantize: {fmt} direct {direct.wall_s:.1f}s wall, {direct.cpu_s:.1f}s CPU")
    return QuantizeBench(fmt, texts, ours.result["stage_s"], ours.result["stage_cpu_s"], float(ours.result["quantize_s"]),
                         direct.wall_s, direct.cpu_s, direct.result["quantize_s"])
