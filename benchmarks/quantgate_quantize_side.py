"""quantgate's quantize stage for one format, as its pipeline runs it: `python -m benchmarks.quantgate_quantize_side JOB`.

harness.pipeline.prepare_inputs builds the recipe and the calibration texts; harness.artifacts.ensure_artifact
(cache off) writes stages/<fmt>/calibration.json, runs the quantize worker and seals the artifact. The stage is
timed around ensure_artifact: wall time, and the CPU time of this process and the worker.
"""

from __future__ import annotations

import os
import sys
import time

from benchmarks.common import children_cpu_s, own_cpu_s, read_job, write_result


def main(argv: list[str]) -> int:
    job = read_job(argv)
    started_env = dict(os.environ)
    from harness import progress
    from harness.config import RunSpec
    from harness.artifacts import ensure_artifact
    from harness.pipeline import prepare_inputs
    from harness.records import FormatRun

    progress.configure(quiet=True)
    fmt = job["format"]
    spec = RunSpec(model=job["model"], formats=["baseline", fmt], out=job["out_dir"], max_items=job["max_items"],
                   calibration_samples=job["calibration_samples"], threads=job["threads"], use_cache=False)
    inputs = prepare_inputs(spec)
    run = FormatRun(fmt)
    started, cpu = time.perf_counter(), own_cpu_s() + children_cpu_s()
    artifact = ensure_artifact(inputs, fmt, run)
    stage_s, stage_cpu_s = time.perf_counter() - started, own_cpu_s() + children_cpu_s() - cpu
    if artifact is None:
        raise SystemExit(f"quantgate's {fmt} stage failed: {run.error}")
    manifest = run.artifact["manifest"]
    write_result(job, {"stage_s": stage_s, "stage_cpu_s": stage_cpu_s, "quantize_s": manifest["quantize_seconds"],
                       "recipe": manifest["recipe"], "calibration_texts": manifest["calibration_texts"],
                       "source_path": str(inputs.source.path),
                       "calibration_path": str(inputs.out_dir / "stages" / fmt / "calibration.json"),
                       "worker_env": worker_env_changes(started_env)})
    return 0


def worker_env_changes(started_env: dict[str, str]) -> dict[str, str]:
    """The variables harness.launcher set for the quantize worker this process started, over the environment this
    process started with (cache locations, offline flags, PYTHONPATH; no secrets). Computed here, where
    QUANTGATE_CACHE is the run's cache, so that the direct side gets exactly the worker's environment."""
    from harness.launcher import worker_environment

    return {name: value for name, value in worker_environment(os.environ).items() if started_env.get(name) != value}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
