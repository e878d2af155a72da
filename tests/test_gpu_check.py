"""scripts/gpu_check/: its CPU smoke (the quantgate step included), its no-GPU exit, its report checks, and the
independence of its direct measurement from harness's measuring code."""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

from scripts.gpu_check import model, quantgate_run, render
from tests.conftest import ROOT

PACKAGE = ROOT / "scripts" / "gpu_check"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_cpu_smoke_runs_quantgate_and_prints_the_memory_figures():
    # --formats baseline: the direct int8 measurement is the same code with another loader; the quantgate step
    # keeps baseline,int8, which is what this test is for.
    result = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--cpu-smoke", "--formats", "baseline"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, QUANTGATE_DEVICE="cpu"))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "== quantgate run on the same model (cpu): formats baseline,int8" in out
    for fmt in ("baseline", "int8"):
        assert f"-- {fmt}: status ok" in out
    for name in ("device", "peak_bytes", "weights_bytes", "weights_bytes_measured", "kv_bytes_per_token",
                 "kv_bytes_per_token_measured", "activation_peak_bytes", "cuda_max_allocated_bytes",
                 "cuda_max_reserved_bytes", "nvml_peak_used_bytes"):
        assert f"memory.{name} " in out
    assert len(re.findall(r"memory\.device +cpu\n", out)) == 2
    assert re.search(r"memory\.kv_bytes_per_token_measured +\d", out)
    assert "latency batch 1: TTFT p50" in out
    assert re.search(r"vllm serve MODEL --max-model-len \d+ .*--gpu-memory-utilization 0\.9", out)  # the planner's
    # the report's plan is the version-aware one: vLLM 0.32+ serves int8 through the vllm-bnb-plugin package
    assert "capacity.vllm_flags: --max-model-len" in out
    assert "--quantization bitsandbytes --load-format bitsandbytes" in out
    assert "[ok] int8: capacity plan with vLLM flags" in out
    assert "[ok] int8: KV bytes per token: measured vs predicted from the config" in out
    assert "FAIL" not in out
    assert out.rstrip().endswith("all checks passed")


@pytest.mark.skipif(_cuda_available(), reason="a CUDA device is here: the no-GPU exit cannot be seen")
@pytest.mark.skipif(shutil.which("timeout") is None, reason="gpu_check.sh needs coreutils' timeout")
def test_gpu_check_sh_exits_3_without_a_gpu():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no CUDA device" in result.stdout


def _entry(**memory):
    base = {"device": "cuda", "peak_bytes": 5 * 2**30, "weights_bytes": 2 * 2**30, "kv_bytes_per_token": 22528,
            "kv_bytes_per_token_measured": 22528, "cuda_max_allocated_bytes": 3 * 2**30,
            "cuda_max_reserved_bytes": 4 * 2**30, "nvml_peak_used_bytes": 5 * 2**30}
    return {"status": "ok", "error": None, "verdict": "GO", "compute_dtype": "bfloat16",
            "memory": {**base, **memory}, "latency": {}, "capacity": {"vllm_flags": "--max-num-seqs 256", "note": ""}}


def _failed(report, device="cuda", formats=("baseline",)):
    checks = quantgate_run.quantgate_checks(report, list(formats), device)
    return [c["name"] for c in checks if not c["ok"]]


def test_quantgate_checks_pass_on_consistent_cuda_figures():
    assert _failed({"baseline": _entry()}) == []


def test_quantgate_checks_catch_what_the_gpu_check_is_for():
    assert _failed({"baseline": _entry(device="cpu")}) == ['memory.device == "cuda"']
    assert _failed({"baseline": _entry(nvml_peak_used_bytes=3 * 2**30)}) == [
        "NVML peak used >= allocator reserved peak >= allocated peak"]
    assert _failed({"baseline": _entry(nvml_peak_used_bytes=None)}) == [
        "NVML peak used >= allocator reserved peak >= allocated peak"]
    assert _failed({"baseline": _entry(kv_bytes_per_token_measured=22528 * 1.02)}) == [
        "KV bytes per token: measured vs predicted from the config"]
    assert _failed({"baseline": _entry(kv_bytes_per_token_measured=22600)}) == []  # within 1%
    assert _failed({}, formats=("int8",)) == ["in report.json"]
    failed = dict(_entry(), status="failed", error="evaluation failed: out of memory")
    assert _failed({"baseline": failed}) == ["ran"]


def test_sizes_and_gptqmodel_workers_come_from_harness(monkeypatch):
    assert [render.size(v) for v in (None, 512 * 2**10, 1.5 * 2**30, -3 * 2**20)] == [
        "-", "0.5 MiB", "1.50 GiB", "-3.0 MiB"]
    assert [render.ms(v) for v in (None, 0.8412, 12.345)] == ["-", "0.84 ms", "12.35 ms"]
    monkeypatch.setenv("GPTQMODEL_CPU_WORKERS", "")  # so that monkeypatch removes what _gptqmodel_env sets
    monkeypatch.delenv("GPTQMODEL_CPU_WORKERS")
    model.gptqmodel_env()
    assert os.environ["GPTQMODEL_CPU_WORKERS"] == str(max(1, os.cpu_count() or 1))
    monkeypatch.setenv("GPTQMODEL_CPU_WORKERS", "3")
    model.gptqmodel_env()
    assert os.environ["GPTQMODEL_CPU_WORKERS"] == "3"  # the user's setting stands


def test_direct_measurement_shares_only_the_nvml_sampler_with_harness_measure():
    """The direct measurement checks harness's: it loads, times and counts bytes with its own code, and takes from
    harness.measure only the predictions it checks (kv, capacity) and the NVML sampler."""
    allowed = {"harness.measure.kv", "harness.capacity", "harness.measure.memory"}
    imported = {}
    for node in ast.walk(ast.parse((PACKAGE / "direct.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.measure"):
            imported[node.module] = {alias.name for alias in node.names}
    assert set(imported) <= allowed, imported
    assert imported.get("harness.measure.memory") == {"NvmlSampler"}


def test_runs_as_a_directory_from_anywhere(tmp_path):
    result = subprocess.run([sys.executable, str(PACKAGE), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--harness-formats" in result.stdout


def test_gpu_wheels_pin_what_pyproject_pins():
    """scripts/gpu_wheels.sh fetches, for the GPU machine, the packages its image lacks: the versions the project
    resolves here, or the GPU check would run other code than CI does."""
    import tomllib

    from packaging.requirements import Requirement

    script = (ROOT / "scripts" / "gpu_wheels.sh").read_text(encoding="utf-8")
    fetched = dict(re.findall(r"\b([a-z][a-z0-9-]*)==([0-9][^\s)]*)", script))
    declared = {Requirement(r).name: Requirement(r).specifier
                for r in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]}
    for name in ("bitsandbytes", "transformers", "datasets", "rouge-score", "pydantic"):
        assert name in fetched, f"gpu_wheels.sh no longer fetches {name}"
        assert fetched[name] in declared[name], f"gpu_wheels.sh fetches {name} {fetched[name]}, pyproject wants {declared[name]}"
    ignored = subprocess.run(["git", "check-ignore", "-q", ".whl/x.whl"], cwd=ROOT).returncode == 0
    assert ignored, ".whl/ (the wheels the device call carries) must stay out of git"
