"""--resume continues a run with the settings it saved: a flag that would change them is refused in one line,
never silently dropped; a flag that repeats the saved value is fine."""

import argparse
import json

import pytest

from conftest import quantgate
from harness.commands.run import add_parser, flag_values, refuse_conflicting_flags
from harness.config import RunSpec
from harness.errors import UserError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def saved_run(tmp_path, **values):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(RunSpec(out=str(out), **values).model_dump()))
    return out


def test_resume_with_a_changed_flag_is_refused_naming_it(tmp_path):
    out = saved_run(tmp_path, batch_size=8)
    result = quantgate("run", "--resume", "--out", str(out), "--batch-size", "4", "--seed", "3",
                       cache=tmp_path / "cache", check_codes=(2,))
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "--batch-size 4 (saved: 8)" in line and "--seed 3 (saved: 0)" in line and "another --out" in line


def test_resume_with_the_saved_values_is_accepted(tmp_path):
    out = saved_run(tmp_path, batch_size=4, formats=["baseline", "int8"])
    spec = RunSpec(**json.loads((out / "run.json").read_text()))
    args = parse("--resume", "--out", str(out), "--batch-size", "4", "--formats", "int8", "--quiet")
    overrides, capacity = flag_values(args)
    refuse_conflicting_flags(spec, overrides, capacity, None, out / "run.json")  # no error


def test_resume_refuses_a_changed_capacity_flag_and_a_config(tmp_path):
    out = saved_run(tmp_path)
    spec = RunSpec(**json.loads((out / "run.json").read_text()))
    overrides, capacity = flag_values(parse("--resume", "--out", str(out), "--gpu-memory-gib", "24"))
    with pytest.raises(UserError, match=r"--gpu-memory-gib 24.0 \(saved: not set\)"):
        refuse_conflicting_flags(spec, overrides, capacity, None, out / "run.json")
    with pytest.raises(UserError, match="--config cannot change it"):
        refuse_conflicting_flags(spec, {}, {}, "run.toml", out / "run.json")


def test_capacity_overhead_is_settable_from_the_cli_and_the_config(tmp_path):
    from harness.commands.run import spec_from_args

    spec = spec_from_args(parse("--capacity-overhead-gib", "1.5", "--out", str(tmp_path / "o")))
    assert spec.capacity.overhead_gib == 1.5
    config = tmp_path / "run.toml"
    config.write_text("[capacity]\noverhead_gib = 0.75\n")
    assert spec_from_args(parse("--config", str(config))).capacity.overhead_gib == 0.75
