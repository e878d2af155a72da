"""A small real run of the demo model keeps the verdicts and scores it had before the pipeline was split into
named stages. tests/fixtures/golden_small_run.json was written by that code (commit 0c86287) on an AVX2-only CPU
without bf16 units (float32 compute). The run takes that CPU's path on any x86 CPU with QUANTGATE_FORCE_AVX2=1:
float32 compute, and torch, oneDNN and MKL in their AVX2 code. The AVX2 code matters: on an AVX-512 CPU
bitsandbytes computes LLM.int8's matmul exactly (torch._int_mm), on an AVX2 one in float32, and int8's greedy
outputs differ (an AVX512-BF16 EPYC with float32 compute alone scored int8 differently; with the switch, exactly as
the fixture). A bf16 golden held only on CPUs with bf16 units (greedy decoding flips near-tie tokens between bf16
kernels)."""

import json
from pathlib import Path

import pytest

from conftest import quantgate

GOLDEN = Path(__file__).parent / "fixtures" / "golden_small_run.json"
AVX2_CPU = {"QUANTGATE_FORCE_AVX2": "1"}


@pytest.mark.slow
def test_a_small_demo_run_keeps_its_verdicts_and_scores(demo_cache, tmp_path):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    quantgate("run", *golden["command"], "--out", str(tmp_path), cache=demo_cache, env=AVX2_CPU)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["device"]["bf16_matmul"] is False and report["device"]["cpu_capability"] == "AVX2"
    produced = {name: {"verdict": entry["verdict"], "scores": entry["scores"]}
                for name, entry in report["formats"].items()}
    assert json.loads(json.dumps(produced)) == golden["formats"]
