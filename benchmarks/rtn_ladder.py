"""Simulated round-to-nearest rungs for the fidelity ladder (#42 item 1): every Linear weight of a checkpoint
quantized to a grid and dequantized again, stored in the model's own dtype, so that a rung costs what the baseline
costs to evaluate and KL can be placed anywhere from about int8's to past GPTQ 4-bit's.

Which weights: every `nn.Linear` of the model (attention and MLP projections) except the output head
(`get_output_embeddings()`, the lm_head), which GPTQ and AWQ leave 16-bit too; on a model with tied embeddings
(the demo model) the head is the embedding matrix, and neither is touched. Norms and embeddings stay as they are,
bit for bit.

The grid, per group of `group_size` inputs of one output row (the last group of a row narrower when the input
width is not a multiple, as GPTQ's groups are), computed in float32 and cast back to the checkpoint's dtype:
- symmetric: scale = max|w| / ((2^b - 1) / 2), q = clamp(round(w / scale), -2^(b-1), 2^(b-1) - 1), w' = q * scale
  (compressed-tensors' and GPTQ's symmetric range: 2^b levels, zero in the middle);
- asymmetric: the range [min(w, 0), max(w, 0)] in 2^b - 1 steps, zero = round(-min / scale),
  q = clamp(round(w / scale) + zero, 0, 2^b - 1), w' = (q - zero) * scale (AWQ's and GPTQ sym=false's).
Every w' is within half a step of w before the cast (the cast adds at most bf16's own rounding).

A rung is a plain safetensors checkpoint that `quantgate run --candidate NAME=PATH` judges: its config.json carries
a `quantization_config` whose `quant_method` is "quantgate-simulated" (harness/candidates.py takes only checkpoints
with a quantization config; transformers skips a method it does not know and loads the 16-bit weights as they are,
and quantgate plans the rung at 16 bits since the config names no `bits`). It is never a product format: vLLM
cannot serve it. Built deterministically; cached under the root by (source fingerprint, bits, group, symmetric)
and sealed, so a truncated or edited rung is rebuilt.

    PYTHONPATH=. .venv/bin/python -m benchmarks.rtn_ladder SOURCE_DIR ROOT [--bits 4 --group 128 --asym]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.candidates import SIMULATED_METHOD  # a quant_method no engine knows: the weights load as stored
from harness.errors import UserError

BITS = (8, 6, 5, 4, 3)
GROUP_SIZES = (128, 32)
SKIPPED_FILES = ("quantgate_seal.json",)  # the source's own cache seal; a rung gets its own


@dataclass(frozen=True)
class RtnScheme:
    bits: int
    group_size: int  # inputs per scale; -1: one scale per output row
    symmetric: bool

    @property
    def name(self) -> str:
        group = "ch" if self.group_size <= 0 else f"g{self.group_size}"
        return f"rtn{self.bits}-{group}-{'sym' if self.symmetric else 'asym'}"

    def quantization_config(self, source_fingerprint: str, dtype: str) -> dict:
        # No `bits`/`group_size`/`sym` keys: harness.quant_config would read those as the stored width.
        return {"quant_method": SIMULATED_METHOD, "simulated": "round-to-nearest, quantized and dequantized",
                "weight_bits": self.bits, "weight_group_size": self.group_size, "weight_symmetric": self.symmetric,
                "stored_dtype": dtype, "modules": "every Linear but the output head (lm_head)",
                "source_fingerprint": source_fingerprint, "built_by": "benchmarks/rtn_ladder.py"}


LADDER = tuple(RtnScheme(bits, group, symmetric) for bits in BITS for group in GROUP_SIZES
               for symmetric in (True, False))


def fake_quantize(weight, scheme: RtnScheme):
    """`weight` (out x in) rounded to the scheme's grid and dequantized, in its own dtype."""
    import torch
    import torch.nn.functional as F

    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D Linear weight, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    group = cols if scheme.group_size <= 0 else scheme.group_size
    pad = (-cols) % group
    w = weight.float()
    grouped = F.pad(w, (0, pad)).view(rows, -1, group)
    # the padding must not widen a short last group's range
    high = F.pad(w, (0, pad), value=float("-inf")).view(rows, -1, group).amax(-1, keepdim=True)
    low = F.pad(w, (0, pad), value=float("inf")).view(rows, -1, group).amin(-1, keepdim=True)
    levels = 2 ** scheme.bits - 1
    if scheme.symmetric:
        scale = torch.maximum(high.abs(), low.abs()) / (levels / 2)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.clamp(torch.round(grouped / scale), -(levels + 1) // 2, levels // 2)
        restored = q * scale
    else:
        low, high = low.clamp(max=0), high.clamp(min=0)
        scale = (high - low) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = torch.round(-low / scale)
        q = torch.clamp(torch.round(grouped / scale) + zero, 0, levels)
        restored = (q - zero) * scale
    return restored.view(rows, -1)[:, :cols].to(weight.dtype).contiguous()


def quantized_weight_names(source: Path) -> tuple[str, ...]:
    """The tensor names of every Linear weight but the output head's, from the model built on the meta device."""
    import torch

    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(source)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    return tuple(f"{name}.weight" for name, module in model.named_modules()
                 if isinstance(module, torch.nn.Linear) and module is not head)


def build_rung(source: Path, root: Path, scheme: RtnScheme) -> Path:
    """The rung's checkpoint directory under `root`, built once per (source fingerprint, scheme)."""
    from harness.source import fingerprint

    digest = fingerprint(source)
    target = root / f"{scheme.name}-{digest.removeprefix('sha256:')[:16]}"
    names = set(quantized_weight_names(source))

    def quantize(tensors: dict) -> dict:
        return {name: fake_quantize(t, scheme) if name in names else t for name, t in tensors.items()}

    return write_variant(source, target, quantize, names,
                         lambda config: {**config, "quantization_config": scheme.quantization_config(
                             digest, str(config.get("dtype") or config.get("torch_dtype") or "?"))})


def write_variant(source: Path, target: Path, transform: Callable[[dict], dict], expected: set[str],
                  edit_config: Callable[[dict], dict]) -> Path:
    """A copy of the checkpoint at `source` whose tensors went through `transform` (one weight file's tensors at a
    time) and whose config.json went through `edit_config`; every other file copied. Reused while sealed.
    `expected`: tensor names that must exist in the weight files (a checkpoint whose names are not the model's
    own is refused rather than silently left unchanged)."""
    from safetensors.torch import load_file, save_file

    from harness.cache import is_sealed, remove_tree, seal_dir
    from harness.source import weight_files

    if is_sealed(target, required=("config.json",)):
        return target
    files = weight_files(source)
    if not files or any(f.suffix != ".safetensors" for f in files):
        raise UserError(f"{source}: needs safetensors weights (found {[f.name for f in files] or 'none'})")
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    if config.get("quantization_config"):
        raise UserError(f"{source}: config.json carries a quantization_config: give a full-precision checkpoint")
    tmp = target.with_name(target.name + ".part")
    remove_tree(tmp)
    tmp.mkdir(parents=True)
    seen: set[str] = set()
    for file in files:
        tensors = load_file(file)
        seen |= tensors.keys()
        save_file(transform(tensors), tmp / file.name, metadata={"format": "pt"})
    missing = sorted(expected - seen)
    if missing:
        remove_tree(tmp)
        raise UserError(f"{source}: {len(missing)} of the model's weights are not in its safetensors files under "
                        f"the model's own names (e.g. {missing[0]}); this builder reads checkpoints saved by "
                        "transformers")
    for item in source.iterdir():
        if item.is_file() and item.name != "config.json" and item.name not in SKIPPED_FILES \
                and item not in files and not item.name.endswith(".bin"):
            shutil.copy2(item, tmp / item.name)
        elif item.is_dir() and not item.name.startswith("."):
            shutil.copytree(item, tmp / item.name)
    (tmp / "config.json").write_text(json.dumps(edit_config(config), indent=2) + "\n", encoding="utf-8")
    seal_dir(tmp)
    remove_tree(target)
    tmp.rename(target)
    return target


def build_ladder(source: Path, root: Path, schemes: tuple[RtnScheme, ...] = LADDER) -> dict[str, Path]:
    """{rung name: checkpoint directory} for every scheme, built or reused."""
    return {scheme.name: build_rung(source, root, scheme) for scheme in schemes}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="simulated RTN rungs of a checkpoint (quantized, dequantized)")
    parser.add_argument("source", type=Path)
    parser.add_argument("root", type=Path, help="where the rungs are built (and reused)")
    parser.add_argument("--bits", type=int, choices=BITS, help="one width (default: all)")
    parser.add_argument("--group", type=int, help="one group size (default: 128 and 32; -1: per output row)")
    parser.add_argument("--asym", action="store_true", help="asymmetric only (with --bits)")
    parser.add_argument("--sym", action="store_true", help="symmetric only (with --bits)")
    args = parser.parse_args(argv)
    schemes = tuple(s for s in (LADDER if args.group is None else tuple(
        RtnScheme(b, args.group, sym) for b in BITS for sym in (True, False)))
        if (args.bits is None or s.bits == args.bits) and not (args.asym and s.symmetric)
        and not (args.sym and not s.symmetric))
    return print_built(args.source, lambda: build_ladder(args.source, args.root, schemes))


def print_built(source: Path, build: Callable[[], dict[str, Path]]) -> int:
    """The builders' command lines end alike: check the source, build, print NAME=PATH per rung; bad input is one
    line and exit 2."""
    try:
        if not (source / "config.json").is_file():
            raise UserError(f"{source}: not a checkpoint directory (no config.json)")
        for name, path in build().items():
            print(f"{name}={path}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
