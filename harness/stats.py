"""Paired comparisons of per-item scores: mean difference, its interval, a test, the detectable drop.

Interval (candidate minus baseline, per item; n paired items):
- n >= 2: the hull of two intervals, [min(lows), max(highs)]:
  - the paired bootstrap BCa interval (bias-corrected and accelerated; acceleration from the
    jackknife), `resamples` resamples drawn as one seeded (resamples x n) index matrix;
  - the Student t interval, mean +- t_{n-1} * sd / sqrt(n).
  Why both: BCa alone undercovers on what quantized-model score differences look like (most items
  unchanged, a few large flips) and at small n, where every bootstrap percentile interval is too narrow
  (plug-in sd, normal quantiles). Measured coverage of a nominal 95% interval, 1000 trials each:
  zero-inflated differences n=15/50/200: BCa 82/88/92%, t 92/95/94%, hull 93/95/94%;
  0/100 flips n=50: BCa 90%, t 94%; exponential-tailed drops n=15/50: BCa 91/93%, t 93/94%,
  hull 94/95%. The t interval carries coverage at small n and on discrete differences; BCa widens
  the skewed side, which t misses. tests/test_stats.py checks coverage at n=15 and n=200.
- All differences equal (identical scores, or a uniform shift d; to within 1e-9 points): the interval is
  [d, d], and the MDE is the resolution 100 / n. A zero-width interval is no evidence by itself: decide.py
  asks for enough items besides.
- n = 1: no interval (the spread cannot be estimated); n = 0: nothing. Both leave the verdict open.

p-value (two-sided, of "no difference"): for 0/1 metrics (every value 0 or 100: em, contains) the exact
McNemar test, a binomial(b + c, 1/2) test of the b items the candidate lost against the c it won;
otherwise the paired t-test.

Minimum detectable effect: (t_{n-1, 1-alpha/2} + z_power) * sd_diff / sqrt(n), two-sided, 80% power
(about 2.8 * sd / sqrt(n) for large n). With zero spread it is the set's resolution, 100 / n (one item
flipping on the 0-100 scale). `items_needed` inverts it: about how many items would bring it to a margin.

Clustered items (several questions about one passage are not independent; Miller 2024, "Adding error
bars to evals"): with `clusters` (one key per item), the bootstrap resamples whole clusters (the mean of
a resample is its clusters' summed differences over their summed sizes; the BCa jackknife leaves one
cluster out), and the t interval, the t-test and the MDE use the cluster-robust standard error
sqrt(G / (G - 1) * sum_c (S_c - n_c * mean)^2) / n over G clusters (S_c: a cluster's summed difference,
n_c its size) with G - 1 degrees of freedom. McNemar assumes independent items, so clustered 0/1 metrics
take the cluster-robust t-test. When every cluster holds one item the result is exactly the unclustered
one; with one cluster there is no interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Hashable, Sequence

import numpy as np

BINARY_VALUES = (0.0, 100.0)
_NORMAL = NormalDist()


@dataclass(frozen=True)
class PairedComparison:
    """Candidate minus baseline over paired items, in score points (0-100 scale)."""

    delta: float | None  # mean paired difference; None when n == 0
    ci_low: float | None
    ci_high: float | None
    n: int
    mde: float | None  # smallest true drop this set detects with the given power (default 80%)
    p_value: float | None
    method: str
    improved: int  # items where the candidate scored higher
    worsened: int  # items where the candidate scored lower
    clusters: int | None = None  # clusters resampled, when items were clustered (some cluster holds > 1 item)
    se: float | None = None  # standard error of delta (cluster-robust when clustered); None when n < 2


SCORE_RANGE = 100.0
CONSTANT_TOLERANCE = 1e-9


def compare_paired(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    power: float = 0.8,
    clusters: Sequence[Hashable] | None = None,
) -> PairedComparison:
    """Compare two equally long, item-aligned score lists (baseline[i] and candidate[i] are one item).

    clusters: one key per item; items with one key share a context and are resampled together.
    """
    base = np.asarray(baseline, dtype=float)
    cand = np.asarray(candidate, dtype=float)
    if base.shape != cand.shape or base.ndim != 1:
        raise ValueError(f"paired scores need two 1-d lists of one length, got {base.shape} and {cand.shape}")
    diffs = cand - base
    groups = cluster_index(clusters, diffs.size)
    if groups is not None:
        return _compare_clustered(base, cand, groups, confidence, resamples, seed, power)
    n = int(diffs.size)
    improved, worsened = int((diffs > 0).sum()), int((diffs < 0).sum())
    if n == 0:
        return PairedComparison(None, None, None, 0, None, None, "none (no items)", 0, 0)
    delta = float(diffs.mean())
    binary = is_binary(base) and is_binary(cand)
    if n == 1:
        p_one = mcnemar_exact(worsened, improved) if binary else None
        return PairedComparison(delta, None, None, 1, None, p_one, "none (1 item)", improved, worsened)

    if is_constant(diffs):
        ci_low = ci_high = delta
        method = "constant difference"
        mde, se = SCORE_RANGE / n, 0.0
    else:
        t_low, t_high = t_interval(diffs, confidence)
        b_low, b_high = bca_interval(diffs, confidence, resamples, seed)
        # Scores live on 0-100, so a paired difference cannot leave [-100, 100]; the t part can at tiny n.
        ci_low, ci_high = max(min(t_low, b_low), -SCORE_RANGE), min(max(t_high, b_high), SCORE_RANGE)
        method = f"paired bootstrap BCa ({resamples}) ∪ t"
        mde, se = minimum_detectable_effect(diffs, confidence, power), float(diffs.std(ddof=1)) / math.sqrt(n)

    if binary:
        p_value = mcnemar_exact(worsened, improved)
        method += "; exact McNemar"
    else:
        p_value = paired_t_pvalue(diffs)
    return PairedComparison(
        delta=delta,
        ci_low=float(ci_low),
        ci_high=float(ci_high),
        n=n,
        mde=mde,
        p_value=p_value,
        method=method,
        improved=improved,
        worsened=worsened,
        se=se,
    )


# --- clusters ------------------------------------------------------------------------------------


def cluster_index(clusters: Sequence[Hashable] | None, n: int) -> np.ndarray | None:
    """Each item's cluster number (0..G-1, in order of first appearance); None when no cluster has 2 items."""
    if clusters is None:
        return None
    keys = list(clusters)
    if len(keys) != n:
        raise ValueError(f"clusters needs one key per item: {len(keys)} keys for {n} items")
    numbers: dict[Hashable, int] = {}
    index = np.array([numbers.setdefault(key, len(numbers)) for key in keys], dtype=np.int64)
    return index if len(numbers) < n else None


