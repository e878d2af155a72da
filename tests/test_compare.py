from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from harness.commands import compare
from harness.errors import UserError

GIB = 1024**3


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
    }


OLD = {
    "schema_version": 1,
    "formats": {
        "baseline": fmt("BASELINE", 60.0, peak=2 * GIB, ttft=100.0),
        "int8": fmt("GO", 59.5, -0.5, "pass", peak=GIB, ttft=150.0),
        "gptq": fmt("GO", 59.0, -1.0, "pass", peak=GIB // 2, ttft=80.0),
        "awq": fmt("INCONCLUSIVE", 58.0, -2.0, "inconclusive", peak=GIB // 2, ttft=80.0),
    },
    "recommendation": {"format": "gptq", "why": "...", "runner_up": "int8"},
}


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


def run_compare(old: Path, new: Path) -> int:
    parser = argparse.ArgumentParser()
    compare.add_parser(parser.add_subparsers())
    args = parser.parse_args(["compare", str(old), str(new)])
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


def test_added_and_removed_formats_are_listed_without_failing(tmp_path, capsys):
    new = copy.deepcopy(OLD)
    del new["formats"]["int8"]
    new["formats"]["hqq"] = fmt("NO-GO", 40.0, -20.0, "fail")
    assert run_compare(write(tmp_path, "old.json", OLD), write(tmp_path, "new.json", new)) == 0
    out = capsys.readouterr().out
    assert "int8: GO \u2192 (not in the new report)" in out
    assert "hqq: (new) NO-GO" in out


def test_go_to_inconclusive_also_exits_1():
    new = copy.deepcopy(OLD)
    new["formats"]["int8"]["verdict"] = "INCONCLUSIVE"
    changes = compare.compare_reports(OLD, new)
    assert changes["regressed"] == ["int8"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a quantgate report"),
        ({"schema_version": 2, "formats": {}}, "schema_version 2 is not supported (expected 1)"),
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
