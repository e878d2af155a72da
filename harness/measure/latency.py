"""Latency figures from batch timings: per-request TTFT, TPOT and end-to-end, summarized as p50/p95.

A p95 needs at least P95_MIN_REQUESTS requests: below that it is the maximum of a few (reports show it as
"max of N", and a p95 budget judged on it is INCONCLUSIVE).
"""

from __future__ import annotations

import statistics

from harness.runtime.base import BatchTiming

P95_MIN_REQUESTS = 20


def summarize(values_ms: list[float]) -> dict:
    if not values_ms:
        return {"p50": None, "p95": None, "max": None, "mean": None, "stdev": None, "count": 0}
    ordered = sorted(values_ms)
    return {
        "p50": round(_percentile(ordered, 50), 3),
        "p95": round(_percentile(ordered, 95), 3),
        "max": round(ordered[-1], 3),
        "mean": round(statistics.fmean(ordered), 3),
        "stdev": round(statistics.stdev(ordered), 3) if len(ordered) > 1 else 0.0,
        "count": len(ordered),
    }


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


percentile = _percentile


def latency_block(timings: list[BatchTiming]) -> dict:
    """Every request in a batch shares its batch's TTFT, TPOT and end-to-end time (static batching)."""
    ttft, tpot, e2e = [], [], []
    tokens, seconds = 0, 0.0
    for timing in timings:
        for _ in range(timing.batch_size):
            ttft.append(timing.ttft_s * 1000)
            e2e.append(timing.e2e_s * 1000)
            if timing.tpot_s is not None:
                tpot.append(timing.tpot_s * 1000)
        tokens += timing.batch_size * timing.steps
        seconds += timing.e2e_s
    return {
        "batch_size": max((t.batch_size for t in timings), default=0),
        "ttft_ms": summarize(ttft),
        "tpot_ms": summarize(tpot),
        "e2e_ms": summarize(e2e),
        "throughput_tok_s": round(tokens / seconds, 2) if seconds else None,
        "requests": len(ttft),
    }
