"""The fidelity stage inside a format's worker: teacher-force the model on prompt + the baseline's continuation.

write_reference (the baseline's worker) keeps, per output position, the top-k token ids and log-probabilities and
the baseline's own token; compare_to_reference (every other format's worker) reads that file and measures the
format against it without the baseline in memory. Both run the forwards in batches (teacher_forced_logprobs:
longest first, left-padded with position ids from the attention mask, as generation is), the same items in the
same batches on both sides, so the baseline against itself is exactly 0; batching moves a figure by float noise
only (tests/test_fidelity.py checks batched against batch 1 on a real model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from harness import progress
from harness.cache import atomic_write_json, read_json
from harness.fidelity.prompt_cache import plain_layers, read_batches

TINY = 1e-12
LOGITS_BYTES = 256 * 2**20  # float32 logits one batched forward may keep: bounds the batch on long answers


def write_reference(model, task, top_k: int, batch_size: int = 1, prompt_cache_dir: Path | None = None) -> None:
    """task: harness.jobs.FidelityTask in mode "reference"; its generation_path holds the baseline's outputs.
    prompt_cache_dir: this job's generation's prompt caches (harness.fidelity.prompt_cache), when it kept them."""
    import torch

    started, cpu_started = time.time(), time.process_time()
    generated = read_json(Path(task.generation_path)) or {}
    continuation = {o["id"]: o.get("token_ids") or [] for o in generated.get("outputs") or []}
    kept = [(item_id, list(prompt_ids), list(continuation.get(item_id) or [])) for item_id, prompt_ids in task.items]
    kept = [entry for entry in kept if entry[2]]
    item_ids = [item_id for item_id, _, _ in kept]
    inputs = [np.asarray(prompt + following, dtype=np.int64) for _, prompt, following in kept]
    prompt_lengths = [len(prompt) for _, prompt, _ in kept]
    targets = [np.asarray(following, dtype=np.int64) for _, _, following in kept]
    tops: list = [None] * len(kept)
    top_lps: list = [None] * len(kept)
    label = f"fidelity reference {task.evalset}"
    progress.step(label, 0, len(kept))
    sequences = [(ids, first) for ids, first in zip(inputs, prompt_lengths)]
    forced = forced_logprobs(model, sequences, batch_size, item_ids, prompt_cache_dir)
    for done, (index, logprobs) in enumerate(forced, 1):
        values, indices = torch.topk(logprobs, min(top_k, logprobs.shape[-1]), dim=-1)
        tops[index] = indices.numpy().astype(np.int64)
        top_lps[index] = values.numpy().astype(np.float32)
        progress.step(label, done, len(kept))
    path = Path(task.reference_path)
    partial = path.with_name(path.name + ".part.npz")
    np.savez_compressed(
        partial, item_ids=np.asarray(item_ids, dtype=str), prompt_lengths=np.asarray(prompt_lengths, dtype=np.int64),
        input_offsets=_offsets(inputs), input_ids=_concat(inputs, np.int64),
        position_offsets=_offsets(targets), targets=_concat(targets, np.int64),
        top_ids=np.concatenate(tops) if tops else np.zeros((0, top_k), np.int64),
        top_logprobs=np.concatenate(top_lps) if top_lps else np.zeros((0, top_k), np.float32),
        key=np.asarray(task.key), wall_s=np.asarray(time.time() - started),
        cpu_s=np.asarray(time.process_time() - cpu_started), prompt_cache_items=np.asarray(forced.cached))
    partial.replace(path)


def compare_to_reference(model, task, batch_size: int = 1, prompt_cache_dir: Path | None = None) -> None:
    """task: harness.jobs.FidelityTask in mode "compare"; writes the per-item figures to task.result_path."""
    import torch

    started, cpu_started = time.time(), time.process_time()
    reference = read_reference(Path(task.reference_path))
    item_ids = reference["item_ids"]
    offsets = reference["input_offsets"]
    sequences = [(reference["input_ids"][offsets[i]:offsets[i + 1]], int(reference["prompt_lengths"][i]))
                 for i in range(len(item_ids))]
    figures_of: list = [None] * len(item_ids)
    label = f"fidelity {task.evalset}"
    progress.step(label, 0, len(item_ids))
    on_caches = bool(reference.get("prompt_cache_items", 0))
    forced = forced_logprobs(model, sequences, batch_size, [str(i) for i in item_ids], prompt_cache_dir,
                             use_cache=on_caches, rebuild=on_caches)
    for done, (index, logprobs) in enumerate(forced, 1):
        rows = slice(reference["position_offsets"][index], reference["position_offsets"][index + 1])
        figures_of[index] = position_figures(logprobs, torch.from_numpy(reference["top_ids"][rows]),
                                             torch.from_numpy(reference["top_logprobs"][rows]),
                                             torch.from_numpy(reference["targets"][rows]))
        progress.step(label, done, len(item_ids))
    items = [{"id": str(item_id), **figures} for item_id, figures in zip(item_ids, figures_of)]
    atomic_write_json(Path(task.result_path), {"evalset": task.evalset, "key": task.key,
                                               "reference_key": str(reference["key"]),
                                               "top_k": int(reference["top_ids"].shape[-1]), "items": items,
                                               "prompt_cache_items": forced.cached,
                                               "wall_s": round(time.time() - started, 3),
                                               "cpu_s": round(time.process_time() - cpu_started, 3)})


class forced_logprobs:
    """(index, log-probabilities) for every sequence: over the cached prompt where this job's generation kept the
    item's prompt cache (continuation_logprobs); with `rebuild` (a comparison against a reference made over cached
    prompts), the items it did not keep (its generation ran in an earlier job) over prompts prefilled again in
    generation's batches (prefilled_batches), so both sides stay on one path; the rest (a sliding-window or
    recurrent cache; a reference's items without caches) over the whole prompt (teacher_forced_logprobs). use_cache False: the whole prompt for every item (a comparison against a
    reference that was made so, to keep both sides on one path). `cached` counts the items taken from prompt caches,
    kept or rebuilt, once iterated."""

    def __init__(self, model, sequences, batch_size: int, item_ids: Sequence[str], prompt_cache_dir: Path | None,
                 use_cache: bool = True, rebuild: bool = False) -> None:
        self.model, self.sequences, self.batch_size = model, sequences, batch_size
        self.item_ids = list(item_ids)
        self.use_cache, self.rebuild = use_cache, rebuild
        self.batches = [] if not use_cache else read_batches(prompt_cache_dir)
        self.cached = 0

    def __iter__(self):
        covered = set()
        if self.use_cache and hasattr(getattr(self.model, "model", None), "config"):
            for index, logprobs in continuation_logprobs(self.model, self.batches, self.sequences, self.item_ids):
                covered.add(index)
                yield index, logprobs
            missing = set(range(len(self.sequences))) - covered
            if missing and self.rebuild and hasattr(self.model, "generate_keeping_prompt_cache"):
                rebuilt = prefilled_batches(self.model, self.sequences, self.item_ids, self.batch_size, missing)
                for index, logprobs in continuation_logprobs(self.model, rebuilt, self.sequences, self.item_ids):
                    covered.add(index)
                    yield index, logprobs
        self.cached = len(covered)
        rest = [i for i in range(len(self.sequences)) if i not in covered]
        for position, logprobs in teacher_forced_logprobs(self.model, [self.sequences[i] for i in rest],
                                                          self.batch_size):
            yield rest[position], logprobs


@dataclass(frozen=True)
class PrefilledBatch:
    """A generation batch's prompt cache rebuilt in memory (prefilled_batches), read as a CachedBatch is. Rows whose
    item is already covered carry an empty id, so continuation_logprobs passes them by."""

    item_ids: tuple[str, ...]
    prompt_lengths: tuple[int, ...]
    width: int
    layers: tuple

    def load(self, rows: list[int], device) -> list[tuple]:
        return [(keys[rows].to(device), values[rows].to(device)) for keys, values in self.layers]


def prefilled_batches(model, sequences: Sequence[tuple[Sequence[int], int]], item_ids: Sequence[str],
                      batch_size: int, wanted: set[int]) -> Iterator[PrefilledBatch]:
    """The prompt caches generation would have kept for the `wanted` sequences: generation's batches (longest prompt
    first, `batch_size` at a time, harness.worker.generate_evalset) prefilled by the runtime's own generate for one
    token, so each cache is the one its generation computed, cut as PromptCacheWriter cuts it. A batch whose cache
    is not a plain full-attention one yields nothing (its items go over whole prompts)."""
    order = sorted(range(len(sequences)), key=lambda i: (-int(sequences[i][1]), i))
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        if not wanted.intersection(batch):
            continue
        prompts = [[int(t) for t in sequences[i][0][:int(sequences[i][1])]] for i in batch]
        kept: dict = {}

        def keep(width, cache):
            layers = plain_layers(cache)
            if layers is not None and width > 1:
                kept["batch"] = PrefilledBatch(
                    tuple(str(item_ids[i]) if i in wanted else "" for i in batch), tuple(len(p) for p in prompts),
                    width, tuple((layer.keys[:, :, :width - 1], layer.values[:, :, :width - 1]) for layer in layers))

        model.generate_keeping_prompt_cache(prompts, 1, keep)
        if "batch" in kept:
            yield kept.pop("batch")


def continuation_logprobs(model, batches, sequences: Sequence[tuple[Sequence[int], int]],
                          item_ids: Sequence[str]) -> Iterator[tuple[int, object]]:
    """(index, log-probabilities [len(ids) - first, vocab]) for the sequences whose item a cached generation
    batch holds with the same prompt length: one forward per batch (split where the kept logits would pass
    LOGITS_BYTES) over each row's last prompt token and its continuation, on the batch's prompt cache, with the
    positions and mask generate() gave the row."""
    position_of = {str(item_id): index for index, item_id in enumerate(item_ids)}
    vocab = int(getattr(model.model.config, "vocab_size", 0) or 0) or 1
    for batch in batches:
        rows = [(row, position_of[item_id]) for row, item_id in enumerate(batch.item_ids)
                if item_id in position_of and int(sequences[position_of[item_id]][1]) == batch.prompt_lengths[row]
                and len(sequences[position_of[item_id]][0]) > batch.prompt_lengths[row]]
        for group in _logit_groups(rows, lambda entry: len(sequences[entry[1]][0]) - sequences[entry[1]][1], vocab):
            yield from _continuation_batch(model, batch, group, sequences)


def _continuation_batch(model, batch, group: list[tuple[int, int]], sequences) -> list[tuple[int, object]]:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=batch.load([row for row, _ in group], model.device))
    prompts = [batch.prompt_lengths[row] for row, _ in group]
    following = [[int(t) for t in sequences[index][0][sequences[index][1]:]] for _, index in group]
    lasts = [int(sequences[index][0][sequences[index][1] - 1]) for _, index in group]
    width = max(len(ids) for ids in following)
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    rows = [[last] + ids[:-1] + [pad] * (width - len(ids)) for last, ids in zip(lasts, following)]
    cached_mask = [[0] * (batch.width - length) + [1] * (length - 1) for length in prompts]
    new_mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids in following]
    attention = torch.tensor([a + b for a, b in zip(cached_mask, new_mask)], device=model.device)
    positions = torch.tensor([[length - 1 + j for j in range(width)] for length in prompts], device=model.device)
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor(rows, device=model.device), attention_mask=attention,
                             position_ids=positions, use_cache=True, **cache_argument(model.model, cache)).logits
        return [(index, torch.log_softmax(logits[row, :len(ids)].float(), dim=-1).cpu())
                for row, ((_, index), ids) in enumerate(zip(group, following))]


def teacher_forced_logprobs(model, sequences: Sequence[tuple[Sequence[int], int]],
                            batch_size: int) -> Iterator[tuple[int, object]]:
    """(index, log-probabilities [len(ids) - first, vocab], float32 on the CPU) for every (ids, first) of
    `sequences`, in the order computed: longest first, up to batch_size a forward (fewer where the kept logits
    would pass LOGITS_BYTES). A runtime that holds a Hugging Face causal LM (`model.model`, as the transformers
    backend does) runs batched; any other runtime with next_token_logprobs runs batch 1."""
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i][0]), i))
    network = getattr(model, "model", None)
    if batch_size <= 1 or network is None or not hasattr(network, "config"):
        for index in order:
            ids, first = sequences[index]
            yield index, model.next_token_logprobs([int(t) for t in ids], first)
        return
    vocab = int(getattr(network.config, "vocab_size", 0) or 0) or 1
    # logits_to_keep is the continuation's positions plus one (the last prompt token's)
    for batch in _logit_groups(order, lambda i: len(sequences[i][0]) - sequences[i][1] + 1, vocab, batch_size):
        yield from zip(batch, _batch_logprobs(model, [sequences[i] for i in batch]))


def _logit_groups(entries: Sequence, positions, vocab: int, limit: int | None = None) -> Iterator[list]:
    """`entries` in consecutive groups whose kept logits (rows x the longest row's `positions` x vocab, float32)
    stay within LOGITS_BYTES, at most `limit` rows a group (a group of one may pass the bound)."""
    group: list = []
    longest = 0
    for entry in entries:
        wanted = max(longest, positions(entry))
        if group and ((limit and len(group) >= limit) or (len(group) + 1) * wanted * vocab * 4 > LOGITS_BYTES):
            yield group
            group, wanted = [], positions(entry)
        group.append(entry)
        longest = wanted
    if group:
        yield group


def _batch_logprobs(model, batch: list[tuple[Sequence[int], int]]) -> list:
    """One batched forward over left-padded sequences. Position ids count real tokens only (from the attention
    mask, as generate() derives them), so each row sees the positions it has at batch 1; only the last `keep`
    positions' logits are computed, and each row's continuation positions are the last of them. The prompt
    prefix the batch's items share (an evalset's instruction and few-shot examples) is run once and its KV cache
    repeated over the batch (shared_prefix)."""
    import torch

    network = model.model
    prefix = shared_prefix(network, batch)
    past = None
    if prefix:
        with torch.inference_mode():
            head = torch.tensor([[int(t) for t in batch[0][0][:prefix]]], device=model.device)
            past = network(input_ids=head, use_cache=True).past_key_values
        if hasattr(past, "batch_repeat_interleave"):
            past.batch_repeat_interleave(len(batch))
        else:  # a cache this transformers cannot repeat over a batch: run the whole prompts instead
            prefix, past = 0, None
    width = max(len(ids) - prefix for ids, _ in batch)
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    rows = [[pad] * (width - len(ids) + prefix) + [int(t) for t in ids[prefix:]] for ids, _ in batch]
    mask = torch.tensor([[0] * (width - len(ids) + prefix) + [1] * (len(ids) - prefix) for ids, _ in batch],
                        device=model.device)
    positions = prefix + (mask.cumsum(-1) - 1).clamp(min=0)
    attention = torch.cat([torch.ones(len(batch), prefix, dtype=mask.dtype, device=mask.device), mask], dim=1)
    wanted = [len(ids) - first for ids, first in batch]
    keep = max(wanted) + 1
    with torch.inference_mode():
        logits = network(input_ids=torch.tensor(rows, device=model.device), attention_mask=attention,
                         position_ids=positions, use_cache=past is not None, **cache_argument(network, past),
                         logits_to_keep=keep).logits
        return [torch.log_softmax(logits[row, keep - 1 - count:keep - 1].float(), dim=-1).cpu()
                for row, count in enumerate(wanted)]


def cache_argument(network, cache) -> dict:
    """The forward's KV-cache keyword: `cache` where the model's forward takes it (transformers 5.24 deprecates
    `past_key_values`), `past_key_values` for a model whose own code predates it (trust_remote_code)."""
    import inspect

    return {"cache" if "cache" in inspect.signature(network.forward).parameters else "past_key_values": cache}


MIN_SHARED_PREFIX = 32  # tokens: below this, running the prefix apart saves less than it costs


def shared_prefix(network, batch: list[tuple[Sequence[int], int]]) -> int:
    """Tokens at the start of every prompt of the batch, short of each prompt's last (whose logits are kept), or 0
    where sharing does not pay or the model's cache cannot be shared so (a sliding window or a recurrent layer)."""
    config = network.config
    if len(batch) < 2 or getattr(config, "sliding_window", None) or getattr(config, "layer_types", None) and any(
            kind != "full_attention" for kind in config.layer_types):
        return 0
    limit = min(first for _, first in batch) - 1
    first_ids = batch[0][0]
    length = 0
    while length < limit and all(int(ids[length]) == int(first_ids[length]) for ids, _ in batch[1:]):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


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

