"""The formats quantgate knows, and what serving engines make of each: one FormatSpec per format.

`vllm_quantization` is vLLM's --quantization value for the format's checkpoint (None: served unquantized);
`vllm_refusal` is why vLLM cannot serve it at all (then no vLLM flags are printed and the vLLM backend reports
it before loading anything).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FormatSpec:
    name: str
    engine: str  # the quantization engine that makes it ("none" for the baseline)
    bits: int  # weight bits
    vllm_quantization: str | None = None
    vllm_refusal: str | None = None
    four_bit_kernel: bool = False  # served through vLLM's 4-bit W4A16 kernels (Marlin on GPUs, cpu_gemm_wna16)


FORMAT_SPECS: dict[str, FormatSpec] = {spec.name: spec for spec in (
    FormatSpec("baseline", engine="none", bits=16),
    FormatSpec("int8", engine="bitsandbytes", bits=8,
               vllm_refusal="bitsandbytes LLM.int8 is not a vLLM quantization method (vLLM 0.32 and later have no "
                            "bitsandbytes): transformers serves it; to serve 8-bit weights with vLLM use a "
                            "compressed-tensors INT8 checkpoint or --quantization int8_per_channel_weight_only"),
    FormatSpec("gptq", engine="gptqmodel", bits=4, vllm_quantization="gptq", four_bit_kernel=True),
    FormatSpec("awq", engine="gptqmodel", bits=4, vllm_quantization="awq", four_bit_kernel=True),
)}
FORMATS = tuple(FORMAT_SPECS)


def format_spec(name: str) -> FormatSpec:
    return FORMAT_SPECS[name]
