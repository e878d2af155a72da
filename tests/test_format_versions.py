"""What each engine release does with the FP8 and FP4 schemes (harness.formats: EngineServing.since, fallback_since,
floors), as the serving plans apply it: a release before the scheme's first says so with the first release that
loads it; a GPU below the native kernels at a release before the weight-only fallback (or before its Turing floor)
is refused with the release that adds it. The releases are read from each vLLM release's own source (the comments
above FP8_NATIVE_CC in harness/formats.py cite file and tag)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_engine, weight_format
from harness.formats import FORMAT_SPECS, scheme_spec
from harness.measure.kv import DEMO_CONFIG

T4, A100, H100, B200 = (gpu_by_name(name) for name in ("T4", "A100-80GB", "H100-SXM", "B200"))


def _vllm(fmt, gpu, version, engine="vllm"):
    options = {"vllm_version": version} if engine == "vllm" else {}
    return plan_engine(engine, model_shape(DEMO_CONFIG), fmt, Target(gpu, 1), Workload(max_model_len=2048), **options)


def _scheme(name, quant_method):
    """The registered format as a checkpoint of another quant_method (DeepSeek's fp8, ModelOpt's NVFP4) stores it."""
    return replace(weight_format(name), spec=scheme_spec(name, quant_method))


def _servable(fmt, gpu, version):
    return _vllm(fmt, gpu, version).servable


def test_a_release_before_the_scheme_names_the_first_release_that_loads_it():
    plan = _vllm(weight_format("nvfp4"), B200, "0.6.4")
    assert not plan.servable
    assert plan.reason == "vLLM 0.6.4 does not load nvfp4 checkpoints: vLLM 0.9.1 is the first release that does"
    assert _servable(weight_format("nvfp4"), B200, "0.9.1")
    assert not _servable(weight_format("nvfp4a16"), B200, "0.8.5") and _servable(weight_format("nvfp4a16"), B200,
                                                                                   "0.9.0")
    assert "0.11.0 is the first" in _vllm(weight_format("fp8-block"), H100, "0.10.2").reason  # compressed-tensors
    assert _servable(weight_format("fp8-block"), H100, "0.11")
    assert "0.6.6 is the first" in _vllm(_scheme("fp8-block", "fp8"), H100, "0.6.5").reason  # DeepSeek-style
    assert _servable(_scheme("fp8-block", "fp8"), H100, "0.6.6")
    assert "0.8.0 is the first" in _vllm(_scheme("nvfp4", "modelopt"), B200, "0.7.3").reason
    assert _servable(_scheme("nvfp4", "modelopt"), B200, "0.8.0")
    assert "0.10.1 is the first" in _vllm(weight_format("mxfp4"), H100, "0.10.0").reason
    assert _servable(weight_format("mxfp4"), H100, "0.10.1")


def test_compressed_tensors_fp8_dynamic_serves_at_every_release_planned():
    """FP8_DYNAMIC loads from vLLM 0.5.3 and its Marlin fallback from 0.5.4, both before 0.6."""
    for version in ("0.6.0", "0.9", "0.34"):
        assert _servable(weight_format("fp8"), H100, version) and _servable(weight_format("fp8"), A100, version)


def test_below_the_native_kernels_before_the_fallback_the_plan_names_the_release_that_adds_it():
    on_hopper = _vllm(weight_format("nvfp4"), H100, "0.9.1")
    assert not on_hopper.servable and "vLLM 0.9.1's nvfp4 kernels need 10.0" in on_hopper.reason
    assert "vLLM 0.9.2 added its FP4 weight-only (W4A16) Marlin kernel (compute capability 8.0+)" in on_hopper.reason
    marlin = _vllm(weight_format("nvfp4"), H100, "0.9.2")
    assert marlin.servable and any("FP4 weight-only (W4A16) Marlin kernel" in note for note in marlin.notes)
    deepseek = _vllm(_scheme("fp8-block", "fp8"), A100, "0.8.5")
    assert not deepseek.servable and "vLLM 0.9.0 added its FP8 weight-only (W8A16) Marlin kernel" in deepseek.reason
    assert _servable(_scheme("fp8-block", "fp8"), A100, "0.9.0")
    modelopt = _vllm(_scheme("nvfp4", "modelopt"), H100, "0.8.5")
    assert not modelopt.servable and "vLLM 0.9.0 added" in modelopt.reason
    assert _servable(_scheme("nvfp4", "modelopt"), H100, "0.9.0")
    block = _vllm(weight_format("fp8-block"), A100, "0.14")  # compressed-tensors' W8A16Fp8 raised on blocks
    assert not block.servable and "vLLM 0.16.0 added its FP8 weight-only (W8A16) Marlin kernel" in block.reason
    assert _servable(weight_format("fp8-block"), A100, "0.16")


def test_marlin_runs_on_turing_from_the_release_that_took_it_there():
    """vllm-project/vllm#29901 (0.14: fp8 and ModelOpt checkpoints) and #31000 (0.16: compressed-tensors)."""
    before = _vllm(weight_format("fp8"), T4, "0.13")
    assert not before.servable and "its FP8 weight-only (W8A16) Marlin kernel needs 8.0" in before.reason
    assert "vLLM 0.16.0 runs it on 7.5+" in before.reason
    assert not _servable(weight_format("fp8"), T4, "0.14")
    newest = _vllm(weight_format("fp8"), T4, "0.34")
    assert newest.servable and any("T4 (compute capability 7.5 < 8.9): FP8 weight-only" in n for n in newest.notes)
    assert not _servable(_scheme("fp8", "fp8"), T4, "0.13") and _servable(_scheme("fp8", "fp8"), T4, "0.14")
    assert not _servable(weight_format("nvfp4"), T4, "0.14") and _servable(weight_format("nvfp4"), T4, "0.16")
    assert not _servable(weight_format("mxfp4"), T4, "0.34")  # Marlin's MXFP4 needs bf16 activations: 8.0+


def test_a_minor_alone_is_its_newest_release():
    assert _servable(weight_format("nvfp4"), H100, "0.9")  # 0.9.2 has the Marlin fallback
    assert _servable(weight_format("mxfp4"), H100, "0.10")


@pytest.mark.parametrize("name", ["fp8", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4"])
def test_every_first_release_is_one_the_planner_can_be_asked_for(name):
    from harness.capacity.vllm import KNOWN_VERSIONS
    from harness.capacity.vllm_versions import parse_release

    oldest = parse_release(KNOWN_VERSIONS[0])
    serving = FORMAT_SPECS[name].serving["vllm"]
    for release in (serving.since, serving.fallback_since, *(since for since, _ in serving.floors)):
        assert release is None or (release >= oldest and release[:2] in {parse_release(v) for v in KNOWN_VERSIONS})


def test_sglang_refuses_nvfp4_weight_only():
    plan = _vllm(weight_format("nvfp4a16"), B200, "", engine="sglang")
    assert not plan.servable and "NVFP4 weight-only (NVFP4A16)" in plan.reason
    assert _vllm(weight_format("nvfp4"), B200, "", engine="sglang").servable
