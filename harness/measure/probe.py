"""The memory and latency probe: its fixed workload, derived from a run's prompts (probe_workload), and the probe
on a loaded runtime: warm-up, batch-1 latency, then the largest batch under a peak tracker (peak, weights, KV cache
and activation bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from harness import progress
from harness.measure.latency import latency_block
from harness.measure.memory import track_peak
from harness.jobs import MeasureTask
from harness.runtime.base import Runtime

if TYPE_CHECKING:
    from harness.evalsets.prompts import Prompt


class ProbeWorkload(NamedTuple):
    batch1: list[list]  # [prompt text, max new tokens], measured one at a time
    batched: list[str]  # the longest prompts, as one full batch
    batched_max_new_tokens: int


@dataclass(frozen=True)
class Measurement:
    """A format's probe as the run read it back: its result file (path, cache key) and what the worker wrote there
    (measure_format's dict; None when nothing was read)."""

    path: str = ""
    key: str = ""
    result: dict | None = None

    @property
    def memory(self) -> dict:
        return self._part("memory") or {}

    @property
    def latency(self) -> dict:
        return self._part("latency") or {}

    @property
    def compute_dtype(self) -> str | None:
        return self._part("compute_dtype")

    @property
    def profile(self) -> dict:
        """The profile forward at the serving plan's token budget (harness.measure.profile): profile_tokens,
        profile_sequences, activation_profile_bytes (None where it failed, with profile_error); {} when none ran
        (a CPU by default, and measurements cached before it was kept)."""
        return self._part("profile") or {}

    @property
    def timeline(self) -> dict | None:
        """The memory timeline of the job that measured (none in measurements cached before it was kept)."""
        return self._part("memory_timeline")

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