def _compare_clustered(
    base: np.ndarray, cand: np.ndarray, groups: np.ndarray, confidence: float, resamples: int, seed: int, power: float
) -> PairedComparison:
    diffs = cand - base
    n = int(diffs.size)
    sums = np.bincount(groups, weights=diffs)
    sizes = np.bincount(groups).astype(float)
    g = int(sums.size)
    delta = float(diffs.mean())
    improved, worsened = int((diffs > 0).sum()), int((diffs < 0).sum())
    se = cluster_se(sums, sizes)
    if is_constant(diffs):
        return PairedComparison(delta, delta, delta, n, SCORE_RANGE / n, 1.0 if delta == 0 else 0.0,
                                "constant difference", improved, worsened, g, 0.0)
    if g == 1:
        return PairedComparison(delta, None, None, n, None, None, "none (1 cluster)", improved, worsened, 1, None)
    half = t_quantile(0.5 + confidence / 2, g - 1) * se
    b_low, b_high = cluster_bca_interval(sums, sizes, confidence, resamples, seed)
    ci_low = max(min(delta - half, b_low), -SCORE_RANGE)
    ci_high = min(max(delta + half, b_high), SCORE_RANGE)
    return PairedComparison(
        delta=delta,
        ci_low=float(ci_low),
        ci_high=float(ci_high),
        n=n,
        mde=_mde_from_se(se, g - 1, n, confidence, power),
        p_value=_t_pvalue(delta, se, g - 1),
        method=f"cluster bootstrap BCa ({resamples}) ∪ cluster-robust t",
        improved=improved,
        worsened=worsened,
        clusters=g,
        se=se,
    )


