"""harness/units.py, the one byte/duration/number formatter, in each caller's style."""

import math

import pytest

from harness import decide
from harness.measure import oom
from harness.units import DASH, MINUS, format_bytes, format_ms, format_number, format_signed, is_number

GIB, MIB, KIB = 2**30, 2**20, 2**10


def test_is_number():
    assert is_number(1) and is_number(-2.5) and is_number(0)
    assert not any(is_number(v) for v in (None, True, False, "1", math.nan, math.inf, -math.inf, [1]))


@pytest.mark.parametrize(("size", "text"), [
    (None, DASH), ("12", DASH), (math.nan, DASH), (True, DASH),
    (0, "0 B"), (1023, "1023 B"), (512.7, "512 B"), (1536, "1.5 KiB"), (3.5 * MIB, "3.5 MiB"),
    (int(14.2e9), "13.22 GiB"), (1.5 * GIB, "1.50 GiB"), (4 * 2**40, "4096.00 GiB"), (-1536, "-1.5 KiB"),
    (-2 * GIB, "-2.00 GiB"),
])
def test_format_bytes_defaults_are_the_reports(size, text):
    assert format_bytes(size) == text


def test_format_bytes_options():
    assert format_bytes(None, missing="n/a") == "n/a"
    assert format_bytes(500, smallest="MiB") == "0.0 MiB"
    assert format_bytes(3 * KIB, smallest="MiB") == "0.0 MiB"
    assert format_bytes(500, smallest="KiB") == "0.5 KiB"
    assert format_bytes(1536, digits=2) == "1.50 KiB"
    assert format_bytes(GIB, digits=1) == "1.0 GiB"
    assert format_bytes(100, byte_unit="bytes") == "100 bytes"


@pytest.mark.parametrize(("size", "verdict_text", "oom_text"), [
    (None, "n/a", "?"), (0, "0.0 MiB", "0 bytes"), (512, "0.0 MiB", "512 bytes"), (1536, "0.0 MiB", "1.50 KiB"),
    (301.06 * MIB, "301.1 MiB", "301.06 MiB"), (1.5 * GIB, "1.50 GiB", "1.50 GiB"),
    (79.1 * GIB, "79.10 GiB", "79.10 GiB"),
])
def test_each_caller_keeps_its_own_text(size, verdict_text, oom_text):
    assert decide.format_bytes(size) == verdict_text  # verdict reasons and `quantgate compare`: MiB and up
    assert oom._fmt(size) == oom_text  # OOM reasons: PyTorch's style, two decimals and "bytes"


def test_plan_sizes():
    from harness.commands import plan

    assert plan.format_bytes(160 * KIB) == "160.0 KiB"  # `quantgate plan` uses the report's style


@pytest.mark.parametrize(("ms", "report_text", "verdict_text"), [
    (None, DASH, "n/a"), (12.34, "12.3 ms", "12.3 ms"), (999.9, "999.9 ms", "999.9 ms"),
    (1000, "1.00 s", "1000.0 ms"), (1500, "1.50 s", "1500.0 ms"), (math.inf, DASH, "n/a"),
])
def test_format_ms(ms, report_text, verdict_text):
    assert format_ms(ms) == report_text
    assert format_ms(ms, missing="n/a", seconds=False) == verdict_text == decide.format_ms(ms)


def test_format_number():
    assert format_number(1.25, 2) == "1.25"
    assert format_number(-1.25) == f"{MINUS}1.2"  # Python rounds the binary value, half to even at .x5
    assert format_number(-0.04) == "0.0"  # no minus on a value shown as zero
    assert format_number(None) == DASH and format_number(None, missing="n/a") == "n/a"
    assert decide.num(-3.0) == f"{MINUS}3.0" and decide.num(None) == "n/a" and decide.num(-0.01) == "0.0"
    assert format_number(7, 0) == "7"


def test_format_signed():
    assert format_signed(0.5) == "+0.5"
    assert format_signed(-1.2) == f"{MINUS}1.2"
    assert format_signed(0.04) == format_signed(-0.04) == format_signed(0) == "0.0"
    assert format_signed(0, plus_zero=True) == "+0.0"
    assert format_signed(None) == DASH
    assert format_signed(-0.04) == "0.0" and format_signed(2, 2) == "+2.00"
    assert decide.signed(0.0) == "+0.0" and decide.signed(-0.01) == "+0.0" and decide.signed(None) == "n/a"
    assert decide.signed(-2.0) == f"{MINUS}2.0" and decide.signed(1.26, 2) == "+1.26"


@pytest.mark.parametrize(("size", "text"), [
    (0.5 * GIB, "0.50 GiB"), (0.09 * GIB, "92.2 MiB"), (3 * GIB, "3.00 GiB"), (500, "0.0 MiB"), (-0.2 * GIB, "-0.20 GiB"),
])
def test_plan_sizes_use_gib_from_a_tenth_of_one(size, text):
    from harness.capacity.common import gib

    assert gib(size) == text == format_bytes(size, smallest="MiB", from_fraction=0.1)
