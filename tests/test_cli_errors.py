"""Bad input through the real CLI: exit 2, one line on stderr naming the file/field, no traceback, no run.json
left behind for --resume. Each case stops before any model is loaded (a few seconds each)."""

import json

import pytest

from conftest import quantgate
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
