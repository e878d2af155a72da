from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from harness.commands import decide as decide_command
from harness.decide import FormatOutcome, baseline_scores, decide_format, exit_code, recommend
from harness.errors import UserError
from harness.policy import DEFAULT_MARGINS, GIB, Policy, load_policy

SCORE_KEYS = ["value", "delta", "ci_low", "ci_high", "n", "margin", "mde", "p_value", "method", "gated", "status"]
ROOT = Path(__file__).resolve().parents[1]


def outcome(name: str, evalset: str = "en_faq", gates=("f1",), **columns) -> FormatOutcome:
    """A format scored on one evalset: columns are metric -> per-item scores (ids q000, q001, ...)."""
    extras = {k: columns.pop(k) for k in ("peak_bytes", "ttft_p95_ms", "tpot_p95_ms", "status", "error") if k in columns}
    n = len(next(iter(columns.values())))
    items = {f"q{i:03d}": {metric: float(values[i]) for metric, values in columns.items()} for i in range(n)}
    return FormatOutcome(name=name, items={evalset: items}, gates={evalset: list(gates)}, **extras)


def noisy(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(10, 90, n)


# --- verdicts -------------------------------------------------------------------------------------


def test_identical_scores_are_go():
    f1 = noisy(60)  # zero spread: GO needs the resolution 100/n <= the 2.0 margin, so n >= 50
    d = decide_format(outcome("baseline", f1=f1), outcome("int8", f1=f1), Policy())
    assert d.verdict == "GO"
    s = d.scores["en_faq"]["f1"]
    assert (s["delta"], s["ci_low"], s["ci_high"], s["n"], s["status"], s["gated"]) == (0.0, 0.0, 0.0, 60, "pass", True)
    assert d.reasons == ["GO by the task rule: every check passes: 1 gated metric(s) above their margins"]
    detail = d.checks[0]["detail"]
    assert d.checks == [{"name": "en_faq/f1", "kind": "metric", "status": "pass", "detail": detail,
                         "reason": f"en_faq/f1: {detail}"}]


def test_uniform_ten_point_drop_on_200_items_is_no_go():
    f1 = noisy(200) + 10
    d = decide_format(outcome("baseline", f1=f1), outcome("gptq", f1=f1 - 10), Policy())
    assert d.verdict == "NO-GO"
    assert d.reasons == ["en_faq/f1: \u221210.0 points [\u221210.0, \u221210.0] is worse than the \u22122.0 margin"]
    assert d.scores["en_faq"]["f1"]["status"] == "fail"


def test_one_point_drop_on_ten_noisy_items_is_inconclusive():
    base = noisy(10)
    cand = base - 1 + np.random.default_rng(1).normal(0, 8, 10)
    d = decide_format(outcome("baseline", f1=base), outcome("awq", f1=cand), Policy())
    assert d.verdict == "INCONCLUSIVE"
    s = d.scores["en_faq"]["f1"]
    assert s["ci_low"] < -2.0 < s["ci_high"] and s["mde"] > 2.0
    [reason] = d.reasons
    assert reason.startswith("en_faq/f1: ") and "straddles the \u22122.0 margin" in reason
    assert f"add items: this set can detect drops of {s['mde']:.1f} points or more" in reason


def test_small_drop_well_inside_the_margin_on_many_items_is_go():
    base = noisy(300)
    cand = base - 0.3 + np.random.default_rng(2).normal(0, 1.0, 300)
    assert decide_format(outcome("b", f1=base), outcome("c", f1=cand), Policy()).verdict == "GO"


def test_score_entries_have_exactly_the_contract_keys():
    f1 = noisy(30)
    d = decide_format(outcome("baseline", f1=f1, em=f1 > 50), outcome("int8", f1=f1, em=f1 > 50), Policy())
    for entry in d.scores["en_faq"].values():
        assert list(entry) == SCORE_KEYS
    base = baseline_scores(outcome("baseline", f1=f1))
    assert list(base["en_faq"]["f1"]) == SCORE_KEYS
    assert base["en_faq"]["f1"]["value"] == pytest.approx(f1.mean())
    assert base["en_faq"]["f1"]["n"] == 30 and base["en_faq"]["f1"]["delta"] is None


def test_non_gated_metrics_are_reported_but_do_not_decide():
    f1 = noisy(50)
    em_base = np.where(f1 > 30, 100.0, 0.0)
    d = decide_format(
        outcome("baseline", f1=f1, em=em_base), outcome("int8", f1=f1, em=np.zeros(50)), Policy()
    )
    assert d.verdict == "GO"
    em = d.scores["en_faq"]["em"]
    assert em["gated"] is False and em["status"] is None and em["delta"] < -50
    assert "exact McNemar" in em["method"] and em["p_value"] < 1e-6


def test_binary_gated_metric_reports_mcnemar_counts():
    base = np.array([100.0] * 8 + [0.0] * 2 + [100.0] * 30)
    cand = np.array([0.0] * 8 + [100.0] * 2 + [100.0] * 30)
    d = decide_format(outcome("b", gates=("em",), em=base), outcome("c", gates=("em",), em=cand), Policy())
    assert "(8 items worse, 2 better, McNemar p=0.109)" in d.checks[0]["detail"]


def test_memory_budget_breach_is_no_go_whatever_the_scores():
    f1 = noisy(60)
    policy = Policy(max_memory_gib=8)
    d = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1, peak_bytes=9 * GIB), policy)
    assert d.verdict == "NO-GO"
    assert d.reasons == ["memory: peak memory 9.00 GiB exceeds the 8.00 GiB budget"]
    ok = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1, peak_bytes=7 * GIB), Policy(max_memory_bytes=8 * GIB))
    assert ok.verdict == "GO"
    assert {"name": "memory", "kind": "memory", "status": "pass", "detail": "peak memory 7.00 GiB within the 8.00 GiB budget",
            "reason": ""} in ok.checks