def cluster_se(sums: np.ndarray, sizes: np.ndarray) -> float:
    """Cluster-robust standard error of the item mean: sqrt(G/(G-1) * sum (S_c - n_c*mean)^2) / n."""
    g, n = sums.size, float(sizes.sum())
    if g < 2:
        return 0.0
    mean = float(sums.sum()) / n
    return math.sqrt(g / (g - 1) * float(((sums - sizes * mean) ** 2).sum())) / n


def cluster_bootstrap_means(sums: np.ndarray, sizes: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Item means of `resamples` resamples of whole clusters, from one seeded (resamples x G) index matrix."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, sums.size, size=(resamples, sums.size), dtype=np.int32)
    return sums[index].sum(axis=1) / sizes[index].sum(axis=1)


def cluster_bca_interval(
    sums: np.ndarray, sizes: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """BCa interval of the item mean, resampling clusters; the jackknife leaves one cluster out."""
    total, n = float(sums.sum()), float(sizes.sum())
    boot = cluster_bootstrap_means(sums, sizes, resamples, seed)
    return _bca(boot, total / n, (total - sums) / (n - sizes), confidence)


def is_constant(diffs: np.ndarray) -> bool:
    """Every difference equal, up to float noise far below a printed point (1e-9 on the 0-100 scale)."""
    return bool(diffs.size) and float(diffs.max() - diffs.min()) <= CONSTANT_TOLERANCE


def is_binary(values: np.ndarray) -> bool:
    """True for 0/1 metrics scored 0 or 100 (em, contains)."""
    return bool(values.size) and bool(np.isin(values, BINARY_VALUES).all())


# --- intervals ---------------------------------------------------------------------------------


def t_interval(diffs: np.ndarray, confidence: float) -> tuple[float, float]:
    """Student t interval for the mean of the differences (n >= 2)."""
    n = diffs.size
    half = t_quantile(0.5 + confidence / 2, n - 1) * float(diffs.std(ddof=1)) / math.sqrt(n)
    mean = float(diffs.mean())
    return mean - half, mean + half


def bootstrap_means(diffs: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means of `resamples` resamples of the items, drawn from one (resamples x n) index matrix."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, diffs.size, size=(resamples, diffs.size), dtype=np.int32)
    return diffs[index].mean(axis=1)


def bca_interval(diffs: np.ndarray, confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """BCa bootstrap interval for the mean of the differences (Efron 1987)."""
    boot = bootstrap_means(diffs, resamples, seed)
    n = diffs.size
    return _bca(boot, float(diffs.mean()), (diffs.sum() - diffs) / (n - 1), confidence)


def _bca(boot: np.ndarray, theta: float, loo: np.ndarray, confidence: float) -> tuple[float, float]:
    """BCa quantiles of bootstrap means `boot` around `theta`; `loo`: the jackknife's leave-one-out means."""
    resamples = boot.size
    # Bias correction; ties at theta count half (score differences are discrete, ties are common).
    below = (np.count_nonzero(boot < theta) + 0.5 * np.count_nonzero(boot == theta)) / resamples
    below = min(max(below, 0.5 / resamples), 1 - 0.5 / resamples)
    z0 = _NORMAL.inv_cdf(below)
    # Acceleration from the jackknife.
    dev = loo.mean() - loo
    denom = 6.0 * float((dev**2).sum()) ** 1.5
    accel = float((dev**3).sum()) / denom if denom > 0 else 0.0

    alpha = 1 - confidence
    levels = []
    for tail in (alpha / 2, 1 - alpha / 2):
        z = z0 + _NORMAL.inv_cdf(tail)
        shrink = 1 - accel * z
        level = _NORMAL.cdf(z0 + z / shrink) if shrink > 0 else (0.0 if z < 0 else 1.0)
        levels.append(level)
    low, high = np.quantile(boot, levels)
    return float(low), float(high)


# --- tests ---------------------------------------------------------------------------------------


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar test: b items lost, c items won; binomial(b + c, 1/2) on min(b, c)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_t_pvalue(diffs: np.ndarray) -> float:
    """Two-sided paired t-test of mean difference 0 (n >= 2)."""
    n = diffs.size
    return _t_pvalue(float(diffs.mean()), float(diffs.std(ddof=1)) / math.sqrt(n), n - 1)


def _t_pvalue(mean: float, se: float, df: int) -> float:
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return max(0.0, 1.0 - _t_central_probability(abs(mean) / se, df))


def minimum_detectable_effect(diffs: np.ndarray, confidence: float, power: float = 0.8) -> float | None:
    """Smallest true mean difference this set detects with the given power (two-sided)."""
    n = diffs.size
    if n < 2:
        return None
    sd = float(diffs.std(ddof=1))
    if sd == 0:
        return 100.0 / n
    crit = t_quantile(0.5 + confidence / 2, n - 1)
    return (crit + _NORMAL.inv_cdf(power)) * sd / math.sqrt(n)


def _mde_from_se(se: float, df: int, n: int, confidence: float, power: float) -> float:
    if se == 0:
        return SCORE_RANGE / n
    return (t_quantile(0.5 + confidence / 2, df) + _NORMAL.inv_cdf(power)) * se


def items_needed(c: PairedComparison, margin: float, confidence: float, power: float = 0.8) -> int | None:
    """About how many paired items would bring the MDE to at most `margin`, at this comparison's spread.

    Zero spread: the resolution rule, 100 / n <= margin. Clustered: the per-item sd behind the cluster-robust
    standard error (so the design effect carries over) and the same items per cluster. None when no set size can
    (a 0 margin, or fewer than 2 items to estimate the spread from).
    """
    if margin <= 0 or c.se is None:
        return None
    if c.se == 0:
        return math.ceil(SCORE_RANGE / margin)
    sd = c.se * math.sqrt(c.n)
    per_cluster = c.n / (c.clusters or c.n)
    z = _NORMAL.inv_cdf(power)

    def enough(n: int) -> int:  # the n that the t quantile at n items asks for
        df = max(1, round(n / per_cluster) - 1)
        return math.ceil(((t_quantile(0.5 + confidence / 2, df) + z) * sd / margin) ** 2)

    needed = max(2, math.ceil(((_NORMAL.inv_cdf(0.5 + confidence / 2) + z) * sd / margin) ** 2))
    for _ in range(50):  # t shrinks as n grows: from the normal estimate this settles in a step or two...
        more = enough(needed)
        if more <= needed:
            break
        needed = more
    while needed > 2 and enough(needed - 1) <= needed - 1:  # ...possibly past the smallest n: step back
        needed -= 1
    return needed


# --- Student t without scipy ---------------------------------------------------------------------

_T_NORMAL_DF = 10_000  # beyond this many degrees of freedom the normal is exact to printing precision


def _t_central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student t with integer df (Abramowitz & Stegun 26.7.3, exact finite series)."""
    if df >= _T_NORMAL_DF:
        return 2 * _NORMAL.cdf(t) - 1
    return _central_from_angle(math.atan(t / math.sqrt(df)), df)


def _central_from_angle(theta: float, df: int) -> float:
    cos2 = math.cos(theta) ** 2
    sin = math.sin(theta)
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= (2 * k - 1) / (2 * k) * cos2
            total += term
        return sin * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for k in range(1, (df - 3) // 2 + 1):
        term *= (2 * k) / (2 * k + 1) * cos2
        total += term
    return 2 / math.pi * (theta + sin * total)


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student t with integer df >= 1, for 0.5 < p < 1 (bisection on the angle)."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1, got {p}")
    if df >= _T_NORMAL_DF:
        return _NORMAL.inv_cdf(p)
    target = 2 * p - 1
    low, high = 0.0, math.pi / 2
    for _ in range(100):
        mid = (low + high) / 2
        if _central_from_angle(mid, df) < target:
            low = mid
        else:
            high = mid
    return math.sqrt(df) * math.tan((low + high) / 2)
