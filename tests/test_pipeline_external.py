"""(Named to run after test_pipeline_e2e: its fixture needs demo_run, and test_faults clears the shared cache's
results, which test_pipeline_e2e's second-identical-run check must find filled.)

Checkpoints quantgate did not make (--candidate NAME=PATH), with real checkpoints: the demo model and the GPTQ
(AutoGPTQ v1 layout) and AWQ (GEMM) checkpoints GPTQModel wrote in the demo_run fixture's cache, copied without
quantgate's manifest so that nothing but their own files says what they are."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import E2E_ARGS, quantgate
from harness.errors import UserError
from harness.candidates import parse_candidates, read_candidate


def _checkpoint_like(source: Path, target: Path, **config_changes) -> Path:
    """A checkpoint directory with source's files (weights symlinked) and config.json changed as given."""
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name in ("quantgate_manifest.json", "quantgate_seal.json") or item.name.startswith("."):
            continue
        if item.suffix == ".safetensors":
            (target / item.name).symlink_to(item.resolve())
        elif item.is_file():
            shutil.copy(item, target / item.name)
    config = json.loads((source / "config.json").read_text())
    config.update(config_changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_candidate_flags_are_checked():
    assert parse_candidates(["hub-awq=/m/awq", "team=/m/t"], ("baseline", "gptq")) == {"hub-awq": "/m/awq",
                                                                                          "team": "/m/t"}
    for bad, expected in ((["nopath"], "NAME=PATH"), (["gptq=/x"], "built-in format"),
                          (["a=/x", "a=/y"], "twice")):
        with pytest.raises(UserError, match=expected):
            parse_candidates(bad, ("baseline", "gptq"))


def test_quantization_config_becomes_the_recipe(tmp_path):
    directory = tmp_path / "ct"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"\0" * 8)
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "group_size": None}}}}}))
    candidate = read_candidate("w8a8", str(directory))
    assert (candidate.method, candidate.bits, candidate.group_size) == ("compressed-tensors", 8, None)
    assert candidate.unquantized_modules == ("lm_head",) and candidate.format_spec().vllm_quantization == \
        "compressed-tensors"
    assert candidate.kind is None  # weight-only 8-bit: no built-in format stores it so
    int8 = {"num_bits": 8, "type": "int"}
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": int8,
                                                                            "input_activations": int8}}}}))
    assert read_candidate("hub-w8a8", str(directory)).kind == "w8a8"  # planned as the w8a8 format's storage
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UserError, match="no quantization_config"):
        read_candidate("plain", str(directory))


def test_a_quantized_model_is_not_a_baseline(demo_checkpoint, demo_cache, tmp_path):
    model = _checkpoint_like(demo_checkpoint, tmp_path / "quantized",
                             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    result = quantgate("run", "--model", str(model), "--formats", "baseline", "--out", str(tmp_path / "out"),
                       cache=demo_cache, check_codes=(2,))
    assert "carries a quantization_config (gptq)" in result.stderr and "--candidate" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_candidate_of_another_model_is_refused(demo_checkpoint, demo_cache, tmp_path):
    other = _checkpoint_like(demo_checkpoint, tmp_path / "other-vocab", vocab_size=50000,
                             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 64})
    result = quantgate("run", "--model", "demo", "--candidate", f"other={other}", "--out", str(tmp_path / "out"),
                       cache=demo_cache, check_codes=(2,))
    assert "field 'vocab_size' is 50000, the baseline's is 49152" in result.stderr


def test_another_tokenizer_needs_the_flag(demo_checkpoint, demo_cache, tmp_path):
    other = _checkpoint_like(demo_checkpoint, tmp_path / "other-template",
                             quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 64})
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        (other / name).unlink(missing_ok=True)
    shutil.copy(demo_checkpoint / "tokenizer_config.json", other / "tokenizer_config.json")
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    result = quantgate("run", "--model", "demo", "--candidate", f"other={other}", "--out", str(tmp_path / "out"),
                       cache=demo_cache, check_codes=(2,))
    assert "its tokenizer differs from the baseline's (another chat template)" in result.stderr
    assert "--allow-tokenizer-mismatch" in result.stderr


def _corrupt_scales(source: Path, target: Path) -> Path:
    """The checkpoint with every GPTQ scale multiplied by 40: it loads, and generates nonsense."""
    from safetensors.torch import load_file, save_file

    _checkpoint_like(source, target)
    weights = target / "model.safetensors"
    tensors = load_file(str(weights.resolve()))
    weights.unlink()
    save_file({k: (v * 40 if k.endswith(".scales") else v) for k, v in tensors.items()}, str(weights),
              metadata={"format": "pt"})
    return target


