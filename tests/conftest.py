import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NOISE = ("Failed to load", "MatMul8bitLt", "Traceback", "GPT-QModel", "UserWarning")


def quantgate(*args: str, cache: Path, timeout: float = 1800, check_codes=(0, 1)) -> subprocess.CompletedProcess:
    env = dict(os.environ, QUANTGATE_CACHE=str(cache), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if check_codes is not None and result.returncode not in check_codes:
        raise AssertionError(f"quantgate {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """One cache for the whole session: the demo model is fetched and converted once, for real."""
    return tmp_path_factory.mktemp("quantgate-cache")


E2E_ARGS = ("--model", "demo", "--max-items", "4", "--batch-size", "4", "--max-new-tokens", "16",
            "--calibration-samples", "8")


@pytest.fixture(scope="session")
def demo_run(demo_cache, tmp_path_factory):
    """The real pipeline on the demo model, all four formats, a few items per bundled set."""
    out = tmp_path_factory.mktemp("demo-run")
    result = quantgate("run", *E2E_ARGS, "--formats", "baseline,int8,gptq,awq", "--out", str(out), cache=demo_cache)
    report = json.loads((out / "report.json").read_text())
    return out, report, result
