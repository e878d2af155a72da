"""The demo recipe with the no-bf16 path forced (QUANTGATE_FORCE_NO_BF16=1: float32 calibration and compute), whatever
this CPU has. Its own file: on a CPU with bf16 units its run shares nothing costly with the native one, so it runs
on the other xdist worker (tests/conftest.py)."""

import pytest

from test_pipeline_e2e import check_every_format_ran, check_the_report_validates

pytestmark = pytest.mark.slow


def test_every_format_of_the_demo_recipe_runs_without_bf16(demo_run_no_bf16):
    _, report, _ = demo_run_no_bf16
    assert report["device"]["bf16_matmul"] is False
    assert report["formats"]["baseline"]["compute_dtype"] == "float32"
    check_every_format_ran(report)


def test_the_no_bf16_report_validates_against_the_published_schema(demo_run_no_bf16):
    check_the_report_validates(demo_run_no_bf16[1])
