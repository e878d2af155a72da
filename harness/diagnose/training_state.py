"""A model too large to train on its card. Training keeps, for every parameter, far more than its weight: with Adam
in mixed precision the 16-bit weights and gradients, fp32 master weights and Adam's two fp32 moments (2 + 2 + 4 + 8 =
16 bytes; in plain fp32, 4 + 4 + 8); without sharding every GPU keeps all of it. Where the log prints the model's
parameter count and 16 bytes a parameter exceed the card's whole memory, no smaller batch or shorter sequence brings
the step under it: a smaller model comes first, then the state moved off the card (an optimizer offloaded to CPU memory,
the state sharded over more GPUs, an 8-bit optimizer)."""

from __future__ import annotations

import re

from harness.diagnose.records import Change, Diagnosis
from harness.measure.oom import OomFigures

BYTES_PER_TRAINED_PARAMETER = 16
# bytes PyTorch had allocated at the failure, per parameter: above this the gradients or the optimizer state are on the
# card already (16-bit weights alone are 2, fp32 weights 4), so the run was a training run whatever its words
HELD_PER_PARAMETER = 8

# the count a training script prints ("Total number of parameters in the model: 3,161,117,824", nanoGPT's "number of
# parameters: 123.59M", "num_params = 1.3B", PEFT's "all params: 6,742,609,920")
_COUNT = re.compile(r"(?:number of param(?:eter)?s|total (?:number of )?param(?:eter)?s|num_params|n_params|"
                    r"param(?:eter)? count|all params)(?: in the model)?\s*[:=]?\s*(\d[\d,_]*(?:\.\d+)?)\s*([KMBG])?\b",
                    re.I)
_TRAINABLE = re.compile(r"trainable params\s*[:=]?\s*(\d[\d,_]*(?:\.\d+)?)\s*([KMBG])?\b", re.I)
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
# training words; inference words; what already shrinks or spreads the state (an adapter, a quantized or 8-bit
# optimizer, ZeRO / FSDP sharding, an offload)
_TRAINING = re.compile(r"\btrain|fine-?tun|finetun|backward|\bepoch|optimizer", re.I)
_INFERENCE = re.compile(r"\bgenerat(?:e|ion|ing)\b|\binference\b|\beval(?:uat\w*)?\b|\bserv(?:e|ing)\b", re.I)
_STATE_SHRUNK = re.compile(r"\bq?lora\b|\bpeft\b|adapter|8[-_ ]?bit|4[-_ ]?bit|bitsandbytes|\bbnb\b|deepspeed|"
                           r"\bzero[-_ ]?(?:stage)?[-_ ]?[123]\b|\bfsdp\b|fully_shard|offload", re.I)


def _count(digits: str, scale: str | None) -> float:
    return float(digits.replace(",", "").replace("_", "")) * _SCALE.get((scale or "").upper(), 1)


def parameters_printed(context: str) -> float | None:
    """The largest parameter count the log prints, or None."""
    found = [_count(m.group(1), m.group(2)) for m in _COUNT.finditer(context)]
    return max(found) if found else None


def model_too_large_to_train(context: str, oom: OomFigures | None, figures: list, quoted: str,
                             source: str) -> Diagnosis | None:
    """A full training run (said, or PyTorch holding more than HELD_PER_PARAMETER bytes a parameter) of a model whose
    printed parameter count needs more than the card at BYTES_PER_TRAINED_PARAMETER; None where the log says inference,
    an adapter trains (PEFT's trainable share below half), or something already shrinks or spreads the state."""
    parameters = parameters_printed(context)
    total = oom.bytes_of("total") if oom is not None else None
    if not parameters or not total or parameters * BYTES_PER_TRAINED_PARAMETER <= total:
        return None
    if _INFERENCE.search(context) or _STATE_SHRUNK.search(context):
        return None
    trainable = [_count(m.group(1), m.group(2)) for m in _TRAINABLE.finditer(context)]
    if trainable and min(trainable) < parameters / 2:
        return None
    allocated = oom.bytes_of("allocated") or 0
    if not _TRAINING.search(context) and allocated < HELD_PER_PARAMETER * parameters:
        return None
    state_gib = parameters * BYTES_PER_TRAINED_PARAMETER / 2**30
    return Diagnosis(source, "pytorch-oom", "optimizer_state",
                     f"a model of {parameters / 1e9:.2f}B parameters is too large to train on this card: its weights, "
                     f"gradients and Adam state take about {state_gib:.1f} GiB (16 bytes a parameter), more than the "
                     f"{total / 2**30:.2f} GiB GPU holds, whatever the batch", tuple(figures), (
                         Change("a smaller model: fewer parameters (a smaller configuration: fewer layers, a narrower "
                                "embedding) or a smaller checkpoint", f"the training state shrinks with the parameters: "
                                f"under {total / 2**30 / BYTES_PER_TRAINED_PARAMETER:.2f}B parameters it fits the card "
                                "before any activation", "quantize_smaller"),
                         Change("offload the optimizer state to CPU memory (DeepSpeed ZeRO-Offload: "
                                "zero_optimization.offload_optimizer {\"device\": \"cpu\"})",
                                "Adam's moments and fp32 master weights (12 of the 16 bytes) leave the GPU",
                                "cpu_offload"),
                         Change("shard the state over more GPUs (FSDP full_shard or DeepSpeed ZeRO-3), or an 8-bit "
                                "optimizer (bitsandbytes AdamW8bit)", "each GPU keeps 1/N of the state; 8-bit moments "
                                "take a quarter of fp32's", "other")),
                     failing_line=quoted)
