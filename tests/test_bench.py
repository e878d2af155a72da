"""The benchmark's arithmetic and its lm-eval task file (the timed runs themselves are `nox -s bench`)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks.lm_eval_side import jinja_from_format, write_task
from benchmarks.report import Check, Timing, render, summary_table


def test_time_ratio_checks_ours_over_reference_on_its_basis():
    faster = Check("eval", Timing(70.0, 60.0), "lm-eval", Timing(100.0, 100.0), 0.67, "at_most", basis="cpu")
    assert math.isclose(faster.ratio, 0.6) and faster.met
    assert math.isclose(faster.ratio_on("wall"), 0.7)
    on_wall = Check("eval", Timing(70.0, 60.0), "lm-eval", Timing(100.0, 100.0), 0.67, "at_most", basis="wall")
    assert not on_wall.met
    assert Check("x", Timing(1.05, 1.05), "r", Timing(1.0, 1.0), 1.05, "at_most").met  # the target itself passes


def test_speedup_checks_reference_over_ours():
    cache = Check("cache", Timing(5.0, 4.0), "cold", Timing(300.0, 400.0), 20, "at_least", basis="wall")
    assert math.isclose(cache.ratio, 60.0) and cache.met and math.isclose(cache.ratio_on("cpu"), 100.0)
    assert not Check("cache", Timing(20.0, 20.0), "cold", Timing(300.0, 300.0), 20, "at_least").met
    assert Check("cache", Timing(0.0, 0.0), "cold", Timing(300.0, 300.0), 20, "at_least").ratio == float("inf")


def test_summary_table_marks_misses_and_the_judged_ratio():
    rows = summary_table([Check("1. evaluation", Timing(99.0, 98.0), "lm-eval", Timing(100.0, 98.0), 0.67, "at_most"),
                          Check("3. cache", Timing(5.0, 4.5), "cold run", Timing(300.0, 350.0), 20, "at_least",
                                basis="wall")])
    assert rows[2] == ("| 1. evaluation | 98.0 s / 99.0 s | lm-eval: 98.0 s / 100.0 s | **1.00×** | 0.99× | "
                       "≤ 0.67× (cpu) | **no** |")
    assert rows[3] == ("| 3. cache | 4.50 s / 5.00 s | cold run: 350.0 s / 300.0 s | 77.78× | **60.00×** | "
                       "≥ 20× (wall) | yes |")
    text = render("title", [("", ["intro"]), ("Section", rows)])
    assert text.startswith("# title\n\nintro\n\n## Section\n\n| benchmark |") and text.endswith("|\n")


def test_prompt_template_becomes_equivalent_jinja():
    template = "Answer it.\n\nContext: {context}\n\nQuestion: {question}"
    assert jinja_from_format(template) == "Answer it.\n\nContext: {{context}}\n\nQuestion: {{question}}"
    # literal braces ({{ in a str.format template) must stay literal in Jinja
    assert jinja_from_format("JSON {{x}}: {question}") == "{% raw %}JSON {x}: {% endraw %}{{question}}"


def test_task_yaml_is_valid_and_carries_the_settings(tmp_path):
    yaml = pytest.importorskip("yaml")

    path = write_task(tmp_path, "bench_squad", "/data/squad.jsonl", 'Q: "{question}"\nC: {context}', 32)
    task = yaml.safe_load(path.read_text())
    assert task["task"] == "bench_squad" and task["dataset_path"] == "json"
    assert task["dataset_kwargs"] == {"data_files": {"test": "/data/squad.jsonl"}}
    assert task["doc_to_text"] == 'Q: "{{question}}"\nC: {{context}}'
    assert task["generation_kwargs"] == {"until": [], "max_gen_toks": 32, "do_sample": False}


def test_saved_results_render_the_same_report(tmp_path):
    from argparse import Namespace

    from benchmarks.cache_bench import CacheBench
    from benchmarks.eval_bench import EvalBench, Side
    from benchmarks.quantize_bench import QuantizeBench
    from benchmarks.report import build_report
    from benchmarks.results import load, save

    def side(name, wall, cpu):
        return Side(name, wall, cpu, wall - 10, cpu - 10, {"em": 50.0, "f1": 60.0}, {"a": "Paris"},
                    {"runs": [[cpu, wall, cpu - 10, wall - 10]]})

    lm = side("lm-eval", 110.0, 108.0)
    lm.extra.update(lm_eval_metrics={"exact_match,none": 0.25}, version="0.4.13")
    run = {
        "args": Namespace(quick=False, threads=1, batch_size=8, items=1, repeats=1, cache_items=2,
                          calibration_samples=4, latency_requests=2, profile_items=1),
        "eval_run": EvalBench(1, 8, 32, "bfloat16", side("quantgate", 100.0, 98.0), lm, side("bare loop", 95.0, 94.0),
                              None, 1, {"lm-eval": 1, "bare loop": 1}),
        "profile": {"generation: model forward (transformers/torch)": 9.0, "imports (python modules, both processes)": 3.0},
        "cache_run": CacheBench(300.0, 310.0, 8.0, 8.1, {"baseline": []}, ["run", "--model", "demo"], tmp_path, tmp_path),
        "quantize_runs": [QuantizeBench("gptq", 16, 93.0, 98.0, 90.0, 94.0, 98.5, 91.0)],
        "load_before": [0.5, 0.4, 0.3], "load_after": [0.6, 0.5, 0.4], "total_s": 1800.0,
        "measured_at": "2026-12-03 10:15 UTC",
    }
    save(tmp_path / "latest.json", run)
    markdown, checks = build_report(**run)
    again, _ = build_report(**load(tmp_path / "latest.json"))
    assert again == markdown
    assert [c.met for c in checks] == [False, True, True, True]  # 0.91x lm-eval misses 0.67x; the rest pass
    assert "## Where targets are missed, and why" in markdown and "lm-eval's own `exact_match` on its outputs is 25.0" in markdown


def test_default_ladder_names_only_rungs_that_exist_and_spans_both_models():
    from benchmarks.decoys import DECOYS
    from benchmarks.fidelity_bench import ALL_RTN, DEFAULT_LADDER, FORMAT_RUNGS, MODELS, RUNGS, SETS
    from benchmarks.rtn_ladder import LADDER

    assert set(DEFAULT_LADDER) == set(MODELS)
    for model, plan in DEFAULT_LADDER.items():
        assert set(plan.rungs) <= set(RUNGS), model
        known = {f for rung in plan.rungs for f in FORMAT_RUNGS.get(rung, ())}
        known |= {s.name for s in LADDER} if "rtn" in plan.rungs else set()
        known |= {d.name for d in DECOYS} if "decoys" in plan.rungs else set()
        assert plan.only <= known, (model, sorted(plan.only - known))
        assert plan.sets and set(plan.sets) <= set(SETS), model
    # at least 40 points of the fit (rung x set, decoys apart)
    assert sum(len([n for n in plan.only if not n.startswith("decoy-")]) * len(plan.sets)
               for plan in DEFAULT_LADDER.values()) >= 40
    assert {s.name for s in LADDER} == set(ALL_RTN)


def test_bench_fidelity_plans_default_per_model_and_overrides_apply_to_every_model():
    from benchmarks import run as bench_run
    from benchmarks.fidelity_bench import DEFAULT_LADDER

    args = bench_run.parse_args(["--steps", "fidelity"])
    assert args.fidelity_items == 100
    assert bench_run.fidelity_plans(args) == {m: (p.rungs, p.only, p.sets) for m, p in DEFAULT_LADDER.items()}
    command = bench_run.ladder_command("gemma3-270m", Path("/w"), *bench_run.fidelity_plans(args)["gemma3-270m"],
                                       args)
    assert command[command.index("--only") + 1].split(",") == sorted(DEFAULT_LADDER["gemma3-270m"].only)
    assert command[command.index("--sets") + 1] == "squad_200,cmrc_200"
    told = bench_run.parse_args(["--steps", "fidelity", "--fidelity-rungs", "rtn", "--fidelity-models", "demo",
                                 "--fidelity-sets", "cmrc_200"])
    assert bench_run.fidelity_plans(told) == {"demo": (("rtn",), frozenset(), ("cmrc_200",))}
    assert told.fidelity_parallel == 1
    with pytest.raises(SystemExit):
        bench_run.parse_args(["--fidelity-parallel", "0"])


def test_a_partial_bench_keeps_the_sections_it_did_not_measure(tmp_path):
    from argparse import Namespace

    from benchmarks.results import carried_line, carry_over, save

    previous = {"args": Namespace(quick=False), "eval_run": None, "profile": {"top": []}, "cache_run": None,
                "quantize_runs": [], "serve_run": {"rows": [1]}, "fidelity_run": {"rows": ["old"]},
                "measured_at": "2026-12-03 10:15 UTC"}
    saved = tmp_path / "latest.json"
    save(saved, previous)
    now = {"args": Namespace(quick=False), "eval_run": None, "profile": None, "cache_run": None, "quantize_runs": [],
           "serve_run": None, "fidelity_run": {"rows": ["new"]}, "measured_at": "2026-12-07 15:00 UTC"}
    run = carry_over(now, ["fidelity"], saved)
    assert run["fidelity_run"] == {"rows": ["new"]}  # measured now: never replaced
    assert run["serve_run"] == {"rows": [1]} and run["profile"] == {"top": []}
    assert run["carried"] == {"profile": "2026-12-03 10:15 UTC, a machine not recorded",
                              "serve": "2026-12-03 10:15 UTC, a machine not recorded"}
    save(saved, run)  # a second partial run keeps the first date, not the date of the run that carried it
    again = carry_over({**now, "measured_at": "2026-12-08 09:00 UTC"}, ["fidelity"], saved)
    assert again["carried"]["serve"] == "2026-12-03 10:15 UTC, a machine not recorded"
    assert "serve (2026-12-03 10:15 UTC, a machine" in carried_line(again["carried"]) and carried_line({}) == ""
    save(saved, {**previous, "machine": {"name": "AMD EPYC"}})
    assert carry_over(now, ["fidelity"], saved)["carried"]["serve"] == "2026-12-03 10:15 UTC, AMD EPYC"
    assert carry_over(now, ["fidelity"], tmp_path / "missing.json") is now
    # the kept sections keep their own machine and settings in the report
    from benchmarks.report import machine_lines

    kept = carry_over(now, ["fidelity"], saved)["kept"]
    assert kept["machine"] == {"name": "AMD EPYC"} and kept["steps"] == ["profile", "serve"]
    args = Namespace(threads=1, batch_size=8, items=24, repeats=1, cache_items=2, calibration_samples=4,
                     latency_requests=2)
    earlier = Namespace(threads=1, batch_size=8, items=200, repeats=2, cache_items=16, calibration_samples=16,
                        latency_requests=8)
    facts = {"name": "Intel Xeon", "cores": 2, "memory_gib": 24, "platform": "Linux", "versions": "torch 2.13.0"}
    text = "\n".join(machine_lines(args, (0.5,), (0.5,), facts, {**kept, "args": earlier,
                                                                 "machine": {**facts, "name": "AMD EPYC"}}))
    assert "machine of this run: Intel Xeon" in text and "machine of the kept sections (profile, serve): AMD" in text
    assert "200 items" in text and "24 items" not in text


def test_bench_takes_saved_ladders_and_refuses_a_missing_one(tmp_path):
    from benchmarks import run as bench_run

    with pytest.raises(SystemExit):
        bench_run.parse_args(["--steps", "fidelity", "--fidelity-results", str(tmp_path / "none.json")])
    saved = tmp_path / "fidelity.json"
    saved.write_text("{}")
    assert bench_run.parse_args(["--steps", "fidelity", "--fidelity-results", str(saved)]).fidelity_results == [saved]
