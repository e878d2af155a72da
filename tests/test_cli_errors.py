"""Bad input through the real CLI: exit 2, one line on stderr naming the file/field, no traceback, no run.json
left behind for --resume. Each case stops before any model is loaded (a few seconds each)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, quantgate
from harness.commands.run import saved_spec
from harness.errors import UserError
from harness.metrics import ALL_METRICS
from harness.policy import load_policy
from harness.quantize import choose_group_size


def fails_with_one_line(result) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def tiny_checkpoint(path, config: dict, tokenizer_config: dict | None = None):
    """A model directory that passes the source checks but that nothing could load (the weights are fake)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (path / "model.safetensors").write_bytes(b"not really weights")
    return path


AUTO_MAP = {"auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}}


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_model_with_custom_code_needs_trust_remote_code(tmp_path, where):
    config, tokenizer_config = (AUTO_MAP, None) if where == "config.json" else ({}, AUTO_MAP)
    model = tiny_checkpoint(tmp_path / "model", config, tokenizer_config)
    out = tmp_path / "out"
    result = quantgate("run", "--model", str(model), "--out", str(out), "--formats", "int8", cache=tmp_path / "cache",
                       check_codes=None)
    line = fails_with_one_line(result)
    assert f"{model / where}: this model needs custom code" in line and "--trust-remote-code" in line
    assert not (out / "run.json").exists()  # a rejected run leaves nothing for --resume to load


def test_out_under_a_regular_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = quantgate("run", "--out", str(blocker / "report"), "--model", str(tmp_path / "no-model"),
                       cache=tmp_path / "cache", check_codes=None)
    assert f"--out {blocker / 'report'}: cannot write there" in fails_with_one_line(result)


def test_debug_after_the_subcommand_is_accepted(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = quantgate("run", "--out", str(blocker / "report"), "--model", str(tmp_path / "no-model"), "--debug",
                       cache=tmp_path / "cache", check_codes=None)
    assert "cannot write there" in fails_with_one_line(result)  # not argparse's "unrecognized arguments"


def test_resume_with_an_invalid_run_json(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"model": "demo", "batch_size": 0}))
    result = quantgate("run", "--resume", "--out", str(out), cache=tmp_path / "cache", check_codes=None)
    line = fails_with_one_line(result)
    assert f"{out / 'run.json'}: field 'batch_size'" in line and "without --resume" in line


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe not utf-8", b'{"formats": ["int4"]}'])
def test_saved_spec_errors_are_user_errors(tmp_path, content):
    (tmp_path / "run.json").write_bytes(content)
    with pytest.raises(UserError, match="run.json"):
        saved_spec(tmp_path / "run.json")


def test_policy_problems_stop_the_run(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[margins]\nrogueL = 1.0\n")
    model = tiny_checkpoint(tmp_path / "model", {})
    result = quantgate("run", "--policy", str(policy), "--model", str(model), "--out", str(tmp_path / "out"),
                       cache=tmp_path / "cache", check_codes=None)
    line = fails_with_one_line(result)
    assert f"{policy}: key 'margins.rogueL': unknown metric 'rogueL'" in line


@pytest.mark.parametrize(("text", "expected"), [
    (b"[margins]\nf1 = 1.0 # \xe9t\xe9\n", ":2: not UTF-8 text (invalid continuation byte at byte 21)"),
    (b"[floors]\n\"squad/exact\" = 10\n", "key 'floors.squad/exact': unknown metric 'exact'"),
])
def test_policy_file_errors_name_the_file(tmp_path, text, expected):
    policy = tmp_path / "policy.toml"
    policy.write_bytes(text)
    with pytest.raises(UserError) as caught:
        load_policy(policy, known_metrics=ALL_METRICS)
    assert str(caught.value).startswith(f"{policy}") and expected in str(caught.value)


def test_policy_metric_names_are_free_where_no_metric_list_applies(tmp_path):
    policy = tmp_path / "policy.toml"  # `quantgate decide` gates on whatever metrics its score files carry
    policy.write_text("[margins]\nbleu = 1.0\n")
    assert load_policy(policy).margin_for("any", "bleu") == 1.0


def test_config_without_layer_widths_names_the_file_and_field():
    with pytest.raises(UserError) as caught:
        choose_group_size({"num_attention_heads": 9}, None, "gptq", "/models/m/config.json")
    assert str(caught.value).startswith("/models/m/config.json: field 'hidden_size' is missing")
    with pytest.raises(UserError, match="field 'text_config.num_attention_heads' is 'x'"):
        choose_group_size({"text_config": {"hidden_size": 64, "num_attention_heads": "x"}}, 32, "awq")


# --- compare inputs, unknown flags, a closed stdout ------------------------------------------------------------

EXAMPLE_REPORT = Path(__file__).parent / "fixtures" / "run_example" / "report.json"


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: d / "missing.json", "missing.json: cannot read (No such file or directory)"),
    (lambda d: (d / "notes.json").write_text("{not json") and d / "notes.json", "notes.json: not valid JSON"),
    (lambda d: (d / "config.json").write_text('{"model_type": "llama"}') and d / "config.json",
     "config.json: not a quantgate report (no 'schema_version' field)"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "empty: no report.json in this directory or its subdirectories"),
])
def test_compare_inputs_that_are_not_reports(tmp_path, make, expected):
    bad = make(tmp_path)
    line = fails_with_one_line(quantgate("compare", str(EXAMPLE_REPORT), str(bad), cache=tmp_path / "cache",
                                         check_codes=None))
    assert line.startswith(f"quantgate: error: {tmp_path}") and expected in line
    assert "schema_version None" not in line