@pytest.fixture(scope="session")
def candidates_run(demo_run, demo_cache, tmp_path_factory):
    # The artifacts demo_run used, which this run's gptq and awq reuse: the cache also holds others by now
    # (demo_run_no_bf16's float32 calibration), and the first one listed is not necessarily the same.
    formats = demo_run[1]["formats"]
    gptq, awq = (Path(formats[name]["artifact"]["path"]) for name in ("gptq", "awq"))
    assert gptq.is_dir() and awq.is_dir(), (gptq, awq)
    where = tmp_path_factory.mktemp("candidates")
    hub_gptq = _checkpoint_like(gptq, where / "hub-gptq")
    hub_awq = _checkpoint_like(awq, where / "hub-awq")
    broken = _corrupt_scales(gptq, where / "broken-gptq")
    out = where / "out"
    result = quantgate("run", *E2E_ARGS, "--formats", "baseline,gptq,awq", "--candidate", f"hub-gptq={hub_gptq}",
                       "--candidate", f"hub-awq={hub_awq}", "--candidate", f"broken-gptq={broken}",
                       "--out", str(out), cache=demo_cache)
    return out, json.loads((out / "report.json").read_text()), result


@pytest.mark.slow
def test_candidates_are_judged_like_the_built_in_formats(candidates_run):
    out, report, result = candidates_run
    formats = report["formats"]
    assert list(formats) == ["baseline", "gptq", "awq", "hub-gptq", "hub-awq", "broken-gptq"]
    assert report["settings"]["candidates"].keys() == {"hub-gptq", "hub-awq", "broken-gptq"}
    for built_in, candidate in (("gptq", "hub-gptq"), ("awq", "hub-awq")):
        entry = formats[candidate]
        assert entry["status"] == "ok", entry["error"]
        assert "quantize" not in entry["stages_run"]  # evaluated as given, never re-quantized
        weights = (Path(entry["artifact"]["path"]) / "model.safetensors").resolve()
        assert weights.parent == Path(formats[built_in]["artifact"]["path"]).resolve()  # the built-in's weights
        assert entry["scores"] == formats[built_in]["scores"] and entry["verdict"] == formats[built_in]["verdict"]
        manifest = entry["artifact"]["manifest"]
        assert manifest["engine"] == "external" and manifest["files"]["model.safetensors"].startswith("sha256:")
        assert entry["capacity"]["vllm_flags"] == formats[built_in]["capacity"]["vllm_flags"]
    layouts = {name: formats[name]["artifact"]["manifest"]["quantization_config"].get("checkpoint_format")
               for name in ("hub-gptq", "hub-awq")}
    assert layouts == {"hub-gptq": "gptq", "hub-awq": "gemm"}  # AutoGPTQ's v1 layout and AWQ GEMM
    broken = formats["broken-gptq"]
    assert broken["status"] == "ok" and broken["verdict"] == "NO-GO", broken["reasons"]
    assert any(check["status"] == "fail" and check["kind"] == "metric" for check in broken["checks"])
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert any(s["format"] == "broken-gptq" for s in samples)  # the per-item evidence is in the samples
    assert "Traceback" not in result.stderr
    markdown = (out / "report.md").read_text()
    assert "hub-awq" in markdown and "broken-gptq" in markdown


def test_cuda_only_layouts_are_not_runnable_on_a_cpu(tmp_path):
    from harness.candidates import not_runnable_here

    directory = tmp_path / "marlin"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"\0" * 8)
    (directory / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}}))
    candidate = read_candidate("marlin", str(directory))
    assert "only CUDA kernels read it" in not_runnable_here(candidate, cuda=False)
    assert not_runnable_here(candidate, cuda=True) is None


def test_a_quantized_baseline_is_named_in_every_verdict():
    from harness.report.build import comparison_notes
    from records import run_inputs

    inputs = run_inputs(model_config={"quantization_config": {"quant_method": "awq", "bits": 4}},
                        candidate_notes={"hub": ["tokenizer differs from the baseline's (another chat template)"]})
    notes = comparison_notes(inputs, "hub")
    assert notes[0].startswith("tokenizer differs") and "compared with a quantized baseline (awq 4-bit" in notes[1]
    assert comparison_notes(run_inputs(model_config={}, candidate_notes={}), "gptq") == []
