"""The run writes report.json from its typed report exactly as the producer built it, and renders the other reports
from that same report. The producer's blocks come from frozen records and hold tuples that the strict typed fields
would refuse (a run once ended in exit 2 after every stage had finished): the schema's blocks take them as the lists
report.json holds."""

import json
from pathlib import Path

from harness.pipeline import write_outputs
from harness.report.schema import RunReport

FIXTURE = Path(__file__).parent / "fixtures" / "run_example" / "report.json"
OUTPUTS = ("report.json", "report.md", "report.html", "junit.xml", "scores.csv")


def _tuples(value):
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def test_a_report_document_that_holds_tuples_is_built_and_written(tmp_path):
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    report = RunReport.model_validate(_tuples(document))
    write_outputs(tmp_path, report, ())
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8")) == document
    for name in OUTPUTS:
        assert (tmp_path / name).stat().st_size > 0, name


def test_report_json_is_the_typed_report_byte_for_byte(tmp_path):
    """Fields as given (none added, none dropped), each block's keys in the order built, and integers as integers
    (a float field reads 2875 as 2875.0)."""
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    document["wall_s"] = 2875
    document["model"] = dict(reversed(document["model"].items()))
    write_outputs(tmp_path, RunReport.model_validate(document), ())
    assert (tmp_path / "report.json").read_text(encoding="utf-8") == json.dumps(document, indent=2,
                                                                                ensure_ascii=False) + "\n"
