"""Explain an out-of-memory failure in one line: the figures PyTorch gave, and which lever to pull.

PyTorch's CUDA OOM message comes in two shapes:
  >= 2.1: "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB is free.
           Including non-PyTorch memory, this process has 78.03 GiB memory in use. Of the allocated memory
           76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated."
  older:   "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated;
           3.50 MiB free; 14.63 GiB reserved in total by PyTorch)"
Sizes are printed as "N bytes", "N.NN KiB/MiB/GiB".
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from harness.units import format_bytes

_SIZE = r"(\d+(?:\.\d+)?\s*(?:bytes|[KMGT]iB|[KMGT]B|B))"
_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_TRIED = re.compile(r"Tried to allocate " + _SIZE, re.I)
_GPU = re.compile(r"GPU (\d+)")
# >= 2.1 (2.1 itself spelled it "capacty")
_TOTAL_NEW = re.compile(r"total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free", re.I)
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use", re.I)
_ALLOCATED_NEW = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", re.I)
_UNALLOCATED_NEW = re.compile(_SIZE + r" is reserved by PyTorch but unallocated", re.I)
# older
_TOTAL_OLD = re.compile(_SIZE + r" total capacity", re.I)
_ALLOCATED_OLD = re.compile(_SIZE + r" already allocated", re.I)
_FREE_OLD = re.compile(_SIZE + r" free", re.I)
_RESERVED_OLD = re.compile(_SIZE + r" reserved in total by PyTorch", re.I)


@dataclass(frozen=True)
class OomFigures:
    """Figures from the message, as printed (for quoting) and in bytes. Missing figures are None."""

    tried: str | None = None
    total: str | None = None
    free: str | None = None
    allocated: str | None = None  # by PyTorch's tensors
    reserved: str | None = None   # held by the caching allocator but not in tensors (new form) or in total (old)
    reserved_is_total: bool = False
    in_use: str | None = None     # by this process incl. non-PyTorch memory (new form only)
    gpu: int | None = None

    def bytes_of(self, field: str) -> int | None:
        return parse_size(getattr(self, field))

    @property
    def reserved_unallocated_bytes(self) -> int | None:
        reserved = self.bytes_of("reserved")
        if reserved is None or not self.reserved_is_total:
            return reserved
        allocated = self.bytes_of("allocated")
        return None if allocated is None else max(reserved - allocated, 0)


def parse_size(text: str | None) -> int | None:
    """'2.00 GiB' -> 2147483648; '0 bytes' -> 0; None or junk -> None."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)", text.strip())
    if not match or match.group(2).lower() not in _UNITS:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_cuda_oom(message: str | None) -> OomFigures | None:
    """The figures of a PyTorch CUDA OOM message, or None when the text is not one."""
    if not message or "out of memory" not in message.lower():
        return None
    tried = _first(_TRIED, message)
    gpu = _GPU.search(message)
    new_total = _TOTAL_NEW.search(message)
    if new_total:
        figures = OomFigures(tried=tried, total=new_total.group(1), free=new_total.group(2),
                             allocated=_first(_ALLOCATED_NEW, message), reserved=_first(_UNALLOCATED_NEW, message),
                             in_use=_first(_IN_USE, message), gpu=int(gpu.group(1)) if gpu else None)
    else:
        figures = OomFigures(tried=tried, total=_first(_TOTAL_OLD, message), free=_first(_FREE_OLD, message),
                             allocated=_first(_ALLOCATED_OLD, message), reserved=_first(_RESERVED_OLD, message),
                             reserved_is_total=True, gpu=int(gpu.group(1)) if gpu else None)
    if figures.tried is None and figures.total is None and figures.allocated is None:
        return None
    return figures


def _first(pattern: re.Pattern, text: str) -> str | None:
    match = pattern.search(text)
    return " ".join(match.group(1).split()) if match else None


GPU_LEVERS = ("lower the batch size or --max-num-seqs, or the prompt/generation length or --max-model-len; "
              "with vLLM, raise --gpu-memory-utilization if the KV cache is what did not fit; "
              "or use a smaller format")
HOST_LEVERS = "lower the batch size or the sequence length, use a machine with more RAM, or a smaller format"


def oom_reason(figures: OomFigures | None, *, killed_signal: int | None = None,
               rss_peak_bytes: int | None = None) -> str:
    """One line: what ran out, the figures, what to change."""
    if killed_signal is not None:
        name = _signal_name(killed_signal)
        peak = f" at a peak RSS of {_fmt(rss_peak_bytes)}" if rss_peak_bytes else ""
        cause = ("most likely the host's out-of-memory killer" if killed_signal == signal.SIGKILL
                 else "not an out-of-memory error as such")
        return f"the subprocess was killed by {name}{peak} ({cause}); {HOST_LEVERS}"
    if figures is None:
        peak = f"peak RSS {_fmt(rss_peak_bytes)}; " if rss_peak_bytes else ""
        return f"{peak}{GPU_LEVERS}"
    parts = []
    if figures.tried:
        where = f" on GPU {figures.gpu}" if figures.gpu is not None else ""
        total = f" ({figures.total} total)" if figures.total else ""
        parts.append(f"tried to allocate {figures.tried}{where}{total}")
    if figures.allocated:
        parts.append(f"{figures.allocated} already allocated")
    if figures.free:
        parts.append(f"{figures.free} free")
    if figures.reserved:
        parts.append(f"{figures.reserved} reserved" + (" in total" if figures.reserved_is_total
                                                       else " but unallocated"))
    other = _other_processes_bytes(figures)
    if other:
        parts.append(f"other processes hold about {_fmt(other)}")
    return "; ".join(parts) + "; " + _lever(figures, other)


def _lever(figures: OomFigures, other_bytes: int | None) -> str:
    total = figures.bytes_of("total")
    unallocated = figures.reserved_unallocated_bytes
    tried = figures.bytes_of("tried")
    if other_bytes and total and other_bytes > 0.1 * total:
        return "free the GPU of other processes, or " + GPU_LEVERS
    if unallocated and tried and total and unallocated >= tried and unallocated >= 0.05 * total:
        # Much memory is cached but fragmented: no free block of the requested size.
        return "fragmentation: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or " + GPU_LEVERS
    return GPU_LEVERS


def _other_processes_bytes(figures: OomFigures) -> int | None:
    """Device memory in use that this process does not account for (new form only, where it can tell)."""
    total, free, in_use = figures.bytes_of("total"), figures.bytes_of("free"), figures.bytes_of("in_use")
    if None in (total, free, in_use):
        return None
    other = total - free - in_use
    return other if other > 256 * 2**20 else None  # below that it is rounding in the printed figures


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _fmt(size: int | None) -> str:
    """PyTorch's own style, so our figures read like those quoted from its message: '1.06 GiB', '512 bytes'."""
    return format_bytes(size, missing="?", digits=2, byte_unit="bytes")