def test_latency_budgets():
    f1 = noisy(60)
    policy = Policy(max_ttft_p95_ms=200, max_tpot_p95_ms=50)
    slow = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1, ttft_p95_ms=250.0, tpot_p95_ms=40.0), policy)
    assert slow.verdict == "NO-GO"
    assert slow.reasons == ["latency/ttft_p95: TTFT p95 250.0 ms exceeds the 200.0 ms budget"]
    fast = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1, ttft_p95_ms=150.0, tpot_p95_ms=40.0), policy)
    assert fast.verdict == "GO"
    unmeasured = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1, ttft_p95_ms=150.0), policy)
    assert unmeasured.verdict == "INCONCLUSIVE"
    assert "TPOT p95 was not measured" in unmeasured.reasons[0]


def test_floors_apply_per_metric_and_per_evalset():
    f1 = np.full(60, 45.0) + noisy(60) / 100
    d = decide_format(outcome("b", f1=f1), outcome("int8", f1=f1), Policy(floors={"f1": 50.0}))
    assert d.verdict == "NO-GO"
    assert d.reasons == [f"en_faq/f1: {f1.mean():.1f} is below the 50.0 floor"]
    # the evalset-specific floor wins over the metric-wide one
    lowered = Policy(floors={"f1": 50.0, "en_faq/f1": 40.0})
    assert decide_format(outcome("b", f1=f1), outcome("int8", f1=f1), lowered).verdict == "GO"
    # floors also hold for non-gated metrics
    em = np.zeros(60)
    d = decide_format(outcome("b", f1=f1, em=em), outcome("int8", f1=f1, em=em), Policy(floors={"em": 10.0}))
    assert d.verdict == "NO-GO" and d.reasons[0].startswith("en_faq/em: 0.0 is below")


def test_failed_format_is_no_go_with_its_error():
    error = "CUDA out of memory: tried to allocate 2.00 GiB (7.5 GiB allocated, 0.3 GiB free, 7.9 GiB reserved)"
    failed = FormatOutcome(name="awq", status="failed", error=error)
    d = decide_format(outcome("baseline", f1=noisy(20)), failed, Policy())
    assert d.verdict == "NO-GO"
    assert d.reasons == [error]
    assert d.checks == [{"name": "run", "kind": "run", "status": "fail", "detail": error, "reason": error}]
    assert d.scores == {}


def test_failed_baseline_makes_every_candidate_no_go():
    broken = FormatOutcome(name="baseline", status="failed", error="weights not found")
    d = decide_format(broken, outcome("int8", f1=noisy(20)), Policy())
    assert d.verdict == "NO-GO" and "weights not found" in d.reasons[0]


def test_missing_ids_are_reported_and_pairing_uses_the_rest():
    f1 = noisy(60)
    base = outcome("baseline", f1=f1)
    cand_items = {k: v for k, v in base.items["en_faq"].items() if k not in ("q003", "q017")}
    cand = FormatOutcome(name="int8", items={"en_faq": cand_items}, gates=base.gates)
    d = decide_format(base, cand, Policy())
    assert d.verdict == "INCONCLUSIVE"
    assert d.scores["en_faq"]["f1"]["n"] == 58
    assert d.reasons == ["en_faq/items: 2 item(s) have no int8 score (q003, q017); compared on the 58 paired item(s)"]


