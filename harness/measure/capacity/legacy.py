"""The version-agnostic vLLM capacity plan that harness/assemble.py and scripts/gpu_check.py call.

vLLM takes `gpu_memory_gib x 2^30 x gpu_memory_utilization` as its budget, subtracts the weights and the peak of a
profiling forward pass (activations), and hands the rest to the KV cache in blocks of `block_size` tokens. This
plan does the same, then keeps `safety_margin` of the KV room back for what the arithmetic misses; `overhead_bytes`
(default 0) subtracts a fixed amount instead or as well. Kept as it was for those callers: it knows no vLLM version
(its int8 flag, --quantization bitsandbytes, is one vLLM 0.32+ refuses). The version-aware planners
(harness.measure.capacity.plan_vllm / plan_sglang / plan_trtllm) model CUDA context, CUDA graphs and headroom as
fixed amounts and never print a flag the engine rejects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

VLLM_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs: more room than this does not raise concurrency
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's chunked-prefill default for online serving on large GPUs
_QUANTIZATION_FLAG = {"baseline": None, "none": None, "int8": "bitsandbytes", "bitsandbytes": "bitsandbytes",
                      "gptq": "gptq", "awq": "awq"}
_GIB = 2**30


@dataclass(frozen=True)
class CapacityPlan:
    gpu_memory_gib: float
    gpu_memory_utilization: float
    max_model_len: int
    budget_bytes: int
    safety_margin: float
    kv_room_bytes: int
    kv_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    vllm_flags: str  # empty when nothing fits: the note says what to change
    fits: bool
    note: str

    def as_dict(self) -> dict:
        return asdict(self)


def default_batched_tokens(max_model_len: int) -> int:
    """A whole prompt of max_model_len in one prefill step, and at least vLLM's usual chunk."""
    return max(max_model_len, DEFAULT_BATCHED_TOKENS)


def vllm_quantization(quantization: str | None) -> str | None:
    """vLLM's --quantization value for a quantgate format name (or a vLLM name, passed through)."""
    if quantization is None:
        return None
    return _QUANTIZATION_FLAG.get(quantization.lower(), quantization)


def plan_capacity(weights_bytes: int, activation_peak_bytes: int, kv_bytes_per_token: int, *,
                  gpu_memory_gib: float = 80.0, gpu_memory_utilization: float = 0.90, max_model_len: int,
                  safety_margin: float = 0.08, quantization: str | None = None, block_size: int = 16,
                  max_num_batched_tokens: int | None = None, overhead_bytes: int = 0) -> CapacityPlan:
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if max_model_len <= 0 or kv_bytes_per_token <= 0 or block_size <= 0:
        raise ValueError("max_model_len, kv_bytes_per_token and block_size must be positive")
    if not 0 <= safety_margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), got {safety_margin}")
    budget = int(gpu_memory_gib * _GIB * gpu_memory_utilization)
    fixed = weights_bytes + max(activation_peak_bytes, 0) + overhead_bytes
    kv_room = max(int((budget - fixed) * (1 - safety_margin)), 0)
    kv_tokens = kv_room // (kv_bytes_per_token * block_size) * block_size
    sequences = kv_tokens // max_model_len
    fits = sequences >= 1
    max_num_seqs = min(sequences, VLLM_MAX_NUM_SEQS)
    batched = max_num_batched_tokens or default_batched_tokens(max_model_len)
    flags = ""
    if fits:
        flags = (f"--gpu-memory-utilization {gpu_memory_utilization:.2f} --max-model-len {max_model_len} "
                 f"--max-num-seqs {max_num_seqs} --max-num-batched-tokens {batched}")
        if vllm_quantization(quantization):
            flags += f" --quantization {vllm_quantization(quantization)}"
    note = _note(fits, sequences, kv_tokens, budget, fixed, kv_bytes_per_token, max_model_len,
                 gpu_memory_gib, gpu_memory_utilization, safety_margin)
    return CapacityPlan(gpu_memory_gib=gpu_memory_gib, gpu_memory_utilization=gpu_memory_utilization,
                        max_model_len=max_model_len, budget_bytes=budget, safety_margin=safety_margin,
                        kv_room_bytes=kv_room, kv_tokens=kv_tokens, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=batched, vllm_flags=flags, fits=fits, note=note)


def _note(fits: bool, sequences: int, kv_tokens: int, budget: int, fixed: int, kv_per_token: int,
          max_model_len: int, gib: float, util: float, margin: float) -> str:
    if fits:
        text = f"KV cache holds {kv_tokens:,} tokens: {sequences:,} sequences of {max_model_len:,} tokens"
        if sequences > VLLM_MAX_NUM_SEQS:
            text += f" (flags cap --max-num-seqs at vLLM's default {VLLM_MAX_NUM_SEQS}; raise it to use the room)"
        return text + "."
    # Memory one full sequence needs, with the margin held back as above.
    needed = fixed + kv_per_token * max_model_len / (1 - margin)
    needed_util = needed / (gib * _GIB)
    needed_gib = needed / (util * _GIB)
    if fixed >= budget:
        head = (f"does not fit: weights and activations ({fixed / _GIB:.2f} GiB) exceed the "
                f"{budget / _GIB:.2f} GiB budget ({gib:g} GiB x {util:.2f})")
        levers = []
    else:
        head = (f"does not fit: the KV room holds {kv_tokens:,} tokens, less than one sequence of "
                f"{max_model_len:,}")
        levers = [f"use --max-model-len {kv_tokens}" if kv_tokens >= 1 else None]
    if needed_util <= 0.98:
        levers.append(f"raise --gpu-memory-utilization to {_ceil2(needed_util):.2f}")
    levers.append(f"use a GPU with at least {needed_gib:.1f} GiB")
    levers.append("or a smaller format")
    return head + "; " + ", ".join(lever for lever in levers if lever) + "."


def _ceil2(value: float) -> float:
    return -(-round(value * 10000) // 100) / 100  # round up to two decimals without float noise
