"""--target-gpu as every command reads it: one GPU or a comma-separated list (one per pipeline stage), each name as
nvidia-smi prints it or as typed; the note of a name that stands for several cards goes to stderr, an unknown name is
a UserError (exit 2) naming the nearest known ones."""

from __future__ import annotations

import sys

from harness.capacity.gpus import Gpu, gpus_by_names, with_article
from harness.errors import UserError


def target_gpus(text: str, flag: str = "--target-gpu") -> tuple[Gpu, ...]:
    """The GPUs `text` names, in order, each name's note printed on stderr."""
    try:
        matches = gpus_by_names(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None
    for match in matches:
        if match.note:
            print(f"note: {match.note}", file=sys.stderr)
    return tuple(match.gpu for match in matches)


def one_target_gpu(text: str, what: str, flag: str = "--target-gpu") -> Gpu:
    """The one GPU `text` names; a list is refused, `what` saying which GPU the command wants."""
    gpus = target_gpus(text, flag)
    if len(gpus) > 1:
        raise UserError(f"{flag} {text!r}: {what}")
    return gpus[0]


def uneven_stages_note(stages: tuple[Gpu, ...]) -> str:
    """What a plan over pipeline stages on GPUs of different sizes is: the engines' plans size each stage as the
    smallest GPU with an even share of the layers; vLLM's is also planned per stage (stages.plan_uneven_vllm)."""
    smallest = min(stages, key=lambda g: g.memory_bytes)
    return (f"{len(stages)} pipeline stages on {' + '.join(g.name for g in stages)}: each engine's plan sizes every "
            f"stage as {with_article(smallest.name)} ({smallest.memory_gib:.2f} GiB) with an even share of the layers; "
            "vLLM's is also planned per stage, with VLLM_PP_LAYER_PARTITION giving each GPU the layers it has room "
            "for (from vLLM 0.9, whose V1 engine runs pipeline parallelism; before it the even plan stands)")
