"""Fidelity through a vLLM server (--backend vllm): the same measures as harness.fidelity.teacher, from the
server's `prompt_logprobs` instead of the full vocabulary.

The served baseline's reference: each item's prompt + its served greedy reply (re-encoded with the baseline's
tokenizer: every format is then teacher-forced on exactly these ids, so the comparison is like for like), and at
every reply position the server's top-SERVED_TOP_K tokens. Another format's server is asked for the same
positions. KL is taken over the baseline's top-k tokens that the format's answer also names, plus one bucket for
the rest of the vocabulary: a coarser grouping than the transformers backend's, so a lower bound again, and
looser (vLLM returns at most --max-logprobs, default 20, tokens per position).
"""

from __future__ import annotations

import math
from pathlib import Path

from harness import progress
from harness.cache import atomic_write_json, cache_dir, read_json, stable_hash
from harness.fidelity import VERSION
from harness.runtime.vllm.client import Endpoint, prompt_logprobs

SERVED_TOP_K = 20  # vLLM's default --max-logprobs: more is refused by a server started without a higher one
TINY = 1e-12


def served_reference_path(generation_key: str) -> Path:
    return cache_dir("results") / ("fidelity-served-reference-"
                                   f"{stable_hash({'generation': generation_key, 'k': SERVED_TOP_K, 'v': VERSION})}"
                                   ".json")


def served_comparison_path(served_key: str, reference: Path) -> Path:
    return cache_dir("results") / f"fidelity-served-{stable_hash({'served': served_key, 'reference': reference.name})}.json"


def write_served_reference(endpoint: Endpoint, evalset: str, prompts, outputs: list[dict], encode, path: Path,
                           label: str, max_model_len: int) -> None:
    """prompts: the evalset's Prompt records; outputs: the served baseline's generation outputs (id, prediction).
    A reply re-encoded longer than the context leaves room for is cut: the server must still generate the one
    token a request asks for ("max_tokens must be at least 1")."""
    replies = {o["id"]: o["prediction"] for o in outputs}
    items = []
    progress.step(label, 0, len(prompts))
    for done, prompt in enumerate(prompts, 1):
        continuation = list(encode(replies.get(prompt.item_id) or ""))[:max(0, max_model_len - len(prompt.ids) - 1)]
        if continuation:
            ids = list(prompt.ids) + continuation
            entries = prompt_logprobs(endpoint, ids, SERVED_TOP_K)[len(prompt.ids):]
            items.append({"id": prompt.item_id, "ids": ids, "first": len(prompt.ids),
                          "positions": [_sorted(entry) for entry in entries]})
        progress.step(label, done, len(prompts))
    atomic_write_json(path, {"evalset": evalset, "top_k": SERVED_TOP_K, "items": items})


def compare_served(endpoint: Endpoint, reference_path: Path, path: Path, label: str) -> None:
    reference = read_json(reference_path) or {"items": []}
    items = []
    progress.step(label, 0, len(reference["items"]))
    for done, item in enumerate(reference["items"], 1):
        entries = prompt_logprobs(endpoint, item["ids"], SERVED_TOP_K)[item["first"]:]
        figures = served_position_figures(item["positions"], entries, item["ids"][item["first"]:])
        items.append({"id": item["id"], **figures})
        progress.step(label, done, len(reference["items"]))
    atomic_write_json(path, {"evalset": reference.get("evalset"), "top_k": SERVED_TOP_K, "backend": "vllm",
                             "reference": reference_path.name, "items": items})


def served_position_figures(reference: list[list[list]], entries: list[dict[int, tuple[float, int]] | None],
                            targets: list[int]) -> dict:
    """One item's figures (the shape of teacher.position_figures) from the reference's sorted [id, logprob, rank]
    lists and the format's {id: (logprob, rank)} entries."""
    kls, agree, target_sum, first_flip = [], 0, 0.0, None
    for position, (base, mine, target) in enumerate(zip(reference, entries, targets)):
        mine = mine or {}
        top = [(token, logprob) for token, logprob, rank in base if rank <= SERVED_TOP_K]
        shared = [(token, logprob, mine[token][0]) for token, logprob in top if token in mine]
        p_rest = max(0.0, 1 - sum(math.exp(p) for _, p, _ in shared))
        q_rest = max(TINY, 1 - sum(math.exp(q) for _, _, q in shared))
        kl = sum(math.exp(p) * (p - q) for _, p, q in shared)
        if p_rest > TINY:
            kl += p_rest * (math.log(p_rest) - math.log(q_rest))
        kls.append(max(kl, 0.0))
        base_top = next((token for token, _, rank in base if rank == 1), None)
        mine_top = next((token for token, (_, rank) in mine.items() if rank == 1), None)
        if base_top is not None and base_top == mine_top:
            agree += 1
        elif first_flip is None:
            first_flip = position
        target_sum += mine.get(target, (math.log(TINY), 0))[0]
    return {"positions": len(kls), "kl_sum": float(sum(kls)), "agree": agree, "target_logprob_sum": target_sum,
            "first_flip": first_flip, "kl_by_position": [round(v, 6) for v in kls]}


def _sorted(entry: dict[int, tuple[float, int]] | None) -> list[list]:
    return sorted(([token, logprob, rank] for token, (logprob, rank) in (entry or {}).items()),
                  key=lambda row: (row[2], row[0]))
