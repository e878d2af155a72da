"""Ways to a GO that must stay shut (issue #38): spot checks people failed, fidelity on part of the items, dropped
items, a fraction where a percentage belongs, fidelity without tokens or spread, a fidelity min_items below the
policy's, per-language limits `decide` ignored, samples.jsonl as `decide` input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.decide import FormatOutcome, decide_format
from harness.errors import UserError
from harness.fidelity.summary import FidelityItem
from harness.policy import Policy, load_policy, policy_from_dict
from harness.review.exact import lower_bound, upper_bound
from harness.review.summary import Share, SpotCheckSummary, judge

RULE = dict(min_reviewed=20, max_increase=5.0, confidence=0.95)


def _spot(judged: int, candidate_bad: int) -> SpotCheckSummary:
    share = Share(0, judged, 0.0, 0.0, 100.0)
    return SpotCheckSummary("int8", ("alice",), judged, judged, share, share, share, candidate_bad, 0,
                            100.0 * candidate_bad / judged,
                            100.0 * (lower_bound(candidate_bad, judged, 0.025) - upper_bound(0, judged, 0.025)),
                            100.0 * upper_bound(candidate_bad, judged, 0.05), None, 0, 0, 0)


# --- spot checks ---------------------------------------------------------------------------------------------------


def test_unacceptable_outputs_people_saw_block_a_go_even_when_spot_checks_are_optional():
    seven_of_18 = judge(_spot(18, 7), required=False, planned=18, **RULE)
    assert seven_of_18.status == "inconclusive" and seven_of_18.counts
    assert "cannot be GO" in seven_of_18.detail
    assert "the plan holds 18 for this format: make a larger plan" in seven_of_18.detail  # never "judge 2 more"
    eight_of_20 = judge(_spot(20, 8), required=False, planned=20, **RULE)
    assert eight_of_20.status in ("inconclusive", "fail") and eight_of_20.counts
    clean = judge(_spot(20, 0), required=False, planned=20, **RULE)  # nothing seen: advisory, as before
    assert clean.status == "inconclusive" and not clean.counts


def _outcomes(n=40, kl=None, fidelity_on=None, drop_after=None):
    """Identical task scores, or from item `drop_after` on a drop of about 1 point with a wide spread (the task
    interval straddles the margin and reaches 0: the fidelity rule may carry a GO past it)."""
    rng = np.random.default_rng(5)
    base = {f"q{i}": {"f1": float(40 + (i * 7) % 50)} for i in range(n)}
    cand = {i: {"f1": row["f1"] - (1.0 + rng.normal(0, 10.0) if drop_after is not None and j >= drop_after else 0)}
            for j, (i, row) in enumerate(base.items())}
    kls = kl if kl is not None else rng.gamma(2.0, 0.002, size=n)
    covered = list(base)[: fidelity_on or n]
    fidelity = {"faq": {i: FidelityItem(24, float(k) * 24, 23.0 + (j % 2)) for j, (i, k) in
                        enumerate(zip(covered, kls))}}
    return (FormatOutcome("baseline", items={"faq": base}, gates={"faq": ["f1"]}, languages={"faq": "en"}),
            FormatOutcome("int8", items={"faq": cand}, gates={"faq": ["f1"]}, fidelity=fidelity,
                          languages={"faq": "en"}))


def test_required_spot_checks_hold_a_go_back_without_reviews_and_keep_the_verdict_for_the_fold():
    baseline, candidate = _outcomes()
    assert decide_format(baseline, candidate, Policy()).verdict == "GO"
    decision = decide_format(baseline, candidate, policy_from_dict({"spot_checks": {"required": True}}))
    assert decision.verdict == "INCONCLUSIVE" and any("spot checks are required" in r for r in decision.reasons)
    assert decision.spot_checks["verdict_without"] == "GO" and decision.spot_checks["status"] == "inconclusive"
    assert any(c["kind"] == "spot_check" for c in decision.checks)


def test_required_spot_checks_hold_in_quantgate_decide(tmp_path, capsys):
    base, cand = _score_files(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text("[spot_checks]\nrequired = true\n", encoding="utf-8")
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand)]) == 0
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand), "--policy", str(policy)]) == 1
    assert "spot checks are required" in capsys.readouterr().out


# --- the fidelity rule's preconditions -------------------------------------------------------------------------


def test_fidelity_on_half_the_items_cannot_carry_a_go():
    baseline, candidate = _outcomes(n=60, fidelity_on=30, drop_after=30)
    whole = decide_format(baseline, _outcomes(n=60, drop_after=30)[1], Policy())
    assert whole.verdict == "GO" and whole.rule == "fidelity"  # the same drop with fidelity on every item
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict != "GO"
    detail = decision.fidelity["faq"]["detail"]
    assert decision.fidelity["faq"]["status"] == "inconclusive"
    assert "fidelity covers 30 of the 60 scored items, not 30 (q30, q31" in detail


def test_a_constant_kl_is_not_evidence_but_an_exact_copy_is():
    baseline, candidate = _outcomes(kl=np.full(40, 0.004))
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict == "INCONCLUSIVE" and "zero width" in decision.fidelity["faq"]["detail"]


def test_fidelity_limits_that_cannot_be_meant_are_refused():
    with pytest.raises(UserError, match=r"min_top1_agreement.*looks like a fraction.*write 90 for 90%"):
        policy_from_dict({"fidelity": {"min_top1_agreement": 0.9}})
    with pytest.raises(UserError, match=r"min_top1_agreement_for.zh' = 0.85 looks like a fraction"):
        policy_from_dict({"fidelity": {"min_top1_agreement_for": {"zh": 0.85}}})
    with pytest.raises(UserError, match=r"fidelity.min_items = 2 is below min_items = 30"):
        policy_from_dict({"fidelity": {"min_items": 2}})
    assert policy_from_dict({"min_items": 10, "fidelity": {"min_items": 12}}).fidelity.min_items == 12


def test_a_policy_saved_with_a_bom_reads(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_bytes("\ufeff[margins]\nf1 = 3.0\n".encode("utf-8"))
    assert load_policy(path).margins["f1"] == 3.0


# --- quantgate decide --------------------------------------------------------------------------------------------


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _score_files(tmp_path: Path, n=40, language=None, kl=0.01):
    extra = {"language": language} if language else {}
    base = _write(tmp_path / "b.jsonl", [{"id": f"q{i}", "f1": float(40 + i), **extra} for i in range(n)])
    cand = _write(tmp_path / "c.jsonl", [
        {"id": f"q{i}", "f1": float(40 + i), **extra,
         "fidelity": {"kl": kl + 0.0005 * (i % 7), "top1_agreement": 97.0 + (i % 3), "tokens": 20}}
        for i in range(n)])
    return base, cand


def test_fidelity_without_tokens_is_refused(tmp_path, capsys):
    base, cand = _score_files(tmp_path)
    rows = [json.loads(line) for line in cand.read_text().splitlines()]
    del rows[3]["fidelity"]["tokens"]
    _write(cand, rows)
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand)]) == 2
    assert "c.jsonl:4: field 'fidelity.tokens': missing" in capsys.readouterr().err


def test_dropped_items_are_counted_and_never_go(tmp_path, capsys):
    base, cand = _score_files(tmp_path, n=60)
    for path in (base, cand):  # the same 5 items null on both sides: nothing "unpaired" to notice
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows[:5]:
            row["f1"] = None
        _write(path, rows)
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand), "--allow-missing"]) == 1
    out = capsys.readouterr().out
    assert "Verdict: INCONCLUSIVE" in out and "5 of 60 item(s) dropped" in out and "cannot be GO" in out


def test_decide_applies_per_language_fidelity_limits_and_checks_their_keys(tmp_path, capsys):
    base, cand = _score_files(tmp_path, language="zh", kl=0.03)
    policy = tmp_path / "policy.toml"
    policy.write_text("[fidelity]\nmax_kl = 0.05\n", encoding="utf-8")
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand), "--policy", str(policy)]) == 0
    policy.write_text("[fidelity]\nmax_kl = 0.05\n[fidelity.max_kl_for]\nzh = 0.02\n", encoding="utf-8")
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand), "--policy", str(policy)]) == 1
    assert "max KL 0.0200" in capsys.readouterr().out
    policy.write_text("[fidelity.max_kl_for]\nfr = 0.02\n", encoding="utf-8")
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand), "--policy", str(policy)]) == 2
    assert "fidelity.max_kl_for.fr" in capsys.readouterr().err


def test_decide_reads_a_runs_samples_jsonl(tmp_path, capsys):
    rows = []
    for fmt, shift in (("baseline", 0.0), ("int8", 0.0), ("gptq", -20.0)):
        rows += [{"format": fmt, "evalset": "faq", "id": f"q{i}", "prediction": "x", "new_tokens": 5,
                  "f1": max(0.0, 40.0 + i + shift)} for i in range(35)]
    samples = _write(tmp_path / "samples.jsonl", rows)
    assert main(["decide", "--baseline", str(samples), "--candidate", str(samples)]) == 2
    assert "--candidate-format NAME" in capsys.readouterr().err
    assert main(["decide", "--baseline", str(samples), "--candidate", str(samples),
                 "--candidate-format", "gptq"]) == 1
    assert "Verdict: NO-GO" in capsys.readouterr().out
    assert main(["decide", "--baseline", str(samples), "--candidate", str(samples),
                 "--candidate-format", "awq"]) == 2
    assert "no lines of format 'awq'" in capsys.readouterr().err


# --- quantgate report never rewrites with less ------------------------------------------------------------------


EXAMPLE = Path(__file__).resolve().parents[1] / "reports" / "example"


@pytest.mark.parametrize("keep", ["none", "half", "baseline only"])
def test_report_refuses_a_samples_file_shorter_than_the_report(tmp_path, capsys, keep):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    lines = (run / "samples.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    kept = {"none": [], "half": lines[: len(lines) // 2],
            "baseline only": [line for line in lines if json.loads(line)["format"] == "baseline"]}[keep]
    (run / "samples.jsonl").write_text("".join(kept), encoding="utf-8")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "samples.jsonl: lacks items report.json lists" in err and "nothing was rewritten" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_report_rerenders_a_whole_run(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    assert main(["report", str(run)]) in (0, 1)
    assert (run / "scores.csv").stat().st_size > 10_000


def test_summary_shows_the_spot_checks_of_every_format_that_has_them():
    from harness.decide import empty_spot_checks
    from harness.report.schema import SpotCheckEntry, load_report
    from harness.report.summary import render_summary

    report = load_report(EXAMPLE)
    assert "Spot checks" not in render_summary(report)
    pending = SpotCheckEntry.model_validate({**empty_spot_checks(), "status": "inconclusive", "detail": "required",
                                             "verdict_without": "GO", "rule_without": "fidelity",
                                             "reasons_without": []})
    formats = {**report.formats, "int8": report.formats["int8"].model_copy(update={"spot_checks": pending})}
    summary = render_summary(report.model_copy(update={"formats": formats}))
    assert "| Spot checks by people |" in summary and "| none judged (inconclusive) |" in summary


def test_report_renderings_keep_their_permissions(tmp_path):
    import os
    import shutil
    import stat

    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    os.chmod(run / "report.html", 0o640)
    assert main(["report", str(run)]) in (0, 1)
    assert stat.S_IMODE((run / "report.html").stat().st_mode) == 0o640
