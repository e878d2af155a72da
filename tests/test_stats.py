from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from harness import stats
from harness.stats import compare_paired, mcnemar_exact


def test_identical_scores_give_zero_delta_and_zero_interval():
    scores = [12.5, 80.0, 33.3, 100.0, 0.0, 64.0]
    r = compare_paired(scores, scores)
    assert (r.delta, r.ci_low, r.ci_high, r.n) == (0.0, 0.0, 0.0, 6)
    assert r.p_value == 1.0
    assert (r.improved, r.worsened) == (0, 0)
    assert r.mde == pytest.approx(100 / 6)  # zero spread: the set's resolution


def test_uniform_shift_gives_a_point_interval_at_the_shift():
    base = [float(x) for x in range(20, 60)]
    r = compare_paired(base, [b - 10 for b in base])
    assert r.delta == pytest.approx(-10.0)
    assert (r.ci_low, r.ci_high) == (pytest.approx(-10.0), pytest.approx(-10.0))
    assert r.worsened == 40 and r.improved == 0


def test_no_items_is_empty():
    r = compare_paired([], [])
    assert (r.delta, r.ci_low, r.ci_high, r.mde, r.p_value, r.n) == (None, None, None, None, None, 0)


def test_one_item_has_a_delta_but_no_interval():
    r = compare_paired([50.0], [40.0])
    assert r.delta == -10.0 and r.n == 1
    assert r.ci_low is None and r.ci_high is None and r.mde is None
    assert r.worsened == 1


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError):
        compare_paired([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (8, 2, 0.109375),  # 2 * (C(10,0)+C(10,1)+C(10,2)) / 2^10 = 2 * 56 / 1024
        (2, 8, 0.109375),
        (6, 0, 0.03125),  # 2 / 2^6
        (5, 5, 1.0),
        (0, 0, 1.0),
        (10, 3, 0.092285156),  # 2 * (1+13+78+286) / 8192 = 756 / 8192
    ],
)
def test_mcnemar_exact_matches_hand_computed_binomial(b, c, expected):
    assert mcnemar_exact(b, c) == pytest.approx(expected, abs=1e-9)


def test_binary_metric_uses_mcnemar_on_discordant_pairs():
    # 8 items lost (100 -> 0), 2 won (0 -> 100), 20 agree.
    base = [100.0] * 8 + [0.0] * 2 + [100.0] * 12 + [0.0] * 8
    cand = [0.0] * 8 + [100.0] * 2 + [100.0] * 12 + [0.0] * 8
    r = compare_paired(base, cand)
    assert r.p_value == pytest.approx(0.109375)
    assert "exact McNemar" in r.method
    assert (r.worsened, r.improved) == (8, 2)
    assert r.delta == pytest.approx(100 * (2 - 8) / 30)


def test_continuous_metric_uses_paired_t_test_p_value():
    # df = 2 has a closed form: P(|T| <= t) = t / sqrt(2 + t^2). Differences with mean m and sd 1 -> t = m * sqrt(3).
    m = 2 / math.sqrt(3)
    r = compare_paired([50.0, 50.0, 50.0], [50 + m - 1, 50 + m, 50 + m + 1])
    assert r.p_value == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-9)


@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (14, 2.1448), (29, 2.0452), (120, 1.9799)])
def test_t_quantile_matches_tables(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_mde_is_about_2_8_standard_errors():
    diffs = np.array([10.0, -10.0] * 50)  # n = 100, sd = 10 * sqrt(100/99)
    expected = (stats.t_quantile(0.975, 99) + 0.841621) * 10 * math.sqrt(100 / 99) / 10
    assert stats.minimum_detectable_effect(diffs, 0.95) == pytest.approx(expected, rel=1e-4)
    assert expected == pytest.approx(2.84, abs=0.01)


def test_bootstrap_draws_one_seeded_index_matrix():
    diffs = np.array([3.0, -1.0, 0.0, 7.5, -2.0, 4.0])
    index = np.random.default_rng(7).integers(0, diffs.size, size=(2000, diffs.size), dtype=np.int32)
    means = stats.bootstrap_means(diffs, 2000, seed=7)
    np.testing.assert_allclose(means, diffs[index].mean(axis=1))
    assert not np.allclose(means, stats.bootstrap_means(diffs, 2000, seed=8))


def test_interval_contains_the_t_interval_and_is_reproducible():
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 100, 60)
    cand = base - rng.gamma(2.0, 3.0, 60) + 4
    r = compare_paired(base, cand, seed=11)
    t_low, t_high = stats.t_interval(cand - base, 0.95)
    assert r.ci_low <= t_low and r.ci_high >= t_high
    assert r.ci_low < r.delta < r.ci_high
    assert compare_paired(base, cand, seed=11) == r


def test_bca_interval_leans_towards_the_long_tail():
    # Right-skewed differences: the interval must reach further above the mean than below it.
    rng = np.random.default_rng(5)
    diffs = rng.exponential(5.0, 80)
    low, high = stats.bca_interval(diffs, 0.95, 4000, seed=0)
    mean = diffs.mean()
    assert high - mean > mean - low > 0


def test_bca_interval_matches_the_textbook_formula():
    # Efron & Tibshirani (1993) 14.3, written out with loops, on the same bootstrap means.
    diffs = np.array([0.0, 0.0, -35.0, 0.0, 12.0, -60.0, 0.0, -8.0, 0.0, 0.0, -100.0, 5.0] * 3)
    boot = stats.bootstrap_means(diffs, 2000, seed=4)
    theta = diffs.mean()
    normal = NormalDist()
    z0 = normal.inv_cdf((np.sum(boot < theta) + 0.5 * np.sum(boot == theta)) / 2000)
    jack = [np.delete(diffs, i).mean() for i in range(diffs.size)]
    jbar = sum(jack) / len(jack)
    a = sum((jbar - j) ** 3 for j in jack) / (6 * sum((jbar - j) ** 2 for j in jack) ** 1.5)
    assert a < 0  # long tail of drops
    levels = [normal.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))) for z in (normal.inv_cdf(0.025), normal.inv_cdf(0.975))]
    expected = np.quantile(boot, levels)
    np.testing.assert_allclose(stats.bca_interval(diffs, 0.95, 2000, seed=4), expected)


def _skewed_trial(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Baseline scores, candidate scores, and the true mean difference (-1.0 points)."""
    base = rng.uniform(20, 90, n)
    drops = rng.gamma(4.0, 1.25, n)  # mean 5, skewness 1
    cand = base + 4.0 - drops + rng.normal(0, 1.5, n)
    return base, cand, -1.0


@pytest.mark.parametrize("n", [15, 200])
def test_interval_covers_the_true_mean_delta(n):
    hits = percentile_hits = 0
    for trial in range(100):
        base, cand, true_delta = _skewed_trial(np.random.default_rng(trial), n)
        r = compare_paired(base, cand, seed=trial)
        hits += r.ci_low <= true_delta <= r.ci_high
        boot = stats.bootstrap_means(cand - base, 2000, trial)
        low, high = np.quantile(boot, [0.025, 0.975])
        percentile_hits += low <= true_delta <= high
    assert hits >= 93
    if n == 15:  # what the plain percentile bootstrap would have given on the same trials
        assert percentile_hits < 93
