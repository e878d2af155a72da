"""QUANTGATE_FORCE_AVX2: a format's worker takes an AVX2-only CPU's kernels on any x86 CPU, and says so."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.runtime.device import (AVX2_KERNEL_ENV, FORCE_AVX2_ENV, cpu_capability, cpu_kernel_environment,
                                    device_info)

TORCH_CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def _capability_in(env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", TORCH_CAPABILITY], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stdout.strip().splitlines()[-1]


def test_forced_avx2_workers_run_torch_onednn_and_mkl_in_their_avx2_code(monkeypatch):
    monkeypatch.setenv(FORCE_AVX2_ENV, "1")
    env = cpu_kernel_environment()
    assert env == AVX2_KERNEL_ENV == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                      "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert _capability_in(env) == "AVX2"  # what bitsandbytes reads to pick its int8 matmul
    info = device_info(1)
    assert info["cpu_capability"] == cpu_capability() == "AVX2" and info["bf16_matmul"] is False


def test_unforced_workers_keep_this_cpus_kernels(monkeypatch):
    monkeypatch.delenv(FORCE_AVX2_ENV, raising=False)
    assert cpu_kernel_environment() == {}
    assert device_info(1)["cpu_capability"] == cpu_capability() == _capability_in({})
