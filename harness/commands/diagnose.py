"""`quantgate diagnose [LOG ...]`: which memory ran out, and which settings to change (harness.diagnose)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="read an OOM message, a vLLM log or an nvidia-smi trace: what ran out, what to change",
        description="Read a PyTorch CUDA out-of-memory message, a vLLM server's start-up or failure log, or an "
                    "nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv trace, and say which "
                    "memory ran out, with the log's figures and the arithmetic, and which settings to change, best "
                    "first. '-' or no file reads standard input.",
    )
    parser.add_argument("logs", nargs="*", default=["-"], metavar="LOG", help="log files ('-': standard input)")
    parser.add_argument("--model", metavar="DIR_OR_CONFIG_JSON", help="the model's directory or config.json: KV bytes "
                        "per token and weight sizes from the memory model")
    parser.add_argument("--target-gpu", metavar="GPU", help="the GPU it ran on (L4, A100-80GB, H100-SXM, ...): its "
                        "total memory, where the log does not give it")
    parser.add_argument("--engine", choices=("vllm", "sglang", "tgi", "trtllm", "pytorch-oom", "nvidia-smi"),
                        help="read the text as this kind of log only (default: whichever it is)")
    parser.add_argument("--version", metavar="X.Y.Z", help="the vLLM version, where the log does not print it (V0 "
                        "before 0.8, V1 from 0.8: some advice differs)")
    parser.add_argument("--flags", metavar="'--max-model-len N ...'", default="",
                        help="the server's flags, where the log does not show them (the log wins)")
    parser.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.diagnose.advise import NotADiagnosableLog, diagnose_text

    context = _context(args)
    diagnoses = []
    for name in args.logs:
        text = _read(name)
        try:
            diagnoses.append(diagnose_text(text, "stdin" if name == "-" else name, context))
        except NotADiagnosableLog as exc:
            raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps([d.as_dict() for d in diagnoses], indent=2, ensure_ascii=False))
    else:
        print("\n\n".join(render(d) for d in diagnoses))
    return 0


def render(diagnosis) -> str:
    lines = [f"{diagnosis.source} ({diagnosis.reader}): {diagnosis.kind.replace('_', ' ')}", f"  {diagnosis.summary}"]
    if diagnosis.figures:
        lines.append("  figures:")
        lines += [f"    {f.label}: {f.value}  [{f.source}]" for f in diagnosis.figures]
    if diagnosis.changes:
        lines.append("  change, best first:")
        lines += [f"    {i}. {c.setting}: {c.effect}" for i, c in enumerate(diagnosis.changes, 1)]
    lines += [f"  missing: {m}" for m in diagnosis.missing]
    return "\n".join(lines)


def _read(name: str) -> str:
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise UserError(f"{name}: cannot read it ({exc.strerror or exc}); give a log file, or '-' for stdin") from None
    if b"\x00" in data[:4096]:
        raise UserError(f"{'stdin' if name == '-' else name}: a binary file, not a log; give the text of the error or "
                        "the server's log")
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise UserError(f"{'stdin' if name == '-' else name}: empty; give the text of the error or the server's log")
    return text


def _context(args: argparse.Namespace):
    from harness.diagnose.advise import Context

    kv = w16 = w4 = None
    source = ""
    if args.model:
        from harness.commands.plan import load_model_config
        from harness.capacity import ConfigFieldError, kv_bytes_per_token, model_shape, weight_format, \
            weights_bytes

        config, source = load_model_config(args.model)
        try:
            shape = model_shape(config)
        except ConfigFieldError as exc:
            raise UserError(f"--model {args.model}: {exc}") from None
        kv = kv_bytes_per_token(shape.attention)
        w16, w4 = weights_bytes(shape, weight_format("baseline")), weights_bytes(shape, weight_format("awq", 128))
    gpu_gib, gpu_name = None, ""
    if args.target_gpu:
        from harness.capacity import gpu_by_name

        gpu = gpu_by_name(args.target_gpu)
        gpu_gib, gpu_name = gpu.memory_bytes / 2**30, gpu.name
    if args.version and not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", args.version):
        raise UserError(f"--version {args.version}: not a version; give it as 0.6.3 or 0.11")
    from harness.diagnose.readers import parse_flags

    flags = tuple(parse_flags(args.flags))
    if args.flags.strip() and not flags:
        raise UserError(f"--flags {args.flags!r}: no flag diagnose uses (--max-model-len, --gpu-memory-utilization, "
                        "--max-num-seqs, --max-num-batched-tokens, --kv-cache-dtype, --block-size, ...)")
    return Context(kv, w16, w4, source, gpu_gib, gpu_name, args.engine, args.version, flags)
