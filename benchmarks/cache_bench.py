"""Benchmark 3: the full demo run (all formats), cold, then repeated with nothing changed.

Both runs use one fresh QUANTGATE_CACHE into which only the converted demo checkpoint is linked, so the cold run
times quantization, measurement and evaluation, not the one-off GGUF conversion.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, child_env, children_cpu_s, demo_cache, say
from harness.report.schema import load_report

FORMATS = "baseline,int8,gptq,awq"


@dataclass
class CacheBench:
    cold_s: float
    cold_cpu_s: float
    warm_s: float
    warm_cpu_s: float
    warm_stages_run: dict[str, list[str]]  # should be empty lists: nothing recomputed
    args: list[str]
    run_dir: Path
    cache: Path


def run_cache_bench(demo_checkpoint: Path, work: Path, max_items: int, calibration_samples: int,
                    latency_requests: int, threads: int, batch_size: int) -> CacheBench:
    cache = demo_cache(work / "cache", demo_checkpoint)
    run_dir = work / "demo-run"
    args = ["run", "--model", "demo", "--formats", FORMATS, "--max-items", str(max_items),
            "--calibration-samples", str(calibration_samples), "--latency-requests", str(latency_requests),
            "--threads", str(threads),
            "--batch-size", str(batch_size), "--out", str(run_dir)]
    say(f"cache: cold `quantgate {' '.join(args[:-2])}` (quantizes int8, gptq, awq)")
    cold, cold_cpu = _quantgate(args, cache, work / "cold.log")
    say(f"cache: cold run took {cold:.1f}s ({cold_cpu:.1f}s CPU); repeating it unchanged")
    warm, warm_cpu = _quantgate(args, cache, work / "warm.log")
    again = load_report(run_dir / "report.json")
    stages = {name: entry.stages_run or [] for name, entry in again.formats.items()}
    say(f"cache: warm run took {warm:.2f}s ({warm_cpu:.2f}s CPU; stages recomputed: {sum(map(len, stages.values()))})")
    return CacheBench(cold, cold_cpu, warm, warm_cpu, stages, args[:-2], run_dir, cache)


def _quantgate(args: list[str], cache: Path, log_path: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one `quantgate` command."""
    env = {**child_env(), "QUANTGATE_CACHE": str(cache)}
    cpu = children_cpu_s()
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if code not in (0, 1):  # 1 = some format is not GO: the run itself worked
        raise RuntimeError(f"quantgate {' '.join(args)} exited with code {code}; see {log_path}")
    return wall, children_cpu_s() - cpu


