"""GPU check of the vLLM backend (issue: capacity checked against vLLM's own figures, within 3% on a GPU).

    scripts/gpu_check_served.py MODEL_DIR [--vllm PATH] [--formats baseline] [QUANTGATE RUN FLAGS...]

Flags it does not know go to `quantgate run` as they are: scripts/gpu_check.sh repeats the check with
`--tensor-parallel-size 2` and `--pipeline-parallel-size 2` on a machine with two GPUs or more (the plan then splits
weights and KV over them, and the 3% must still hold).

Runs `quantgate run --backend vllm` on MODEL_DIR (e.g. the random model that `python -m scripts.gpu_check
--keep-model DIR` kept) and checks, per served format: the server started, vLLM's logged KV tokens are within 3% of
quantgate's prediction, the saturation check held, and no server process is left. Exit 0 all passed, 1 a check
failed, 3 no vLLM here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness.report.schema import load_report  # noqa: E402

TOLERANCE = 0.03


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--vllm", help="a vllm executable (default: .venv-vllm, else none)")
    parser.add_argument("--formats", default="baseline")
    args, passed_on = parser.parse_known_args(argv)
    vllm = args.vllm or (str(ROOT / ".venv-vllm" / "bin" / "vllm") if (ROOT / ".venv-vllm").is_dir() else None)
    if vllm is None:
        print("no vLLM on this machine (.venv-vllm missing and no --vllm): nothing to check")
        return 3
    out = Path(tempfile.mkdtemp(prefix="gpu-check-served-"))
    command = [sys.executable, "-m", "harness", "run", "--model", args.model_dir, "--formats", args.formats,
               "--backend", "vllm", "--max-items", "4", "--max-new-tokens", "16", "--latency-requests", "4",
               "--out", str(out), *passed_on] + ([] if not args.vllm else ["--vllm", args.vllm])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if not (out / "report.json").is_file():
        print(f"quantgate run exited {done.returncode} without a report:\n{done.stderr[-2000:]}")
        return 1
    failed = []
    for name, entry in load_report(out / "report.json").formats.items():
        served = entry.served
        kv, saturation = (served.kv_cache, served.saturation) if served else (None, None)
        error = kv.relative_error if kv else None
        print(f"{name}: served {served.status if served else None} ({(served and served.reason) or 'ok'}); KV "
              f"predicted {kv and kv.predicted_tokens} vs vLLM {kv and kv.vllm_tokens} (error {error}); saturation "
              f"{saturation and saturation.reason}")
        if served is not None and served.status == "unsupported":
            continue
        if served is None or served.status != "ok" or error is None or abs(error) > TOLERANCE:
            failed.append(f"{name}: KV prediction not within {TOLERANCE:.0%}")
        if saturation is None or not saturation.holds:
            failed.append(f"{name}: saturation")
    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints|vllm serve|harness.runtime.vllm.supervise"],
                              capture_output=True, text=True).stdout.split()
    if leftover:
        failed.append(f"server processes left: {leftover}")
    print("all served checks passed" if not failed else "FAILED: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