def test_gated_metric_without_margin_or_items_is_inconclusive():
    x = noisy(30)
    d = decide_format(outcome("b", gates=("bleu",), bleu=x), outcome("c", gates=("bleu",), bleu=x), Policy())
    assert d.verdict == "INCONCLUSIVE" and "add `bleu = <points>` under [margins]" in d.reasons[0]
    d = decide_format(outcome("b", f1=x[:1]), outcome("c", f1=x[:1]), Policy())
    assert d.verdict == "INCONCLUSIVE" and "only 1 paired item" in d.reasons[0]
    d = decide_format(outcome("b", rougeL=x), outcome("c", rougeL=x), Policy())  # gate f1 was never scored
    assert d.verdict == "INCONCLUSIVE" and d.reasons == ["en_faq/f1: no paired items to compare; score this evalset for both formats"]


# --- recommendation and exit code -----------------------------------------------------------------


def _decisions(**verdicts: str):
    f1 = noisy(60)
    make = {
        "GO": lambda n: decide_format(outcome("b", f1=f1), outcome(n, f1=f1), Policy()),
        "NO-GO": lambda n: decide_format(outcome("b", f1=f1), outcome(n, f1=f1 - 20), Policy()),
        "INCONCLUSIVE": lambda n: decide_format(outcome("b", f1=f1[:2]), outcome(n, f1=f1[:2] - [0, 5]), Policy()),
    }
    decisions = {name: make[v](name) for name, v in verdicts.items()}
    assert {n: d.verdict for n, d in decisions.items()} == verdicts
    return {n: d.verdict for n, d in decisions.items()}


def test_recommendation_picks_the_smallest_go_format():
    decisions = _decisions(int8="GO", gptq="GO", awq="NO-GO", hqq="GO")
    peaks = {"int8": 200 * 2**20, "gptq": 120 * 2**20, "awq": 100 * 2**20, "hqq": None}
    rec = recommend(decisions, peaks)
    assert rec == {
        "format": "gptq",
        "why": "gptq is GO with the smallest peak memory (120.0 MiB); runner-up int8 (200.0 MiB)",
        "runner_up": "int8",
    }


def test_recommendation_without_any_go_names_the_baseline():
    rec = recommend(_decisions(int8="NO-GO", gptq="INCONCLUSIVE"), {"int8": 1, "gptq": 2})
    assert rec["format"] is None and rec["runner_up"] is None
    assert "int8: NO-GO, gptq: INCONCLUSIVE" in rec["why"] and "baseline" in rec["why"]
    assert "only GO format" in recommend(_decisions(int8="GO"), {"int8": 5})["why"]


def test_exit_codes():
    strict, lenient = Policy(), Policy(inconclusive_is="pass")
    assert exit_code(_decisions(int8="GO", gptq="GO"), strict) == 0
    assert exit_code(_decisions(int8="GO", gptq="INCONCLUSIVE"), strict) == 1
    assert exit_code(_decisions(int8="GO", gptq="INCONCLUSIVE"), lenient) == 0
    assert exit_code(_decisions(int8="GO", gptq="NO-GO"), lenient) == 1


# --- policy ---------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_policy_defaults_and_merged_margins(tmp_path):
    assert load_policy(None) == Policy()
    assert Policy().margins == DEFAULT_MARGINS == {
        "rougeL": 1.0, "rouge1": 1.0, "rouge2": 1.0, "f1": 2.0, "em": 2.0, "contains": 2.0
    }
    path = write(tmp_path, "p.toml", '[margins]\nf1 = 3.0\n"zh_qa/f1" = 5\n[floors]\nem = 20\n')
    policy = load_policy(path)
    assert policy.margins["f1"] == 3.0 and policy.margins["rougeL"] == 1.0
    assert policy.margin_for("zh_qa", "f1") == 5.0 and policy.margin_for("en", "f1") == 3.0
    assert policy.floor_for("any", "em") == 20.0 and policy.floor_for("any", "f1") is None
    assert Policy(max_memory_gib=2).memory_budget_bytes == 2 * GIB
    data = policy.as_dict()
    assert data["margins"]["f1"] == 3.0 and data["inconclusive_is"] == "fail" and data["resamples"] == 2000
    json.dumps(data)


