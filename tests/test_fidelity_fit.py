"""benchmarks/fidelity_fit.py: the ladder's fit with intervals, the coincidence count the defaults must keep at 0,
fidelity's time share from progress lines, and the plot."""

from benchmarks import fidelity_fit


def row(fmt, kl, delta, *, margin=2.0, spread=1.0, agree=95.0, family="rtn", status=None, verdict="NO-GO",
        model="demo"):
    return {"model": model, "format": fmt, "family": family, "evalset": "s", "metric": "f1",
            "kl": {"value": kl, "ci_low": kl * 0.8, "ci_high": kl * 1.2},
            "top1_agreement": {"value": agree, "ci_low": agree - 2, "ci_high": min(agree + 2, 100)},
            "delta": delta, "ci_low": delta - spread, "ci_high": delta + spread, "margin": margin,
            "fidelity_status": status, "verdict": verdict}


def test_the_fit_recovers_a_known_slope_and_its_interval_holds_it():
    # drop in margins = 10 x KL, with noise that differs per rung
    rows = [row(f"r{i}", kl, -2.0 * 10 * kl * (1 + 0.1 * ((-1) ** i)))
            for i, kl in enumerate([0.01, 0.02, 0.05, 0.1, 0.2, 0.4])]
    result = fidelity_fit.fit(rows)
    assert result["points"] == 6 and result["rungs"] == 6
    low, high = result["drop_per_nat_ci"]
    assert low <= result["drop_per_nat"] <= high and low < 10 < high
    assert abs(result["kl_at_margin"] - 0.1) < 0.02
    kl_low, kl_high = result["kl_at_margin_ci"]
    assert kl_low <= result["kl_at_margin"] <= kl_high


def test_decoys_and_rows_without_a_margin_stay_out_of_the_fit():
    rows = [row("a", 0.1, -2.0), row("b", 0.2, -4.0), row("d", 0.001, -40.0, family="decoy"),
            row("m", 0.3, -1.0, margin=None)]
    assert fidelity_fit.fit(rows)["points"] == 2


def test_a_fit_needs_two_rungs():
    assert fidelity_fit.fit([row("a", 0.1, -2.0)]) == {}


def test_safety_factor_at_the_fit_and_at_the_low_end():
    factor = fidelity_fit.safety_factor({"kl_at_margin": 0.2, "kl_at_margin_ci": [0.1, 0.4]}, 0.05)
    assert factor == {"at_fit": 4.0, "at_low_end": 2.0}


def test_coincidences_find_a_fidelity_pass_past_the_margin_and_a_go_past_it():
    fine = row("ok", 0.01, -0.5, agree=99.0)  # passes fidelity, task interval [-1.5, 0.5] within the margin
    fooled = row("decoy-x", 0.01, -6.0, agree=99.0, family="decoy")  # passes fidelity, task [-7, -5] past -2
    damaged = row("r3", 0.5, -6.0, agree=60.0, verdict="GO")  # a GO that lies past the margin
    found = fidelity_fit.coincidences([fine, fooled, damaged], max_kl=0.05, min_agreement=90.0)
    assert found["fidelity_passes"] == 2
    assert [r["format"] for r in found["passes_past_margin"]] == ["decoy-x"]
    assert found["go_past_margin"] == ["demo/r3"]
    assert found["passes_with_real_drop"] == [fooled] and found["go_by_fidelity_over_real_drop"] == []
    carried = row("fp8", 0.007, -0.8, spread=0.6, agree=98.0, verdict="GO")  # [-1.4, -0.2]: within 2, yet real
    carried["rule"] = "fidelity"
    found = fidelity_fit.coincidences([fine, carried], max_kl=0.05, min_agreement=90.0)
    assert found["passes_past_margin"] == [] and found["go_by_fidelity_over_real_drop"] == [carried]
    # the run's own check outranks the interval test: a row the rule failed (tail condition) is not a pass
    fooled["fidelity_status"] = "fail"
    assert fidelity_fit.coincidences([fooled], 0.05, 90.0)["passes_past_margin"] == []


def test_time_shares_from_finished_progress_bars():
    log = "\n".join([
        "[quantgate] gptq: generating squad_200 [######..................] 8/30 eta   20s",
        "[quantgate] gptq: generating squad_200 [########################] 30/30  40.0s",
        "[quantgate] gptq: generating cmrc_200 [########################] 30/30  60.0s",
        "[quantgate] gptq: fidelity squad_200 [########################] 30/30   4.0s",
        "[quantgate] gptq: fidelity cmrc_200 [########################] 30/30   6.0s",
        "[quantgate] baseline: fidelity reference squad_200 [########################] 30/30   1.5s",
        "[quantgate] baseline: generating squad_200 [########################] 30/30  30.0s"])
    shares = fidelity_fit.time_shares(log)
    assert shares["gptq"] == {"generation_s": 100.0, "fidelity_s": 10.0, "share": 0.1}
    assert shares["baseline"]["share"] == 0.05
    # a later ladder in the same work directory appends to the log: only its own formats and sets are counted
    later = log + "\n[quantgate] baseline: generating cnndm_100 [########################] 30/30  90.0s"
    assert fidelity_fit.time_shares(later, {"baseline"}, {"cnndm_100"}) == {
        "baseline": {"generation_s": 90.0, "fidelity_s": 0.0, "share": 0.0}}


