"""The prompts' KV caches from a format's own generation, kept on disk for its fidelity forwards.

Teacher-forcing the baseline's continuation costs a forward over prompt + continuation for every item, and the
prompt is most of it (the bundled zh set: ~480 prompt tokens against ~86 answer tokens), while the format's
generation has just computed that prompt's KV cache. So, when a job has fidelity work, each generation batch's
cache, cut to the prompt (all but its last token, whose logits predict the first answer token), is written here
after the batch's timing ends, and the fidelity forwards run over the last prompt token and the continuation only
(teacher.continuation_logprobs). The baseline's reference and every comparison take this same path, batch for batch
(generation batches are the same for every format), so the baseline against itself stays exactly 0.

Written outside the timed region and without copying a layer whole on a CPU (each (row, head) slice is contiguous,
written as it lies), so neither the latency nor the memory peaks of the evaluated generation change; read back in
the fidelity stage, which runs after the measured timeline. Only a plain DynamicCache of full-attention layers is
kept (a sliding-window or recurrent layer's cache does not hold the whole prompt); a job whose caches would pass
LIMIT_BYTES, or half the free disk, keeps what fits and teacher-forces the rest over the whole prompt.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

LIMIT_BYTES = 8 * 2**30  # a job's prompt caches on disk at most


@dataclass(frozen=True)
class CachedBatch:
    """One generation batch's prompt cache: rows in batch order, each left-padded to `width` tokens, of which the
    first width - 1 are cached (positions 0 .. width - 2)."""

    path: Path
    item_ids: tuple[str, ...]
    prompt_lengths: tuple[int, ...]
    width: int
    dtype: str
    layers: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per layer: (key shape, value shape)

    def load(self, rows: list[int], device) -> list[tuple]:
        """[(keys, values)] per layer for the batch rows `rows`, as tensors on `device`."""
        import torch

        dtype = getattr(torch, self.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        tensors = []
        with open(self.path, "rb") as stream:
            for shapes in self.layers:
                pair = []
                for shape in shapes:
                    raw = bytearray(stream.read(math.prod(shape) * itemsize))
                    whole = torch.frombuffer(raw, dtype=dtype).reshape(shape)
                    pair.append(whole[rows].to(device))
                tensors.append(tuple(pair))
        return tensors


class PromptCacheWriter:
    """Writes each generation batch's prompt cache under `directory` (one .bin and one .json a batch)."""

    def __init__(self, directory: Path, limit_bytes: int = LIMIT_BYTES) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.budget = min(limit_bytes, shutil.disk_usage(directory).free // 2)
        self.written = 0
        self.batches = 0

    def save(self, item_ids: list[str], prompt_lengths: list[int], width: int, cache) -> bool:
        """Keep this batch's prompt cache; False when the cache is not a plain full-attention DynamicCache or the
        budget is spent (its items are then teacher-forced over the whole prompt)."""
        layers = plain_layers(cache)
        kept = width - 1
        if layers is None or kept < 1:
            return False
        size = sum(layer.keys[:, :, :kept].numel() * layer.keys.element_size()
                   + layer.values[:, :, :kept].numel() * layer.values.element_size() for layer in layers)
        if self.written + size > self.budget:
            return False
        stem = self.directory / f"batch-{self.batches:05d}"
        shapes = []
        with open(stem.with_suffix(".bin"), "wb") as stream:
            for layer in layers:
                pair = []
                for tensor in (layer.keys, layer.values):
                    _write_prefix(stream, tensor, kept)
                    pair.append([tensor.shape[0], tensor.shape[1], kept, tensor.shape[3]])
                shapes.append(pair)
        stem.with_suffix(".json").write_text(json.dumps({
            "item_ids": list(item_ids), "prompt_lengths": list(prompt_lengths), "width": width,
            "dtype": str(layers[0].keys.dtype).replace("torch.", ""), "layers": shapes}))
        self.written += size
        self.batches += 1
        return True


def plain_layers(cache) -> list | None:
    """The cache's layers when every one is a plain DynamicLayer holding keys [batch, heads, tokens, dim]."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized
                         or getattr(layer.keys, "ndim", 0) != 4 for layer in layers):
        return None
    return list(layers)


def _write_prefix(stream, tensor, kept: int) -> None:
    """tensor[:, :, :kept] in [batch, heads, kept, dim] order, slice by slice: each (row, head) slice of a
    contiguous cache tensor is itself contiguous, so nothing the size of a layer is copied on a CPU."""
    import torch

    if tensor.device.type != "cpu":
        tensor = tensor[:, :, :kept].cpu()
    for row in range(tensor.shape[0]):
        for head in range(tensor.shape[1]):
            piece = tensor[row, head, :kept]
            if not piece.is_contiguous():
                piece = piece.contiguous()
            stream.write(piece.view(torch.uint8).numpy().data)


def read_batches(directory: Path | None) -> list[CachedBatch]:
    if directory is None or not directory.is_dir():
        return []
    found = []
    for meta in sorted(directory.glob("batch-*.json")):
        data = json.loads(meta.read_text())
        found.append(CachedBatch(meta.with_suffix(".bin"), tuple(data["item_ids"]), tuple(data["prompt_lengths"]),
                                 int(data["width"]), data["dtype"],
                                 tuple((tuple(k), tuple(v)) for k, v in data["layers"])))
    return found
