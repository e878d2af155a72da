"""The memory and latency probe: its fixed workload, derived from a run's prompts (probe_workload), and the probe
on a loaded runtime: warm-up, batch-1 latency, then the largest batch under a peak tracker (peak, weights, KV cache
and activation bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from pydantic import ValidationError

from harness import progress
from harness.measure.latency import latency_block
from harness.measure.memory import track_peak
from harness.jobs import MeasureTask
from harness.report.schema import Latency, Memory, MemoryTimeline
from harness.runtime.base import Runtime

if TYPE_CHECKING:
    from harness.evalsets.prompts import Prompt


class ProbeWorkload(NamedTuple):
    batch1: list[list]  # [prompt text, max new tokens], measured one at a time
    batched: list[str]  # the longest prompts, as one full batch
    batched_max_new_tokens: int


@dataclass(frozen=True)
class ProfileResult:
    """The profile forward at the serving plan's token budget (harness.measure.profile): its size, and the
    activation peak it measured (None where it failed, with the error)."""

    tokens: int | None = None
    sequences: int | None = None
    activation_bytes: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Measurement:
    """A format's probe as the run read it back: its result file (path, cache key) and what the worker wrote there
    (measure_format's dict; None when nothing was read), read as the report's typed blocks. A result whose blocks
    are not what the schema declares raises pydantic's ValidationError on first reading (harness.collect turns it
    into the format's failure)."""

    path: str = ""
    key: str = ""
    result: dict | None = None

    @cached_property
    def memory(self) -> Memory:
        """The probe's memory figures (Memory() when nothing was measured)."""
        return Memory.model_validate(self._part("memory") or {})

    @cached_property
    def latency(self) -> Latency:
        return Latency.model_validate(self._part("latency") or {})

    @property
    def measured(self) -> bool:
        """Whether the probe left memory figures (a format that failed before it leaves none)."""
        return bool(self._part("memory"))

    @property
    def timed(self) -> bool:
        """Whether the probe left latency figures."""
        return bool(self._part("latency"))

    @property
    def compute_dtype(self) -> str | None:
        return self._part("compute_dtype")

    @cached_property
    def profile(self) -> ProfileResult:
        """ProfileResult() when none ran (a CPU by default, and measurements cached before it was kept)."""
        found = self._part("profile") or {}
        return ProfileResult(found.get("profile_tokens"), found.get("profile_sequences"),
                             found.get("activation_profile_bytes"), found.get("profile_error"))

    @cached_property
    def timeline(self) -> MemoryTimeline | None:
        """The memory timeline of the job that measured (none in measurements cached before it was kept)."""
        found = self._part("memory_timeline")
        return MemoryTimeline.model_validate(found) if found else None

    def unreadable(self) -> str | None:
        """Why the result's blocks are not the report's (its first problem: 'memory.peak_bytes: Input should be a
        valid integer'); None when they all read."""
        for block in ("memory", "latency", "timeline"):
            try:
                getattr(self, block)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in (block, *first["loc"]))
                return f"{where}: {first['msg']}"
        return None

    def _part(self, name: str) -> Any:
        return self.result.get(name) if self.result else None


def probe_workload(prompts_per_set: Sequence[Sequence[Prompt]], latency_requests: int,
                   batch_size: int) -> ProbeWorkload:
    """The fixed workload that memory and latency are measured on, from the evalsets' prompts (in evalset order):
    the first prompts of each set, round-robin, one at a time; and the longest prompts as one full batch."""
    batch1: list[list] = []
    for index in range(max((len(p) for p in prompts_per_set), default=0)):
        for prompts in prompts_per_set:
            if index < len(prompts) and len(batch1) < latency_requests:
                batch1.append([prompts[index].text, prompts[index].max_new_tokens])
    everything = sorted((p for prompts in prompts_per_set for p in prompts),
                        key=lambda p: (-p.tokens, p.evalset, p.item_id))
    longest = everything[:batch_size]
    batched_new = max((p.max_new_tokens for p in everything), default=1)
    return ProbeWorkload(batch1, [p.text for p in longest], batched_new)


def measure_format(model: Runtime, measure: MeasureTask, tokens, load_peak, weights: int, loaded_bytes: int, *,
                   timeline=None) -> dict:
    """Warm-up, batch-1 latency and the largest batch; `timeline` (a MemoryTimeline) gets a marker per stage."""

    def mark(stage: str) -> None:
        if timeline is not None:
            timeline.mark(stage)

    batch1 = [(tokens(p), n) for p, n in measure.batch1]
    mark("warm-up")
    for prompt, _ in batch1[: measure.warmup]:
        model.generate([prompt], 4)
    mark("latency")
    timings_1, probe_reply = [], None
    for index, (prompt, max_new) in enumerate(batch1, 1):
        generations, timing = model.generate([prompt], max_new)
        timings_1.append(timing)
        if probe_reply is None:  # what a served baseline must reproduce (harness.served.baseline_reproduced)
            probe_reply = generations[0].text
        progress.step("latency at batch 1", index, len(batch1))
    batched = [tokens(p) for p in measure.batched]
    max_new = measure.batched_max_new_tokens
    mark("measure batch")
    with track_peak() as gen_peak:
        outputs, timing, kv_bytes = model.generate_with_cache_bytes(batched, max_new)
    cached_tokens = timing.batch_size * (timing.prompt_tokens + max(timing.steps - 1, 0))
    peak = max(load_peak.peak_bytes, gen_peak.peak_bytes)
    if gen_peak.cuda_allocated_start_bytes is not None:
        activation = (gen_peak.cuda_max_allocated_bytes or 0) - gen_peak.cuda_allocated_start_bytes - kv_bytes
    else:
        activation = gen_peak.peak_bytes - gen_peak.start_bytes - kv_bytes
    return {
        "memory": {
            "peak_bytes": peak,
            "weights_bytes": weights,
            "parameters": model.parameter_count(),
            "weights_bytes_measured": loaded_bytes,  # allocator (GPU) or RSS (CPU) growth across the load
            "kv_bytes_per_token_measured": round(kv_bytes / cached_tokens) if cached_tokens else None,
            "kv_bytes_largest_batch": kv_bytes,
            "activation_peak_bytes": max(0, activation),
            "rss_peak_bytes": max(load_peak.rss_peak_bytes or 0, gen_peak.rss_peak_bytes or 0),
            "cuda_max_allocated_bytes": _max_or_none(load_peak.cuda_max_allocated_bytes, gen_peak.cuda_max_allocated_bytes),
            "cuda_max_reserved_bytes": _max_or_none(load_peak.cuda_max_reserved_bytes, gen_peak.cuda_max_reserved_bytes),
            "nvml_peak_used_bytes": _max_or_none(load_peak.nvml_peak_used_bytes, gen_peak.nvml_peak_used_bytes),
            "largest_batch": {"batch_size": timing.batch_size, "prompt_tokens": timing.prompt_tokens,
                              "new_tokens": timing.steps, "tokens": cached_tokens},
        },
        "latency": {"warmup_requests": min(len(batch1), measure.warmup),
                    "batch_1": latency_block(timings_1), "batched": latency_block([timing])},
        "prompt_tokens_max": max((len(p) for p, _ in batch1), default=0),
        "compute_dtype": model.dtype,
        "probe_reply": probe_reply,
    }


def _max_or_none(*values):
    present = [v for v in values if v is not None]
    return max(present) if present else None
