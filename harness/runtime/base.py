"""What a runtime is: load an artifact, encode prompts, generate a batch greedily with its timing, and report the
bytes its weights and KV cache hold. harness.runtime.transformers_backend.LoadedModel is one; the registry
(harness.runtime.registry) names them. A runtime may also offer a profile forward (ProfileForward), which the
measure stage uses to measure the activation peak at a serving engine's token budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol


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
    # The generated ids up to and including the stop token (when one ended it): the reference continuation
    # the fidelity stage teacher-forces every format on (harness.fidelity).
    token_ids: tuple[int, ...] = ()


class Runtime(Protocol):
    dtype: str  # the dtype the model computes in ("bfloat16", "float32", ...)
    # Libraries the worker imports before the load, so that their own memory is not counted as the weights'.
    preload: ClassVar[tuple[str, ...]]

    @classmethod
    def load(cls, artifact_path: Path, *, dtype: str = "auto", trust_remote_code: bool = False) -> Runtime:
        """Load an artifact (a checkpoint directory) to generate from, computing in `dtype` ("auto": the
        checkpoint's, as far as the device runs it)."""
        ...

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


class ProfileForward(Protocol):
    """Optional for a Runtime: the forward harness.measure.profile measures. A runtime without it gets no profile
    (the serving plans then estimate activations from the config)."""

    def profile_forward(self, sequences: int, tokens_per_sequence: int) -> None:
        """One forward of `sequences` x `tokens_per_sequence` dummy tokens, as a serving engine's profile run: no
        KV cache kept, logits for each sequence's last position only, softmaxed in float32 (the sampler);
        nothing returned, everything freed."""
        ...


class TeacherForcing(Protocol):
    """Optional for a Runtime: next-token log-probabilities over the whole vocabulary at given positions, what
    harness.fidelity compares formats on. A runtime without it measures no fidelity."""

    def next_token_logprobs(self, input_ids: list[int], first: int):
        """One batch-1 forward over input_ids; a float32 tensor [len(input_ids) - first, vocab] whose row i is
        log p(. | input_ids[:first + i]), the distribution that predicts input_ids[first + i]."""
        ...
