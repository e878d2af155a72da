"""INT8 W8A8 with compressed-tensors: int8 weights per output channel, int8 activations per token at run time.

The checkpoint is compressed-tensors' `int-quantized` format (llm-compressor's W8A8 scheme, without SmoothQuant
or GPTQ): every Linear layer's weight stored as int8 with one scale per output channel (symmetric, from the
weight's own min/max), and its input quantized to int8 per token by the serving kernel, dynamically. Dynamic
activations need no calibration data. lm_head (and MoE routers) stay 16-bit, as embeddings and norms do
(harness.quantize.compressed_tensors_engine writes it, as it writes FP8 and NVFP4).

vLLM serves it with `--quantization compressed-tensors` (CompressedTensorsW8A8Int8: oneDNN on CPUs, AVX2 included;
CUTLASS int8 on GPUs of compute capability 7.5+). transformers loads it through compressed-tensors, decompressing
the weights to 16-bit at the first forward and quantizing each layer's input per token (fake-quantized numerics,
16-bit speed and memory).
"""

from __future__ import annotations

from harness.quantize.compressed_tensors_engine import CompressedTensorsQuantizer

SCHEME = "W8A8"  # compressed-tensors' preset: int8 channel-wise static weights, int8 token-wise dynamic inputs


class W8A8Quantizer(CompressedTensorsQuantizer):
    scheme = SCHEME

    def __init__(self, name: str = "w8a8") -> None:
        super().__init__(name)


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
