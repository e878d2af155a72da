"""Prompts: rendering an item as chat messages or as one plain prompt that ends with the answer cue, and the rendered
prompt a run sends (`Prompt`). The templates themselves are harness.evalsets.template's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import UserError

if TYPE_CHECKING:
    from harness.evalsets.items import EvalItem, EvalSet, FewShotExample



@dataclass
class Prompt:
    """One item as the model gets it: rendered through its chat template (or plain), with its token count."""

    evalset: str
    item_id: str
    text: str
    tokens: int
    max_new_tokens: int
    ids: tuple[int, ...] = ()  # the token ids both backends generate from


def shared_prefix_tokens(prompts: list[Prompt]) -> int:
    """How many tokens all `prompts` open with alike (their token ids' common prefix): what a serving engine's
    prefix cache keeps once for them. 0 for fewer than two prompts or prompts without ids."""
    if len(prompts) < 2 or any(not p.ids for p in prompts):
        return 0
    first, last = min(p.ids for p in prompts), max(p.ids for p in prompts)  # the common prefix of the extremes
    shared = 0
    for a, b in zip(first, last):
        if a != b:
            break
        shared += 1
    return shared


def _fill(template: str, question: str, context: str, instruction: str) -> str:
    return template.format(question=question, context=context, instruction=instruction)


def _user_text(evalset: EvalSet, example: EvalItem | FewShotExample) -> str:
    return _fill(evalset.prompt_template, example.question, example.context, example.instruction)


def render_messages(evalset: EvalSet, item: EvalItem) -> list[dict[str, str]]:
    """Chat messages: optional system prompt, few-shot user/assistant turns, then the item."""
    messages = []
    if evalset.system_prompt:
        messages.append({"role": "system", "content": evalset.system_prompt})
    for example in evalset.few_shot:
        messages.append({"role": "user", "content": _user_text(evalset, example)})
        messages.append({"role": "assistant", "content": example.answer})
    messages.append({"role": "user", "content": _user_text(evalset, item)})
    return messages


def _answer_cue(evalset: EvalSet, item: EvalItem) -> str:
    zh = evalset.item_language(item) == "zh"
    if evalset.task == "qa":
        return "答案：" if zh else "Answer:"
    return "回答：" if zh else "Response:"


def render_plain(evalset: EvalSet, item: EvalItem) -> str:
    """One prompt string for models without a chat template; ends with the answer cue."""
    cue = _answer_cue(evalset, item)
    gap = "" if cue.endswith("：") else " "
    blocks = [evalset.system_prompt] if evalset.system_prompt else []
    blocks += [f"{_user_text(evalset, ex)}\n{cue}{gap}{ex.answer}" for ex in evalset.few_shot]
    blocks.append(f"{_user_text(evalset, item)}\n{cue}")
    return "\n\n".join(blocks)


def check_prompt_lengths(prompts: dict[str, list[Prompt]], model_config: dict) -> None:
    """A prompt plus its new tokens beyond the model's context is refused here, before any model loads (it would
    fail or be cut off silently deep in a worker)."""
    limit = model_config.get("text_config", model_config).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return
    too_long = [p for rendered in prompts.values() for p in rendered if p.tokens + p.max_new_tokens > limit]
    if too_long:
        listed = ", ".join(f"{p.evalset}/{p.item_id} ({p.tokens:,} + {p.max_new_tokens} new)" for p in too_long[:5])
        more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
        raise UserError(f"{len(too_long)} prompt(s) do not fit the model's context of {limit:,} tokens "
                        f"(max_position_embeddings): {listed}{more}; shorten those items or lower max_new_tokens")


def leading_bos(tokenizer) -> int | None:
    """The beginning-of-sequence id when the tokenizer itself puts it in front of every encoding (Llama, Gemma),
    else None (GPT-2-style and Qwen tokenizers add nothing)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    probe = tokenizer("a")["input_ids"]
    return bos if probe and probe[0] == bos else None


def with_bos(ids: list[int], bos: int | None) -> list[int]:
    """ids with the tokenizer's leading BOS where it puts one and the text did not already start with it: a chat
    template writes its own (`<bos>`, `<|begin_of_text|>`), a base model's plain prompt has none, and Gemma answers
    garbage without it."""
    return ids if bos is None or (ids and ids[0] == bos) else [bos, *ids]


def prompt_encoder(tokenizer):
    """text -> a rendered prompt's token ids, as render_prompts counts them and every runtime is given them; the
    tokenizer is probed for its BOS once, not per prompt."""
    bos = leading_bos(tokenizer)
    return lambda text: with_bos(tokenizer(text, add_special_tokens=False)["input_ids"], bos)


def render_prompts(tokenizer, evalsets: list[EvalSet], max_new_tokens: int | None = None) -> dict[str, list[Prompt]]:
    """Render each item through the model's chat template (plain text when it has none) and count its tokens;
    max_new_tokens (--max-new-tokens) caps each set's own."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    rendered: dict[str, list[Prompt]] = {}
    for evalset in evalsets:
        max_new = min(evalset.max_new_tokens, max_new_tokens or evalset.max_new_tokens)
        texts = [tokenizer.apply_chat_template(render_messages(evalset, item), add_generation_prompt=True,
                                               tokenize=False) if has_template else render_plain(evalset, item)
                 for item in evalset.items]
        bos = leading_bos(tokenizer)
        encoded = [with_bos(ids, bos) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        rendered[evalset.name] = [Prompt(evalset.name, item.id, text, len(ids), max_new, tuple(ids))
                                  for item, text, ids in zip(evalset.items, texts, encoded)]
    return rendered
