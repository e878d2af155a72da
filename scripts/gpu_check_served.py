"""GPU check of the vLLM backend (issue: capacity checked against vLLM's own figures, within 3% on a GPU).

    scripts/gpu_check_served.py MODEL_DIR [--vllm PATH] [--formats baseline]

Runs `quantgate run --backend vllm` on MODEL_DIR (e.g. the random model that `python -m scripts.gpu_check
--keep-model DIR` kept) and checks, per served format: the server started, vLLM's logged KV tokens are within 3% of
quantgate's prediction, the saturation check held, and no server process is left. Exit 0 all passed, 1 a check
failed, 3 no vLLM here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.03


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--vllm", help="a vllm executable (default: .venv-vllm, else none)")
    parser.add_argument("--formats", default="baseline")
    args = parser.parse_args(argv)
    vllm = args.vllm or (str(ROOT / ".venv-vllm" / "bin" / "vllm") if (ROOT / ".venv-vllm").is_dir() else None)
    if vllm is None:
        print("no vLLM on this machine (.venv-vllm missing and no --vllm): nothing to check")
        return 3
    out = Path(tempfile.mkdtemp(prefix="gpu-check-served-"))
    command = [sys.executable, "-m", "harness", "run", "--model", args.model_dir, "--formats", args.formats,
               "--backend", "vllm", "--max-items", "4", "--max-new-tokens", "16", "--latency-requests", "4",
               "--out", str(out)] + ([] if not args.vllm else ["--vllm", args.vllm])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if not (out / "report.json").is_file():
        print(f"quantgate run exited {done.returncode} without a report:\n{done.stderr[-2000:]}")
        return 1
    failed = []
    for name, entry in json.loads((out / "report.json").read_text())["formats"].items():
        served = entry.get("served") or {}
        kv = served.get("kv_cache") or {}
        error = kv.get("relative_error")
        print(f"{name}: served {served.get('status')} ({served.get('reason') or 'ok'}); KV predicted "
              f"{kv.get('predicted_tokens')} vs vLLM {kv.get('vllm_tokens')} (error {error}); saturation "
              f"{(served.get('saturation') or {}).get('reason')}")
        if served.get("status") == "unsupported":
            continue
        if served.get("status") != "ok" or error is None or abs(error) > TOLERANCE:
            failed.append(f"{name}: KV prediction not within {TOLERANCE:.0%}")
        if not (served.get("saturation") or {}).get("holds"):
            failed.append(f"{name}: saturation")
    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints|vllm serve|harness.runtime.vllm.supervise"],
                              capture_output=True, text=True).stdout.split()
    if leftover:
        failed.append(f"server processes left: {leftover}")
    print("all served checks passed" if not failed else "FAILED: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
