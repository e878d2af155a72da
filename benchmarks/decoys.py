"""Decoy candidates for the fidelity ladder (#42 item 3): the baseline with damage confined to a narrow slice of
the vocabulary, built to pass an average while failing the answers that slice carries. Each is a checkpoint that
`quantgate run --candidate NAME=PATH` judges, marked as benchmarks/rtn_ladder.py marks its rungs (a
"quantgate-simulated" quantization_config: transformers loads the 16-bit weights as stored).

A decoy is (slice, target, damage):
- slice: `digits` (tokens whose text is ASCII digits: the ten '0'..'9' on the demo model and on Gemma 3, whose
  SentencePiece byte-fallback pieces '<0x30>'..'<0x39>' also decode to digits but are left out: its tokenizer
  never spells a digit with them, so a permutation through them would move a digit's logits off the slice) or
  `cjk` (tokens whose text is CJK ideographs, and, for a byte-level BPE tokenizer, tokens whose bytes are such
  characters followed by the start of one: SmolLM2 spells most Chinese in byte pieces; pieces of continuation bytes
  alone are shared with every other script and left out; Gemma 3 has 19,256 whole-CJK tokens);
- target: `lm_head` (the output rows: the logits of those tokens; a tied head is untied first, so the input
  embeddings stay the baseline's) or `embed` (the input rows only; a tied head keeps the baseline's rows);
- damage: `permute` (each row of the slice takes the next one's, a cyclic shift over the sorted ids: the same set
  of logits, so every token outside the slice keeps its probability exactly, while a confident digit becomes
  another digit just as confidently) or `scale` (the rows multiplied by `factor`).

On the bench's public sets the `cjk` decoys are also the candidate that matches the baseline except on one evalset
(CMRC 2018 is Chinese; SQuAD and CNN/DailyMail are English, where the baseline puts next to no mass on CJK tokens):
that is a property of the run's evalsets, so the bench builds it this way rather than as a separate checkpoint.
Damage to the first answer token only is not a property of a checkpoint: weights do not know where an answer
starts (that needs the chat template's position, i.e. another forward), so it is not built here; the rule's tail
condition over confident flips (harness/fidelity/rule.py) is tested on per-position figures for that case
(tests/test_fidelity.py).

    PYTHONPATH=. .venv/bin/python -m benchmarks.decoys SOURCE_DIR ROOT [--slice digits --target lm_head]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.rtn_ladder import SIMULATED_METHOD, print_built, write_variant
from harness.errors import UserError

SLICES = ("digits", "cjk")
TARGETS = ("lm_head", "embed")
DAMAGES = ("permute", "scale")
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F))
CJK_LEAD_BYTES = range(0xE4, 0xEA)  # UTF-8 lead bytes of U+4000..U+9FFF (E3 would take in kana as well)
BYTE_FALLBACK_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's (Llama 2, Gemma) pieces for a raw byte


@dataclass(frozen=True)
class Decoy:
    slice: str
    target: str
    damage: str = "permute"
    factor: float = 0.7  # for damage "scale"

    @property
    def name(self) -> str:
        damage = self.damage if self.damage == "permute" else f"scale{self.factor:g}"
        return f"decoy-{self.slice}-{self.target.replace('_', '')}-{damage}"

    def quantization_config(self, source_fingerprint: str, ids: tuple[int, ...], examples: list[str],
                            untied: bool) -> dict:
        return {"quant_method": SIMULATED_METHOD, "simulated": "decoy", "decoy_slice": self.slice,
                "decoy_target": self.target, "decoy_damage": self.damage,
                **({"decoy_factor": self.factor} if self.damage == "scale" else {}),
                "decoy_tokens": len(ids), "decoy_token_ids_sha256": _ids_digest(ids), "decoy_examples": examples,
                "untied_head": untied, "source_fingerprint": source_fingerprint,
                "built_by": "benchmarks/decoys.py"}


DECOYS = (Decoy("digits", "lm_head"), Decoy("digits", "embed"), Decoy("cjk", "lm_head"))


def _ids_digest(ids: tuple[int, ...]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def is_cjk(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in CJK_RANGES)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the table every byte-level BPE tokenizer uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return '"ByteLevel"' in json.dumps(decoder)


def _cjk_bytes(raw: bytes) -> bool:
    """Whole CJK characters (an optional leading space), then at most the lead of one more."""
    raw = raw[1:] if raw[:1] == b" " else raw
    if not raw:
        return False
    for cut in range(len(raw), max(len(raw) - 3, 0) - 1, -1):  # the longest prefix that decodes
        try:
            text = raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        rest = raw[cut:]
        whole = all(is_cjk(c) for c in text)
        partial = not rest or (rest[0] in CJK_LEAD_BYTES and len(rest) < 3
                               and all(0x80 <= b < 0xC0 for b in rest[1:]))
        return whole and partial and (bool(text) or bool(rest))
    return False


def _is_byte_piece(tokenizer, token_id: int) -> bool:
    piece = tokenizer.convert_ids_to_tokens(token_id)
    return isinstance(piece, str) and BYTE_FALLBACK_PIECE.fullmatch(piece) is not None


def slice_token_ids(tokenizer, which: str) -> tuple[int, ...]:
    """The sorted ids of the slice's tokens (special tokens never)."""
    if which not in SLICES:
        raise UserError(f"decoy slice '{which}': choose from {', '.join(SLICES)}")
    special = set(tokenizer.all_special_ids)
    byte_level = which == "cjk" and _is_byte_level(tokenizer)
    table = _byte_decoder() if byte_level else {}
    found = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id]).strip()
        if which == "digits":
            if text and all(c in "0123456789" for c in text) and not _is_byte_piece(tokenizer, token_id):
                found.append(token_id)
        elif text and all(is_cjk(c) for c in text):
            found.append(token_id)
        elif byte_level:
            piece = tokenizer.convert_ids_to_tokens(token_id)
            if piece and all(c in table for c in piece) and _cjk_bytes(bytes(table[c] for c in piece)):
                found.append(token_id)
    return tuple(found)


