"""The profile forward: the activation peak at a serving engine's token budget, measured the way vLLM sizes it.

vLLM (vllm/v1/worker/gpu_model_runner.py::profile_run, _dummy_run, _dummy_sampler_run) runs one forward of
max_num_batched_tokens tokens spread over min(max_num_seqs, tokens) sequences, computes logits for each sequence's
last token only and samples from them, and reserves that peak for activations before it sizes the KV cache. The
profile here does the same on the loaded Runtime (its optional profile_forward, harness.runtime.base): one forward,
no KV cache kept, `logits_to_keep=1`, the kept logits softmaxed in float32 (the sampler's buffers), under the peak
tracker; activation = peak - memory in use before (the CUDA allocator's bytes on a GPU, RSS on a CPU).

It runs on CUDA by default. On a CPU it is slow at a real budget and RSS is a poor proxy for GPU activations, so it
runs only when QUANTGATE_PROFILE_ON_CPU=1 forces it (the tests do, with a tiny model); without a profile the plans
estimate the activations from the config (capacity.memory.activation_peak_bytes).
"""

from __future__ import annotations

import math
import os

from harness import progress

PROFILE_ON_CPU_ENV = "QUANTGATE_PROFILE_ON_CPU"


def profile_wanted() -> bool:
    """Whether this run measures a profile forward: on CUDA, or on a CPU with QUANTGATE_PROFILE_ON_CPU=1."""
    from harness.runtime.device import is_cuda

    return is_cuda() or os.environ.get(PROFILE_ON_CPU_ENV, "") not in ("", "0")


def profile_shape(tokens: int, max_num_seqs: int) -> tuple[int, int]:
    """(sequences, tokens per sequence) of the profile batch: min(max_num_seqs, tokens) sequences, as vLLM's
    _dummy_run spreads the budget. vLLM gives the last sequence the remainder; a padded batch cannot, so each
    sequence gets ceil(tokens / sequences) and the profile runs at most sequences - 1 tokens more than asked
    (recorded as profile_tokens; the planners scale from what ran)."""
    if tokens < 1 or max_num_seqs < 1:
        raise ValueError(f"a profile needs at least one token and one sequence, got {tokens} and {max_num_seqs}")
    sequences = min(max_num_seqs, tokens)
    return sequences, math.ceil(tokens / sequences)


def measure_profile(model, tokens: int, max_num_seqs: int) -> dict:
    """The profile forward of `tokens` tokens over min(max_num_seqs, tokens) sequences on `model` (a Runtime):
    {"profile_tokens", "profile_sequences", "activation_profile_bytes"}. A runtime without profile_forward, or a
    forward that fails (a GPU too small for the budget), gives activation_profile_bytes None and a profile_error:
    the plans then estimate from the config, and the rest of the measurement stands."""
    from harness.measure.memory import track_peak

    sequences, width = profile_shape(tokens, max_num_seqs)
    record = {"profile_tokens": sequences * width, "profile_sequences": sequences, "activation_profile_bytes": None}
    forward = getattr(model, "profile_forward", None)
    if forward is None:
        return {**record, "profile_error": f"the runtime {type(model).__name__} has no profile_forward"}
    progress.say(f"profile forward: {sequences * width:,} tokens over {sequences:,} sequences")
    try:
        with track_peak() as peak:
            forward(sequences, width)
    except Exception as exc:  # noqa: BLE001 - a synthetic forward must not lose the measurement taken before it
        _release_cuda_cache()
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        progress.say(f"profile forward failed ({reason}); the plans estimate activations from the config")
        return {**record, "profile_error": reason}
    _release_cuda_cache()
    if peak.cuda_allocated_start_bytes is not None:
        activation = (peak.cuda_max_allocated_bytes or 0) - peak.cuda_allocated_start_bytes
    else:
        activation = peak.peak_bytes - peak.start_bytes
    return {**record, "activation_profile_bytes": max(0, activation)}


def _release_cuda_cache() -> None:
    """Hand the profile's cached blocks back, so that they do not sit in the device's used memory afterwards."""
    from harness.runtime.device import is_cuda

    if is_cuda():
        import torch

        torch.cuda.empty_cache()
