"""What PyTorch's out-of-memory message alone settles, in any engine's log: memory another process holds (the first
lever: free it), and fragmentation (reserved-but-unallocated much larger than the request). Every reader asks this
before its own engine's levers."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.diagnose.records import Change, Figure
from harness.measure.oom import OomFigures, parse_size

GIB = 2**30
OTHER_PROCESS_GIB = 0.5  # total - free - this process above this: another process holds memory
# PyTorch's older message has no per-process figure: total - free - reserved is what neither this process's tensors nor
# its allocator hold, which is its CUDA context and libraries' workspaces (0.4-1.6 GiB in the corpus's older messages)
# and other processes' memory; above half the card it cannot be this process's own
OLDER_MESSAGE_OTHERS_SHARE = 0.5
FRAGMENTED_SHARE = 0.05  # or unallocated above this share of the GPU (and at least the request)
FRAGMENTED_RATIO = 2.0  # or unallocated at least twice the request: the request would fit in it but for the holes
FREE_BUT_FAILED = 10.0  # free memory this many times the request, yet it failed: the allocator, not the GPU, is full
FRAGMENTED_MIN_GIB = 1.0  # holes smaller than this are the allocator's normal slack, whatever the request
LIST_PROCESSES = "nvidia-smi --query-compute-apps=pid,used_memory --format=csv"


@dataclass(frozen=True)
class Verdict:
    kind: str
    summary: str
    changes: tuple[Change, ...]


def gib(text: str | None) -> float | None:
    size = parse_size(text)
    return None if size is None else size / GIB


def oom_figures(oom: OomFigures, line: int) -> list[Figure]:
    where = f"log line {line}"
    return [Figure(label, value, where) for label, value in (
        ("tried to allocate", oom.tried), ("GPU total", oom.total), ("free", oom.free),
        ("allocated by PyTorch", oom.allocated), ("reserved but unallocated" if not oom.reserved_is_total
                                                  else "reserved in total", oom.reserved),
        ("this process in use", oom.in_use)) if value]


def held_elsewhere_gib(oom: OomFigures) -> float | None:
    total, free, in_use = gib(oom.total), gib(oom.free), gib(oom.in_use)
    if total is not None and free is not None and in_use is None and oom.reserved_is_total and oom.reserved:
        outside = total - free - gib(oom.reserved)
        return outside if outside > OLDER_MESSAGE_OTHERS_SHARE * total else None
    if total is None or free is None or in_use is None:
        return None
    # the process's own figure comes from NVML, which sees no process inside some containers ("this process has
    # 0 bytes memory in use" beside 36 GiB allocated by PyTorch): it holds at least what PyTorch reserved
    reserved = (gib(oom.allocated) or 0.0) + (oom.reserved_unallocated_bytes or 0) / GIB
    held = total - free - max(in_use, reserved)
    return held if held > OTHER_PROCESS_GIB else None


def allocator_verdict(oom: OomFigures) -> Verdict | None:
    tried, total = gib(oom.tried), gib(oom.total)
    held = held_elsewhere_gib(oom)
    if held is not None and (tried is None or held >= tried or held >= 0.1 * (total or 0)):
        return Verdict("memory_held_elsewhere",
                       f"another process holds {held:.2f} GiB of the {total:.2f} GiB GPU (this process "
                       f"{total - gib(oom.free) - held:.2f}, free {gib(oom.free):.2f}): free that first",
                       (free_other_process(held),))
    free = gib(oom.free)
    if tried and free is not None and free >= FREE_BUT_FAILED * tried and free >= FRAGMENTED_MIN_GIB:
        return Verdict("fragmentation",
                       f"{free:.2f} GiB is free yet {tried:.2f} GiB could not be allocated: the allocator could not get "
                       "a segment of that size (fragmented or capped address space)",
                       (Change("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                               "lets the allocator map memory in growing segments"),))
    unallocated = (oom.reserved_unallocated_bytes or 0) / GIB
    if tried and unallocated >= tried and unallocated >= FRAGMENTED_MIN_GIB and (
            unallocated >= FRAGMENTED_RATIO * tried or (total and unallocated >= FRAGMENTED_SHARE * total)):
        return Verdict("fragmentation",
                       f"fragmentation: {unallocated:.2f} GiB is reserved by PyTorch but unallocated, more than the "
                       f"{tried:.2f} GiB asked for, yet no block of that size is free",
                       (Change("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                               f"lets the allocator grow segments instead of needing one free block of {tried:.2f} GiB"),
                        Change("torch.cuda.empty_cache() between phases", "returns the cached blocks")))
    return None


# PyTorch's own OOM message ends "... to avoid fragmentation" (max_split_size_mb, later expandable_segments): that
# hint is printed on every OOM and says nothing; a person or a tool saying the memory is fragmented does
_STOCK_HINT = re.compile(r"to avoid fragmentation", re.I)
_FRAGMENTATION_SAID = re.compile(r"\bfragment(?:ation|ed|s)\b|内存碎片|显存碎片", re.I)


def fragmentation_said(text: str) -> str | None:
    """The first line that states fragmentation in words (outside PyTorch's stock hint), or None."""
    for line in text.splitlines():
        if _FRAGMENTATION_SAID.search(_STOCK_HINT.sub("", line)):
            return line.strip()[:300]
    return None


_GROW_SEGMENTS = Change("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                        "the allocator grows segments instead of needing one free block of the request's size")
_EMPTY_CACHE = Change("torch.cuda.empty_cache() between phases", "returns the cached blocks")


def fragmentation_in_words(text: str) -> Verdict | None:
    """An OOM the log says is fragmentation, with no allocator figures to weigh: the allocator's own switch first."""
    said = fragmentation_said(text)
    if said is None:
        return None
    return Verdict("fragmentation",
                   f"the log says the memory is fragmented ({said[:120]!r}) and gives no allocator figures to weigh: "
                   "the caching allocator's expandable segments are the first thing to try",
                   (_GROW_SEGMENTS, _EMPTY_CACHE))


# the failure came at a later step of a run whose earlier steps ran ("after a few training steps", "at step 4", "after
# 300 iterations", "OOMing at later steps"): the step's own peak fitted the card before
_LATER_STEP = re.compile(r"\bafter (?:a few|several|some|\d+) (?:training |optimi[sz]ation )?(?:steps|iterations|"
                         r"batches)\b|\bat (?:training )?(?:step|iteration) (?:[3-9]|[1-9]\d+)\b|"
                         r"\bat (?:the )?(?:very )?(?:third|fourth|fifth|later|\d+(?:rd|th)) (?:training )?"
                         r"(?:steps?|iterations?)\b", re.I)
# the second step is the first that carries the optimizer's state (Adam allocates its moments at the first step()): a
# failure there is a step that no longer fits beside that state, not holes that grew
_SECOND_STEP = re.compile(r"\b(?:at|in|on|during) (?:the )?(?:very )?(?:second|2nd) (?:training )?(?:step|iteration)\b|"
                          r"\bat (?:training )?(?:step|iteration) 2\b", re.I)


def fragmentation_after_steps(text: str) -> Verdict | None:
    """An OOM said in words to come after earlier steps of the same run fitted, with no allocator figures to weigh:
    the step's own peak fitted before, and what grows from step to step is the caching allocator's holes (the shapes
    change between steps: rollouts of varying length, dynamic padding), so the allocator's expandable segments come
    before a smaller step. Not where the log says the second step failed (the optimizer's state arrives there)."""
    found = _LATER_STEP.search(text)
    if found is None or _SECOND_STEP.search(text):
        return None
    return Verdict("fragmentation",
                   f"the failure came after earlier steps of the same run fitted ({found.group(0)!r}) and the message "
                   "gives no allocator figures: a step that fitted before does not outgrow the card by itself, the "
                   "caching allocator's holes between steps of changing shapes do; expandable segments first",
                   (_GROW_SEGMENTS, Change("lower the tokens per step (batch x sequence length)",
                                           "if a longer batch than the earlier ones is what grew"), _EMPTY_CACHE))


def free_other_process(held_gib: float | None = None) -> Change:
    return Change(f"stop the other process ({LIST_PROCESSES} names it), or run on a GPU no process holds "
                  "(CUDA_VISIBLE_DEVICES)",
                  f"frees {held_gib:.2f} GiB for this one" if held_gib else "frees what it holds for this one")
