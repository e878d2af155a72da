"""INT8 W8A8 with compressed-tensors: int8 weights per output channel, int8 activations per token at run time.

The checkpoint is compressed-tensors' `int-quantized` format (llm-compressor's W8A8 scheme, without SmoothQuant
or GPTQ): every Linear layer's weight stored as int8 with one scale per output channel (symmetric, from the
weight's own min/max), and its input quantized to int8 per token by the serving kernel, dynamically. Dynamic
activations need no calibration data. lm_head (and MoE routers) stay 16-bit, as embeddings and norms do.

vLLM serves it with `--quantization compressed-tensors` (CompressedTensorsW8A8Int8: oneDNN on CPUs, AVX2 included;
CUTLASS int8 on GPUs of compute capability 7.5+). transformers loads it through compressed-tensors, decompressing
the weights to 16-bit at the first forward and quantizing each layer's input per token (fake-quantized numerics,
16-bit speed and memory).
"""

from __future__ import annotations

from pathlib import Path

from harness.quantize.base import Recipe, package_versions

SCHEME = "W8A8"  # compressed-tensors' preset: int8 channel-wise static weights, int8 token-wise dynamic inputs


class W8A8Quantizer:
    engine = "compressed-tensors"

    def __init__(self, name: str = "w8a8") -> None:
        self.name = name

    def versions(self) -> dict[str, str]:
        return package_versions("compressed-tensors", "transformers", "torch")

    def calibration_dtype(self, source_path: Path) -> str:
        return "none"  # weight scales come from the weights; activation scales are computed per token at run time

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        import torch
        from compressed_tensors.compressors import ModelCompressor, compress_module
        from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                                     apply_quantization_config, preset_name_to_scheme)
        from compressed_tensors.quantization.utils import calculate_qparams
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from harness.runtime.device import device_map

        model = AutoModelForCausalLM.from_pretrained(source_path, dtype="auto", device_map=device_map(),
                                                     trust_remote_code=trust_remote_code)
        store_dtype = model.dtype
        config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(SCHEME, ["Linear"])},
                                    ignore=list(recipe.extra.get("ignore", ["lm_head"])),
                                    quantization_status=QuantizationStatus.INITIALIZED)
        apply_quantization_config(model, config)  # attaches the scheme and an empty weight_scale to each layer
        compressor = ModelCompressor.from_pretrained_model(model)  # infers the int-quantized format per layer
        with torch.no_grad():
            for module in model.modules():
                scheme = getattr(module, "quantization_scheme", None)
                if scheme is None:
                    continue
                # One layer at a time in float32: in bf16, weight / scale (up to 128) would be rounded to half a
                # step before rounding to an integer.
                module.float()
                weight = module.weight
                # llm-compressor's memoryless min-max observer, per output channel; the scale is rounded to the
                # dtype it is stored in first, so that the stored scale is the one the weights were divided by.
                scale, zero_point = calculate_qparams(weight.amin(dim=1, keepdim=True),
                                                      weight.amax(dim=1, keepdim=True), scheme.weights)
                module.weight_scale.copy_(scale.to(store_dtype))
                module.weight_zero_point.copy_(zero_point.to(module.weight_zero_point.dtype))
                compress_module(module)  # int8 weight; the symmetric zero point dropped, as vLLM expects
                module.to(store_dtype)  # the scale back in the checkpoint's dtype (exactly: it was rounded to it)
        compressor.quantization_config.quantization_status = QuantizationStatus.COMPRESSED
        model.save_pretrained(out_dir)
        compressor.update_config(str(out_dir))  # config.json's quantization_config
        AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code).save_pretrained(out_dir)

def is_int8_w8a8(quantization_config) -> bool:
    """Whether a checkpoint's quantization_config is compressed-tensors INT8 W8A8: int8 weights and int8 inputs in
    every config group (this format, or one llm-compressor wrote; static or dynamic activation scales)."""
    if not isinstance(quantization_config, dict):
        return False
    if str(quantization_config.get("quant_method") or "").lower() not in ("compressed-tensors", "compressed_tensors"):
        return False
    groups = [g for g in (quantization_config.get("config_groups") or {}).values() if isinstance(g, dict)]

    def int8(args) -> bool:
        return isinstance(args, dict) and args.get("type") == "int" and args.get("num_bits") == 8

    return bool(groups) and all(int8(g.get("weights")) and int8(g.get("input_activations")) for g in groups)
