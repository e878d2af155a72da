import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NOISE = ("Failed to load", "MatMul8bitLt", "Traceback", "GPT-QModel", "UserWarning")


def quantgate(*args: str, cache: Path, timeout: float = 1800, check_codes=(0, 1),
              env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUANTGATE_CACHE": str(cache), "PYTHONPATH": str(ROOT), **(env or {})}
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


# `nox -s demo`'s own recipe (calibration count, group size, calibration source: all defaults) on fewer items.
# Only these size flags may be added: a test that quantizes another way once hid a crash of two formats.
E2E_ARGS = ("--model", "demo", "--max-items", "4", "--batch-size", "4", "--max-new-tokens", "16")
SIZE_FLAGS = ("--max-items", "--batch-size", "--max-new-tokens", "--latency-requests")
NO_BF16 = {"QUANTGATE_FORCE_NO_BF16": "1"}


def _demo_recipe_run(cache: Path, out: Path, env: dict | None = None):
    # On a 2-core CPU without bf16 units the four formats take about half an hour: the timeout leaves room.
    result = quantgate("run", *E2E_ARGS, "--formats", "baseline,int8,gptq,awq", "--out", str(out), cache=cache,
                       env=env, timeout=3000)
    return out, json.loads((out / "report.json").read_text()), result


@pytest.fixture(scope="session")
def demo_run(demo_cache, tmp_path_factory):
    """The real pipeline on the demo model, all four formats, the demo's recipe, a few items per bundled set."""
    return _demo_recipe_run(demo_cache, tmp_path_factory.mktemp("demo-run"))


@pytest.fixture(scope="session")
def demo_run_no_bf16(demo_cache, tmp_path_factory):
    """The same with the no-bf16 path forced (float32 calibration and compute), whatever this CPU has. On a CPU
    without bf16 units it is the path demo_run took, and the cache serves it; elsewhere it runs anew."""
    return _demo_recipe_run(demo_cache, tmp_path_factory.mktemp("demo-run-no-bf16"), NO_BF16)


@pytest.fixture(scope="session")
def demo_checkpoint(demo_cache) -> Path:
    """The converted demo checkpoint directory (bf16 safetensors) in the session's cache."""
    quantgate("cache", "ls", cache=demo_cache)  # a cheap command first: the cache directory exists
    code = ("from harness.source import resolve_source; print(resolve_source('demo').path)")
    env = dict(os.environ, QUANTGATE_CACHE=str(demo_cache), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900, check=True)
    return Path(result.stdout.strip().splitlines()[-1])
