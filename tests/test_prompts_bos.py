"""A plain prompt (a base model without a chat template) gets the beginning-of-sequence token its tokenizer puts
in front of every encoding, the same ids in render_prompts, LoadedModel.encode and the smoke check; a chat
template's own special tokens are not doubled, and a tokenizer that adds none gets none."""

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from harness.evalsets.prompts import leading_bos, prompt_encoder, render_prompts, with_bos
from harness.evalsets import load_evalsets


def _tokenizer(adds_bos: bool, template: str | None = None) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "[UNK]": 3, **{w: i + 4 for i, w in enumerate(
        "question answer what is the capital of france paris : ?".split())}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="[UNK]")
    tokenizer.chat_template = template
    return tokenizer


def test_a_plain_prompt_gets_the_bos_its_tokenizer_adds():
    tokenizer = _tokenizer(adds_bos=True)
    assert leading_bos(tokenizer) == 1
    assert prompt_encoder(tokenizer)("what is the capital of france ?")[:2] == [1, tokenizer.convert_tokens_to_ids("what")]


def test_a_template_that_writes_its_bos_is_not_doubled():
    tokenizer = _tokenizer(adds_bos=True)
    ids = prompt_encoder(tokenizer)("<bos> question : what")
    assert ids[0] == 1 and ids[1] != 1


def test_a_tokenizer_that_adds_nothing_gets_nothing():
    tokenizer = _tokenizer(adds_bos=False)
    assert leading_bos(tokenizer) is None
    assert prompt_encoder(tokenizer)("what is paris") == tokenizer("what is paris", add_special_tokens=False)["input_ids"]
    assert with_bos([5, 6], None) == [5, 6] and with_bos([], 1) == [1]


def test_render_prompts_and_the_runtime_encode_agree():
    from harness.runtime.transformers_backend import LoadedModel

    tokenizer = _tokenizer(adds_bos=True)
    [evalset] = load_evalsets([Path(__file__).parents[1] / "evalsets" / "en_product_faq_qa.toml"])
    rendered = render_prompts(tokenizer, [evalset])[evalset.name]
    loaded = LoadedModel.__new__(LoadedModel)
    loaded.tokenizer = tokenizer
    for prompt in rendered:
        assert prompt.ids[0] == 1 and prompt.tokens == len(prompt.ids)
        assert list(prompt.ids) == loaded.encode(prompt.text)

