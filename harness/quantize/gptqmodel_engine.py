"""GPTQ and AWQ 4-bit through GPTQModel (the maintained successor of AutoGPTQ, which absorbed AutoAWQ).

Both write the checkpoint formats vLLM serves with `--quantization gptq|awq`.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.quantize.base import Recipe, package_versions


class GptqModelQuantizer:
    engine = "gptqmodel"

    def __init__(self, method: str) -> None:
        self.method = method  # "gptq" | "awq"

    def versions(self) -> dict[str, str]:
        return package_versions("gptqmodel", "transformers", "torch", "optimum")

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path) -> None:
        # On a 2-core machine GPTQModel asks for more CPU workers than it finds unless told.
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, os.cpu_count() or 1)))
        from gptqmodel import BACKEND, GPTQModel
        from gptqmodel.quantization import AWQConfig, GPTQConfig

        from harness.runtime.device import is_cuda

        device = "cuda" if is_cuda() else "cpu"
        if self.method == "awq":
            config = AWQConfig(bits=recipe.bits or 4, group_size=recipe.group_size)
            backend = BACKEND.AUTO if is_cuda() else BACKEND.AWQ_TORCH
        else:
            config = GPTQConfig(bits=recipe.bits or 4, group_size=recipe.group_size)
            backend = BACKEND.AUTO
        model = GPTQModel.load(str(source_path), config, device=device)
        # AWQ's auto backend asks for CUDA; on CPU name the portable torch kernel.
        model.quantize(calibration, batch_size=1, backend=backend)
        model.save(str(out_dir))
