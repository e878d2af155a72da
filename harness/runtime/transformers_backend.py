"""Load an artifact with transformers and generate greedily in left-padded batches, timing each batch.

TTFT and per-step times come from a logits processor: generate() calls it once per step, right after the
forward pass that produced that step's logits, so the first call marks the end of the prefill. This costs
nothing extra (no second prefill just to time it).
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.runtime.base import BatchTiming, Generation
from harness.runtime.device import device_map, is_cuda


class _StepClock:
    """A LogitsProcessor that only records when each step's logits arrive."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        if is_cuda():
            import torch

            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        return scores


class LoadedModel:
    """The transformers Runtime (harness.runtime.base)."""

    preload = ("transformers",)

    @classmethod
    def load(cls, artifact_path: Path, *, dtype: str = "auto", trust_remote_code: bool = False) -> LoadedModel:
        return cls(artifact_path, dtype, trust_remote_code=trust_remote_code)

    def __init__(self, artifact_path: Path, dtype: str = "auto", trust_remote_code: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(artifact_path, trust_remote_code=trust_remote_code)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        import json

        from harness.runtime.device import compute_dtype

        self.dtype = compute_dtype(dtype, json.loads((Path(artifact_path) / "config.json").read_text()))
        torch_dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(artifact_path, dtype=torch_dtype, device_map=device_map(),
                                                          trust_remote_code=trust_remote_code)
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.dtype = str(self.model.dtype).replace("torch.", "")
        # Greedy decoding: drop sampling defaults a checkpoint's generation_config may carry.
        config = self.model.generation_config
        config.do_sample = False
        config.temperature = config.top_p = config.top_k = None
        config.pad_token_id = self.tokenizer.pad_token_id

    def encode(self, prompt: str) -> list[int]:
        from harness.evalsets.prompts import prompt_encoder

        if not hasattr(self, "_encode"):
            self._encode = prompt_encoder(self.tokenizer)  # one BOS probe a model: encode runs once per prompt
        return self._encode(prompt)

    def weights_bytes(self) -> int:
        from harness.measure.memory import loaded_weights_bytes

        return loaded_weights_bytes(self.model)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def profile_forward(self, sequences: int, tokens_per_sequence: int) -> None:
        """One forward of sequences x tokens_per_sequence dummy tokens (id 0, as vLLM's dummy run), no KV cache,
        logits of the last position only (`logits_to_keep=1`), softmaxed in float32 as a sampler would
        (harness.runtime.base.ProfileForward)."""
        import torch

        input_ids = torch.zeros((sequences, tokens_per_sequence), dtype=torch.long, device=self.device)
        with torch.inference_mode():
            output = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
            probabilities = torch.softmax(output.logits[:, -1, :].float(), dim=-1)
        if is_cuda():
            torch.cuda.synchronize()
        del output, probabilities, input_ids

    def next_token_logprobs(self, input_ids: list[int], first: int):
        """harness.runtime.base.TeacherForcing: one forward, no KV cache kept, logits of the positions that predict
        input_ids[first:] only, log-softmaxed in float32."""
        import torch

        wanted = len(input_ids) - first
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=wanted + 1).logits[0, :-1]
            return torch.log_softmax(logits.float(), dim=-1).cpu()

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[Generation], BatchTiming]:
        """Greedy-generate for one batch of token-id prompts (left-padded to the longest)."""
        generations, timing, _ = self._generate(prompts, max_new_tokens, keep_cache=False)
        return generations, timing

    def generate_with_cache_bytes(self, prompts: list[list[int]], max_new_tokens: int):
        """As generate(), plus the bytes the KV cache held at the end (measured, not predicted)."""
        return self._generate(prompts, max_new_tokens, keep_cache=True)

    def generate_keeping_prompt_cache(self, prompts: list[list[int]], max_new_tokens: int, sink):
        """As generate(), then, after the batch's timing ends, sink(width, past_key_values): the batch's KV cache
        for the fidelity stage (harness.fidelity.prompt_cache), prompts left-padded to `width` tokens."""
        generations, timing, _ = self._generate(prompts, max_new_tokens, keep_cache=False, cache_sink=sink)
        return generations, timing

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, keep_cache: bool, cache_sink=None):
        import torch
        from transformers import LogitsProcessorList

        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        clock = _StepClock()
        if is_cuda():
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
                logits_processor=LogitsProcessorList([clock]), pad_token_id=pad,
                return_dict_in_generate=keep_cache or cache_sink is not None,
            )
        cache_bytes, past = 0, None
        if keep_cache or cache_sink is not None:
            past = output.past_key_values
            output = output.sequences
        if keep_cache:
            from harness.measure.memory import kv_cache_bytes

            cache_bytes = kv_cache_bytes(past)
        if is_cuda():
            torch.cuda.synchronize()
        end = time.perf_counter()
        if cache_sink is not None:
            cache_sink(width, past)
        del past
        new = output[:, width:].tolist()
        stops = stop_ids(self.model.generation_config, self.tokenizer)
        results = []
        for prompt, row in zip(prompts, new):
            kept = until_stop(row, stops)
            continuation = row[:len(kept) + 1] if len(kept) < len(row) else kept  # with its stop token
            results.append(Generation(self.tokenizer.decode(kept, skip_special_tokens=True).strip(), len(prompt),
                                      len(kept), tuple(continuation)))
        steps = len(clock.stamps)
        ttft = (clock.stamps[0] - start) if clock.stamps else end - start
        return results, BatchTiming(len(prompts), width, steps, ttft, end - start), cache_bytes


def stop_ids(generation_config, tokenizer) -> set[int]:
    eos = generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def until_stop(row: list[int], stop_ids: set[int]) -> list[int]:
    for index, token in enumerate(row):
        if token in stop_ids:
            return row[:index]
    return row