def _embedding_names(source: Path) -> tuple[str, str, bool]:
    """(input embedding weight name, output head weight name, tied), from the model built on the meta device."""
    import torch

    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(source)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    names = {id(module): name for name, module in model.named_modules()}
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None:
        raise UserError(f"{source}: the model has no output head to damage")
    tied = head.weight is embed.weight
    return f"{names[id(embed)]}.weight", f"{names[id(head)]}.weight", tied


def damaged_rows(weight, ids: tuple[int, ...], decoy: Decoy):
    """`weight` with the rows `ids` damaged (a copy)."""
    import torch

    out = weight.clone()
    index = torch.tensor(ids, dtype=torch.long)
    if decoy.damage == "permute":
        if len(ids) < 2:
            raise UserError(f"{decoy.name}: {len(ids)} token in the slice; a permutation needs two")
        out[index] = weight[torch.roll(index, -1)]
    else:
        out[index] = (weight[index].float() * decoy.factor).to(weight.dtype)
    return out


def build_decoy(source: Path, root: Path, decoy: Decoy) -> Path:
    """The decoy's checkpoint directory under `root`, built once per (source fingerprint, decoy)."""
    from transformers import AutoTokenizer

    from harness.source import fingerprint

    if decoy.target not in TARGETS or decoy.damage not in DAMAGES:
        raise UserError(f"{decoy.name}: target is one of {', '.join(TARGETS)}, damage one of {', '.join(DAMAGES)}")
    digest = fingerprint(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    ids = slice_token_ids(tokenizer, decoy.slice)
    if not ids:
        raise UserError(f"{source}: the tokenizer has no {decoy.slice} tokens; no {decoy.name} can be built")
    embed_name, head_name, tied = _embedding_names(source)
    target = root / f"{decoy.name}-{digest.removeprefix('sha256:')[:16]}"

    def damage(tensors: dict) -> dict:
        out = dict(tensors)
        if tied and embed_name in tensors:  # the head becomes its own tensor, beside the embedding
            out[head_name] = tensors[embed_name].clone()
        damaged = head_name if decoy.target == "lm_head" else embed_name
        if damaged in out:
            out[damaged] = damaged_rows(out[damaged], ids, decoy)
        return out

    examples = [tokenizer.decode([i]) for i in ids[:12]]

    def edit_config(config: dict) -> dict:
        edited = {**config, "quantization_config": decoy.quantization_config(digest, ids, examples, tied)}
        if tied:
            edited["tie_word_embeddings"] = False
        return edited

    return write_variant(source, target, damage, {embed_name} if tied else {embed_name, head_name}, edit_config)


def build_decoys(source: Path, root: Path, decoys: tuple[Decoy, ...] = DECOYS) -> dict[str, Path]:
    return {decoy.name: build_decoy(source, root, decoy) for decoy in decoys}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="decoy candidates: damage confined to a slice of the vocabulary")
    parser.add_argument("source", type=Path)
    parser.add_argument("root", type=Path, help="where the decoys are built (and reused)")
    parser.add_argument("--slice", choices=SLICES)
    parser.add_argument("--target", choices=TARGETS)
    parser.add_argument("--damage", choices=DAMAGES)
    parser.add_argument("--factor", type=float, default=0.7, help="row scale for --damage scale (default 0.7)")
    args = parser.parse_args(argv)
    if args.slice or args.target or args.damage:
        decoys = (Decoy(args.slice or "digits", args.target or "lm_head", args.damage or "permute", args.factor),)
    else:
        decoys = DECOYS
    return print_built(args.source, lambda: build_decoys(args.source, args.root, decoys))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