def test_the_plot_is_written(tmp_path):
    rows = [row("a", 0.1, -2.0), row("b", 0.2, -4.0, family="format"), row("d", 0.01, -1.0, family="decoy")]
    path = fidelity_fit.plot(rows, tmp_path / "ladder.png", 0.05)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_the_bench_section_carries_the_fit_intervals_coincidences_time_shares_and_plot(tmp_path):
    from benchmarks.fidelity_bench import fit, render_fidelity_bench

    rows = [row(f"r{i}", kl, -2.0 * 10 * kl * (1 + 0.1 * ((-1) ** i)))
            for i, kl in enumerate([0.01, 0.02, 0.05, 0.1, 0.2, 0.4])]
    rows.append(row("decoy-digits", 0.004, -6.0, agree=99.0, family="decoy", status="pass", verdict="INCONCLUSIVE"))
    result = {"rows": rows, "fit": fit(rows), "items": 30, "sets": ["squad_200"], "rungs": ["rtn", "decoys"],
              "command": "quantgate run ...", "wall_s": 600.0, "device": "cpu", "compute_dtype": "bfloat16",
              "decoys": {"decoy-digits": {"verdict": "INCONCLUSIVE", "status": "ok"}},
              "time_shares": {"r1": {"generation_s": 100.0, "fidelity_s": 8.0, "share": 0.08}}}
    text = "\n".join(render_fidelity_bench(result, tmp_path / "ladder.png"))
    assert "95% intervals by resampling rungs" in text and "one margin at KL 0.1" in text
    assert "Factor of safety of max_kl over every rung: the fitted one-margin KL is" in text
    assert "Over the decision region only (KL at most 0.2: 5 points" in text
    # the decoy passes fidelity while its task interval lies past the margin: the section names it
    assert "with the task interval wholly past the margin: 1 (demo/decoy-digits/s)" in text
    assert "| r1 | 100.0 | 8.0 | 0.080x |" in text
    assert "![drop in margins against KL" in text and (tmp_path / "ladder.png").is_file()


def test_departures_from_a_runs_per_item_figures(tmp_path):
    import json

    from benchmarks.fidelity_bench import render_fidelity_bench, with_item_figures

    samples = tmp_path / "samples.jsonl"
    records = [{"format": "baseline", "evalset": "s", "id": f"q{i}", "f1": 50.0, "prediction": f"answer {i}"}
               for i in range(4)]
    records += [{"format": "fp8", "evalset": "s", "id": "q0", "f1": 50.0, "prediction": "answer 0",
                 "fidelity": {"kl": 0.001, "tokens": 10, "first_flip": None}},
                {"format": "fp8", "evalset": "s", "id": "q1", "f1": 40.0, "prediction": "other 1",
                 "fidelity": {"kl": 0.02, "tokens": 10, "first_flip": 2}},
                {"format": "fp8", "evalset": "s", "id": "q2", "f1": 48.0, "prediction": "other 2",
                 "fidelity": {"kl": 0.01, "tokens": 20, "first_flip": None}},  # a tie broken the other way
                {"format": "fp8", "evalset": "t", "id": "q3", "f1": 0.0, "prediction": "x",
                 "fidelity": {"kl": 0.5, "tokens": 5, "first_flip": 0}}]
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = with_item_figures([row("fp8", 0.01, -4.0), row("int8", 0.01, 0.0)], samples)
    assert rows[0]["items_figures"] == [["q0", 10, None, 0.001, 0.0, True], ["q1", 10, 2, 0.02, -10.0, False],
                                        ["q2", 20, None, 0.01, -2.0, False]]
    assert "items_figures" not in rows[1]  # no sample of that format: the row as it was
    found = fidelity_fit.departures(rows[0])
    assert (found["items"], found["departed"], found["departed_unflipped"], found["flipped"]) == (3, 2, 1, 1)
    assert found["verbatim_token_share"] == (10 + 2 + 20) / 40
    assert found["delta_departed"] == -6.0 and found["delta_kept"] == 0.0
    assert fidelity_fit.departures(rows[1]) is None
    text = "\n".join(render_fidelity_bench({"rows": rows, "fit": {}, "items": 3, "command": "quantgate run",
                                            "wall_s": 1, "device": "cpu", "compute_dtype": "bfloat16",
                                            "rungs": ["fp8"]}))
    assert "| demo | fp8 | s | 2 of 3 | 1 | 1 | 80% | -6.00 | +0.00 |" in text
