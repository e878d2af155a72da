"""A freshly saved artifact must load and generate before it is sealed into the cache.

Quantizers and kernels disagree: a checkpoint can save cleanly and still produce NaN logits, one token over
and over (an AutoAWQ checkpoint loaded through another library did exactly that), or fluent-looking noise (GPTQModel
7.6's AWQ calibrated in float32 did that here). Such an artifact is a failed quantization, with the reason, not a
format to evaluate. The noise case is caught by perplexity on a probe text against the source model's: a working
4-bit model stays within a few tens of percent of it; a broken one is many times worse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROBE_PROMPTS = ("What is the capital of France?", "用一句话介绍你自己。")
PROBE_NEW_TOKENS = 8
PROBE_TEXT = ("The support team answers the same few questions every week. Customers ask how to reset a "
              "password, why an invoice shows two charges, and when a new feature will reach their region. "
              "Clear answers, written once and kept up to date, save everyone time.")
GARBAGE_PERPLEXITY_RATIO = 4.0


class ArtifactCheckFailed(RuntimeError):
    """The saved checkpoint does not load or does not generate sensibly."""


@dataclass(frozen=True)
class SmokeResult:
    replies: tuple[str, ...]
    new_tokens: tuple[int, ...]
    perplexity: float | None = None
    source_perplexity: float | None = None


def check_artifact_generates(artifact: Path, *, source: Path | None = None,
                             trust_remote_code: bool = False) -> SmokeResult:
    """Reload the artifact the way evaluation will, generate a few greedy tokens on two probe prompts, and
    (given the source checkpoint) compare its perplexity on a probe text with the source's."""
    import torch

    from harness.runtime.transformers_backend import LoadedModel

    source_perplexity = None
    if source is not None:
        reference = LoadedModel(source, trust_remote_code=trust_remote_code)
        source_perplexity = perplexity(reference, PROBE_TEXT)
        del reference
    try:
        loaded = LoadedModel(artifact, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any load failure is the finding
        raise ArtifactCheckFailed(f"the saved checkpoint does not load: {type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc
    prompts = [_render(loaded.tokenizer, text) for text in PROBE_PROMPTS]
    with torch.inference_mode():
        ids = torch.tensor([prompts[0]], device=loaded.device)
        logits = loaded.model(input_ids=ids).logits[0, -1].float()
    if not torch.isfinite(logits).all():
        bad = int((~torch.isfinite(logits)).sum())
        raise ArtifactCheckFailed(f"the saved checkpoint produces non-finite logits ({bad} of {logits.numel()} "
                                  "NaN/inf on a probe prompt): its weights or scales are broken")
    rows = [_greedy_ids(loaded, prompt) for prompt in prompts]
    if not any(rows):
        raise ArtifactCheckFailed("the saved checkpoint generates nothing (end of sequence at once) on every "
                                  "probe prompt")
    if all(len(row) >= 4 and len(set(row)) == 1 for row in rows):
        token = loaded.tokenizer.convert_ids_to_tokens(rows[0][0])
        raise ArtifactCheckFailed(f"the saved checkpoint generates one token over and over (token {rows[0][0]} "
                                  f"{token!r} on every probe prompt): garbage output")
    replies = tuple(loaded.tokenizer.decode(row, skip_special_tokens=True).strip() for row in rows)
    measured = perplexity(loaded, PROBE_TEXT)
    if source_perplexity is not None and measured > GARBAGE_PERPLEXITY_RATIO * source_perplexity:
        raise ArtifactCheckFailed(f"the saved checkpoint generates noise: perplexity {measured:,.1f} on a probe "
                                  f"text, {measured / source_perplexity:,.0f}x the source model's "
                                  f"{source_perplexity:,.1f} (replies: {replies[0][:60]!r})")
    return SmokeResult(replies, tuple(len(row) for row in rows), round(measured, 2),
                       None if source_perplexity is None else round(source_perplexity, 2))


def perplexity(loaded, text: str) -> float:
    import math

    import torch

    ids = torch.tensor([loaded.encode(text)], device=loaded.device)
    with torch.inference_mode():
        loss = loaded.model(input_ids=ids, labels=ids).loss.float().item()
    return math.exp(loss) if math.isfinite(loss) else float("inf")


def _greedy_ids(loaded, prompt: list[int]) -> list[int]:
    """New token ids up to the first stop token, as the evaluation's generation would keep them."""
    import torch

    from harness.runtime.transformers_backend import stop_ids, until_stop

    with torch.inference_mode():
        output = loaded.model.generate(input_ids=torch.tensor([prompt], device=loaded.device),
                                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long,
                                                                 device=loaded.device),
                                       max_new_tokens=PROBE_NEW_TOKENS, do_sample=False,
                                       pad_token_id=loaded.tokenizer.pad_token_id)
    return until_stop(output[0, len(prompt):].tolist(), stop_ids(loaded.model.generation_config, loaded.tokenizer))


def _render(tokenizer, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    from harness.evalsets.prompts import prompt_encoder

    return prompt_encoder(tokenizer)(text)
