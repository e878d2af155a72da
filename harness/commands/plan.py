"""`quantgate plan`: what a model needs on a target GPU per format, from its config alone (no weights loaded)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.errors import UserError
from harness.measure.capacity import default_batched_tokens, plan_capacity
from harness.measure.kv import (DEMO_CONFIG, estimate_activation_peak_bytes, estimate_weights_bytes,
                                kv_bytes_per_token, parameter_count, text_config)
from harness.quantize import FORMATS, VLLM_QUANTIZATION, choose_group_size

_GIB = 2**30
DEFAULT_MAX_MODEL_LEN = 4096


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="estimate weights, KV cache and vLLM capacity per format from a model's config",
        description="From a model's config.json alone (no weights are loaded, nothing runs): estimated weights per "
                    "format, KV cache bytes per token, how many sequences fit on the target GPU, and the vLLM flags.")
    parser.add_argument("--model", default="demo", metavar="PATH_OR_CONFIG_JSON",
                        help="a Hugging Face model directory, its config.json, or 'demo' (SmolLM2-135M; default)")
    parser.add_argument("--format", default=",".join(FORMATS), metavar="NAME[,NAME...]",
                        help=f"format(s) to plan, comma-separated, of {', '.join(FORMATS)} (default: all)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="gptq/awq group size (default: the largest of 128/64/32 dividing the layer widths)")
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0, help="target GPU memory (default 80)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                        help="vLLM's --gpu-memory-utilization (default 0.90)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help=f"tokens per sequence (default {DEFAULT_MAX_MODEL_LEN}, or the model's limit if lower)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="tokens per forward step (default: max(max-model-len, 8192))")
    parser.add_argument("--activation-gib", type=float, default=None,
                        help="activation peak to reserve, in GiB (default: estimated from the config at "
                             "--max-num-batched-tokens: tokens x (4 x hidden + 3 x intermediate) x 2 bytes "
                             "plus fp32 sampler logits for 256 sequences)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, described = load_model_config(args.model)
    formats = _parse_formats(args.format)
    _check_positive(args)
    max_model_len = _max_model_len(config, args.max_model_len)
    batched = args.max_num_batched_tokens or default_batched_tokens(max_model_len)
    try:
        kv_per_token = kv_bytes_per_token(config)
        parameters = parameter_count(config)
        estimated_activation = estimate_activation_peak_bytes(config, batched)
    except (ValueError, TypeError) as exc:
        raise UserError(f"--model {args.model}: {exc}") from None
    activation = estimated_activation if args.activation_gib is None else int(args.activation_gib * _GIB)
    plans = {}
    for fmt in formats:
        bits, group = _scheme(fmt, config, args.group_size)
        weights = estimate_weights_bytes(config, bits, group, fmt=fmt)
        capacity = plan_capacity(weights, activation, kv_per_token, gpu_memory_gib=args.gpu_memory_gib,
                                 gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=max_model_len,
                                 quantization=VLLM_QUANTIZATION[fmt], max_num_batched_tokens=batched)
        plans[fmt] = {"bits": bits, "group_size": group, "weights_bytes": weights, "capacity": capacity.as_dict()}
    result = {"model": {"source": described, "architecture": (config.get("architectures") or ["?"])[0],
                        "num_parameters": parameters},
              "kv_bytes_per_token": kv_per_token, "activation_peak_bytes": activation,
              "activation_estimated": args.activation_gib is None, "max_num_batched_tokens": batched,
              "formats": plans}
    print(json.dumps(result, indent=2) if args.json else render_table(result))
    return 0


def load_model_config(model: str) -> tuple[dict, str]:
    """The text model's config fields and a description of where they came from."""
    if model == "demo":
        return text_config(DEMO_CONFIG), "demo (SmolLM2-135M config)"
    path = Path(model).expanduser()
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        where = "this directory has no config.json" if path.is_dir() else "no such file"
        raise UserError(f"--model {model}: {where}; pass a Hugging Face model directory, its config.json, or demo")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{config_path}: not a readable JSON config ({exc})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{config_path}: expected a JSON object (a model's config.json)")
    return text_config(raw), str(config_path)


def _parse_formats(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise UserError(f"--format: unknown format {', '.join(repr(u) for u in unknown) or '(none given)'} "
                        f"(known: {', '.join(FORMATS)})")
    return list(dict.fromkeys(names))


def _check_positive(args: argparse.Namespace) -> None:
    if args.gpu_memory_gib <= 0:
        raise UserError(f"--gpu-memory-gib {args.gpu_memory_gib}: must be positive (e.g. 80)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {args.gpu_memory_utilization}: must be in (0, 1] (e.g. 0.90)")
    for flag, value in (("--max-model-len", args.max_model_len),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} {value}: must be a positive number of tokens")
    if args.activation_gib is not None and args.activation_gib < 0:
        raise UserError(f"--activation-gib {args.activation_gib}: must not be negative")


def _max_model_len(config: dict, requested: int | None) -> int:
    limit = config.get("max_position_embeddings")
    if requested is None:
        return min(DEFAULT_MAX_MODEL_LEN, int(limit)) if limit else DEFAULT_MAX_MODEL_LEN
    if limit and requested > int(limit) and not config.get("rope_scaling"):
        raise UserError(f"--max-model-len {requested}: longer than the model's max_position_embeddings {limit} "
                        f"(vLLM refuses it); use --max-model-len {limit} or less")
    return requested


def _scheme(fmt: str, config: dict, group_size: int | None) -> tuple[int, int | None]:
    if fmt == "baseline":
        return 16, None
    if fmt == "int8":
        return 8, None
    return 4, choose_group_size(config, group_size, fmt)


def render_table(result: dict) -> str:
    model = result["model"]
    first = next(iter(result["formats"].values()))["capacity"]
    lines = [
        f"model: {model['source']}, {model['architecture']}, {model['num_parameters'] / 1e6:,.1f}M parameters",
        f"KV cache per token: {_fmt(result['kv_bytes_per_token'])} (16-bit); activation peak "
        f"{'estimated' if result['activation_estimated'] else 'given'}: {_fmt(result['activation_peak_bytes'])} "
        f"at {result['max_num_batched_tokens']:,} batched tokens",
        f"target: {first['gpu_memory_gib']:g} GiB GPU at {first['gpu_memory_utilization']:.2f} utilization "
        f"({_fmt(first['budget_bytes'])} budget), max-model-len {first['max_model_len']:,}, "
        f"{first['safety_margin']:.0%} of the KV room held back",
        "",
        f"{'format':<9} {'weights':>11} {'KV room':>11} {'KV tokens':>11} {'max seqs':>9}  fits",
    ]
    for fmt, plan in result["formats"].items():
        cap = plan["capacity"]
        name = fmt + (f" g{plan['group_size']}" if plan["group_size"] else "")
        lines.append(f"{name:<9} {_fmt(plan['weights_bytes']):>11} {_fmt(cap['kv_room_bytes']):>11} "
                     f"{cap['kv_tokens']:>11,} {cap['max_num_seqs']:>9,}  {'yes' if cap['fits'] else 'NO'}")
    lines.append("")
    for fmt, plan in result["formats"].items():
        cap = plan["capacity"]
        lines.append(f"{fmt}: " + (f"vllm serve MODEL {cap['vllm_flags']}" if cap["vllm_flags"] else cap["note"]))
        if cap["vllm_flags"]:
            lines.append(f"  {cap['note']}")
    return "\n".join(lines)


def _fmt(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}" if unit == "GiB" else f"{size / scale:.1f} {unit}"
    return f"{size} B"
