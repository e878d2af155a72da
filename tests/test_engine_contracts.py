"""What quantgate relies on inside its engines. Each test names the code it depends on, so that an engine upgrade
that changes it fails here, loudly, instead of silently changing a recipe."""

import inspect

import torch


def test_awq_clip_search_is_still_the_attribute_quantgate_patches():
    """GPTQModel has no option for AWQ's clip search: harness.quantize.gptqmodel_engine._awq_clip_search sets
    `AWQProcessor.apply_clip` after __init__. If GPTQModel renames it or adds an option, revisit that patch."""
    from gptqmodel.looper.awq_processor import AWQProcessor

    assert "self.apply_clip = True" in inspect.getsource(AWQProcessor.__init__)
    assert "if self.apply_clip:" in inspect.getsource(AWQProcessor)


def test_awq_clip_patch_takes_effect_and_is_undone():
    from gptqmodel.looper.awq_processor import AWQProcessor

    from harness.quantize.gptqmodel_engine import _awq_clip_search

    original = AWQProcessor.__init__
    with _awq_clip_search(False):
        assert AWQProcessor.__init__ is not original
    assert AWQProcessor.__init__ is original


def test_gptq_packs_float32_with_a_kernel_that_declares_it():
    """GPTQ calibrated in float32 (CPUs without bf16 units) packs with the torch-fused kernel, no patch."""
    from gptqmodel.nn_modules.qlinear.torch_fused import TorchFusedLinear
    from gptqmodel.utils.importer import _supports_pack_api

    assert torch.float32 in TorchFusedLinear.SUPPORTS_DTYPES and _supports_pack_api(TorchFusedLinear)


def test_offload_to_disk_is_a_supported_option():
    """The float32 path keeps finished layers in memory; the option must exist and reach the config."""
    from gptqmodel.quantization import AWQConfig, GPTQConfig

    from harness.quantize.base import Recipe
    from harness.quantize.gptqmodel_engine import GptqModelQuantizer

    for method, kind in (("gptq", GPTQConfig), ("awq", AWQConfig)):
        config = GptqModelQuantizer(method).quantize_config(Recipe(method, bits=4, group_size=64),
                                                            offload_to_disk=False)
        assert isinstance(config, kind) and config.offload_to_disk is False and config.group_size == 64


def test_forced_no_bf16_path_calibrates_gptq_in_float32(monkeypatch, tmp_path):
    from harness.quantize.gptqmodel_engine import GptqModelQuantizer, calibration_plan

    (tmp_path / "config.json").write_text('{"dtype": "bfloat16"}')
    monkeypatch.setenv("QUANTGATE_FORCE_NO_BF16", "1")
    plan = calibration_plan(tmp_path, "gptq")
    assert plan.load_dtype is torch.float32 and plan.store_dtype is torch.bfloat16 and plan.cast_after
    from gptqmodel import BACKEND

    assert GptqModelQuantizer("gptq").backend(plan) == BACKEND.GPTQ_TORCH_FUSED
    # AWQ calibrated in float32 generates garbage with GPTQModel 7.6: it keeps the checkpoint's dtype everywhere
    awq = calibration_plan(tmp_path, "awq")
    assert awq.load_dtype == "auto" and not awq.cast_after
    assert GptqModelQuantizer("awq").backend(awq) == BACKEND.AWQ_TORCH


def test_the_artifact_key_follows_the_calibration_dtype_not_the_cpu(monkeypatch, tmp_path):
    """A GPTQ artifact calibrated in float32 is another artifact; AWQ's (always the checkpoint's dtype) is not."""
    from harness.cachekeys import quantize_device_key
    from harness.quantize import quantizer_for

    (tmp_path / "config.json").write_text('{"dtype": "bfloat16"}')
    monkeypatch.setenv("QUANTGATE_DEVICE", "cpu")
    monkeypatch.setenv("QUANTGATE_FORCE_NO_BF16", "1")
    forced = {f: quantize_device_key(quantizer_for(f), tmp_path) for f in ("int8", "gptq", "awq")}
    assert forced == {"int8": {"kind": "cpu", "calibration_dtype": "none"},
                      "gptq": {"kind": "cpu", "calibration_dtype": "float32"},
                      "awq": {"kind": "cpu", "calibration_dtype": "checkpoint"}}
