"""model_shape: a model's shape from its config, for every architecture: shapes.py's written-out counts where it
has them, else from the model transformers itself builds on the meta device (no weights are allocated or read):
every architecture transformers knows, not only the hand-written ones in shapes.py.

Linear weights are every nn.Linear but the lm_head, and every 3-D expert parameter (transformers 5 fuses an MoE
layer's experts into one [experts, ., .] tensor per projection); a 2-D parameter of any other module is a router
(kept 16-bit, on every GPU). Everything else (norms, attention sinks, loose biases) is `other_params`. Tensor
parallel splits follow the projection's name (q/k/v/o, gate/up/down, fc1/fc2, w1/w2/w3). The attention (KV heads,
head size, MLA, sliding or chunked layers, a hybrid's recurrent states) comes from the config as for the
hand-written shapes. A multimodal config is its language model (the text config with transformers' defaults under
it) plus the vision tower's parameters (multimodal_shape).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace
from typing import Any

from harness.capacity.shapes import (KNOWN_TYPES, ConfigFieldError, Linear, ModelShape, attention_shape,
                                             config_fields, derived_max_len, positive_int, sglang_context_length,
                                             written_shape)

_LAYER_INDEX = re.compile(r"\.(\d+)\.")
_ROW = re.compile(r"(o_proj|out_proj|down_proj|dense_4h_to_h|fc2|w2|c_proj)$")
_KV = re.compile(r"(k_proj|v_proj)$")
_EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def model_shape(config: Any) -> ModelShape:
    """Every linear layer, the norms and the attention of the model this config describes: written out for the
    architectures shapes.py knows (no torch import), built on the meta device for any other transformers knows.
    A multimodal config (one with a `text_config`) is planned from its language model plus the vision tower's
    weights (multimodal_shape)."""
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    nested = raw.get("text_config")
    if hasattr(nested, "to_dict") or (isinstance(nested, dict) and nested):
        return multimodal_shape(raw)
    if raw.get("vision_config") and raw.get("model_type") not in KNOWN_TYPES:
        # a multimodal config.json with its language model's fields at the top level (Qwen2-VL, Qwen2.5-VL): the
        # config class takes them as its text config, as transformers' own loading does
        text = {k: v for k, v in raw.items() if k not in ("vision_config", "architectures", "model_type")}
        return multimodal_shape({**raw, "text_config": text})
    fields = config_fields(config)
    if not fields.get("model_type") or fields["model_type"] in KNOWN_TYPES:
        return written_shape(fields)
    return meta_shape(fields)


def meta_shape(fields: dict[str, Any]) -> ModelShape:
    """The ModelShape of the decoder transformers builds for this config (fields: config.json as a dict, the
    language model's part of a multimodal one); ConfigFieldError when transformers cannot build it."""
    attention = attention_shape(fields)  # a missing attention field names itself before transformers is imported
    model = _meta_model(fields)
    hidden, vocab = positive_int(fields, "hidden_size"), positive_int(fields, "vocab_size")
    layers = attention.layers
    groups: dict[tuple, set[int]] = defaultdict(set)
    counts: dict[tuple, int] = defaultdict(int)
    other = 0
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    linear_params: set[int] = set()
    import torch

    kept_16bit: set[int] = set()  # a Mamba / short-conv layer's depthwise Conv1d: 3-D, but no expert, unquantized
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding):
            linear_params.update(id(p) for p in module.parameters(recurse=False))
        elif isinstance(module, torch.nn.Conv1d):
            kept_16bit.update(id(p) for p in module.parameters(recurse=False))
        elif isinstance(module, torch.nn.Linear):
            linear_params.update(id(p) for p in module.parameters(recurse=False))
            if name.endswith("lm_head") or module.out_features == vocab and "layers" not in name:
                continue
            key = (_pattern(name), module.in_features, module.out_features, module.bias is not None,
                   _split(name, module.out_features, fields), not _is_router(name, module.out_features, fields))
            counts[key] += 1
            groups[key].update(_layer(name))
    params = dict(model.named_parameters())
    for name, param in params.items():
        if id(param) in linear_params:
            continue
        leaf = name.rpartition(".")[2]
        if id(param) in kept_16bit:
            other += param.numel()
        elif param.dim() == 3:  # fused experts: [experts, a, b], either orientation: the hidden side tells
            experts, a, b = (int(d) for d in param.shape)
            down = "down" in leaf or "w2" in leaf
            in_f, out_f = ((b, a) if b == hidden else (a, b)) if down else ((a, b) if a == hidden else (b, a))
            key = (_pattern(name), in_f, out_f, f"{name}_bias" in params, "row" if down else "column", True)
            counts[key] += experts
            groups[key].update(_layer(name))
        elif leaf.endswith("_bias") and name.removesuffix("_bias") in params \
                and params[name.removesuffix("_bias")].dim() == 3:
            continue  # counted with its expert weights (bias=True)
        elif param.dim() == 2:  # a router's weight (MoE layers that do not use nn.Linear for it)
            out_f, in_f = (int(d) for d in param.shape)
            key = (_pattern(name), in_f, out_f, False, "none", False)
            counts[key] += 1
            groups[key].update(_layer(name))
        else:
            other += param.numel()
    linears = []
    for key, count in counts.items():
        pattern, in_f, out_f, bias, split, quantized = key
        held = len(groups[key])
        placed = held not in (0, layers)
        linears.append(Linear(pattern, in_f, out_f, count, bias, split, quantized, held if placed else 0,
                              tuple(sorted(groups[key])) if placed else ()))
    experts = next((positive_int(fields, f) for f in _EXPERT_COUNT_FIELDS if fields.get(f)), 0)
    top_k = positive_int(fields, "num_experts_per_tok") if experts and fields.get("num_experts_per_tok") else 0
    return ModelShape(model_type=str(fields.get("model_type")), hidden=hidden, vocab=vocab, tied_embeddings=tied,
                      attention=attention, linears=tuple(sorted(linears, key=lambda l: l.name)),
                      other_params=max(other, hidden), mlp_width=_mlp_width(linears, hidden, top_k),
                      experts=experts, experts_per_token=top_k, max_len=derived_max_len(fields),
                      sglang_max_len=sglang_context_length(fields),
                      torch_dtype=fields.get("torch_dtype") or fields.get("dtype"))


