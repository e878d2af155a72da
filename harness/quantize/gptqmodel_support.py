"""Whether the installed GPTQModel can quantize an architecture, asked before any weight is loaded or calibrated.

Called at the start of GptqModelQuantizer.quantize (in the quantization subprocess, which imports GPTQModel anyway),
it asks GPTQModel's own tables (GPTQModel 7.6):
- gptqmodel/models/auto.py MODEL_MAP: the model_types it has a definition for. Any other is quantized through
  BaseQModel's auto-detected module tree (models/base.py:_auto_detect_module_tree), which takes GPTQ and gives up
  on AWQ ("Module Tree AutoCompat: Failed, quant_method=awq").
- a definition's require_pkgs: the package versions it needs (loader.check_versions raises at load otherwise).
- AWQ recomputes the rotary position embeddings as `rotary_emb(x, position_ids)` for every layer it replays
  (looper/awq_processor.py), taking the root rotary module as _get_root_rotary does (model.model.rotary_emb); a
  rotary embedding whose forward needs more (Gemma 3's `layer_type` in transformers 5) fails mid-calibration with
  "TypeError: Gemma3RotaryEmbedding.forward() missing 1 required positional argument: 'layer_type'". The model is
  built on the meta device to find that module: no weights are read.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from harness.formats import FORMAT_SPECS


def architecture_refusal(source_path: Path, method: str, *, trust_remote_code: bool = False) -> str | None:
    """One line saying why GPTQModel cannot quantize this checkpoint's architecture with `method` ("gptq" or
    "awq") and what can, or None when nothing it can be asked says so."""
    import gptqmodel
    from gptqmodel.models.auto import MODEL_MAP

    config = json.loads((Path(source_path) / "config.json").read_text(encoding="utf-8"))
    model_type = str(config.get("model_type") or "").lower()
    engine = f"GPTQModel {gptqmodel.__version__}"
    definition = MODEL_MAP.get(model_type)
    if definition is None:
        unlisted = f"{method}: {engine} has no definition for model_type '{model_type}' (gptqmodel.models.auto.MODEL_MAP)"
        if method == "awq":
            return (f"{unlisted} and its auto-detected module tree takes GPTQ, not AWQ "
                    f"(BaseQModel._auto_detect_module_tree); {_alternatives(method)}")
        if not _module_tree_detected(source_path, trust_remote_code):
            return (f"{unlisted}, and its module-tree auto-detection (BaseQModel._auto_detect_module_tree) finds no "
                    f"list of decoder layers holding Linear modules in it; {_alternatives(None)}")
        return None
    unmet = unmet_requirements(definition.require_pkgs or ())
    if unmet:
        return (f"{method}: {engine}'s definition of model_type '{model_type}' ({definition.__name__}) requires "
                f"{', '.join(unmet)}; {_alternatives(None)}")
    if method == "awq":
        needs = _rotary_extra_arguments(source_path, definition, trust_remote_code)
        if needs:
            rotary, names, transformers = needs
            return (f"{method}: {engine}'s AWQ cannot quantize model_type '{model_type}': it replays each layer "
                    f"with rotary_emb(x, position_ids) (looper/awq_processor.py), and {rotary}.forward also needs "
                    f"{', '.join(repr(n) for n in names)} (transformers {transformers}); {_alternatives(method)}")
    return None


def unmet_requirements(requirements) -> list[str]:
    """Each of a GPTQModel definition's require_pkgs ("transformers<=4.44.2", "mamba-ssm") the installed packages
    do not meet, with what is installed; read with GPTQModel's own parser and comparison."""
    from importlib.metadata import PackageNotFoundError, version

    from gptqmodel.models.loader import compare_versions, parse_requirement

    unmet = []
    for requirement in requirements:
        package, operator, wanted = parse_requirement(requirement)
        try:
            installed = version(package)
        except PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        if operator and not compare_versions(installed, wanted, operator):
            unmet.append(f"{requirement} (installed {installed})")
    return unmet


def _meta_model(source_path: Path, loader, trust_remote_code: bool):
    """The model as GPTQModel's loader would build it, on the meta device (no weights read); None where it cannot
    be built here (GPTQModel then finds out itself)."""
    import torch
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source_path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return loader.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, KeyError, OSError, ImportError, AttributeError, RuntimeError):
        return None


def _module_tree_detected(source_path: Path, trust_remote_code: bool) -> bool:
    """Whether GPTQModel's module-tree auto-detection, which it runs for a model_type without a definition, finds
    the layers to quantize (asked as GPTQModel asks it: BaseQModel._resolve_effective_module_tree's detector)."""
    from gptqmodel.models.base import BaseQModel
    from gptqmodel.quantization import METHOD

    model = _meta_model(source_path, BaseQModel.loader, trust_remote_code)
    if model is None:
        return True
    return BaseQModel.__new__(BaseQModel)._auto_detect_module_tree(model, METHOD.GPTQ) is not None


def _rotary_extra_arguments(source_path: Path, definition, trust_remote_code: bool):
    """(rotary class name, its forward's required arguments past (x, position_ids), transformers version) where
    AWQ's replay would call the model's root rotary embedding with too few; None otherwise."""
    if definition.rotary_embedding or definition.awq_preserve_explicit_position_embeddings:
        return None  # the definition points AWQ elsewhere, or AWQ keeps the model's own position embeddings
    import transformers

    model = _meta_model(source_path, definition.loader, trust_remote_code)
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p.name for p in list(inspect.signature(type(rotary).forward).parameters.values())[1:]
                if p.kind in positional and p.default is inspect.Parameter.empty]
    if len(required) <= 2:
        return None
    return type(rotary).__name__, required[2:], transformers.__version__


def _alternatives(method: str | None) -> str:
    """What else quantgate can judge: GPTQ where only AWQ fails, and the formats other engines make."""
    others = [name for name, spec in FORMAT_SPECS.items()
              if spec.quantizer and spec.engine not in ("gptqmodel", "none") and not spec.plan_only]
    gptq = "gptq, or " if method == "awq" else ""
    return f"judge {gptq}{', '.join(others)} (made by other engines) instead"
