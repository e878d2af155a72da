"""The run writes its reports from report.json as written: the in-memory report holds tuples (frozen records) that
the strict typed readers would refuse, and a run once ended in exit 2 after every stage had finished."""

import json
from pathlib import Path

from harness.pipeline import write_outputs

FIXTURE = Path(__file__).parent / "fixtures" / "run_example" / "report.json"


def _tuples(value):
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def test_reports_render_from_a_report_that_holds_tuples(tmp_path):
    report = json.loads(FIXTURE.read_text(encoding="utf-8"))
    written = write_outputs(tmp_path, _tuples(report), ())
    assert written == report
    for name in ("report.json", "report.md", "report.html", "junit.xml", "scores.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