def test_policy_unknown_key_is_a_user_error(tmp_path):
    path = write(tmp_path, "policy.toml", "[marginz]\nf1 = 1.0\n")
    with pytest.raises(UserError) as err:
        load_policy(path)
    message = str(err.value)
    assert message.startswith(f"{path}: unknown key 'marginz' (allowed: margins, floors, max_memory_bytes, ")
    assert message.endswith("confidence, resamples, seed, serving, fidelity, spot_checks)")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[margins]\nf1 = 'two'\n", "key 'margins.f1': "),
        ("confidence = 1.5\n", "key 'confidence': "),
        ("inconclusive_is = 'maybe'\n", "key 'inconclusive_is': "),
        ("resamples = 100\n", "key 'resamples': "),
        ("max_memory_bytes = 1\nmax_memory_gib = 1\n", "set max_memory_bytes or max_memory_gib, not both"),
        ("[margins]\nf1 = -1\n", "must be a finite number of points >= 0"),
        ("seed = \n", "not valid TOML"),
    ],
)
def test_policy_bad_values_are_user_errors(tmp_path, text, expected):
    with pytest.raises(UserError) as err:
        load_policy(write(tmp_path, "policy.toml", text))
    assert str(err.value).startswith(f"{tmp_path / 'policy.toml'}: ")
    assert expected in str(err.value)


def test_missing_policy_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read the policy file"):
        load_policy(tmp_path / "nope.toml")


def test_example_policy_file_has_every_key_and_the_defaults():
    path = ROOT / "policies" / "default.toml"
    assert load_policy(path) == Policy()
    text = path.read_text(encoding="utf-8")
    for key in Policy.model_fields:
        assert key in text, key


# --- the decide command ---------------------------------------------------------------------------


def run_decide(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    decide_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["decide", *argv])
    return args.func(args)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_decide_cli_go_with_json(tmp_path, capsys):
    f1 = noisy(60)
    rows = [{"id": f"q{i}", "f1": float(v), "em": 100.0 if v > 50 else 0.0, "prediction": "x"} for i, v in enumerate(f1)]
    base = write_jsonl(tmp_path / "base.jsonl", rows)
    cand = write_jsonl(tmp_path / "cand.jsonl", list(reversed(rows)))  # order does not matter: paired by id
    out = tmp_path / "out" / "decision.json"
    assert run_decide("--baseline", str(base), "--candidate", str(cand), "--json", str(out)) == 0
    printed = capsys.readouterr().out
    assert "Verdict: GO" in printed
    header = printed.splitlines()[0].split()
    assert header == ["metric", "n", "baseline", "candidate", "delta", "95%", "CI", "margin", "status"]
    data = json.loads(out.read_text())
    assert data["candidate"]["verdict"] == "GO" and data["exit_code"] == 0
    assert set(data["candidate"]["scores"]["scores"]) == {"f1", "em"}  # both have margins: both gated
    assert data["candidate"]["scores"]["scores"]["em"]["gated"] is True


def test_decide_cli_no_go_with_evalsets_and_gate(tmp_path, capsys):
    base_rows, cand_rows = [], []
    for group, drop in (("en", 0.0), ("zh", 15.0)):
        for i, v in enumerate(noisy(100, seed=4)):  # identical rougeL passes a 1.0 margin from 100 items
            base_rows.append({"id": i, "evalset": group, "f1": float(v) + 10, "rougeL": float(v)})
            cand_rows.append({"id": i, "evalset": group, "f1": float(v) + 10 - drop, "rougeL": float(v)})
    base = write_jsonl(tmp_path / "b.jsonl", base_rows)
    cand = write_jsonl(tmp_path / "c.jsonl", cand_rows)
    assert run_decide("--baseline", str(base), "--candidate", str(cand), "--gate", "rougeL") == 0
    assert run_decide("--baseline", str(base), "--candidate", str(cand), "--gate", "zh/f1") == 1
    printed = capsys.readouterr().out
    assert "Verdict: NO-GO" in printed
    assert "zh/f1: \u221215.0 points [\u221215.0, \u221215.0] is worse than the \u22122.0 margin" in printed
    with pytest.raises(UserError, match="--gate bleu: not a metric in both files"):
        run_decide("--baseline", str(base), "--candidate", str(cand), "--gate", "bleu")