def multimodal_shape(raw: dict[str, Any]) -> ModelShape:
    """A vision-language model as a serving engine holds it: its language model (the text config with the defaults
    transformers fills in, since a published config.json leaves them out: Gemma-3-27B's text_config has no
    vocab_size, max_position_embeddings or sliding_window_pattern) and the vision tower and projector, counted from
    the model transformers builds on the meta device. The vision weights are added as 16-bit parameters on every GPU
    (other_params: engines load the vision tower unquantized; under tensor parallelism this over-counts them)."""
    given = raw["text_config"].to_dict() if hasattr(raw["text_config"], "to_dict") else dict(raw["text_config"])
    # a caller may have merged the text fields over the top level already (shapes.config_fields): the top-level
    # fields are then those the text config does not have, and the top-level model_type is the architecture's
    outer = {k: v for k, v in raw.items() if k not in given or k in ("text_config", "vision_config")}
    outer["model_type"] = _multimodal_type(raw, given.get("model_type"))
    built = _transformers_config(outer)
    text = built.get_text_config()
    text = text.to_dict() if hasattr(text, "to_dict") else dict(text)
    defaults = {k: v for k, v in text.items() if v is not None}
    top = {k: v for k, v in outer.items() if k not in ("text_config", "vision_config") and v is not None}
    fields = {**top, **defaults, **given}
    fields["model_type"] = given.get("model_type") or defaults.get("model_type")
    language = written_shape(fields) if fields["model_type"] in KNOWN_TYPES else meta_shape(fields)
    vision_linears, vision_other = _vision_parts(built)
    return replace(language, linears=language.linears + vision_linears,
                   other_params=language.other_params + vision_other)


def _multimodal_type(raw: dict[str, Any], text_type: str | None) -> str | None:
    """The multimodal model's own model_type: that of the config class of its architecture
    (Gemma3ForConditionalGeneration -> gemma3), else the config's own unless it is the text model's (the text
    fields merged over the top level)."""
    model_type = raw.get("model_type")
    from harness.quiet import quiet_imports

    with quiet_imports():
        import transformers

    for architecture in raw.get("architectures") or ():
        config_class = getattr(getattr(transformers, str(architecture), None), "config_class", None)
        if config_class is not None and getattr(config_class, "model_type", None):
            return config_class.model_type
    if model_type and model_type != text_type:
        return model_type
    # merged without a usable architecture (a text_config's "architectures": null over the top level's): the
    # multimodal config class whose text sub-config is this text model
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for candidate, config_class in CONFIG_MAPPING.items():
        text_class = (getattr(config_class, "sub_configs", None) or {}).get("text_config")
        if text_type and getattr(text_class, "model_type", None) == text_type:
            return candidate
    raise ConfigFieldError("architectures", f"names no multimodal model transformers knows, and model_type "
                                            f"{model_type!r} is the text model's")


def _transformers_config(raw: dict[str, Any]):
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoConfig

    model_type = raw.get("model_type")
    try:
        return AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigFieldError("model_type", f"is {model_type!r}, which this transformers does not know either "
                               f"({str(exc)[:160]})") from None


