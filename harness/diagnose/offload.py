"""A model's load that ran out moving its weights onto one GPU: PyTorch's Module.to() (its `convert` frame, `return
t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, non_blocking)`) or accelerate's
set_module_tensor_to_device placing every weight there. The change that keeps the same checkpoint is a cap on what the
GPU holds, the rest of the weights in CPU memory: accelerate's device_map="auto" with max_memory, text-generation-
webui's --gpu-memory (its transformers loader passes it on as max_memory). Where a cap is in place and the load still
fails, the cap comes down below it (the card's CUDA context and the activations need room beside the weights)."""

from __future__ import annotations

import re

from harness.diagnose.records import Change, Diagnosis

_MOVING_WEIGHTS = re.compile(r"t\.to\(device, dtype if t\.is_floating_point\(\)|module\.py\"?, line \d+, in convert\b|"
                             r"set_module_tensor_to_device", re.I)
_TRAINING = re.compile(r"\.backward\(|optimizer\.step|training_step|train_step|run_backward", re.I)
# a GPU cap in place: text-generation-webui's --gpu-memory (MiB when a bare number above 100, else GiB), accelerate's
# max_memory={0: "6GiB"}
_WEBUI_CAP = re.compile(r"--gpu[-_]memory[\"']?\s*(?:[:=]\s*|\s+)(\d+(?:\.\d+)?)\s*(MiB|GiB)?", re.I)
_MAX_MEMORY = re.compile(r"max_memory\s*=\s*\{[^}]*?\b0\s*:\s*[\"'](\d+(?:\.\d+)?)\s*(MiB|GiB|GB|MB)[\"']", re.I)
HEADROOM_GIB = 1.5  # the CUDA context and a forward's activations beside the capped weights


def _cap_gib(context: str) -> float | None:
    if (found := _WEBUI_CAP.search(context)) is not None:
        value, unit = float(found.group(1)), (found.group(2) or "").lower()
        return value / 1024 if unit == "mib" or (not unit and value > 100) else value
    if (found := _MAX_MEMORY.search(context)) is not None:
        value, unit = float(found.group(1)), found.group(2).lower()
        return value / 1024 if unit in ("mib", "mb") else value
    return None


def load_moving_weights(text: str, flags_text: str, total_gib: float | None, figures: list, quoted: str,
                        source: str) -> Diagnosis | None:
    around = "\n".join(text.splitlines()[-40:])
    if not _MOVING_WEIGHTS.search(around) or _TRAINING.search(text):
        return None
    cap = _cap_gib(f"{text}\n{flags_text}")
    if cap is not None:
        lower = max(round(cap - HEADROOM_GIB, 1), 1.0)
        offload = Change(f"a lower GPU cap: --gpu-memory {int(lower * 1024)} (text-generation-webui, MiB) / "
                         f"max_memory={{0: '{lower:g}GiB', 'cpu': ...}}",
                         f"the cap in place ({cap:g} GiB) left too little beside the weights it placed; the rest of "
                         "the weights stay in CPU memory (slower)", "cpu_offload")
    else:
        suggested = f"{max(total_gib - HEADROOM_GIB, 1.0):g}" if total_gib else "(the card less 1.5)"
        offload = Change(f"cap the GPU's share of the weights: device_map='auto' with max_memory={{0: '{suggested}GiB', "
                         f"'cpu': ...}} (text-generation-webui: --gpu-memory)",
                         "the weights that do not fit under the cap stay in CPU memory and run from there (slower); "
                         "the checkpoint stays the same", "cpu_offload")
    return Diagnosis(source, "pytorch-oom", "weights_loading",
                     "the load ran out moving the model's weights onto the GPU"
                     + (f" under a cap of {cap:g} GiB" if cap is not None else ", all of them to one card"),
                     tuple(figures), (
                         offload,
                         Change("quantize the weights on load (load_in_8bit / load_in_4bit, or a GPTQ/AWQ "
                                "checkpoint)", "a half or a quarter of the 16-bit weights", "quantize_smaller"),
                         Change("split the model over more GPUs (device_map='auto' with every card visible)",
                                "each card holds part of the weights", "tensor_parallel_up")),
                     failing_line=quoted)
