"""Peak-memory trackers, used as context managers around one phase of a format's subprocess.

CPU: resident set size of this process; the kernel's high-water mark (VmHWM) is reset per phase through
/proc/self/clear_refs, after glibc has handed back the heap memory it keeps from freed tensors (malloc_trim): without
that, a phase whose tensors fit in what earlier phases freed raises no RSS at all and its activation reads 0. GPU: the caching allocator's peaks (reset per phase) and the device's used memory as NVML
reports it (what nvidia-smi shows and what OOMs), sampled every 10 ms in a thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from harness.measure.rss import RssSampler, own_rss_bytes, status_kib
from harness.runtime.device import is_cuda


@dataclass
class PhasePeak:
    peak_bytes: int = 0  # the figure that OOMs: RSS on CPU, NVML device used on GPU (allocator reserved without NVML)
    start_bytes: int = 0
    rss_peak_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None
    cuda_allocated_start_bytes: int | None = None
    nvml_peak_used_bytes: int | None = None

    @property
    def in_use_start_bytes(self) -> int:
        """What memory_in_use() read when the phase began."""
        return self.cuda_allocated_start_bytes if self.cuda_allocated_start_bytes is not None else self.start_bytes


def memory_in_use() -> int:
    """Bytes the model's tensors can occupy now: the CUDA allocator's allocated bytes on GPU, RSS on CPU."""
    if is_cuda():
        import torch

        return torch.cuda.memory_allocated()
    return own_rss_bytes()


def release_freed_heap() -> bool:
    """Return the heap memory glibc keeps after frees to the kernel (malloc_trim(0), every arena), so that RSS
    counts what the next phase allocates. False where the C library has no malloc_trim (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class NvmlSampler(threading.Thread):
    """Device-level used memory (all processes, what nvidia-smi shows) of the first visible GPU, sampled every
    10 ms: `start()`, then `stop()` returns the peak. `start_used` is what the device used when it was made.
    Raises when NVML (nvidia-ml-py) or its driver is missing. Public for scripts/gpu_check, which measures
    with its own code but samples NVML with this one."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self._pynvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(_cuda_index())
        self.start_used = self.peak = self.used()
        self._stop_event = threading.Event()

    def used(self) -> int:
        return int(self._pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            self.peak = max(self.peak, self.used())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, self.used())


def _cuda_index() -> int:
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    first = visible.split(",")[0].strip()
    return int(first) if first.isdigit() else 0


class track_peak:
    """`with track_peak() as peak: ...` fills `peak` (a PhasePeak) when the block ends."""

    def __enter__(self) -> PhasePeak:
        self.result = PhasePeak()
        if not is_cuda():
            release_freed_heap()
        self._sampler = None if _reset_rss_peak() else RssSampler()  # where VmHWM cannot be reset: every 10 ms
        if self._sampler:
            self._sampler.start()
        self.result.start_bytes = own_rss_bytes()
        self._nvml = None
        if is_cuda():
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.result.cuda_allocated_start_bytes = torch.cuda.memory_allocated()
            try:
                self._nvml = NvmlSampler()
                self._nvml.start()
            except Exception:  # noqa: BLE001 - NVML missing: allocator figures still stand
                self._nvml = None
        return self.result

    def __exit__(self, *exc) -> None:
        result = self.result
        result.rss_peak_bytes = self._sampler.stop() if self._sampler else status_kib("VmHWM") * 1024
        result.peak_bytes = result.rss_peak_bytes
        if is_cuda():
            import torch

            torch.cuda.synchronize()
            result.cuda_max_allocated_bytes = torch.cuda.max_memory_allocated()
            result.cuda_max_reserved_bytes = torch.cuda.max_memory_reserved()
            result.peak_bytes = result.cuda_max_reserved_bytes
            if self._nvml:
                result.nvml_peak_used_bytes = self._nvml.stop()
                result.peak_bytes = result.nvml_peak_used_bytes


def loaded_weights_bytes(model) -> int:
    """Bytes of parameters and buffers as loaded (quantized packs, scales and zeros included)."""
    seen: set[int] = set()
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in seen:  # tied embeddings count once
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


def kv_cache_bytes(past_key_values) -> int:
    """Bytes held by a transformers KV cache object (DynamicCache or legacy tuples)."""
    total = 0
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:
        for layer in layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if tensor is not None and hasattr(tensor, "numel"):
                    total += tensor.numel() * tensor.element_size()
        return total
    for entry in past_key_values:
        for tensor in entry:
            total += tensor.numel() * tensor.element_size()
    return total