def _vision_parts(config) -> tuple[tuple[Linear, ...], int]:
    """Everything but the language model and its lm_head (the vision tower and the projector), from the model
    transformers builds on the meta device: its linear layers, kept 16-bit (quantized checkpoints leave the vision
    tower unquantized) and split over tensor-parallel GPUs as vLLM shards them (column, or row for the output
    projections), all on one pipeline stage (Linear.layers 1); and the count of its other parameters."""
    from harness.quiet import quiet_imports

    with quiet_imports():
        import torch
        from transformers import AutoModel, AutoModelForImageTextToText

    try:
        with torch.device("meta"):
            try:
                model = AutoModelForImageTextToText.from_config(config)
            except ValueError:
                model = AutoModel.from_config(config)
    except Exception as exc:  # noqa: BLE001 - any failure to build is a config this planner cannot count
        raise ConfigFieldError("vision_config", f"of model_type {config.model_type!r}: transformers could not build "
                               f"the vision tower on the meta device ({type(exc).__name__}: {str(exc)[:160]})") \
            from None
    counts: dict[tuple, int] = defaultdict(int)
    in_linears: set[int] = set()
    for name, module in model.named_modules():
        if "language_model" in name or name.startswith("lm_head") or not isinstance(module, torch.nn.Linear):
            continue
        in_linears.update(id(p) for p in module.parameters(recurse=False))
        split = "row" if _ROW.search(name) else "column"
        counts[(f"vision.{_pattern(name)}", module.in_features, module.out_features, module.bias is not None,
                split)] += 1
    linears = tuple(Linear(pattern, in_f, out_f, count, bias, split, quantized=False, layers=1)
                    for (pattern, in_f, out_f, bias, split), count in sorted(counts.items()))
    other = sum(p.numel() for name, p in model.named_parameters() if id(p) not in in_linears
                and "language_model" not in name and not name.startswith("lm_head"))
    return linears, other


def _meta_model(fields: dict[str, Any]):
    from harness.quiet import quiet_imports

    with quiet_imports():
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    model_type = fields.get("model_type")
    try:
        config = AutoConfig.for_model(model_type, **{k: v for k, v in fields.items()
                                                     if k not in ("model_type", "text_config", "vision_config")})
    except (ValueError, KeyError) as exc:
        raise ConfigFieldError("model_type", f"is {model_type!r}, which this transformers "
                               f"does not know either ({exc})") from None
    try:
        with torch.device("meta"):
            try:
                return AutoModelForCausalLM.from_config(config)
            except ValueError:  # a multimodal model's text part (MllamaTextConfig): its XForCausalLM by name
                import transformers

                name = re.sub(r"(Text)?Config$", "ForCausalLM", type(config).__name__)
                if hasattr(transformers, name):
                    return getattr(transformers, name)(config)
                # a text part with no causal-LM class (Qwen2_5_VLTextConfig): its decoder alone; the lm_head and
                # embeddings are counted from the vocabulary either way
                return AutoModel.from_config(config)
    except Exception as exc:  # noqa: BLE001 - any failure to build is a config this planner cannot count
        raise ConfigFieldError("model_type", f"is {model_type!r}: transformers could not build it on the meta "
                               f"device ({type(exc).__name__}: {str(exc)[:160]})") from None


def _pattern(name: str) -> str:
    """The name with layer and expert indices dropped: 'model.layers.3.mlp.up_proj' -> 'mlp.up_proj'."""
    tail = name.split(".layers.", 1)[-1]
    return re.sub(r"^\d+\.", "", _LAYER_INDEX.sub(".", f".{tail}.")).strip(".").removesuffix(".weight")


def _layer(name: str) -> set[int]:
    match = re.search(r"\.layers\.(\d+)\.", name)
    return {int(match.group(1))} if match else set()


def _split(name: str, out_features: int, fields: dict[str, Any]) -> str:
    if _is_router(name, out_features, fields):
        return "none"
    if _KV.search(name):
        return "kv"
    return "row" if _ROW.search(name) else "column"


def _is_router(name: str, out_features: int, fields: dict[str, Any]) -> bool:
    experts = next((fields[f] for f in _EXPERT_COUNT_FIELDS if fields.get(f)), None)
    return bool(experts) and out_features == experts and ("router" in name or name.endswith(("gate", "mlp.gate")))


def _mlp_width(linears: list[Linear], hidden: int, top_k: int) -> int:
    """Widest MLP activation per token: a dense MLP's width, or top_k routed experts' plus a shared expert's (a
    fused gate_up projection counts both halves)."""
    mlp = [l for l in linears if l.split == "column" and l.in_features == hidden and l.quantized
           and not _is_attention(l.name)]
    def width(lin: Linear) -> int:
        return lin.out_features // 2 if "gate_up" in lin.name else lin.out_features

    routed = [width(l) for l in mlp if "expert" in l.name and "shared" not in l.name]
    shared = [width(l) for l in mlp if "shared" in l.name]
    dense = [width(l) for l in mlp if "expert" not in l.name]
    return max([top_k * max(routed, default=0) + max(shared, default=0), *dense], default=4 * hidden)


def _is_attention(name: str) -> bool:
    return bool(re.search(r"(q_proj|k_proj|v_proj|qkv|o_proj|attn|attention)", name))
