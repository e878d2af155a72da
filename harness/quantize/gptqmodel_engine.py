"""GPTQ and AWQ 4-bit through GPTQModel (the maintained successor of AutoGPTQ, which absorbed AutoAWQ).

Both write the checkpoint formats vLLM serves with `--quantization gptq|awq`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from harness.quantize.base import Recipe, package_versions
from harness.runtime.device import cpu_has_bf16_matmul, is_cuda


class GptqModelQuantizer:
    engine = "gptqmodel"

    def __init__(self, method: str) -> None:
        self.method = method  # "gptq" | "awq"

    def versions(self) -> dict[str, str]:
        return package_versions("gptqmodel", "transformers", "torch", "optimum")

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        # On a 2-core machine GPTQModel asks for more CPU workers than it finds unless told.
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, os.cpu_count() or 1)))
        from gptqmodel import BACKEND, GPTQModel
        from gptqmodel.quantization import AWQConfig, GPTQConfig

        device = "cuda" if is_cuda() else "cpu"
        if self.method == "awq":
            config = AWQConfig(bits=recipe.bits or 4, group_size=recipe.group_size)
            backend = BACKEND.AUTO if is_cuda() else BACKEND.AWQ_TORCH
        else:
            config = GPTQConfig(bits=recipe.bits or 4, group_size=recipe.group_size)
            backend = BACKEND.AUTO
        import torch

        calibrate_fp32 = not is_cuda() and not cpu_has_bf16_matmul()
        dtype = torch.float32 if calibrate_fp32 else "auto"
        model = GPTQModel.load(str(source_path), config, device=device, dtype=dtype,
                               trust_remote_code=trust_remote_code)
        # AWQ's auto backend asks for CUDA; on CPU name the portable torch kernel.
        with _float32_packing(calibrate_fp32), _awq_clip_search(bool(recipe.extra.get("apply_clip", True))):
            model.quantize(calibration, batch_size=1, backend=backend)
        if calibrate_fp32:
            # Stored in the source checkpoint's 16-bit dtype, as if it had been calibrated in it. Not float16 by
            # default: AWQ folds its scales into the norms, which can leave float16's range (garbage output seen).
            target = _source_dtype(source_path)
            model.model.to(target)
            model.model.config.dtype = target
        model.save(str(out_dir))


@contextlib.contextmanager
def _float32_packing(enabled: bool):
    """Let GPTQModel's CPU torch kernels accept a float32 model while it quantizes.

    On a CPU without bf16 units, calibration forwards in bf16 run about 5x slower than float32 (AWQ's scale
    search runs some 80 of them per layer). GPTQModel's torch kernels declare float16/bfloat16 only, although
    their packing is dtype-agnostic; the model is cast to float16 before saving.
    """
    if not enabled:
        yield
        return
    import torch
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear

    saved = {cls: cls.SUPPORTS_DTYPES for cls in (TorchLinear, AwqTorchLinear)}
    try:
        for cls in saved:
            cls.SUPPORTS_DTYPES = [*saved[cls], torch.float32]
        yield
    finally:
        for cls, dtypes in saved.items():
            cls.SUPPORTS_DTYPES = dtypes


@contextlib.contextmanager
def _awq_clip_search(enabled: bool):
    """AWQ's weight-clipping search (AutoAWQ's `apply_clip`), which GPTQModel always runs.

    It is part of the AWQ recipe and stays on by default; on a CPU it dominates quantization time (about a minute
    per layer of the demo model), so the CPU recipe may turn it off, and the manifest records the choice.
    """
    from gptqmodel.looper.awq_processor import AWQProcessor

    original = AWQProcessor.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.apply_clip = enabled

    AWQProcessor.__init__ = init
    try:
        yield
    finally:
        AWQProcessor.__init__ = original


def _source_dtype(source_path: Path):
    import json

    import torch

    config = json.loads((source_path / "config.json").read_text(encoding="utf-8"))
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return torch.float16 if name == "float16" else torch.bfloat16
