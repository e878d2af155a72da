"""A small real run of the demo model keeps the verdicts and scores it had before the pipeline was split into
named stages. tests/fixtures/golden_small_run.json was written by that code (commit 0c86287) on the no-bf16 path
(QUANTGATE_FORCE_NO_BF16=1: float32 compute), which every CPU takes alike; a bf16 golden held only on CPUs with
bf16 units (greedy decoding flips near-tie tokens between bf16 kernels)."""

import json
from pathlib import Path

import pytest

from conftest import NO_BF16, quantgate

GOLDEN = Path(__file__).parent / "fixtures" / "golden_small_run.json"


@pytest.mark.slow
def test_a_small_demo_run_keeps_its_verdicts_and_scores(demo_cache, tmp_path):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    quantgate("run", *golden["command"], "--out", str(tmp_path), cache=demo_cache, env=NO_BF16)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["device"]["bf16_matmul"] is False
    produced = {name: {"verdict": entry["verdict"], "scores": entry["scores"]}
                for name, entry in report["formats"].items()}
    assert json.loads(json.dumps(produced)) == golden["formats"]
