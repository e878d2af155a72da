"""GPTQ and AWQ 4-bit through GPTQModel (the maintained successor of AutoGPTQ, which absorbed AutoAWQ).

Both write the checkpoint formats vLLM serves with `--quantization gptq|awq`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.quantize.base import Recipe, package_versions
from harness.runtime.device import cpu_has_bf16_matmul, is_cuda


class GptqModelQuantizer:
    engine = "gptqmodel"

    def __init__(self, method: str) -> None:
        self.method = method  # "gptq" | "awq"

    def versions(self) -> dict[str, str]:
        return package_versions("gptqmodel", "transformers", "torch", "optimum")

    def calibration_dtype(self, source_path: Path) -> str:
        return calibration_plan(source_path, self.method).calibration_dtype

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        import torch
        from gptqmodel import GPTQModel  # GPTQMODEL_CPU_WORKERS comes from the worker's environment (launcher)

        from harness.quantize.gptqmodel_support import architecture_refusal

        refusal = architecture_refusal(source_path, self.method, trust_remote_code=trust_remote_code)
        if refusal:  # before any weight is loaded or calibrated
            raise UserError(refusal)
        plan = calibration_plan(source_path, self.method)
        config = self.quantize_config(recipe, offload_to_disk=not plan.cast_after)
        model = GPTQModel.load(str(source_path), config, device=plan.device, dtype=plan.load_dtype,
                               trust_remote_code=trust_remote_code)
        with _awq_clip_search(bool(recipe.extra.get("apply_clip", True))):
            model.quantize(calibration, batch_size=1, backend=self.backend(plan))
        if plan.cast_after:
            # Stored in the source checkpoint's 16-bit dtype, as if it had been calibrated in it. Not float16 by
            # default: AWQ folds its scales into the norms, which can leave float16's range (garbage output seen).
            model.model.to(plan.store_dtype)
            model.model.config.dtype = plan.store_dtype
        model.save(str(out_dir))
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def quantize_config(self, recipe: Recipe, *, offload_to_disk: bool):
        """GPTQModel offloads finished layers to disk while it quantizes, recording each packed tensor's dtype;
        `save` then checks them against the model's. A model calibrated in float32 and cast back to its 16-bit
        dtype before saving no longer matches ("Offload metadata mismatch ... expected dtype torch.bfloat16 ...
        found dtype torch.float16"), so that path keeps the layers in memory (`offload_to_disk=False`, a
        supported option): a 4-bit model on a CPU host is small next to the float32 copy being calibrated."""
        from gptqmodel.quantization import AWQConfig, GPTQConfig

        kind = AWQConfig if self.method == "awq" else GPTQConfig
        return kind(bits=recipe.bits or 4, group_size=recipe.group_size, offload_to_disk=offload_to_disk)

    def backend(self, plan: CalibrationPlan):
        """The kernel GPTQModel packs with. GPTQ calibrated in float32 on CPU: the torch-fused kernel, which
        declares float32 (the plain torch one accepts only 16-bit dtypes) and writes the same GPTQ checkpoint.
        AWQ on CPU: the portable torch kernel (the auto backend asks for CUDA)."""
        from gptqmodel import BACKEND

        if plan.device == "cuda":
            return BACKEND.AUTO
        if self.method == "awq":
            return BACKEND.AWQ_TORCH
        return BACKEND.GPTQ_TORCH_FUSED if plan.cast_after else BACKEND.AUTO


@dataclass(frozen=True)
class CalibrationPlan:
    device: str
    load_dtype: object  # torch.dtype or "auto"
    store_dtype: object  # the dtype the checkpoint is saved in
    cast_after: bool  # calibrated in another dtype than stored: cast before saving

    @property
    def calibration_dtype(self) -> str:
        return "float32" if self.cast_after else "checkpoint"


def calibration_plan(source_path: Path, method: str) -> CalibrationPlan:
    """Where and in which dtype to calibrate.

    GPTQ on a CPU without bf16 units: in float32 (its calibration forwards in emulated bf16 are slow), stored in
    the source's 16-bit dtype. AWQ always calibrates in the checkpoint's own dtype: calibrated in float32, GPTQModel
    7.6's AWQ path writes a checkpoint that generates garbage (measured on the demo model: 4 calibration texts,
    bf16 -> "The capital of France is Paris.", float32 -> noise; also with 32 texts, with and without disk
    offload), and in bf16 it took no longer here (58 s against 77 s for those 4 texts).
    `QUANTGATE_FORCE_NO_BF16=1` takes the no-bf16 path on any CPU.
    """
    import torch

    if is_cuda():
        return CalibrationPlan("cuda", "auto", "auto", False)
    if cpu_has_bf16_matmul() or method == "awq":
        return CalibrationPlan("cpu", "auto", "auto", False)
    return CalibrationPlan("cpu", torch.float32, _source_dtype(source_path), True)


@contextlib.contextmanager
def _awq_clip_search(enabled: bool):
    """AWQ's weight-clipping search (AutoAWQ's `apply_clip`), which GPTQModel always runs.

    It is part of the AWQ recipe and stays on by default; on a CPU it dominates quantization time (about a minute
    per layer of the demo model), so the CPU recipe may turn it off, and the manifest records the choice.
    GPTQModel 7.6 has no option for it (`AWQProcessor.__init__` sets `self.apply_clip = True`), hence this patch;
    tests/test_engine_contracts.py fails when GPTQModel changes that code.
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
