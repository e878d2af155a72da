from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from harness.commands import compare
from harness.errors import UserError
from harness.report.schema import parse_report

GIB = 1024**3
EXAMPLE = Path(__file__).parent / "fixtures" / "run_example" / "report.json"


def example(**edits) -> dict:
    """tests/fixtures/run_example/report.json (int8 GO, gptq INCONCLUSIVE, awq failed), edited in place."""
    report = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    for key, value in edits.items():
        report[key] = value
    return report


def parsed(report: dict):
    return parse_report(report, "test report")


def score(value, delta=None, status=None):
    return {"value": value, "delta": delta, "ci_low": None, "ci_high": None, "n": 30, "margin": 2.0, "mde": 3.0,
            "p_value": None, "method": "t", "gated": status is not None, "status": status}


def fmt(verdict, f1, delta=None, status=None, peak=None, ttft=None, reasons=()):
    return {
        "role": "baseline" if verdict == "BASELINE" else "candidate",
        "status": "ok",
        "error": None,
        "verdict": verdict,
        "reasons": list(reasons),
        "checks": [],
        "memory": {"device": "cpu", "peak_bytes": peak},
        "latency": {"ttft_ms": {"p50": None, "p95": ttft}, "tpot_ms": {"p50": None, "p95": 20.0}},
        "scores": {"en_faq": {"f1": score(f1, delta, status)}},
        "artifact": None,
        "capacity": None,
        "generation": None,
    }


