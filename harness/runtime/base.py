"""What a runtime is: load an artifact, encode prompts, generate a batch greedily with its timing, and report the
bytes its weights and KV cache hold. harness.runtime.transformers_backend.LoadedModel is one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BatchTiming:
    batch_size: int
    prompt_tokens: int  # longest prompt in the batch (the padded length)
    steps: int  # decode steps the batch ran (new tokens of its longest output)
    ttft_s: float
    e2e_s: float

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.steps - 1) if self.steps > 1 else None


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    new_tokens: int


class Runtime(Protocol):
    dtype: str  # the dtype the model computes in ("bfloat16", "float32", ...)

    def encode(self, prompt: str) -> list[int]: ...

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[Generation], BatchTiming]: ...

    def generate_with_cache_bytes(self, prompts: list[list[int]],
                                  max_new_tokens: int) -> tuple[list[Generation], BatchTiming, int]:
        """As generate(), plus the bytes the KV cache held at the end."""
        ...

    def weights_bytes(self) -> int:
        """Bytes of parameters and buffers as loaded (quantized packs, scales and zeros included)."""
        ...

    def parameter_count(self) -> int: ...
