"""A small real run of the demo model keeps the verdicts and scores it had before the pipeline was split into
named stages (tests/fixtures/golden_small_run.json was written from that run)."""

import json
from pathlib import Path

import pytest

from conftest import quantgate

GOLDEN = Path(__file__).parent / "fixtures" / "golden_small_run.json"


@pytest.mark.slow
def test_a_small_demo_run_keeps_its_verdicts_and_scores(demo_cache, tmp_path):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    quantgate("run", *golden["command"], "--out", str(tmp_path), cache=demo_cache)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    produced = {name: {"verdict": entry["verdict"], "scores": entry["scores"]}
                for name, entry in report["formats"].items()}
    assert json.loads(json.dumps(produced)) == golden["formats"]