def test_decide_cli_inconclusive_follows_the_policy(tmp_path):
    base = noisy(10)
    cand = np.clip(base - 1 + np.random.default_rng(1).normal(0, 8, 10), 0, 100)
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": i, "f1": float(v)} for i, v in enumerate(base)])
    c = write_jsonl(tmp_path / "c.jsonl", [{"id": i, "f1": float(v)} for i, v in enumerate(cand)])
    lenient = write(tmp_path, "p.toml", 'inconclusive_is = "pass"\nmax_memory_gib = 1\n')
    assert run_decide("--baseline", str(b), "--candidate", str(c)) == 1
    assert run_decide("--baseline", str(b), "--candidate", str(c), "--policy", str(lenient)) == 0


def test_decide_cli_without_any_gated_metric_is_a_user_error(tmp_path):
    rows = [{"id": i, "bleu": 10.0 * i} for i in range(5)]
    b, c = write_jsonl(tmp_path / "b.jsonl", rows), write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(UserError, match=r"nothing to gate on: no metric in both files \(bleu\) has a policy margin"):
        run_decide("--baseline", str(b), "--candidate", str(c))
    with pytest.raises(UserError, match="cannot read"):
        run_decide("--baseline", str(tmp_path / "none.jsonl"), "--candidate", str(c))


def test_decide_cli_missing_ids_name_them_and_count(tmp_path):
    base = write_jsonl(tmp_path / "base.jsonl", [{"id": f"q{i}", "f1": 50.0} for i in range(30)])
    cand = write_jsonl(tmp_path / "cand.jsonl", [{"id": f"q{i}", "f1": 50.0} for i in range(12, 31)])
    with pytest.raises(UserError) as err:
        run_decide("--baseline", str(base), "--candidate", str(cand))
    message = str(err.value)
    assert message.startswith("13 id(s) are in one file only: q0 (only in base.jsonl), q1 (only in base.jsonl), ")
    assert "q9 (only in base.jsonl), and 3 more" in message and "q10" not in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "b.jsonl:2: not valid JSON"),
        ('["a"]', "b.jsonl:2: expected a JSON object"),
        ('{"f1": 3}', "b.jsonl:2: field 'id': missing"),
        ('{"id": "q1", "f1": true}', "b.jsonl:2: field 'f1': expected a number, got True (a boolean)"),
        ('{"id": "q0", "f1": 3}', "b.jsonl:2: duplicate id 'q0' (first on line 1)"),
    ],
)
def test_decide_cli_malformed_lines_name_file_and_line(tmp_path, line, expected):
    base = tmp_path / "b.jsonl"
    base.write_text('{"id": "q0", "f1": 1}\n' + line + "\n", encoding="utf-8")
    cand = write_jsonl(tmp_path / "c.jsonl", [{"id": "q0", "f1": 1}])
    with pytest.raises(UserError) as err:
        run_decide("--baseline", str(base), "--candidate", str(cand))
    assert expected in str(err.value)


def test_score_files_with_a_raw_line_separator_in_a_string_read_one_record_per_line(tmp_path):
    path = tmp_path / "samples.jsonl"  # ensure_ascii=False writes U+2028 raw; str.splitlines() would split there
    rows = [{"id": "q0", "prediction": "Paris\u2028is the capital", "f1": 80.0}, {"id": "q1", "f1": 60.0}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    scores, order, _ = decide_command.read_scores(path)
    assert scores == {"scores": {"q0": {"f1": 80.0}, "q1": {"f1": 60.0}}}
    assert order == [("scores", "q0"), ("scores", "q1")]


def test_a_format_the_interrupted_run_never_reached_is_inconclusive_not_no_go():
    """Stopped before it ran (Ctrl-C, SIGTERM): nothing was judged, so NO-GO would give a reason that is not true."""
    f1 = noisy(60)
    waiting = FormatOutcome("awq", status="interrupted", error="not run: the run was interrupted")
    decision = decide_format(outcome("b", f1=f1), waiting, Policy())
    assert decision.verdict == "INCONCLUSIVE" and "awq did not run: the run was interrupted" in decision.reasons[0]
    assert "--resume" in decision.reasons[0]
    stopped_baseline = FormatOutcome("baseline", status="interrupted")
    assert decide_format(stopped_baseline, outcome("int8", f1=f1), Policy()).verdict == "INCONCLUSIVE"
    crashed = FormatOutcome("gptq", status="failed", error="quantization failed: boom")
    assert decide_format(outcome("b", f1=f1), crashed, Policy()).verdict == "NO-GO"  # a crash is still NO-GO