OLD = example(  # a version-1 report (latency as the top-level copies only) with these formats
    schema_version=1,
    formats={
        "baseline": fmt("BASELINE", 60.0, peak=2 * GIB, ttft=100.0),
        "int8": fmt("GO", 59.5, -0.5, "pass", peak=GIB, ttft=150.0),
        "gptq": fmt("GO", 59.0, -1.0, "pass", peak=GIB // 2, ttft=80.0),
        "awq": fmt("INCONCLUSIVE", 58.0, -2.0, "inconclusive", peak=GIB // 2, ttft=80.0),
    },
    recommendation={"format": "gptq", "why": "...", "runner_up": "int8"},
)


def new_report():
    new = copy.deepcopy(OLD)
    new["formats"]["gptq"] = fmt(
        "NO-GO", 52.0, -8.0, "fail", peak=GIB // 2 + 64 * 2**20, ttft=80.0,
        reasons=["en_faq/f1: \u22128.0 points [\u221210.1, \u22125.9] is worse than the \u22122.0 margin"],
    )
    new["formats"]["awq"] = fmt("GO", 59.8, -0.2, "pass", peak=GIB // 2, ttft=80.0)
    new["formats"]["int8"]["latency"]["ttft_ms"]["p95"] = 165.0
    new["recommendation"] = {"format": "awq", "why": "...", "runner_up": "int8"}
    return new


def write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def run_compare(*paths: Path, flags: tuple[str, ...] = ()) -> int:
    parser = argparse.ArgumentParser()
    compare.add_parser(parser.add_subparsers())
    args = parser.parse_args(["compare", *map(str, paths), *flags])
    return args.func(args)


def test_go_to_no_go_is_listed_first_and_exits_1(tmp_path, capsys):
    assert run_compare(write(tmp_path, "old.json", OLD), write(tmp_path, "new.json", new_report())) == 1
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    verdicts = lines[lines.index("Verdicts:") + 1 : lines.index("Scores:")]
    assert verdicts == [
        "gptq: GO \u2192 NO-GO (en_faq/f1: \u22128.0 points [\u221210.1, \u22125.9] is worse than the \u22122.0 margin)",
        "awq: INCONCLUSIVE \u2192 GO",
    ]
    assert "gptq en_faq/f1: 59.0 \u2192 52.0 (\u22127.0); delta vs baseline \u22121.0 \u2192 \u22128.0; pass \u2192 fail" in lines
    assert "gptq peak memory: 512.0 MiB \u2192 576.0 MiB (+12.5%)" in lines
    assert "int8 TTFT p95: 150.0 ms \u2192 165.0 ms (+10.0%)" in lines
    assert "gptq \u2192 awq" in lines
    assert lines[-1] == "no longer GO: gptq"
    assert lines.index("Verdicts:") < lines.index("Scores:") < lines.index("Memory:") < lines.index("Latency:")


def test_improvements_only_exit_0(tmp_path, capsys):
    new = copy.deepcopy(OLD)
    new["formats"]["awq"] = fmt("GO", 59.8, -0.2, "pass", peak=GIB // 2, ttft=80.0)
    assert run_compare(write(tmp_path, "old.json", OLD), write(tmp_path, "new.json", new)) == 0
    out = capsys.readouterr().out
    assert "awq: INCONCLUSIVE \u2192 GO" in out and "no longer GO" not in out


def test_identical_reports_say_no_changes(tmp_path, capsys):
    path = write(tmp_path, "r.json", OLD)
    assert run_compare(path, path) == 0
    assert "no changes" in capsys.readouterr().out


def test_added_and_removed_formats_are_listed(tmp_path, capsys):
    new = copy.deepcopy(OLD)
    del new["formats"]["awq"]  # was INCONCLUSIVE: listed, no regression
    new["formats"]["hqq"] = fmt("NO-GO", 40.0, -20.0, "fail")
    assert run_compare(write(tmp_path, "old.json", OLD), write(tmp_path, "new.json", new)) == 0
    out = capsys.readouterr().out
    assert "awq: INCONCLUSIVE \u2192 (not in the new report)" in out
    assert "hqq: (new) NO-GO" in out


def test_a_go_format_missing_from_the_new_report_is_a_regression(tmp_path, capsys):
    new = copy.deepcopy(OLD)
    del new["formats"]["int8"]  # nothing measured it: no evidence that it still works
    assert run_compare(write(tmp_path, "old.json", OLD), write(tmp_path, "new.json", new)) == 1
    out = capsys.readouterr().out
    assert "int8: GO \u2192 (not in the new report)" in out
    assert out.strip().splitlines()[-1] == "no longer GO: int8"


def test_go_to_inconclusive_also_exits_1():
    new = copy.deepcopy(OLD)
    new["formats"]["int8"]["verdict"] = "INCONCLUSIVE"
    changes = compare.compare_reports(parsed(OLD), parsed(new))
    assert changes.regressed == ["int8"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a quantgate report"),
        ({"schema_version": 3, "formats": {}}, "schema_version 3 is not supported (expected 1 or 2)"),
        ({"schema_version": 1}, "field 'formats'"),
        ({"schema_version": 1, "formats": {"int8": {"status": "ok"}}}, "formats.int8: expected an object with a 'verdict'"),
        ({"schema_version": 1, "formats": {"int8": {"verdict": "GO", "scores": [1]}}}, "formats.int8.scores"),
    ],
)
def test_bad_reports_are_user_errors_naming_the_file(tmp_path, content, expected):
    bad = write(tmp_path, "bad.json", content)
    with pytest.raises(UserError) as err:
        run_compare(write(tmp_path, "old.json", OLD), bad)
    assert str(err.value).startswith(f"{bad}: ") and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_report_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        run_compare(tmp_path / "missing.json", write(tmp_path, "new.json", OLD))


# --- real reports: comparability, failed formats, trends ------------------------------------------------------

ARROW = "\u2192"
CALIBRATION = {"source": "bundled corpus", "texts": 128, "tokens_mean": 301.5, "tokens_min": 257,
               "hash": "sha256:" + "4" * 64, "overlap": None}


def edited(edit) -> dict:
    report = example()
    edit(report)
    return report


def set_at(*path_and_value):
    *path, value = path_and_value

    def edit(report):
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def lines_of(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip()]


INCOMPARABLE = [
    (set_at("model", "fingerprint", "sha256:" + "0" * 64),
     f"model fingerprint: sha256:5f1c0a9e3b7d\u2026 {ARROW} sha256:000000000000\u2026"),
    (set_at("evalsets", "zh_billing_qa", "hash", "sha256:" + "1" * 64),
     f"evalset zh_billing_qa contents (hash): sha256:3c4d5e6f7081\u2026 {ARROW} sha256:111111111111\u2026"),
    (lambda r: r["evalsets"].pop("en_ticket_summaries"),
     f"evalset en_ticket_summaries: evaluated (6 items) {ARROW} not evaluated"),
    (lambda r: r["evalsets"].__setitem__("fr_faq", dict(r["evalsets"]["en_support_qa"], n=40)),
     f"evalset fr_faq: not evaluated {ARROW} evaluated (40 items)"),
    (set_at("evalsets", "en_support_qa", "n", 4), f"evalset en_support_qa items evaluated: 6 {ARROW} 4"),
    (set_at("evalsets", "en_support_qa", "gate", ["em"]), f"evalset en_support_qa gate: [f1] {ARROW} [em]"),
    (set_at("evalsets", "en_support_qa", "metrics", ["em", "f1"]),
     f"evalset en_support_qa metrics: [contains, em, f1] {ARROW} [em, f1]"),
    (set_at("evalsets", "zh_billing_qa", "tokenizer", "rouge-score default"),
     f"evalset zh_billing_qa tokenizer: char-cjk+word-latin {ARROW} rouge-score default"),
    (set_at("settings", "max_new_tokens", 16), f"evalset en_support_qa max_new_tokens: 48 {ARROW} 16"),
]


@pytest.mark.parametrize(("edit", "expected"), INCOMPARABLE)
def test_incomparable_reports_exit_2_listing_the_difference(tmp_path, capsys, edit, expected):
    old, new = write(tmp_path, "old.json", example()), write(tmp_path, "new.json", edited(edit))
    with pytest.raises(UserError) as err:
        run_compare(old, new)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert f"{old} {ARROW} {new}: not comparable (" in str(err.value) and "--allow-changes" in str(err.value)
    lines = lines_of(capsys.readouterr().out)
    assert lines[1].startswith("Not comparable") and lines[2] == expected
    assert "Verdicts:" not in lines and "no changes" not in lines  # nothing is compared


@pytest.mark.parametrize(("edit", "expected"), INCOMPARABLE[:3])
def test_allow_changes_lists_them_as_warnings_and_compares(tmp_path, capsys, edit, expected):
    new = edited(edit)
    new["formats"]["int8"]["verdict"] = "NO-GO"
    code = run_compare(write(tmp_path, "old.json", example()), write(tmp_path, "new.json", new),
                       flags=("--allow-changes",))
    assert code == 1  # the regression still counts
    lines = lines_of(capsys.readouterr().out)
    assert lines[1] == "Warnings:"
    assert f"{expected} (scores not comparable; compared anyway: --allow-changes)" in lines
    assert lines.index("Warnings:") < lines.index("Verdicts:")


WARNINGS = [
    (set_at("device", "name", "NVIDIA H100 80GB HBM3"), f"device name: NVIDIA H200 {ARROW} NVIDIA H100 80GB HBM3"),
    (set_at("device", "threads", 16), f"device threads: 8 {ARROW} 16"),
    (set_at("environment", "torch", "2.14.0+cu128"), f"environment torch: 2.13.0+cu128 {ARROW} 2.14.0+cu128"),
    (lambda r: r["environment"].pop("optimum"), f"environment optimum: 2.3.0 {ARROW} (not recorded)"),
    (lambda r: r["policy"]["margins"].__setitem__("f1", 1.0), f"policy margins f1: 2 {ARROW} 1"),
    (lambda r: r["formats"]["gptq"]["artifact"]["manifest"]["versions"].__setitem__("gptqmodel", "7.7.0"),
     f"gptq versions gptqmodel: 7.6.0 {ARROW} 7.7.0"),
    (lambda r: r["formats"]["gptq"]["artifact"]["manifest"]["recipe"].__setitem__("group_size", 64),
     f"gptq recipe group_size: 128 {ARROW} 64"),
    (lambda r: r["formats"]["gptq"]["artifact"]["manifest"].__setitem__("calibration_hash", "sha256:" + "2" * 64),
     f"gptq calibration hash: sha256:77a0c1d2e3f4\u2026 {ARROW} sha256:222222222222\u2026"),
    (lambda r: r["formats"]["gptq"].__setitem__("calibration", dict(CALIBRATION)),
     f'gptq calibration: (not recorded) {ARROW} {{"hash": "sha256:{"4" * 64}", "overlap": null, '
     f'"source": "bundled corpus", "texts": 128, "tokens_mean": 301.5, "tokens_min": 257}}'),
]


@pytest.mark.parametrize(("edit", "expected"), WARNINGS)
def test_setting_and_version_changes_are_warnings_printed_first(tmp_path, capsys, edit, expected):
    assert run_compare(write(tmp_path, "old.json", example()), write(tmp_path, "new.json", edited(edit))) == 0
    lines = lines_of(capsys.readouterr().out)
    assert lines[1:3] == ["Warnings:", expected]
    assert lines[-1] == "no changes in verdicts, scores, memory or latency"


def test_calibration_is_compared_when_both_have_it(tmp_path, capsys):
    old, new = example(), example()
    for report in (old, new):
        report["formats"]["gptq"]["calibration"] = dict(CALIBRATION)
    new["formats"]["gptq"]["calibration"].update(source="/data/traffic-sample.jsonl", tokens_min=12)
    assert run_compare(write(tmp_path, "old.json", old), write(tmp_path, "new.json", new)) == 0
    lines = lines_of(capsys.readouterr().out)
    assert lines[1:4] == ["Warnings:", f"gptq calibration source: bundled corpus {ARROW} /data/traffic-sample.jsonl",
                          f"gptq calibration tokens_min: 257 {ARROW} 12"]
    assert compare.find_differences(parsed(old), parsed(old)) == []  # the same block is no difference


def test_recipe_change_warns_and_reports_the_score_changes(tmp_path, capsys):
    new = example()
    new["formats"]["gptq"]["artifact"]["manifest"]["recipe"]["group_size"] = 32
    new["formats"]["gptq"]["scores"]["en_support_qa"]["f1"].update(value=95.0, delta=-1.67, status="pass")
    new["formats"]["gptq"]["verdict"] = "GO"
    assert run_compare(write(tmp_path, "old.json", example()), write(tmp_path, "new.json", new)) == 0
    lines = lines_of(capsys.readouterr().out)
    assert lines.index(f"gptq recipe group_size: 128 {ARROW} 32") < lines.index("Verdicts:")
    assert f"gptq: INCONCLUSIVE {ARROW} GO" in lines
    assert (f"gptq en_support_qa/f1: 80.0 {ARROW} 95.0 (+15.0); delta vs baseline \u221216.7 {ARROW} \u22121.7; "
            f"inconclusive {ARROW} pass") in lines


def test_a_go_format_that_failed_is_a_regression_whatever_its_verdict_says(tmp_path, capsys):
    new = example()
    new["formats"]["int8"].update(status="failed", error="int8 measure: worker exited with signal 9", reasons=[])
    assert run_compare(write(tmp_path, "old.json", example()), write(tmp_path, "new.json", new)) == 1
    lines = lines_of(capsys.readouterr().out)
    assert f"int8: GO {ARROW} NO-GO (status failed: int8 measure: worker exited with signal 9)" in lines
    assert lines[-1] == "no longer GO: int8"


def test_latency_changes_read_batch_1_before_the_deprecated_top_level_copy(tmp_path, capsys):
    new = example()
    new["formats"]["int8"]["latency"]["batch_1"]["ttft_ms"]["p95"] = 84.7  # the copy still says 77.0
    assert run_compare(write(tmp_path, "old.json", example()), write(tmp_path, "new.json", new)) == 0
    assert f"int8 TTFT p95: 77.0 ms {ARROW} 84.7 ms (+10.0%)" in lines_of(capsys.readouterr().out)


def test_real_report_against_itself_has_no_changes(capsys):
    assert run_compare(EXAMPLE, EXAMPLE.parent) == 0  # a run directory stands for its report.json
    assert lines_of(capsys.readouterr().out)[-1] == "no changes"


VERSION_1 = Path(__file__).parent / "fixtures" / "report_v1.json"


def test_a_version_1_report_compares_with_a_version_2_report(capsys):
    """The run example as version 1 (before checks carried their reason) against the same run as version 2."""
    assert json.loads(VERSION_1.read_text(encoding="utf-8"))["schema_version"] == 1
    assert json.loads(EXAMPLE.read_text(encoding="utf-8"))["schema_version"] == 2
    assert run_compare(VERSION_1, EXAMPLE) == 0
    assert lines_of(capsys.readouterr().out)[-1] == "no changes"
    assert run_compare(EXAMPLE, VERSION_1) == 0


def test_shared_baseline_report_reads(tmp_path, capsys):
    shared = Path(__file__).parents[1] / "reports" / "shared-baseline" / "report.json"
    with pytest.raises(UserError, match="not comparable"):  # another model, other evalsets, another device
        run_compare(EXAMPLE, shared)
    out = capsys.readouterr().out
    assert "model fingerprint: " in out and "evalset squad_200: not evaluated" in out and "device kind: cuda" in out


# --- trend ----------------------------------------------------------------------------------------------------

def week(created_at: str, int8_f1: float, int8_delta: float, int8_verdict: str, status: str) -> dict:
    report = example(created_at=created_at)
    report["formats"]["int8"]["verdict"] = int8_verdict
    report["formats"]["int8"]["scores"]["en_support_qa"]["f1"].update(value=int8_f1, delta=int8_delta, status=status)
    return report


def runs_dir(tmp_path: Path, reports: dict[str, dict]) -> Path:
    root = tmp_path / "runs"
    for name, report in reports.items():
        (root / name).mkdir(parents=True)
        write(root / name, "report.json", report)
    (root / "crashed-run").mkdir()  # no report.json: not a run
    return root


WEEKS = {  # directory names sort differently from the runs' times: the order is created_at's
    "b-second": week("2026-12-09T18:00:00Z", 98.0, 1.33, "GO", "pass"),
    "a-first": week("2026-12-02T18:00:00Z", 100.0, 3.33, "GO", "pass"),
    "c-third": week("2026-12-16T18:00:00Z", 80.0, -16.67, "NO-GO", "fail"),
}


def test_directory_of_runs_prints_the_trend_oldest_first(tmp_path, capsys):
    root = runs_dir(tmp_path, WEEKS)
    (root / "latest").symlink_to(root / "c-third", target_is_directory=True)  # the same run, counted once
    assert run_compare(root) == 1  # int8 GO -> NO-GO between the last two
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"3 runs, oldest first: {root / 'a-first' / 'report.json'} \u2026 {root / 'c-third' / 'report.json'}"
    assert [line.split()[0] for line in lines if line.startswith("  #")] == ["#1", "#2", "#3"]
    assert f"  #2  2026-12-09T18:00:00Z  {root / 'b-second' / 'report.json'}" in lines
    int8 = lines[lines.index("  int8") + 1: lines.index("  int8") + 4]
    assert int8[0].split() == ["#1", "#2", "#3"]
    assert int8[1].split() == ["verdict", "GO", "GO", f"GO{ARROW}NO-GO"]
    assert int8[2].split() == ["en_support_qa/f1", "100.0", "(+3.3)", "98.0", "(+1.3)", "80.0", "(\u221216.7)"]
    awq = lines[lines.index("  awq") + 1: lines.index("  awq") + 3]
    assert awq[1].split() == ["verdict", "NO-GO", "NO-GO", "NO-GO"]  # failed: no gated scores to show
    baseline = lines[lines.index("  baseline") + 1: lines.index("  baseline") + 5]
    assert baseline[2].split() == ["en_support_qa/f1", "96.7", "96.7", "96.7"]  # no delta for the baseline itself
    assert f"Changes #2{ARROW}#3 ({root / 'b-second' / 'report.json'} {ARROW} {root / 'c-third' / 'report.json'}):" in lines
    assert lines.index("  int8") < lines.index("Verdicts:") and lines[-1] == "no longer GO: int8"


def test_trend_rules_between_the_last_two_and_warnings_for_every_pair(tmp_path, capsys):
    reports = [copy.deepcopy(WEEKS[k]) for k in ("a-first", "b-second", "c-third")]
    reports[0]["evalsets"]["zh_billing_qa"]["hash"] = "sha256:" + "1" * 64  # an older run on an older set
    reports[2]["device"]["name"] = "NVIDIA H100"
    reports[2]["formats"]["int8"] = reports[1]["formats"]["int8"]  # int8 stays GO
    paths = [write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reports)]
    assert run_compare(*paths) == 0  # the earlier pair is not comparable: a warning; the last pair is
    lines = lines_of(capsys.readouterr().out)
    warnings = lines[lines.index("Warnings:") + 1: lines.index("Runs (oldest first):")]
    assert warnings == [
        f"#1{ARROW}#2 evalset zh_billing_qa contents (hash): sha256:111111111111\u2026 {ARROW} "
        f"sha256:3c4d5e6f7081\u2026 (scores not comparable)",
        f"#2{ARROW}#3 device name: NVIDIA H200 {ARROW} NVIDIA H100",
    ]


def test_trend_refuses_an_incomparable_last_pair(tmp_path, capsys):
    reports = [WEEKS["a-first"], WEEKS["b-second"], copy.deepcopy(WEEKS["c-third"])]
    reports[2]["model"]["fingerprint"] = "sha256:" + "0" * 64
    with pytest.raises(UserError, match="not comparable \\(model fingerprint changed\\)"):
        run_compare(*[write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reports)])
    lines = lines_of(capsys.readouterr().out)
    assert lines[2].startswith(f"#2{ARROW}#3 model fingerprint: ")


def test_html_trend_page_is_self_contained_with_a_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    page = tmp_path / "trend.html"
    assert run_compare(runs_dir(tmp_path, WEEKS), flags=("--html", str(page))) == 1
    assert f"trend page: {page}" in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert html.count('src="data:image/png;base64,') == 1 and "could not draw" not in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "Content-Security-Policy" in html and "No longer GO in the last run: int8" in html
    assert f'<td class="v-nogo turn">GO{ARROW}NO-GO</td>' in html
    assert "<td>80.0 (\u221216.7)</td>" in html


def test_html_for_two_runs_and_a_bad_destination(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="--html .*: cannot write"):
        run_compare(EXAMPLE, EXAMPLE, flags=("--html", str(tmp_path / "no-dir" / "t.html")))
    assert run_compare(EXAMPLE, EXAMPLE, flags=("--html", str(tmp_path / "t.html"))) == 0
    assert "data:image/png;base64," in (tmp_path / "t.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: write(d, "config.json", {"model_type": "llama", "hidden_size": 64}),
         "not a quantgate report (no 'schema_version' field)"),
        (lambda d: write(d, "other.json", {"schema_version": 1, "tool": {"name": "lm-eval"}, "formats": {}}),
         "not a quantgate report"),
        (lambda d: (d / "empty-dir").mkdir() or d / "empty-dir", "no report.json in this directory or its subdirectories"),
        (lambda d: runs_dir(d, {"only-run": example()}), "only one report to compare"),
        (lambda d: write(d, "r.json", {"schema_version": True, "formats": {}}), "schema_version True is not supported"),
    ],
)
def test_inputs_that_are_not_reports(tmp_path, make, expected):
    path = make(tmp_path)
    with pytest.raises(UserError) as err:
        run_compare(path) if expected.startswith("only one") else run_compare(EXAMPLE, path)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_directory_of_runs_without_times_cannot_be_ordered(tmp_path):
    reports = {"a": example(), "b": example(created_at="last tuesday")}
    with pytest.raises(UserError, match="field 'created_at': 'last tuesday' is not an ISO time"):
        run_compare(runs_dir(tmp_path, reports))
