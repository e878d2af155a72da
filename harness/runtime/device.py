"""Which device we run on and how many threads, decided once per process."""

from __future__ import annotations

import os


def is_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("QUANTGATE_DEVICE", "auto") != "cpu"


def device_map() -> str:
    return "cuda:0" if is_cuda() else "cpu"


def configure_threads(threads: int) -> int:
    """Pin torch's thread count. On a shared 2-core machine 2 threads under load ran 5x slower than 1."""
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def device_info(threads: int) -> dict:
    import platform

    import torch

    if is_cuda():
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "threads": threads, "total_memory_bytes": props.total_memory}
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
            "total_memory_bytes": psutil.virtual_memory().total}
