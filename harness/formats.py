"""The formats quantgate knows: one FormatSpec per format, and everything else asks it.

A FormatSpec says which engine makes the format (`quantizer`: "module:Class", imported only when used), its
weight bits and whether it takes a group size, the packages recorded for provenance, how vLLM serves it
(`vllm_quantization`: its --quantization value, None for an unquantized checkpoint; `vllm_refusal`: why vLLM cannot
serve it at all, so no vLLM flags are printed and the vLLM backend reports it before loading anything), and
whether a run without --formats includes it. Adding a format is one engine module plus one entry here
(docs/extending.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from harness.errors import UserError


@dataclass(frozen=True)
class FormatSpec:
    name: str
    engine: str  # the quantization engine's name in reports ("none" for the baseline, "external" for candidates)
    bits: int  # weight bits
    quantizer: str | None = None  # "module:Class" of its harness.quantize.base.Quantizer; None: not quantized here
    grouped: bool = False  # takes a group size (GPTQ/AWQ); the recipe picks one that divides every layer
    g_idx: bool = False  # stores an int32 g_idx per input channel (GPTQ)
    packages: tuple[str, ...] = ()  # recorded in the artifact's provenance
    vllm_quantization: str | None = None
    vllm_refusal: str | None = None
    four_bit_kernel: bool = False  # vLLM serves it through its 4-bit W4A16 kernels (Marlin, cpu_gemm_wna16)
    default: bool = True  # run when --formats is not given
    recipe_extra: dict = field(default_factory=dict)  # engine settings every recipe of it carries

    def make_quantizer(self):
        if self.quantizer is None:
            raise UserError(f"format '{self.name}' is not made by quantgate")
        module, _, name = self.quantizer.partition(":")
        return getattr(importlib.import_module(module), name)(self.name)


FORMAT_SPECS: dict[str, FormatSpec] = {}


def register(spec: FormatSpec) -> FormatSpec:
    """Declare a format (the built-in ones below; a plugin or a test may add its own)."""
    FORMAT_SPECS[spec.name] = spec
    return spec


register(FormatSpec("baseline", engine="none", bits=16))
register(FormatSpec(
    "int8", engine="bitsandbytes", bits=8, quantizer="harness.quantize.bnb_int8:BnbInt8Quantizer",
    packages=("bitsandbytes", "transformers", "torch"), recipe_extra={"llm_int8_threshold": 6.0},
    vllm_refusal="bitsandbytes LLM.int8 is not a vLLM quantization method (vLLM 0.32 and later have no "
                 "bitsandbytes): transformers serves it; the 8-bit format vLLM serves is w8a8 (compressed-tensors "
                 "INT8 W8A8: --formats w8a8)"))
register(FormatSpec("gptq", engine="gptqmodel", bits=4, quantizer="harness.quantize.gptqmodel_engine:GptqModelQuantizer",
                    grouped=True, g_idx=True, packages=("gptqmodel", "transformers", "torch", "optimum"),
                    vllm_quantization="gptq", four_bit_kernel=True))
register(FormatSpec("awq", engine="gptqmodel", bits=4, quantizer="harness.quantize.gptqmodel_engine:GptqModelQuantizer",
                    grouped=True, packages=("gptqmodel", "transformers", "torch", "optimum"),
                    vllm_quantization="awq", four_bit_kernel=True))
register(FormatSpec(
    "w8a8", engine="compressed-tensors", bits=8, quantizer="harness.quantize.w8a8:W8A8Quantizer",
    packages=("compressed-tensors", "transformers", "torch"), vllm_quantization="compressed-tensors", default=False,
    recipe_extra={"scheme": "W8A8", "weights": "int8, symmetric, one scale per output channel (min-max)",
                  "activations": "int8, symmetric, per token, dynamic", "calibration": "none needed",
                  "ignore": ["lm_head", r"re:.*mlp\.gate$"]}))
FORMATS = tuple(FORMAT_SPECS)  # the built-in formats, in report order


def known_formats() -> tuple[str, ...]:
    return tuple(FORMAT_SPECS)


def default_formats() -> list[str]:
    return [name for name, spec in FORMAT_SPECS.items() if spec.default]


def format_spec(name: str) -> FormatSpec:
    try:
        return FORMAT_SPECS[name]
    except KeyError:
        raise UserError(f"unknown format '{name}' (known: {', '.join(FORMAT_SPECS)})") from None


def check_format_names(names: list[str], where: str) -> list[str]:
    """Known names, baseline first, each once; `where` names the flag or field in the error."""
    cleaned = [n.strip().lower() for n in names if n.strip()]
    unknown = [n for n in cleaned if n not in FORMAT_SPECS]
    if unknown:
        raise UserError(f"{where}: unknown format {', '.join(repr(u) for u in unknown)} "
                        f"(known: {', '.join(FORMAT_SPECS)})")
    if not cleaned:
        raise UserError(f"{where}: name at least one format (e.g. {where} int8,gptq,awq)")
    return ["baseline"] + [n for n in dict.fromkeys(cleaned) if n != "baseline"]