def test_compare_of_incomparable_reports_exits_2_with_one_line(tmp_path):
    report = json.loads(EXAMPLE_REPORT.read_text())
    report["model"]["fingerprint"] = "sha256:" + "0" * 64
    (tmp_path / "new.json").write_text(json.dumps(report))
    result = quantgate("compare", str(EXAMPLE_REPORT), str(tmp_path / "new.json"), cache=tmp_path / "cache",
                       check_codes=None)
    line = fails_with_one_line(result)
    assert "not comparable (model fingerprint changed); pass --allow-changes" in line
    assert "model fingerprint: sha256:5f1c0a9e3b7d" in result.stdout
    allowed = quantgate("compare", str(EXAMPLE_REPORT), str(tmp_path / "new.json"), "--allow-changes",
                        cache=tmp_path / "cache", check_codes=(0,))
    assert "(scores not comparable; compared anyway: --allow-changes)" in allowed.stdout


@pytest.mark.parametrize("args", [("run", "--foo"), ("plan", "--json", "--foo"), ("cache", "ls", "--foo"),
                                  ("compare", "a.json", "b.json", "--foo")])
def test_unknown_flags_name_the_subcommand_and_show_its_usage(tmp_path, args):
    result = quantgate(*args, cache=tmp_path / "cache", check_codes=None)
    command = " ".join(a for a in args if not a.startswith("-") and not a.endswith(".json"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"usage: quantgate {command} ")
    assert lines[-1] == f"quantgate {command}: error: unrecognized arguments: --foo"


def quantgate_into_pipe(*args: str, cache: Path, stdout) -> subprocess.Popen:
    env = dict(os.environ, QUANTGATE_CACHE=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


def test_stdout_closed_before_anything_is_written_ends_quietly(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `quantgate plan | true`: the reader is gone before plan prints
    try:
        process = quantgate_into_pipe("plan", cache=tmp_path / "cache", stdout=write_end)
    finally:
        os.close(write_end)
    _, stderr = process.communicate(timeout=120)
    assert (process.returncode, stderr) == (141, "")


def test_stdout_closed_after_one_line_ends_quietly(tmp_path):
    """`quantgate cache ls results | head -1` on a large cache: plan's output fits in the pipe, this one does not,
    so quantgate is still writing when the reader goes away."""
    for i in range(2000):
        (tmp_path / "cache" / "results" / f"entry-{i:05d}-{'x' * 30}").mkdir(parents=True)
    process = quantgate_into_pipe("cache", "ls", "results", cache=tmp_path / "cache", stdout=subprocess.PIPE)
    assert process.stdout.readline().startswith("results in ")
    process.stdout.close()
    stderr = process.stderr.read()
    assert (process.wait(timeout=120), stderr) == (141, "")
