"""What vLLM says about itself at start-up, read from its log (formats as in vLLM 0.32-0.34):

    (EngineCore pid=1) INFO ... [kv_cache_utils.py:2327] CPU KV cache size: 45,500 tokens, Maximum concurrency
        for 1,000 tokens per request: 45.50x                       (vllm/v1/core/kv_cache_utils.py)
    (Worker pid=2) INFO ... [cpu_worker.py:260] Explicitly set (1.0/15.21) GiB for KV cache on node 0.
    (Worker pid=2) INFO ... [gpu_worker.py:760] Available KV cache memory: 61.2 GiB
    ... Selected CPUWNA16LinearKernel for GPTQLinearMethod      (vllm/model_executor/kernels/linear/__init__.py)
    ... Using MarlinLinearKernel for mixed-precision linear
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_KV_SIZE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                      r"([\d.]+)x")
_CPU_KV_MEMORY = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_GPU_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_KERNEL = re.compile(r"(?:Selected|Using) (\w+Kernel\w*) for ")


@dataclass(frozen=True)
class StartupFacts:
    kv_tokens: int | None
    max_model_len: int | None
    max_concurrency: float | None
    kv_memory_gib: float | None
    kernels: tuple[str, ...]


def parse_startup(text: str) -> StartupFacts:
    size = _KV_SIZE.findall(text)
    memory = _CPU_KV_MEMORY.findall(text) or _GPU_KV_MEMORY.findall(text)
    tokens, length, concurrency = size[-1] if size else (None, None, None)
    return StartupFacts(
        kv_tokens=int(tokens.replace(",", "")) if tokens else None,
        max_model_len=int(length.replace(",", "")) if length else None,
        max_concurrency=float(concurrency) if concurrency else None,
        kv_memory_gib=float(memory[-1]) if memory else None,
        kernels=tuple(dict.fromkeys(_KERNEL.findall(text))),
    )


def read_startup(log_path: Path, since_offset: int = 0) -> StartupFacts:
    """The facts of the server start whose output begins at byte `since_offset` of the log (logs append)."""
    with open(log_path, "rb") as log:
        log.seek(since_offset)
        return parse_startup(log.read().decode("utf-8", errors="replace"))
