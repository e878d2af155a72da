"""`quantgate diagnose [LOG ...]`: which memory ran out, and which settings to change (harness.diagnose)."""

from __future__ import annotations

import argparse
import json
import re
import sys

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
    parser.add_argument("--target-gpu", metavar="GPU", help="the GPU it ran on, as nvidia-smi prints it or as typed "
                        "(L4, 'RTX 3090', 'NVIDIA A100-SXM4-80GB', H100, MI300X, ...): its total memory as torch "
                        "reports it, where the log does not give it")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, metavar="GIB",
                        help="the GPU's total memory in GiB, where the log does not give it (with --target-gpu: that "
                             "GPU at this size, e.g. a MIG slice)")
    parser.add_argument("--engine", choices=("vllm", "sglang", "tgi", "trtllm", "pytorch-oom", "nvidia-smi"),
                        help="read the text as this kind of log only (default: whichever it is)")
    parser.add_argument("--version", metavar="X.Y.Z", help="the vLLM version, where the log does not print it (V0 "
                        "before 0.8, V1 from 0.8: some advice differs)")
    parser.add_argument("--flags", metavar="'--max-model-len N ...'", default="",
                        help="the server's flags in any engine's syntax (vLLM, SGLang, TGI, TensorRT-LLM), and "
                        "KEY=VALUE environment variables, where the log does not show them (the log wins)")
    parser.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    parser.set_defaults(func=run)


MAX_INPUT_BYTES = 16 * 2**20  # a log longer than this is cut: its tail (where a failure is) is kept
READ_CHUNK = 2**20


def run(args: argparse.Namespace) -> int:
    from harness.diagnose.advise import NotADiagnosableLog, diagnose_all

    context = _context(args)
    diagnoses = []
    for name in args.logs:
        text = _read(name)
        try:
            diagnoses += diagnose_all(text, "stdin" if name == "-" else name, context)
        except NotADiagnosableLog as exc:
            raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps([d.as_dict() for d in diagnoses], indent=2, ensure_ascii=False))
    else:
        print("\n\n".join(render(d) for d in diagnoses))
    return 0


def render(diagnosis) -> str:
    part = f" lines {diagnosis.lines}" if diagnosis.lines else ""
    lines = [f"{diagnosis.source}{part} ({diagnosis.reader}): {diagnosis.kind.replace('_', ' ')}",
             f"  {diagnosis.summary}"]
    if diagnosis.failing_line and diagnosis.failing_line not in diagnosis.summary:
        lines.append(f"  failing line: {diagnosis.failing_line}")
    if diagnosis.figures:
        lines.append("  figures:")
        lines += [f"    {f.label}: {f.value}  [{f.source}]" for f in diagnosis.figures]
    if diagnosis.changes:
        lines.append("  change, best first:")
        lines += [f"    {i}. {c.setting}: {c.effect}  [{c.lever}]" for i, c in enumerate(diagnosis.changes, 1)]
    lines += [f"  missing: {m}" for m in diagnosis.missing]
    return "\n".join(lines)


def _read(name: str) -> str:
    """The log's text, read in bounded chunks: at most MAX_INPUT_BYTES (/dev/zero or a runaway log must not fill
    memory); a longer input is refused with one line."""
    label = "stdin" if name == "-" else name
    try:
        stream = sys.stdin.buffer if name == "-" else open(name, "rb")
    except OSError as exc:
        raise UserError(f"{name}: cannot read it ({exc.strerror or exc}); give a log file, or '-' for stdin") from None
    chunks, size = [], 0
    try:
        while size <= MAX_INPUT_BYTES:
            chunk = stream.read(min(READ_CHUNK, MAX_INPUT_BYTES + 1 - size))
            if not chunk:
                break
            if size == 0 and b"\x00" in chunk[:4096]:
                raise UserError(f"{label}: a binary file, not a log; give the text of the error or the server's log")
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UserError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    finally:
        if name != "-":
            stream.close()
    if size > MAX_INPUT_BYTES:
        raise UserError(f"{label}: larger than {MAX_INPUT_BYTES // 2**20} MiB; pass the part around the failure "
                        "(the start-up lines and the error's traceback), e.g. with tail -c 4M")
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if not text.strip():
        raise UserError(f"{label}: empty; give the text of the error or the server's log")
    return text


def _context(args: argparse.Namespace):
    from harness.diagnose.advise import Context

    kv = w16 = w4 = None
    source = ""
    if args.model:
        from harness.capacity import ConfigFieldError, kv_bytes_per_token, model_shape, weight_format, \
            weights_bytes

        config, source = _model_config(args.model)
        try:
            shape = model_shape(config)
        except ConfigFieldError as exc:
            raise UserError(f"--model {args.model}: {exc}") from None
        kv = kv_bytes_per_token(shape.attention)
        w16, w4 = weights_bytes(shape, weight_format("baseline")), weights_bytes(shape, weight_format("awq", 128))
    gpu_gib, gpu_name = _gpu_total(args)
    if args.version and not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", args.version):
        raise UserError(f"--version {args.version}: not a version; give it as 0.6.3 or 0.11")
    return Context(kv, w16, w4, source, gpu_gib, gpu_name, args.engine, args.version, (), args.flags.strip())


def _model_config(model: str) -> tuple[dict, str]:
    """config.json's text-model fields, read directly by the planner's loader (a directory, its config.json, a GGUF
    file or demo): no quantization library is imported to read a config."""
    from harness.commands.plan import load_model_config

    return load_model_config(model)


def _gpu_total(args: argparse.Namespace) -> tuple[float | None, str]:
    """The GPU's total memory in GiB and its name, from --target-gpu and --gpu-memory-gib (None, "": neither)."""
    from harness.capacity.gpus import gpu_of_size
    from harness.commands.gpu_args import one_target_gpu

    gib = args.gpu_memory_gib
    if gib is not None and not (0 < gib < 10_000):
        raise UserError(f"--gpu-memory-gib {gib}: must be a GPU's memory in GiB (e.g. 79.15)")
    gpu = None
    if args.target_gpu:
        gpu = one_target_gpu(args.target_gpu, "name the one GPU the log is from")
    if gib is not None:
        gpu = gpu_of_size(gib, like=gpu)
    return (None, "") if gpu is None else (gpu.memory_bytes / 2**30, gpu.name)
