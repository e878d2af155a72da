"""A toy format, a toy metric and a toy runtime, added through quantgate's seams alone (docs/extending.md walks through it).

toy8: every linear layer's weights rounded to a symmetric 8-bit grid per output row and stored back in the
checkpoint's dtype (fake quantization: transformers loads it like the baseline).
length_ratio: how close a generation's length is to the reference's, 0-100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from harness.formats import FormatSpec, register
from harness.metrics import MetricSpec, register_metric
from harness.quantize.base import Recipe, package_versions
from harness.runtime.registry import register_runtime


class ToyRoundingQuantizer:
    engine = "toy-rounding"

    def __init__(self, name: str) -> None:
        self.name = name

    def versions(self) -> dict[str, str]:
        return package_versions("torch", "transformers")

    def calibration_dtype(self, source_path: Path) -> str:
        return "none"

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(source_path, dtype="auto", trust_remote_code=trust_remote_code)
        levels = 2 ** (recipe.bits - 1) - 1
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module.weight.shape[0] != model.config.vocab_size:
                    weight = module.weight.float()
                    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / levels
                    module.weight.copy_((weight / scale).round().clamp(-levels, levels) * scale)
        model.save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code).save_pretrained(out_dir)


def length_ratio(prediction: str, references: Sequence[str], language: str) -> float:
    words = len(prediction.split())
    best = max((min(words, len(r.split())) / max(words, len(r.split()), 1) for r in references), default=0.0)
    return 100.0 * best


register(FormatSpec("toy8", engine="toy-rounding", bits=8, quantizer="quantgate_toy:ToyRoundingQuantizer",
                    packages=("torch", "transformers"), default=False,
                    vllm_refusal="toy8 is fake-quantized 16-bit weights: serve the baseline instead"))
register_metric(MetricSpec("length_ratio", "generation", item_score=length_ratio))
# toy-eager: transformers' own runtime under another name, enough to show --backend choosing a registered runtime
register_runtime("toy-eager", "harness.runtime.transformers_backend:LoadedModel")
