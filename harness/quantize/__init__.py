"""The formats quantgate knows, their engines, and the checks a recipe must pass before any work starts."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.formats import check_format_names, format_spec
from harness.quantize.base import Quantizer, Recipe

GROUP_SIZE_CHOICES = (128, 64, 32)


def quantizer_for(name: str) -> Quantizer:
    return format_spec(name).make_quantizer()


def parse_formats(text: str) -> list[str]:
    return check_format_names(text.split(","), "--formats")


def linear_input_widths(config: dict, config_path: str = "config.json") -> dict[str, int]:
    """Input width of each quantized linear layer kind in a Llama-style decoder (what a group must divide)."""
    text = config.get("text_config", config)
    where = f"{config_path}: field '" + ("text_config." if text is not config else "")
    hidden = _positive_int(text, "hidden_size", where)
    heads = _positive_int(text, "num_attention_heads", where)
    head_dim = _positive_int(text, "head_dim", where, default=hidden // heads)
    intermediate = _positive_int(text, "intermediate_size", where, default=4 * hidden)
    return {"q/k/v_proj": hidden, "o_proj": heads * head_dim, "gate/up_proj": hidden, "down_proj": intermediate}


def _positive_int(config: dict, field: str, where: str, default: int | None = None) -> int:
    value = config.get(field) or default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        found = "is missing" if value is None else f"is {value!r}, not a positive integer"
        raise UserError(f"{where}{field}' {found}; GPTQ/AWQ need the layer widths of a "
                        "Llama-style decoder (hidden_size, num_attention_heads) to choose a group size")
    return value


def choose_group_size(config: dict, requested: int | None, fmt: str, config_path: str = "config.json") -> int:
    widths = linear_input_widths(config, config_path)
    if requested is not None:
        bad = {name: width for name, width in widths.items() if width % requested}
        if requested <= 0 or bad:
            detail = ", ".join(f"{name} has {width} inputs" for name, width in bad.items()) or "must be positive"
            fits = [g for g in GROUP_SIZE_CHOICES if all(w % g == 0 for w in widths.values())]
            raise UserError(f"{fmt}: group size {requested} does not divide this model's layer widths ({detail}); "
                            f"use --group-size {fits[0] if fits else 32}")
        return requested
    for group in GROUP_SIZE_CHOICES:
        if all(width % group == 0 for width in widths.values()):
            return group
    raise UserError(f"{fmt}: no group size of {GROUP_SIZE_CHOICES} divides the layer widths {widths}; "
                    "pass --group-size N that divides all of them")


def _check_fp8_block(config: dict, config_path: str | Path) -> None:
    """fp8-block is refused before any work where its blocks cannot tile the layers, or where nothing here can
    run it: transformers runs block-FP8's per-128 activation quantization through compressed-tensors 0.17, which
    fails on a CPU ("The size of tensor a (256) must match the size of tensor b (2)", tests/test_fp8_nvfp4.py)."""
    from harness.quantize.compressed_tensors_engine import block_problem
    from harness.runtime.device import is_cuda

    problem = block_problem(config)
    if problem:
        raise UserError(f"fp8-block: FP8_BLOCK quantizes 128x128 weight blocks, and this model's {problem} "
                        f"({config_path}); judge fp8 (one scale per output channel) instead")
    if not is_cuda():
        raise UserError("fp8-block: compressed-tensors cannot run block-FP8 activations in transformers on a CPU "
                        "(its per-128 input quantization fails at the first forward); judge it on a GPU, or judge "
                        "fp8 (per-channel) here")


DEFAULT_CALIBRATION_SAMPLES = 32  # GPTQ/AWQ's calibration texts when none is asked for (RunSpec's default)
AWQ_NO_BF16_CALIBRATION_SAMPLES = 4


def recipe_for(fmt: str, config: dict, group_size: int | None, calibration_samples: int, seed: int, *,
               config_path: str | Path = "config.json") -> Recipe:
    spec = format_spec(fmt)
    extra = dict(spec.recipe_extra)
    if fmt == "awq":
        from harness.runtime.device import cpu_has_bf16_matmul, is_cuda

        # AWQ's clip search costs about a minute per layer on a CPU; on a GPU it is cheap and stays on.
        extra["apply_clip"] = is_cuda()
        if not is_cuda() and not cpu_has_bf16_matmul() and calibration_samples == DEFAULT_CALIBRATION_SAMPLES:
            # GPTQModel 7.6's AWQ packers take 16-bit models only (a float32 calibration packs garbage), so on a CPU
            # without bf16 units AWQ calibrates in emulated bf16: about 1.7 minutes per layer of the demo model
            # with 32 texts. The default there is fewer texts; the recipe and the report say how many.
            calibration_samples = AWQ_NO_BF16_CALIBRATION_SAMPLES
            extra["calibration_samples_note"] = (f"{AWQ_NO_BF16_CALIBRATION_SAMPLES} texts instead of "
                                                 f"{DEFAULT_CALIBRATION_SAMPLES}: AWQ calibrates in emulated bf16 on "
                                                 "a CPU without bf16 units (--calibration-samples sets another count)")
    if fmt == "fp8-block":
        _check_fp8_block(config, config_path)
    if not spec.grouped:
        return Recipe(fmt, bits=spec.bits, calibration_samples=calibration_samples if spec.calibrated else 0,
                      seed=seed, extra=extra)
    return Recipe(fmt, bits=spec.bits, group_size=choose_group_size(config, group_size, fmt, str(config_path)),
                  calibration_samples=calibration_samples, seed=seed, extra=extra)
