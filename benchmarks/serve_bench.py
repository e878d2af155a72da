"""Benchmark 5: the same evalset scored through quantgate's two backends, transformers in-process and a vLLM
server (`--backend vllm`), each a whole `quantgate run` of the baseline on a fresh cache, with its scores.

What is compared: the evaluation's generation time (the generate stage; for vLLM the server's start-up is
reported beside it), the whole run's wall time, the mean scores, and how many predictions are identical. On a
CPU the vLLM path is for fidelity (kernels, capacity, flags), not speed; the numbers say by how much it differs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import ROOT, child_env, say
from harness.jsonl import read_jsonl
from harness.report.schema import load_report


@dataclass
class BackendRun:
    backend: str
    wall_s: float  # the whole `quantgate run`
    generate_s: float  # the generate stage over every item
    startup_s: float | None  # vLLM: until /health answered
    scores: dict[str, float]  # metric -> mean value (0-100)
    items: int
    predictions: dict[str, str] = field(default_factory=dict)


def run_serve_bench(model_path: Path, evalset_spec: Path, items: int, batch_size: int, threads: int,
                    work: Path) -> dict:
    runs = [_run_backend(backend, model_path, evalset_spec, items, batch_size, threads, work)
            for backend in ("transformers", "vllm")]
    first, second = runs
    same = sum(first.predictions.get(k) == v for k, v in second.predictions.items())
    return {"runs": [r.__dict__ for r in runs], "identical_predictions": same, "items": items}


def _run_backend(backend: str, model_path: Path, evalset_spec: Path, items: int, batch_size: int, threads: int,
                 work: Path) -> BackendRun:
    out, cache = work / f"run-{backend}", work / f"cache-{backend}"
    command = [sys.executable, "-m", "harness", "run", "--model", str(model_path), "--formats", "baseline",
               "--backend", backend, "--evalsets", str(evalset_spec), "--allow-outside-paths",
               "--max-items", str(items), "--batch-size",
               str(batch_size), "--max-num-seqs", str(batch_size), "--threads", str(threads),
               "--latency-requests", "2", "--concurrency", "1", "--out", str(out), "--quiet"]
    say(f"serve: {items} items through the {backend} backend")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**child_env(), "QUANTGATE_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=4 * 3600)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"quantgate run --backend {backend} failed ({done.returncode}): {done.stderr[-800:]}")
    entry = load_report(out / "report.json").formats["baseline"]
    predictions = {}
    for sample in read_jsonl(out / "samples.jsonl"):
        predictions[f"{sample['evalset']}/{sample['id']}"] = sample["prediction"]
    scores = {metric: value.value for metrics in entry.scores.values() for metric, value in metrics.items()}
    return BackendRun(backend, round(wall, 1), entry.generation.wall_s, entry.served and entry.served.startup_s,
                      scores, entry.generation.items, predictions)


def render_serve_bench(result: dict | None) -> list[str]:
    if not result:
        return []
    runs = {r["backend"]: r for r in result["runs"]}
    metrics = sorted(runs["transformers"]["scores"])
    lines = ["## 5. The vLLM backend beside transformers", "",
             f"The {result['items']} SQuAD items through `quantgate run --formats baseline --backend B` on a fresh "
             "cache (benchmarks/serve_bench.py); generation is the generate stage, the vLLM server's start-up "
             "is its own column.", "",
             "| backend | generation s | server start-up s | whole run s | " + " | ".join(metrics) + " |",
             "|---|---|---|---|" + "---|" * len(metrics)]
    for name, run in runs.items():
        startup = f"{run['startup_s']:.0f}" if run["startup_s"] is not None else "-"
        lines.append(f"| {name} | {run['generate_s']:.1f} | {startup} | {run['wall_s']:.0f} | "
                     + " | ".join(f"{run['scores'][m]:.1f}" for m in metrics) + " |")
    ratio = runs["vllm"]["generate_s"] / runs["transformers"]["generate_s"] if runs["transformers"]["generate_s"] else 0
    verdict = "slower" if ratio > 1 else "faster"
    lines += ["", f"Identical predictions: {result['identical_predictions']} of {result['items']}. On this machine "
                  f"the vLLM backend's generation is {ratio:.2f}x the transformers backend's time ({verdict})."]
    return lines
