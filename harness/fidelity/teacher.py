"""The fidelity stage inside a format's worker: teacher-force the model on prompt + the baseline's continuation.

write_reference (the baseline's worker) keeps, per output position, the top-k token ids and log-probabilities and
the baseline's own token; compare_to_reference (every other format's worker) reads that file and measures the
format against it without the baseline in memory. Both run batch 1, so no padding enters the comparison.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness import progress
from harness.cache import atomic_write_json, read_json

TINY = 1e-12


def write_reference(model, task, top_k: int) -> None:
    """task: harness.jobs.FidelityTask in mode "reference"; its generation_path holds the baseline's outputs."""
    import torch

    generated = read_json(Path(task.generation_path)) or {}
    continuation = {o["id"]: o.get("token_ids") or [] for o in generated.get("outputs") or []}
    item_ids, inputs, prompt_lengths, tops, top_lps, targets = [], [], [], [], [], []
    label = f"fidelity reference {task.evalset}"
    progress.step(label, 0, len(task.items))
    for done, (item_id, prompt_ids) in enumerate(task.items, 1):
        following = list(continuation.get(item_id) or [])
        if following:
            ids = list(prompt_ids) + following
            logprobs = model.next_token_logprobs(ids, len(prompt_ids))
            values, indices = torch.topk(logprobs, min(top_k, logprobs.shape[-1]), dim=-1)
            item_ids.append(item_id)
            inputs.append(np.asarray(ids, dtype=np.int64))
            prompt_lengths.append(len(prompt_ids))
            tops.append(indices.numpy().astype(np.int64))
            top_lps.append(values.numpy().astype(np.float32))
            targets.append(np.asarray(following, dtype=np.int64))
        progress.step(label, done, len(task.items))
    path = Path(task.reference_path)
    partial = path.with_name(path.name + ".part.npz")
    np.savez_compressed(
        partial, item_ids=np.asarray(item_ids, dtype=str), prompt_lengths=np.asarray(prompt_lengths, dtype=np.int64),
        input_offsets=_offsets(inputs), input_ids=_concat(inputs, np.int64),
        position_offsets=_offsets(targets), targets=_concat(targets, np.int64),
        top_ids=np.concatenate(tops) if tops else np.zeros((0, top_k), np.int64),
        top_logprobs=np.concatenate(top_lps) if top_lps else np.zeros((0, top_k), np.float32),
        key=np.asarray(task.key))
    partial.replace(path)


def compare_to_reference(model, task) -> None:
    """task: harness.jobs.FidelityTask in mode "compare"; writes the per-item figures to task.result_path."""
    import torch

    reference = read_reference(Path(task.reference_path))
    items = []
    label = f"fidelity {task.evalset}"
    total = len(reference["item_ids"])
    progress.step(label, 0, total)
    for index, item_id in enumerate(reference["item_ids"]):
        ids = reference["input_ids"][reference["input_offsets"][index]:reference["input_offsets"][index + 1]]
        first = int(reference["prompt_lengths"][index])
        rows = slice(reference["position_offsets"][index], reference["position_offsets"][index + 1])
        logprobs = model.next_token_logprobs(ids.tolist(), first)
        figures = position_figures(logprobs, torch.from_numpy(reference["top_ids"][rows]),
                                   torch.from_numpy(reference["top_logprobs"][rows]),
                                   torch.from_numpy(reference["targets"][rows]))
        items.append({"id": str(item_id), **figures})
        progress.step(label, index + 1, total)
    atomic_write_json(Path(task.result_path), {"evalset": task.evalset, "key": task.key,
                                               "reference_key": str(reference["key"]),
                                               "top_k": int(reference["top_ids"].shape[-1]), "items": items})


def position_figures(logprobs, top_ids, top_logprobs, targets) -> dict:
    """One item's figures from the format's log-probabilities [P, vocab] and the reference's top-k [P, k]."""
    import torch

    format_top = logprobs.gather(1, top_ids)
    p_top = top_logprobs.exp()
    p_rest = (1 - p_top.sum(dim=1)).clamp(min=0)
    q_rest = (1 - format_top.exp().sum(dim=1)).clamp(min=TINY)
    rest = torch.where(p_rest > TINY, p_rest * (p_rest.clamp(min=TINY).log() - q_rest.log()), torch.zeros_like(p_rest))
    kl = ((p_top * (top_logprobs - format_top)).sum(dim=1) + rest).clamp(min=0)
    agree = logprobs.argmax(dim=1) == top_ids[:, 0]
    departed = (~agree).nonzero()
    target_logprob = logprobs.gather(1, targets[:, None])[:, 0]
    return {"positions": int(kl.numel()), "kl_sum": float(kl.sum()), "agree": int(agree.sum()),
            "target_logprob_sum": float(target_logprob.sum()),
            "first_flip": int(departed[0, 0]) if departed.numel() else None,
            "kl_by_position": [round(float(v), 6) for v in kl]}


def read_reference(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _offsets(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(a) for a in arrays], dtype=np.int64)]).astype(np.int64)


def _concat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)

