"""GO needs evidence: min_items, MDE <= margin, a metric that tells formats apart, clustered items, p95 counts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness import stats
from harness.decide import FormatOutcome, decide_format
from harness.errors import UserError
from harness.measure.latency import P95_MIN_REQUESTS
from harness.measure.probe import Measurement
from harness.policy import Policy, load_policy
from harness.records import EvalsetGeneration
from harness.stats import compare_paired, items_needed
from records import format_run, run_inputs
from test_decide import run_decide, write_jsonl

MINUS = "\u2212"


def outcome(name: str, evalset: str = "en_faq", gates=("f1",), clusters=None, **columns) -> FormatOutcome:
    """One evalset; columns are metric -> per-item scores (ids q000, ...); clusters: per-item cluster keys."""
    extras = {k: columns.pop(k) for k in ("ttft_p95_ms", "tpot_p95_ms", "latency_requests") if k in columns}
    n = len(next(iter(columns.values())))
    ids = [f"q{i:03d}" for i in range(n)]
    items = {item: {metric: float(values[i]) for metric, values in columns.items()} for i, item in enumerate(ids)}
    if clusters is not None:
        extras["clusters"] = {evalset: {item: str(key) for item, key in zip(ids, clusters)}}
        extras["cluster_by"] = {evalset: "context"}
    return FormatOutcome(name=name, items={evalset: items}, gates={evalset: list(gates)}, **extras)


def noisy(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(10, 90, n)


# --- min_items and MDE <= margin --------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 5, 29])
def test_decide_cli_on_a_few_identical_items_is_inconclusive(tmp_path, capsys, n):
    rows = [{"id": f"q{i}", "f1": float(v)} for i, v in enumerate(noisy(n))]
    base, cand = write_jsonl(tmp_path / "b.jsonl", rows), write_jsonl(tmp_path / "c.jsonl", rows)
    assert run_decide("--baseline", str(base), "--candidate", str(cand)) == 1
    out = capsys.readouterr().out
    assert "Verdict: INCONCLUSIVE" in out and " pass" not in out
    [reason] = [line.strip() for line in out.splitlines() if line.strip().startswith("- ")]
    assert reason.startswith(f"- scores/f1: +0.0 points [0.0, 0.0] lies above the {MINUS}2.0 margin, but that is not "
                             f"evidence yet: only {n} paired items, and GO needs at least 30 (min_items); ")
    assert f"is {100 / n:.1f} points (MDE, the resolution 100/{n} of a zero-spread set), above the 2.0 margin" in reason
    assert reason.endswith("add items: about 50 paired items in all would do")  # 100 / 2.0 margin > min_items


def test_identical_scores_pass_only_once_the_resolution_reaches_the_margin():
    for n, verdict in ((30, "INCONCLUSIVE"), (49, "INCONCLUSIVE"), (50, "GO"), (200, "GO")):
        f1 = noisy(n)
        assert decide_format(outcome("b", f1=f1), outcome("c", f1=f1), Policy()).verdict == verdict, n
    rouge = noisy(99)  # a 1.0 margin needs 100 identical items
    d = decide_format(outcome("b", gates=("rougeL",), rougeL=rouge), outcome("c", gates=("rougeL",), rougeL=rouge),
                      Policy())
    assert d.verdict == "INCONCLUSIVE" and d.reasons[0].endswith("about 100 paired items in all would do")


def test_large_set_without_a_true_drop_is_go():
    base = noisy(200)
    cand = base + np.random.default_rng(3).normal(0, 3, 200)
    d = decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy())
    assert d.verdict == "GO", d.reasons


def test_interval_above_the_margin_on_a_noisy_set_needs_the_mde_too():
    rng = np.random.default_rng(1)
    base = rng.uniform(20, 80, 40)
    cand = base + 2 + rng.normal(0, 10, 40)
    d = decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy())
    s = d.scores["en_faq"]["f1"]
    assert d.verdict == "INCONCLUSIVE" and s["ci_low"] > -2.0 and s["mde"] > 2.0
    [reason] = d.reasons
    assert "lies above the \u22122.0 margin, but that is not evidence yet: the smallest drop it can detect at 80% " \
           f"power is {s['mde']:.1f} points (MDE), above the 2.0 margin; add items: about " in reason
    assert "min_items" not in reason  # 40 items clear min_items = 30: only the MDE rule is named
    needed = int(reason.rsplit("about ", 1)[1].split()[0])
    sd = float((cand - base).std(ddof=1))
    assert _mde(sd, needed) <= 2.0 < _mde(sd, needed - 1)  # the smallest such n


def _mde(sd: float, n: int, confidence: float = 0.95, power: float = 0.8) -> float:
    return (stats.t_quantile(0.5 + confidence / 2, n - 1) + stats._NORMAL.inv_cdf(power)) * sd / math.sqrt(n)


@pytest.mark.parametrize("sd", [0.5, 4.0, 12.0, 40.0])
def test_items_needed_brings_the_mde_to_the_margin(sd):
    diffs = np.random.default_rng(0).normal(0, 1, 30)
    diffs = (diffs - diffs.mean()) / diffs.std(ddof=1) * sd  # sample sd exactly `sd`
    c = compare_paired(np.full(30, 50.0), 50.0 + diffs)
    needed = items_needed(c, 2.0, 0.95, 0.8)
    assert _mde(sd, needed) <= 2.0 and (needed == 2 or _mde(sd, needed - 1) > 2.0)  # the smallest such n


def test_items_needed_for_zero_spread_and_a_zero_margin():
    c = compare_paired([50.0] * 10, [50.0] * 10)
    assert c.se == 0 and items_needed(c, 2.0, 0.95) == 50 and items_needed(c, 0.5, 0.95) == 200
    assert items_needed(c, 0.0, 0.95) is None
    base = noisy(300)
    cand = base + 3 + np.random.default_rng(1).normal(0, 1, 300)  # clearly better: the interval lies above 0
    d = decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy(margins={"f1": 0.0}))
    assert d.verdict == "INCONCLUSIVE" and d.reasons[0].endswith(
        "; no number of items shows a drop of at most 0.0: set a margin above 0")


def test_min_items_per_metric_and_per_evalset():
    policy = Policy(min_items=10, min_items_for={"f1": 100, "en_faq/f1": 80})
    assert policy.min_items_at("en_faq", "f1") == 80
    assert policy.min_items_at("zh_faq", "f1") == 100
    assert policy.min_items_at("en_faq", "em") == 10
    base = noisy(60)
    cand = base + np.random.default_rng(2).normal(0, 1, 60)
    assert decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy()).verdict == "GO"
    d = decide_format(outcome("b", f1=base), outcome("c", f1=cand), policy)
    assert d.verdict == "INCONCLUSIVE"
    assert "but that is not evidence yet: only 60 paired items, and GO needs at least 80 (min_items); " \
           "add items: about 80 paired items in all would do" in d.reasons[0]


def test_a_drop_beyond_the_margin_is_no_go_even_on_few_items():
    d = decide_format(outcome("b", f1=[50.0, 60.0, 70.0]), outcome("c", f1=[40.0, 50.0, 60.0]), Policy())
    assert d.verdict == "NO-GO"
    assert d.reasons == ["en_faq/f1: \u221210.0 points [\u221210.0, \u221210.0] is worse than the \u22122.0 margin"]
    base = noisy(8)
    cand = base - 30 + np.random.default_rng(4).normal(0, 3, 8)
    assert decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy()).verdict == "NO-GO"


# --- a metric that cannot tell formats apart ---------------------------------------------------------


def test_baseline_zero_on_every_item_is_inconclusive():
    zeros = np.zeros(200)
    d = decide_format(outcome("b", f1=zeros), outcome("c", f1=zeros), Policy())
    assert d.verdict == "INCONCLUSIVE"
    assert d.reasons == ["en_faq/f1: the baseline scores 0 on all 200 items, so f1 cannot tell formats apart; "
                         "check the set's language, prompt template and references"]
    some = np.where(np.arange(200) % 50 == 0, 100.0, 0.0)  # the candidate gets 4 items right: still no evidence
    assert decide_format(outcome("b", f1=zeros), outcome("c", f1=some), Policy()).verdict == "INCONCLUSIVE"


@pytest.mark.parametrize("value", [100.0, 50.0])
def test_every_item_tied_at_one_constant_is_inconclusive(value):
    flat = np.full(300, value)
    d = decide_format(outcome("b", gates=("em",), em=flat), outcome("c", gates=("em",), em=flat), Policy())
    assert d.verdict == "INCONCLUSIVE"
    assert d.reasons == [f"en_faq/em: both formats score {value:.1f} on all 300 items, so em cannot tell formats "
                         "apart; use items that some format gets wrong, or gate on another metric"]
    assert d.scores["en_faq"]["em"]["status"] == "inconclusive"


# --- clustered items ----------------------------------------------------------------------------------


def _planted(seed: int = 0, clusters: int = 20, size: int = 10, shift_sd: float = 5.0, drop: float = 0.5):
    """Items in clusters sharing a cluster-level shift of the difference; the true mean difference is `drop`."""
    rng = np.random.default_rng(seed)
    keys = np.repeat(np.arange(clusters), size)
    base = rng.uniform(20, 80, clusters * size)
    cand = base + drop + rng.normal(0, shift_sd, clusters)[keys] + rng.normal(0, 1, clusters * size)
    return base, cand, [f"passage-{k}" for k in keys]


def test_singleton_clusters_give_exactly_the_unclustered_result():
    base, cand, _ = _planted()
    ids = [f"q{i}" for i in range(base.size)]
    assert compare_paired(base, cand, clusters=ids, seed=3) == compare_paired(base, cand, seed=3)
    em_base, em_cand = (base > 50) * 100.0, (cand > 50) * 100.0
    assert compare_paired(em_base, em_cand, clusters=ids) == compare_paired(em_base, em_cand)
    with pytest.raises(ValueError, match="one key per item"):
        compare_paired(base, cand, clusters=ids[:-1])


def test_planted_cluster_correlation_widens_the_interval_and_the_mde():
    base, cand, keys = _planted()
    flat = compare_paired(base, cand)
    clustered = compare_paired(base, cand, clusters=keys)
    assert clustered.clusters == 20 and flat.clusters is None
    assert clustered.method == "cluster bootstrap BCa (2000) \u222a cluster-robust t"
    assert clustered.delta == pytest.approx(flat.delta)
    assert clustered.ci_high - clustered.ci_low > 2.5 * (flat.ci_high - flat.ci_low)
    assert clustered.mde > 2.5 * flat.mde
    # the cluster-robust t part: delta +- t_{G-1} * cluster-sums standard error
    diffs = cand - base
    sums = np.array([diffs[i * 10:(i + 1) * 10].sum() for i in range(20)])
    se = math.sqrt(20 / 19 * ((sums - 10 * diffs.mean()) ** 2).sum()) / 200
    assert clustered.se == pytest.approx(se)
    half = stats.t_quantile(0.975, 19) * se
    assert clustered.ci_low <= clustered.delta - half + 1e-12 and clustered.ci_high >= clustered.delta + half - 1e-12
    assert clustered.mde == pytest.approx((stats.t_quantile(0.975, 19) + stats._NORMAL.inv_cdf(0.8)) * se)


def test_clustered_interval_covers_where_the_unclustered_one_does_not():
    hits = flat_hits = 0
    for trial in range(60):
        base, cand, keys = _planted(seed=trial)
        clustered, flat = compare_paired(base, cand, clusters=keys, seed=trial), compare_paired(base, cand, seed=trial)
        hits += clustered.ci_low <= 0.5 <= clustered.ci_high
        flat_hits += flat.ci_low <= 0.5 <= flat.ci_high
    assert hits >= 54 and flat_hits <= 36


def test_cluster_bootstrap_resamples_whole_clusters():
    sums, sizes = np.array([3.0, -1.0, 10.0]), np.array([1.0, 2.0, 4.0])
    index = np.random.default_rng(5).integers(0, 3, size=(2000, 3), dtype=np.int32)
    np.testing.assert_allclose(stats.cluster_bootstrap_means(sums, sizes, 2000, 5),
                               sums[index].sum(axis=1) / sizes[index].sum(axis=1))


def test_one_cluster_has_no_interval():
    base, cand = noisy(12), noisy(12, seed=1)
    c = compare_paired(base, cand, clusters=["one passage"] * 12)
    assert (c.ci_low, c.ci_high, c.clusters) == (None, None, 1)
    d = decide_format(outcome("b", f1=base, clusters=["p"] * 12), outcome("c", f1=cand), Policy())
    assert d.verdict == "INCONCLUSIVE" and "all share one context: no interval" in d.reasons[0]


def test_decide_resamples_clusters_and_says_so():
    base, cand, keys = _planted(shift_sd=6.0)
    flat = decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy())
    assert flat.verdict == "GO"  # 200 "independent" items look like plenty
    d = decide_format(outcome("b", f1=base, clusters=keys), outcome("c", f1=cand), Policy())
    s = d.scores["en_faq"]["f1"]
    assert d.verdict == "INCONCLUSIVE" and s["ci_low"] < -2.0
    assert s["method"] == "cluster bootstrap BCa (2000) \u222a cluster-robust t, clustered by context (20 clusters)"
    assert "over 20 clusters by context" in d.checks[0]["detail"]


def test_decide_cli_reads_an_optional_group_column(tmp_path, capsys):
    base, cand, keys = _planted(shift_sd=6.0)
    b_rows = [{"id": i, "f1": float(v), "group": k} for i, (v, k) in enumerate(zip(base, keys))]
    c_rows = [{"id": i, "f1": float(v)} for i, v in enumerate(cand)]
    b, c = write_jsonl(tmp_path / "b.jsonl", b_rows), write_jsonl(tmp_path / "c.jsonl", c_rows)
    out = tmp_path / "d.json"
    assert run_decide("--baseline", str(b), "--candidate", str(c), "--json", str(out)) == 1
    entry = json.loads(out.read_text())["candidate"]["scores"]["scores"]["f1"]
    assert entry["method"].endswith("clustered by group (20 clusters)") and entry["status"] == "inconclusive"
    assert "group" not in json.loads(out.read_text())["candidate"]["scores"]["scores"]  # not a metric
    c_rows[0]["group"] = "another passage"
    write_jsonl(c, c_rows)
    with pytest.raises(UserError, match=r"0: field 'group' is 'passage-0' in .*b.jsonl but 'another passage' in "):
        run_decide("--baseline", str(b), "--candidate", str(c))


# --- latency p95 on too few requests -----------------------------------------------------------------


def test_p95_budget_on_too_few_requests_is_inconclusive_but_a_breach_still_fails():
    f1 = noisy(60)
    policy = Policy(max_ttft_p95_ms=200)
    few = decide_format(outcome("b", f1=f1), outcome("c", f1=f1, ttft_p95_ms=150.0, latency_requests=8), policy)
    assert few.verdict == "INCONCLUSIVE"
    assert few.reasons == ["latency/ttft_p95: TTFT p95 150.0 ms within the 200.0 ms budget, but the p95 of 8 requests "
                           "is about the max of 8; it needs >= 20 requests (quantgate run --latency-requests 20)"]
    slow = decide_format(outcome("b", f1=f1), outcome("c", f1=f1, ttft_p95_ms=250.0, latency_requests=8), policy)
    assert slow.verdict == "NO-GO" and "exceeds the 200.0 ms budget" in slow.reasons[0]
    enough = outcome("c", f1=f1, ttft_p95_ms=150.0, latency_requests=P95_MIN_REQUESTS)
    assert decide_format(outcome("b", f1=f1), enough, policy).verdict == "GO"
    unknown = outcome("c", f1=f1, ttft_p95_ms=150.0)  # latency_requests None: not held against the format
    assert decide_format(outcome("b", f1=f1), unknown, policy).verdict == "GO"


def test_evaluate_passes_latency_requests_and_clusters(tmp_path, monkeypatch):
    from harness import evaluate
    from harness.evalsets import Prompt, load_evalsets
    from harness.measure.latency import latency_block
    from harness.runtime.base import BatchTiming

    rows = [{"id": f"q{i}", "question": f"Question {i}?", "context": f"Passage {i // 3}.", "answers": ["x"]}
            for i in range(6)]
    write_jsonl(tmp_path / "faq.jsonl", rows)
    (tmp_path / "faq.toml").write_text('name = "faq"\ntask = "qa"\nlanguage = "en"\n', encoding="utf-8")
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    [evalset] = load_evalsets([tmp_path / "faq.toml"])
    timings = [BatchTiming(batch_size=1, prompt_tokens=12, steps=10, ttft_s=0.1, e2e_s=0.3) for _ in range(5)]
    measurement = Measurement(result={"latency": {"batch_1": latency_block(timings)}, "memory": {}})
    outputs = [{"id": r["id"], "prediction": "x", "new_tokens": 1} for r in rows]
    run = format_run("baseline", status="ok", error=None, measurement=measurement,
                     generations={"faq": EvalsetGeneration.from_result({"evalset": "faq", "outputs": outputs})})
    inputs = run_inputs(evalsets=[evalset], recipes={}, calibration=None, policy=Policy(),
                        prompts={"faq": [Prompt("faq", r["id"], "p", 1, 1) for r in rows]})
    seen = {}

    class Captured(Exception):
        pass

    def capture(*args, **kwargs):  # the outcome evaluate builds, then stop: the rest needs a whole run
        seen["outcome"] = FormatOutcome(*args, **kwargs)
        raise Captured

    monkeypatch.setattr(evaluate, "FormatOutcome", capture)
    with pytest.raises(Captured):
        evaluate.evaluate_formats(inputs, {"baseline": run})
    got = seen["outcome"]
    assert got.latency_requests == 5
    assert got.clusters == {"faq": {f"q{i}": f"Passage {i // 3}." for i in range(6)}}
    assert got.cluster_by == {"faq": "context"}


# --- the decide command checks its policy as run does --------------------------------------------------


def test_decide_cli_rejects_a_misspelled_margin_key(tmp_path):
    rows = [{"id": i, "rougeL": float(v), "bleu": float(v)} for i, v in enumerate(noisy(120))]
    b, c = write_jsonl(tmp_path / "b.jsonl", rows), write_jsonl(tmp_path / "c.jsonl", rows)
    policy = tmp_path / "policy.toml"
    policy.write_text("[margins]\nrogueL = 1.0\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        run_decide("--baseline", str(b), "--candidate", str(c), "--policy", str(policy))
    message = str(caught.value)
    assert message.startswith(f"{policy}: key 'margins.rogueL': unknown metric 'rogueL' (did you mean 'rougeL'?) (known: ")
    assert "\n" not in message and caught.value.exit_code == 2
    policy.write_text("[min_items_for]\n\"scores/f2\" = 40\n", encoding="utf-8")
    with pytest.raises(UserError, match="key 'min_items_for.scores/f2': unknown metric 'f2'"):
        run_decide("--baseline", str(b), "--candidate", str(c), "--policy", str(policy))
    policy.write_text("[margins]\nbleu = 1.0\n", encoding="utf-8")  # a metric the score files carry is fine
    assert run_decide("--baseline", str(b), "--candidate", str(c), "--policy", str(policy)) == 0


def test_decide_cli_policy_error_exits_2_through_the_cli(tmp_path, capsys):
    from harness.cli import main

    rows = [{"id": i, "f1": float(v)} for i, v in enumerate(noisy(10))]
    b, c = write_jsonl(tmp_path / "b.jsonl", rows), write_jsonl(tmp_path / "c.jsonl", rows)
    policy = tmp_path / "policy.toml"
    policy.write_text("[margins]\nrogueL = 1.0\n", encoding="utf-8")
    assert main(["decide", "--baseline", str(b), "--candidate", str(c), "--policy", str(policy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown metric 'rogueL'" in err[0]


@pytest.mark.parametrize(("text", "expected"), [
    ("min_items = 1\n", "key 'min_items': "),
    ("power = 1.2\n", "key 'power': "),
    ("[min_items_for]\nf1 = 1\n", "must be at least 2 items"),
])
def test_evidence_policy_keys_are_validated(tmp_path, text, expected):
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=expected):
        load_policy(path)


def test_evidence_policy_defaults():
    policy = Policy()
    assert (policy.min_items, policy.min_items_for, policy.power) == (30, {}, 0.8)
