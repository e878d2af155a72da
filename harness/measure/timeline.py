"""Memory over time: a context manager that samples this process's memory every 100 ms, with stage markers.

    with MemoryTimeline() as timeline:
        timeline.mark("load")
        ...
        timeline.mark("generate:en_faq")
        ...
    series = timeline.as_dict()

CPU: the process's resident set size (psutil). GPU: NVML device used memory (what nvidia-smi shows, device level)
and the caching allocator's `torch.cuda.memory_allocated` / `memory_reserved` (NVML left out where it cannot be
read). A daemon thread samples; it is stopped and joined when the block ends, so it never outlives it. Each sample
is one tuple appended to a list (no other work in the loop); `mark` takes a sample too, so a stage shorter than the
interval still shows. `as_dict()` downsamples to at most MAX_POINTS points, taking each bucket's maximum per field,
so no peak is lost, and reports each field's peak (from every sample, not the downsampled series) with its time and
stage. The JSON shape is the report's `memory.timeline` (harness/report/schema.py, MemoryTimeline).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

INTERVAL_S = 0.1
MAX_POINTS = 300
FIELDS_CPU = ("rss_bytes",)
FIELDS_GPU = ("nvml_used_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")
# The measurement's peak figure each sampled field can raise.
PEAK_FIELD_OF = {"rss_bytes": "rss_peak_bytes", "nvml_used_bytes": "nvml_peak_used_bytes",
                 "cuda_allocated_bytes": "cuda_max_allocated_bytes", "cuda_reserved_bytes": "cuda_max_reserved_bytes"}


def _rss_reader() -> Callable[[], tuple[int, ...]]:
    import psutil

    process = psutil.Process()
    return lambda: (process.memory_info().rss,)


def _gpu_reader(with_nvml: bool = True) -> tuple[tuple[str, ...], Callable[[], tuple[int, ...]]]:
    import torch

    allocated, reserved = torch.cuda.memory_allocated, torch.cuda.memory_reserved
    if with_nvml:
        try:
            import pynvml

            from harness.measure.memory import _cuda_index

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(_cuda_index())
            info = pynvml.nvmlDeviceGetMemoryInfo
            info(handle)
            return FIELDS_GPU, lambda: (int(info(handle).used), allocated(), reserved())
        except Exception:  # noqa: BLE001 - NVML missing: the allocator figures still stand
            pass
    return FIELDS_GPU[1:], lambda: (allocated(), reserved())


class MemoryTimeline:
    """`with MemoryTimeline() as t: t.mark("load"); ...`; then `t.as_dict()` is the series (see the module doc).

    `cuda`: sample the GPU (default: whether the run's device is CUDA); `stage`: the stage the block starts in;
    `reader`/`fields` replace the readers (tests)."""

    def __init__(self, *, interval_s: float = INTERVAL_S, max_points: int = MAX_POINTS, cuda: bool | None = None,
                 reader: Callable[[], tuple[int, ...]] | None = None, fields: tuple[str, ...] | None = None,
                 stage: str | None = None) -> None:
        self.interval_s = interval_s
        self.max_points = max_points
        if reader is not None:
            self.fields, self._read = tuple(fields or FIELDS_CPU), reader
        else:
            if cuda is None:
                from harness.runtime.device import is_cuda

                cuda = is_cuda()
            self.fields, self._read = _gpu_reader() if cuda else (FIELDS_CPU, _rss_reader())
        self.samples: list[tuple] = []  # (t_s, value per field..., stage index)
        self.stages: list[tuple[str, float]] = []  # (stage, start_s)
        self.error: str | None = None
        self._stage = -1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._ended: float | None = None
        self._first_stage = stage

    # --- sampling ---------------------------------------------------------------------------------

    def __enter__(self) -> MemoryTimeline:
        self._started = time.perf_counter()
        if self._first_stage is not None:
            self.mark(self._first_stage)
        self._sample()
        self._thread = threading.Thread(target=self._run, name="quantgate-memory-timeline", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the series now (the block's end does it too; a second call does nothing): what runs after it, still
        inside the block, is not sampled."""
        if self._ended is not None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sample()
        self._ended = time.perf_counter() - self._started

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s) and self.error is None:
            self._sample()

    def _sample(self) -> None:
        if self.error is not None:
            return
        try:
            with self._lock:
                self.samples.append((time.perf_counter() - self._started, *self._read(), self._stage))
        except Exception as exc:  # noqa: BLE001 - a failing reader ends the series, never the job
            self.error = f"{type(exc).__name__}: {exc}"

    def mark(self, stage: str) -> None:
        """From now on samples belong to `stage`; one sample closes the stage before it."""
        if self._thread is not None:
            self._sample()
        with self._lock:
            self.stages.append((stage, time.perf_counter() - self._started))
            self._stage = len(self.stages) - 1

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the series -------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The report's `memory.timeline`: points (downsampled), stages with start and end, each field's peak."""
        with self._lock:
            samples, stages = list(self.samples), list(self.stages)
        duration = self._ended if self._ended is not None else time.perf_counter() - self._started
        names = [name for name, _ in stages]

        def stage_of(index: int) -> str | None:
            return names[index] if index >= 0 else None

        width = len(self.fields)
        peaks = {}
        for column, field in enumerate(self.fields, 1):
            best = max(samples, key=lambda s: s[column]) if samples else None
            if best is not None:
                peaks[field] = {"bytes": int(best[column]), "t_s": round(best[0], 2), "stage": stage_of(best[-1])}
        points = []
        for bucket in downsample(samples, self.max_points, width):
            t_s, values, stage = bucket[0], bucket[1:1 + width], bucket[-1]
            points.append({"t_s": round(t_s, 2), "stage": stage_of(stage),
                           **{f: int(v) for f, v in zip(self.fields, values)}})
        ends = [start for _, start in stages[1:]] + [duration]
        return {"interval_s": self.interval_s, "duration_s": round(duration, 2), "samples": len(samples),
                "fields": list(self.fields),
                "points": points,
                "stages": [{"stage": name, "start_s": round(start, 2), "end_s": round(end, 2)}
                           for (name, start), end in zip(stages, ends)],
                "peaks": peaks, "error": self.error}


def downsample(samples: list[tuple], max_points: int, width: int) -> list[tuple]:
    """At most max_points of (t_s, value x width, stage) samples: consecutive buckets, each field's maximum in the
    bucket (so every local peak keeps its height), at the time and stage of the first field's maximum."""
    if len(samples) <= max_points:
        return list(samples)
    out = []
    count = len(samples)
    for bucket in range(max_points):
        chunk = samples[bucket * count // max_points:(bucket + 1) * count // max_points]
        if not chunk:
            continue
        lead = max(chunk, key=lambda s: s[1])
        out.append((lead[0], *(max(s[column] for s in chunk) for column in range(1, 1 + width)), lead[-1]))
    return out


def whole_job_peaks(memory: dict, series: dict) -> dict:
    """`memory` (a measurement's) with its peaks raised to the whole job's, from the timeline `series`
    (as_dict()): the measure stage tracks load and its largest batch, but generating every evalset afterwards can
    go higher (bitsandbytes int8 on CPU kept growing its RSS through generation). peak_bytes is the figure that
    runs out first: NVML used on a GPU, else the allocator's reserved peak, RSS on a CPU."""
    raised = dict(memory)
    for field, peak in (series.get("peaks") or {}).items():
        key = PEAK_FIELD_OF.get(field)
        if key is not None and raised.get(key) is not None:
            raised[key] = max(raised[key], peak["bytes"])
    headline = next((raised[k] for k in ("nvml_peak_used_bytes", "cuda_max_reserved_bytes", "rss_peak_bytes")
                     if raised.get(k) is not None), None)
    if headline is not None and raised.get("peak_bytes") is not None:
        raised["peak_bytes"] = max(raised["peak_bytes"], headline)
    return raised
