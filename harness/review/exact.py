"""Exact binomial intervals (Clopper-Pearson) and reviewer agreement (Fleiss' kappa), without scipy."""

from __future__ import annotations

import math
from typing import Sequence


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_cdf(x: int, n: int, p: float) -> float:
    """P(X <= x) for X ~ Binomial(n, p)."""
    if x < 0:
        return 0.0
    if x >= n:
        return 1.0
    return min(1.0, sum(math.exp(_log_pmf(k, n, p)) for k in range(x + 1)))


def _solve(f, target: float) -> float:
    """The p in [0, 1] where the decreasing f(p) crosses target (bisection to 1e-10)."""
    low, high = 0.0, 1.0
    for _ in range(80):
        mid = (low + high) / 2
        if f(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def upper_bound(x: int, n: int, alpha: float) -> float:
    """One-sided exact upper bound of a proportion: the p with P(X <= x | p) = alpha (1 when x = n)."""
    _check(x, n)
    return 1.0 if x >= n else _solve(lambda p: binomial_cdf(x, n, p), alpha)


def lower_bound(x: int, n: int, alpha: float) -> float:
    """One-sided exact lower bound: the p with P(X >= x | p) = alpha (0 when x = 0)."""
    _check(x, n)
    return 0.0 if x <= 0 else 1.0 - upper_bound(n - x, n, alpha)


def clopper_pearson(x: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact interval of x successes in n trials."""
    alpha = (1.0 - confidence) / 2
    return lower_bound(x, n, alpha), upper_bound(x, n, alpha)


def items_for_upper_bound(rate: float, limit: float, alpha: float, start: int, cap: int = 100_000) -> int | None:
    """The fewest judged items at which `rate` (observed share) keeps its exact upper bound at or below `limit`;
    None when no count does (the rate itself reaches the limit)."""
    if rate >= limit:
        return None
    if rate == 0.0:  # closed form: 1 - alpha ** (1 / n) <= limit
        return max(start, math.ceil(math.log(alpha) / math.log1p(-limit)))
    n = max(start, 1)
    while n <= cap:
        if upper_bound(round(rate * n), n, alpha) <= limit:
            return n
        n = max(n + 1, int(n * 1.05))
    return None


def fleiss_kappa(ratings: Sequence[Sequence[str]]) -> float | None:
    """Agreement beyond chance among reviewers: one sequence of category labels per item, rated by two or more
    (Fleiss 1971, the form that allows a different number of raters per item). None when fewer than 2 items are
    rated twice, or when every rating is one category (chance agreement is then 1)."""
    items = [list(r) for r in ratings if len(r) >= 2]
    if len(items) < 2:
        return None
    categories = sorted({c for r in items for c in r})
    total = sum(len(r) for r in items)
    shares = [sum(r.count(c) for r in items) / total for c in categories]
    expected = sum(s * s for s in shares)
    if expected >= 1.0:
        return None
    observed = sum((sum(r.count(c) ** 2 for c in categories) - len(r)) / (len(r) * (len(r) - 1)) for r in items)
    return (observed / len(items) - expected) / (1.0 - expected)


def _check(x: int, n: int) -> None:
    if n < 1 or not 0 <= x <= n:
        raise ValueError(f"need 0 <= x <= n and n >= 1, got x={x}, n={n}")

