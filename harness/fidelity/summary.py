"""Per evalset: a format's fidelity figures with intervals that resample items.

KL and top-1 agreement are token-weighted means (sum over all output positions / positions), as llama.cpp's
--kl-divergence reports them; the interval resamples whole items, or whole clusters of items that share a context,
as the task metrics do (harness.stats): the hull of the cluster bootstrap BCa interval of the ratio and the
cluster-robust t interval, so a few long, divergent answers widen it instead of hiding in the token count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from harness.stats import cluster_bca_interval, cluster_se, t_quantile


@dataclass(frozen=True)
class FidelityItem:
    """One item's figures against the baseline's continuation (harness.fidelity.teacher.position_figures)."""

    positions: int  # output positions compared (tokens of the baseline's continuation)
    kl_sum: float  # summed KL(baseline || format) over them, nats
    agree: float  # positions where the format's top-1 token is the baseline's
    target_logprob_sum: float = 0.0  # summed log-probability the format gives the baseline's tokens, nats
    first_flip: int | None = None  # first position whose top-1 differs; None: none did
    kl_by_position: tuple[float, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping) -> FidelityItem:
        return cls(int(data["positions"]), float(data["kl_sum"]), float(data["agree"]),
                   float(data.get("target_logprob_sum", 0.0)), data.get("first_flip"),
                   tuple(float(v) for v in data.get("kl_by_position") or ()))

    @property
    def kl(self) -> float:
        return self.kl_sum / self.positions if self.positions else 0.0

    @property
    def top1_agreement(self) -> float:
        return 100.0 * self.agree / self.positions if self.positions else 100.0


@dataclass(frozen=True)
class Interval:
    value: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class FidelitySummary:
    items: int
    positions: int
    kl: Interval  # nats per token
    top1_agreement: Interval  # percent of positions
    target_logprob: float | None  # mean log-probability of the baseline's token, nats
    flipped_items: int  # items where some position's top-1 departs from the baseline's
    median_first_flip: float | None  # among those, the median first position
    clusters: int | None  # clusters resampled when some cluster holds more than one item
    method: str
    by_position: tuple[dict, ...] = ()  # mean KL per band of POSITION_BAND output positions
    largest: tuple[dict, ...] = ()  # the LARGEST items by KL, largest first

    def as_dict(self) -> dict:
        return {"items": self.items, "positions": self.positions,
                "kl": vars(self.kl), "top1_agreement": vars(self.top1_agreement),
                "target_logprob": self.target_logprob, "flipped_items": self.flipped_items,
                "median_first_flip": self.median_first_flip, "clusters": self.clusters, "method": self.method,
                "by_position": list(self.by_position), "largest": list(self.largest)}


POSITION_BAND = 16
SMALL_N = 10  # the far end's inflation at few clusters (skewed_far_end), fitted by benchmarks/fidelity_coverage.py
LARGEST = 5


def position_profile(items: list[FidelityItem]) -> tuple[dict, ...]:
    """Mean KL per band of output positions over the items long enough to reach it."""
    sums: dict[int, list[float]] = {}
    for item in items:
        for position, kl in enumerate(item.kl_by_position):
            band = sums.setdefault(position // POSITION_BAND, [0.0, 0])
            band[0] += kl
            band[1] += 1
    return tuple({"start": band * POSITION_BAND, "end": band * POSITION_BAND + POSITION_BAND - 1,
                  "kl": total / count, "tokens": count} for band, (total, count) in sorted(sums.items()))


def skewed_far_end(value: float, half: float, bound: float, clusters: int) -> float:
    """The end away from `bound` (the limit a figure cannot cross: KL's 0, agreement's 100%) of a t interval taken
    on the log of the distance from it, by the delta method, d * exp(half / d), its half-width inflated by
    sqrt(1 + SMALL_N / clusters). Per-item KL is right-skewed with a heavy tail (a few items diverge far more than
    the rest), so a small sample mostly misses the tail, understates its own spread, and a symmetric interval ends
    too close to the bound on the far side: KL's upper end and agreement's lower, the ends a GO rests on. The near
    ends (a NO-GO's) held without it (benchmarks/fidelity_coverage.py; docs/fidelity.md) and stay as they were."""
    distance = value - bound
    if distance == 0:
        return value
    return bound + distance * math.exp(min(half * math.sqrt(1 + SMALL_N / clusters) / abs(distance), 50.0))


def summarize_fidelity(items: Mapping[str, FidelityItem], clusters: Mapping[str, str] | None = None, *,
                       confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> FidelitySummary:
    ids = [i for i, item in items.items() if item.positions > 0]
    positions = np.array([items[i].positions for i in ids], dtype=float)
    keys = [(clusters or {}).get(i, f"item:{i}") for i in ids]
    numbers: dict[str, int] = {}
    groups = np.array([numbers.setdefault(k, len(numbers)) for k in keys], dtype=np.int64)
    flips = [items[i].first_flip for i in ids if items[i].first_flip is not None]
    clustered = len(numbers) < len(ids)
    method = (f"token-weighted means, intervals by cluster bootstrap BCa ({resamples}) ∪ cluster-robust t over "
              f"{'clusters of items that share a context' if clustered else 'items'}")

    def interval(per_item: np.ndarray, low_limit: float, high_limit: float, bound: float) -> Interval:
        if not ids:
            return Interval(None, None, None)
        sums, sizes = np.bincount(groups, weights=per_item), np.bincount(groups, weights=positions)
        value = float(sums.sum() / sizes.sum())
        if sums.size < 2:
            return Interval(value, None, None)
        if float(np.ptp(per_item / positions)) <= 1e-12:
            return Interval(value, value, value)
        t, se = t_quantile(0.5 + confidence / 2, sums.size - 1), cluster_se(sums, sizes)
        b_low, b_high = cluster_bca_interval(sums, sizes, confidence, resamples, seed)
        low, high = min(value - t * se, b_low), max(value + t * se, b_high)
        far = skewed_far_end(value, t * se, bound, sums.size)
        low, high = (low, max(high, far)) if far >= value else (min(low, far), high)
        return Interval(value, max(low, low_limit), min(high, high_limit))

    kl_sums = np.array([items[i].kl_sum for i in ids], dtype=float)
    agree = np.array([100.0 * items[i].agree for i in ids], dtype=float)
    total = float(positions.sum())
    return FidelitySummary(
        items=len(ids), positions=int(total),
        kl=interval(kl_sums, 0.0, math.inf, 0.0), top1_agreement=interval(agree, 0.0, 100.0, 100.0),
        target_logprob=(sum(items[i].target_logprob_sum for i in ids) / total) if total else None,
        flipped_items=len(flips), median_first_flip=float(np.median(flips)) if flips else None,
        clusters=len(numbers) if clustered else None, method=method,
        by_position=position_profile([items[i] for i in ids]),
        largest=tuple({"id": i, "kl": float(items[i].kl), "top1_agreement": items[i].top1_agreement,
                       "first_flip": items[i].first_flip, "tokens": items[i].positions}
                      for i in sorted(ids, key=lambda i: (-items[i].kl, i))[:LARGEST]))
