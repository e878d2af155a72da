"""Which decoder linears vLLM keeps 16-bit in a pre-quantized bitsandbytes checkpoint (its llm_int8_skip_modules),
by release, and whether that agrees with what the checkpoint stores: where it does not, vLLM fails to load it.

What the checkpoint stores (transformers' _replace_with_bnb_linear, integrations/bitsandbytes.py in the 4.x releases
that wrote the bnb exports on the Hub): a linear stays 16-bit when its own name is an entry, an entry followed by a
dot occurs in its full name ("model.layers.1.mlp" keeps model.layers.1.mlp.gate_proj), or an entry is its full name.

What vLLM allocates (vllm/model_executor/layers/quantization/bitsandbytes.py): BitsAndBytesConfig.get_quant_method
(@v0.8.5:123-129) gives a LinearBase whose prefix is_layer_skipped_bnb matches an UnquantizedLinearMethod (a 16-bit
weight) and every other one a BitsAndBytesLinearMethod (packed uint8). The prefix is the module vLLM builds, with
q/k/v fused into self_attn.qkv_proj and gate/up into mlp.gate_up_proj (models/qwen2.py@v0.8.5:79-86,142-149; Llama
and Mistral alike). is_layer_skipped_bnb:
- to 0.7.2 (@v0.7.2:131-137): an entry matches when it equals one dot-separated component of the prefix
  ("lm_head", "mlp"), so a dotted module path never does;
- from 0.7.3 (vllm-project/vllm#12974, "Allow Unsloth Dynamic 4bit BnB quants to work"; @v0.7.3:131-145, the same
  @v0.8.5:132-146): also when it equals a dotted prefix of it ("model.layers.1.mlp" for
  model.layers.1.mlp.gate_up_proj, "model.layers.0.self_attn" for its qkv_proj and o_proj). A path to a module
  vLLM fuses ("model.layers.1.mlp.gate_proj") is no prefix of the fused one and still never matches.
The lm_head and the embedding are no LinearBase: 16-bit whatever the list says.

BitsAndBytesModelLoader._quantized_4bit_generator (model_loader/loader.py@v0.8.5:984-1036) yields every checkpoint
tensor as stored; a layer whose vLLM storage differs from the checkpoint's fails the weight loaders'
`assert param_data.shape == loaded_weight.shape` (layers/linear.py@v0.8.5:607,704,1253) before memory is profiled.
So a vLLM run that reached its KV cache held exactly the checkpoint's 16-bit linears, and its weights are the
checkpoint's (storage.unconverted_copies sizes them); where the two rules disagree there is no such run.
"""

from __future__ import annotations

from collections.abc import Iterable

Release = tuple[int, ...]

# is_layer_skipped_bnb's dotted-prefix match, added by vllm-project/vllm#12974
VLLM_BNB_DOTTED_SKIP_SINCE: Release = (0, 7, 3)

# the checkpoint's module inside a decoder layer -> the one vLLM builds for a dense decoder (packed_modules_mapping)
VLLM_MODULE = {"self_attn.q_proj": "self_attn.qkv_proj", "self_attn.k_proj": "self_attn.qkv_proj",
               "self_attn.v_proj": "self_attn.qkv_proj", "self_attn.o_proj": "self_attn.o_proj",
               "mlp.gate_proj": "mlp.gate_up_proj", "mlp.up_proj": "mlp.gate_up_proj", "mlp.down_proj": "mlp.down_proj"}


def is_layer_skipped_bnb(prefix: str, entries: Iterable[str], release: Release | None = None) -> bool:
    """vLLM's is_layer_skipped_bnb at `release` (None: the newest): whether llm_int8_skip_modules keeps the module
    at `prefix` 16-bit."""
    entries = tuple(entries)
    components = prefix.split(".")
    if any(entry in components for entry in entries):
        return True
    if release is not None and release < VLLM_BNB_DOTTED_SKIP_SINCE:
        return False
    prefixes = {".".join(components[:i + 1]) for i in range(len(components))}
    return bool(prefixes & set(entries))


def checkpoint_keeps(name: str, entries: Iterable[str]) -> bool:
    """Whether a bitsandbytes export kept the linear at full name `name` 16-bit (transformers' rule, above)."""
    leaf = name.rsplit(".", 1)[-1]
    return any(entry == leaf or f"{entry}." in name or entry == name for entry in entries)


def vllm_load_problem(entries: Iterable[str], layers: int, release: Release | None = None) -> str | None:
    """Why vLLM `release` (None: the newest) cannot load a dense decoder's bnb checkpoint with these
    llm_int8_skip_modules (the first layer where vLLM's storage differs from the checkpoint's), or None."""
    entries = tuple(str(entry) for entry in entries)
    if not entries:
        return None
    for layer in range(layers):
        for module, fused in VLLM_MODULE.items():
            name, prefix = f"model.layers.{layer}.{module}", f"model.layers.{layer}.{fused}"
            kept, skipped = checkpoint_keeps(name, entries), is_layer_skipped_bnb(prefix, entries, release)
            if kept != skipped:
                held, quantizes = ("16-bit", "quantizes") if kept else ("quantized", "keeps 16-bit")
                return (f"the checkpoint holds {name} {held} (llm_int8_skip_modules), but vLLM {quantizes} {prefix} "
                        "(is_layer_skipped_bnb matches a module vLLM builds, by a whole component or, from "
                        f"0.7.3, a dotted prefix), so loading the weight fails")
    return None
