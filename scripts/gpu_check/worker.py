"""One step of the check in a fresh subprocess, so that no format inherits another's allocations and a crash or
an OOM ends only that step: `run_step` on the parent's side, `python -m scripts.gpu_check.worker KIND JOB_JSON`
on the child's. The child writes its result (or {"error": ...}) as JSON to the job's "out" path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from scripts.gpu_check import REPO
STEPS = ("build", "quantize-gptq", "measure")


def run_step(kind: str, job: dict, tmp: Path, deadline: float) -> dict:
    """Run step `kind` on `job` in a subprocess, stopped at `deadline` (time.monotonic()); its result, or
    {"error": ...} with the last lines of its log printed to stderr."""
    out = tmp / f"{kind}-{job.get('format', 'model')}.json"
    log = tmp / f"{kind}-{job.get('format', 'model')}.log"
    job = {**job, "out": str(out)}
    timeout = max(deadline - time.monotonic(), 10)
    with open(log, "w", encoding="utf-8") as log_file:
        try:
            proc = subprocess.run([sys.executable, "-m", "scripts.gpu_check.worker", kind, json.dumps(job)],
                                  cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    if code is None:
        result = {"error": f"{kind} timed out after {timeout:.0f} s"}
    elif out.is_file():
        result = json.loads(out.read_text(encoding="utf-8"))
    elif code < 0:
        from harness.measure.oom import oom_reason

        result = {"error": f"{kind}: {oom_reason(None, killed_signal=-code)}"}
    else:
        result = {"error": f"{kind} subprocess exited with code {code} and wrote no result"}
    if "error" not in result:
        return result
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
    print(f"[{kind} {job.get('format', '')} log, last lines]\n  " + "\n  ".join(tail), file=sys.stderr)
    return result


def worker(kind: str, job: dict) -> int:
    import torch

    from scripts.gpu_check.direct import measure_format
    from scripts.gpu_check.model import build_model, quantize_gptq

    torch.manual_seed(0)
    if job["device"] == "cpu":
        torch.set_num_threads(1)  # the smoke run shares small machines
    try:
        result = {"build": build_model, "quantize-gptq": quantize_gptq, "measure": measure_format}[kind](job)
        code = 0
    except Exception as exc:  # noqa: BLE001 - the parent prints the reason
        traceback.print_exc()
        result, code = {"error": _describe(exc)}, 1
    Path(job["out"]).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return code


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    if "out of memory" in text.lower():
        from harness.measure.oom import oom_reason, parse_cuda_oom

        return "out of memory: " + oom_reason(parse_cuda_oom(text))
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:400]


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in STEPS:
        raise SystemExit(f"usage: python -m scripts.gpu_check.worker {{{','.join(STEPS)}}} JOB_JSON")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(worker(sys.argv[1], json.loads(sys.argv[2])))
