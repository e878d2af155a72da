"""The random-weight Llama model the check runs on: built in bf16 (no network, no downloaded weights), with a
word-level tokenizer and a chat template, and its GPTQ 4-bit checkpoint when GPTQModel works here."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

TINYLLAMA_SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                       tie_word_embeddings=False)
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=False)

# A plain chat template, so quantgate renders its prompts the way it does for instruct models.
CHAT_TEMPLATE = ("{% for message in messages %}<s> {{ message['role'] }} : {{ message['content'] }} </s>\n"
                 "{% endfor %}{% if add_generation_prompt %}<s> assistant :{% endif %}")


def gptq_dir(model_dir: str) -> str:
    """Where the model's GPTQ checkpoint goes: beside it, DIR-gptq."""
    return model_dir + "-gptq"


def reusable_model(model_dir: Path, shape: dict):
    """True: a model of this shape (with its tokenizer) is there; None: nothing there, build it; a str: why not."""
    config_path = model_dir / "config.json"
    if not model_dir.exists() or (model_dir.is_dir() and not any(model_dir.iterdir())):
        return None
    if not config_path.is_file():
        return "exists but holds no config.json; give an empty or new directory"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    different = {k: (config.get(k), v) for k, v in shape.items() if config.get(k) != v}
    if different:
        return ("holds a model of another shape (" + ", ".join(f"{k} {a} != {b}" for k, (a, b) in different.items())
                + "); give another directory")
    if not (model_dir / "tokenizer_config.json").is_file():
        return "holds a model without a tokenizer; give another directory"
    return True


def build_model(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    start = time.perf_counter()
    config = LlamaConfig(**job["shape"], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(job["device"]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(job["model_dir"])
    _save_tokenizer(job["model_dir"], config.vocab_size)
    name = torch.cuda.get_device_name(0) if job["device"] == "cuda" else "cpu"
    return {"parameters": sum(p.numel() for p in model.parameters()), "wall_s": time.perf_counter() - start,
            "device_name": name}


def tokenizer_words(vocab_size: int) -> int:
    """How many made-up words (w0, w1, ...) the tokenizer knows: ids 4 and up, within the model's vocabulary."""
    return min(vocab_size, 4096) - 4


def _save_tokenizer(model_dir: str, vocab_size: int) -> None:
    """A word-level tokenizer over made-up words, with a chat template: GPTQModel wants one beside the weights,
    quantgate loads it with AutoTokenizer; nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3,
             **{f"w{i}": i + 4 for i in range(tokenizer_words(vocab_size))}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)


def gptqmodel_env() -> None:
    # GPTQModel asks for more CPU workers than small machines have unless told (as quantgate's workers are).
    from harness.launcher import set_gptqmodel_cpu_workers

    set_gptqmodel_cpu_workers(os.environ)


def quantize_gptq(job: dict) -> dict:
    import torch

    gptqmodel_env()
    from gptqmodel import GPTQModel
    from gptqmodel.quantization import GPTQConfig

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    calibration = [{"input_ids": ids, "attention_mask": [1] * len(ids)}
                   for ids in torch.randint(4, 4096, (32, 256), generator=generator).tolist()]
    model = GPTQModel.load(job["model_dir"], GPTQConfig(bits=4, group_size=job["gptq_group"]), device=job["device"])
    model.quantize(calibration, batch_size=4)
    model.save(gptq_dir(job["model_dir"]))
    return {"wall_s": time.perf_counter() - start}
