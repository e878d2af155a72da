import pytest

from harness.config import build_spec
from harness.errors import UserError
from harness.quantize import choose_group_size, parse_formats, recipe_for

SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "num_hidden_layers": 30}


def test_default_group_size_is_largest_that_divides_every_layer():
    assert choose_group_size(SMOLLM2, None, "gptq") == 64  # 576 % 128 != 0
    assert choose_group_size({**SMOLLM2, "hidden_size": 4096, "intermediate_size": 11008,
                              "num_attention_heads": 32, "head_dim": 128}, None, "awq") == 128


def test_group_size_that_does_not_divide_is_refused_with_the_layer_named():
    with pytest.raises(UserError) as caught:
        choose_group_size(SMOLLM2, 128, "gptq")
    message = str(caught.value)
    assert "group size 128 does not divide" in message
    assert "q/k/v_proj has 576 inputs" in message and "use --group-size 64" in message


def test_recipes_per_format():
    assert recipe_for("int8", SMOLLM2, None, 32, 0).calibration_samples == 0
    gptq = recipe_for("gptq", SMOLLM2, 32, 16, 0)
    assert (gptq.bits, gptq.group_size, gptq.calibration_samples) == (4, 32, 16)


def test_unknown_format_is_named():
    with pytest.raises(UserError, match="unknown format 'int4'"):
        parse_formats("int8,int4")
    assert parse_formats("awq,int8") == ["baseline", "awq", "int8"]


def test_per_format_group_size_from_config_file(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('model = "demo"\ngroup_size = 64\n[formats.baseline]\n[formats.gptq]\ngroup_size = 32\n'
                      '[formats.awq]\n')
    spec = build_spec(str(config), {})
    assert spec.formats == ["baseline", "gptq", "awq"]
    assert spec.group_size_for("gptq") == 32 and spec.group_size_for("awq") == 64


def test_config_file_errors_name_the_file_and_field(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("batch_size = 0\n")
    with pytest.raises(UserError, match=r"run.toml: field 'batch_size'"):
        build_spec(str(config), {})
    config.write_text("batchsize = 4\n")
    with pytest.raises(UserError, match=r"field 'batchsize': Extra inputs are not permitted"):
        build_spec(str(config), {})
    config.write_text("batch_size = [\n")
    with pytest.raises(UserError, match="not valid TOML"):
        build_spec(str(config), {})


def test_awq_takes_fewer_calibration_texts_without_bf16_units(monkeypatch):
    """GPTQModel's AWQ packers take 16-bit models only, so without bf16 units AWQ calibrates in emulated bf16: the
    default count is cut there (and said in the recipe); a count the user gives stands."""
    from harness.quantize import AWQ_NO_BF16_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SAMPLES

    monkeypatch.setenv("QUANTGATE_FORCE_NO_BF16", "1")
    awq = recipe_for("awq", SMOLLM2, None, DEFAULT_CALIBRATION_SAMPLES, 0)
    assert awq.calibration_samples == AWQ_NO_BF16_CALIBRATION_SAMPLES and "emulated bf16" in awq.extra[
        "calibration_samples_note"]
    assert recipe_for("awq", SMOLLM2, None, 16, 0).calibration_samples == 16
    assert recipe_for("gptq", SMOLLM2, None, DEFAULT_CALIBRATION_SAMPLES, 0).calibration_samples == 32
