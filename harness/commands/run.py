"""`quantgate run`: the whole pipeline for one model and a list of formats."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UserError

if TYPE_CHECKING:
    from harness.report.schema import RunReport


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("run", help="quantize, measure, evaluate, decide and report",
                                   description="Quantize a model into each format, measure memory and latency, "
                                               "score it on your evalsets and decide GO / NO-GO / INCONCLUSIVE.",
                                   epilog="example: quantgate run --model ./my-model --evalsets ./evalsets "
                                          "--formats baseline,int8,awq --policy policy.toml --out runs/today")
    inputs = parser.add_argument_group("inputs", "the model, the evalsets and checkpoints made elsewhere")
    formats = parser.add_argument_group("formats", "what to quantize and how it is calibrated")
    evaluation = parser.add_argument_group("evaluation", "generation, scoring and measurement")
    decision = parser.add_argument_group("decision", "the policy the verdicts follow")
    plan = parser.add_argument_group("serving plan", "the GPU and limits the serving commands are planned for")
    served = parser.add_argument_group("vLLM backend", "judging each format as a vLLM server runs it")
    control = parser.add_argument_group("run control", "output, cache, resuming")
    inputs.add_argument("--config", help="run spec TOML (CLI flags override its values)")
    inputs.add_argument("--model", help="Hugging Face model directory, .gguf file, or 'demo' (default)")
    formats.add_argument("--formats", help="comma-separated: baseline,int8,gptq,awq,w8a8 (baseline is always added)")
    inputs.add_argument("--evalsets", nargs="+", metavar="PATH", help="evalset specs, data files or directories "
                        "(default: the bundled evalsets/)")
    control.add_argument("--out", help="output directory (default: quantgate-report)")
    decision.add_argument("--policy", help="policy TOML: margins, floors, budgets (default: built-in)")
    formats.add_argument("--group-size", type=int, help="GPTQ/AWQ group size (default: largest of 128/64/32 "
                        "that divides every layer's input width)")
    formats.add_argument("--calibration", help="calibration texts, e.g. a sample of real traffic: a text file (one "
                        "per line) or JSONL with 'text' (default: an evalset's calibration split, else the corpus "
                        "bundled in evalsets/calibration/; never the evaluated items)")
    formats.add_argument("--allow-calibration-overlap", action="store_true", help="run even though the calibration "
                        "texts overlap evaluated items (the report says so, and such a format cannot be GO)")
    inputs.add_argument("--allow-outside-paths", action="store_true", help="let evalset specs name data and "
                        "calibration files outside their own directory (refused by default)")
    formats.add_argument("--calibration-samples", type=int, help="number of calibration texts (default 32)")
    evaluation.add_argument("--max-items", type=int, help="use only the first N items of each evalset")
    evaluation.add_argument("--max-new-tokens", type=int, help="cap every evalset's max_new_tokens")
    evaluation.add_argument("--batch-size", type=int, help="generation batch size (default 8)")
    evaluation.add_argument("--threads", type=int, help="torch threads per format subprocess on CPU (default 1)")
    evaluation.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"],
                        help="compute dtype for the baseline (default: the checkpoint's)")
    evaluation.add_argument("--seed", type=int)
    evaluation.add_argument("--latency-requests", type=int, help="requests timed one at a time (default 20: a p95 "
                        "needs at least 20)")
    evaluation.add_argument("--memory-limit-gib", type=float, help="kill a format's subprocess above this RSS, as "
                        "a smaller host's OOM killer would (that format becomes NO-GO; the others run)")
    plan.add_argument("--target-gpu", metavar="NAME", help="target GPU of the serving plans by name, as nvidia-smi "
                        "prints it or as typed: T4, L4, 'RTX 4090', A100-80GB, 'NVIDIA H100 80GB HBM3', H200, B200, "
                        "MI300X, ... (`quantgate plan --help` lists them; default: the policy's [serving] "
                        "target_gpu, else an 80 GiB GPU, or --gpu-memory-gib)")
    plan.add_argument("--gpu-memory-gib", type=float, help="target GPU memory for the capacity plan (default: the "
                        "--target-gpu's own, else the policy's [serving] target_gpu's, else 80); with --target-gpu, "
                        "that GPU at this size (a MIG slice or a shared card: its compute capability kept)")
    plan.add_argument("--gpu-memory-utilization", type=float, help="vLLM --gpu-memory-utilization of the plans and "
                        "the capacity check (default: the vLLM version's own, 0.92 on 0.32/0.33; on 0.34 the plans "
                        "set --kv-cache-memory-bytes)")
    plan.add_argument("--max-model-len", type=int, help="target context length for the capacity plan "
                        "(default: the policy's [serving] max_model_len when it names a target_gpu, else the "
                        "longest prompt + max new tokens seen)")
    plan.add_argument("--capacity-overhead-gib", type=float, help="CUDA context + non-torch GPU memory per GPU, "
                        "if you have measured yours (vLLM logs it as non_torch_memory); replaces the serving "
                        "planners' 0.5 GiB estimate")
    plan.add_argument("--vllm-version", help="plan vLLM's flags by this version's rules (0.32, 0.33 or 0.34; "
                        "default: the vLLM that serves the run, else the installed one, else the newest known)")
    inputs.add_argument("--candidate", action="append", metavar="NAME=PATH", help="a checkpoint already quantized "
                        "elsewhere (AutoAWQ, AutoGPTQ, GPTQModel, llm-compressor, bitsandbytes, compressed-tensors), "
                        "judged against --model like the built-in formats, without re-quantizing (repeatable)")
    inputs.add_argument("--baseline-is-quantized", action="store_true", help="accept a --model that is itself "
                        "quantized as the baseline (every verdict then says what it was compared with)")
    inputs.add_argument("--allow-tokenizer-mismatch", action="store_true", help="judge a candidate whose tokenizer "
                        "differs from the baseline's (the report says so)")
    served.add_argument("--backend", help="what scores and times each format: transformers in this process "
                        "(default), a vLLM server started with the planned flags (vllm: the verdict is then about "
                        "the format as vLLM serves it), or an in-process runtime a plugin registered")
    served.add_argument("--vllm", metavar="PATH", help="your own `vllm` executable (default: the project's "
                        ".venv-vllm, built by nox -s vllm_env)")
    served.add_argument("--vllm-endpoint", action="append", metavar="FORMAT=URL", help="a vLLM server you already "
                        "run for FORMAT, e.g. baseline=http://10.0.0.5:8000 (repeatable; implies --backend vllm)")
    served.add_argument("--vllm-kv-cache-gib", type=int, help="CPU: vLLM's KV cache space in GiB "
                        "(VLLM_CPU_KVCACHE_SPACE, default 1)")
    served.add_argument("--max-num-seqs", type=int, help="vLLM --max-num-seqs (default: the plan's; on CPU the "
                        "batch size)")
    served.add_argument("--concurrency", help="served latency at these concurrencies, e.g. 1,8,32 (default: 1 and "
                        "max-num-seqs)")
    served.add_argument("--tensor-parallel-size", type=int, help="vLLM --tensor-parallel-size (default 1)")
    served.add_argument("--pipeline-parallel-size", type=int, help="vLLM --pipeline-parallel-size (default 1)")
    served.add_argument("--devices", help="CUDA devices to run formats on in parallel, e.g. 0,1,2,3: one lane (and "
                        "one vLLM server) per group of tensor x pipeline parallel size devices")
    from harness.executors.registry import EXECUTORS

    control.add_argument("--executor", choices=list(EXECUTORS), help="how the formats run: local (default: on this "
                         "machine, one after another or in --devices lanes) or ray (one Ray task a format, placed on "
                         "any node of the cluster with room; needs pip install 'quantgate[ray]')")
    control.add_argument("--ray-address", metavar="ADDRESS", help="the Ray cluster of --executor ray, e.g. "
                         "ray://head:10001 or head:6379 (default: RAY_ADDRESS, else a local Ray started for the run "
                         "and stopped after it)")
    control.add_argument("--cache", metavar="URL", dest="cache_url", help="with --executor ray: the cache in an fsspec "
                         "store no node needs to mount, e.g. s3://bucket/quantgate or file:///shared/quantgate "
                         "(default: QUANTGATE_CACHE, a directory every node must mount)")
    control.add_argument("--no-cache", action="store_true", help="recompute every stage (the cache is refreshed)")
    control.add_argument("--resume", action="store_true", help="continue the run in --out with its saved settings")
    inputs.add_argument("--trust-remote-code", action="store_true", help="allow models that need custom code")
    control.add_argument("--quiet", action="store_true", help="no progress output")
    inputs.add_argument("--reviews", nargs="+", type=Path, metavar="REVIEW_JSONL",
                        help="people's judgments from `quantgate review` of an earlier run of the same model and "
                             "evalsets: folded into the verdicts when the outputs they judged are unchanged")
    parser.set_defaults(func=run)


def spec_from_args(args):
    from harness.config import build_spec

    overrides, capacity = flag_values(args)
    if args.resume:
        if not args.out:
            raise UserError("--resume needs --out DIR: the run directory to continue")
        spec = saved_spec(Path(args.out) / "run.json")
        refuse_conflicting_flags(spec, overrides, capacity, args.config, Path(args.out) / "run.json")
        # where the chains run is no setting of the run: a cluster run may be resumed here, or on another cluster
        placed = {k: overrides[k] for k in RESUMABLE_ELSEWHERE if overrides.get(k) is not None}
        return spec.model_copy(update=placed) if placed else spec
    spec = build_spec(args.config, overrides)
    if capacity:
        spec = spec.model_copy(update={"capacity": validated_capacity(spec.capacity, capacity)})
    return spec


def validated_capacity(settings, flags: dict):
    """The capacity settings with the flags' values, validated as `plan` validates them, before any work: a
    model_copy(update=...) would take --gpu-memory-utilization 1.5 and fail after every stage had run."""
    from pydantic import ValidationError

    try:
        return type(settings).model_validate({**settings.model_dump(), **flags})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        flag = "--capacity-overhead-gib" if field == "overhead_gib" else "--" + field.replace("_", "-")
        message = error["msg"].removeprefix("Value error, ")
        raise UserError(f"{flag} {flags.get(field)}: {message}") from None


def flag_values(args) -> tuple[dict, dict]:
    """The run settings given on the command line (None: not given), and the capacity ones."""
    from harness.quantize import parse_formats

    target_gpu = getattr(args, "target_gpu", None)
    if target_gpu:
        from harness.commands.gpu_args import one_target_gpu

        target_gpu = one_target_gpu(target_gpu, "the serving plans of a run are for one GPU (`quantgate plan` "
                                    "takes one per pipeline stage)").name
    capacity = {k: v for k, v in {"target_gpu": target_gpu,
                                  "gpu_memory_gib": args.gpu_memory_gib,
                                  "gpu_memory_utilization": args.gpu_memory_utilization,
                                  "max_model_len": args.max_model_len,
                                  "overhead_gib": args.capacity_overhead_gib,
                                  "vllm_version": getattr(args, "vllm_version", None)}.items() if v is not None}
    overrides = {
        "model": args.model, "formats": parse_formats(args.formats) if args.formats else None,
        "evalsets": args.evalsets, "out": args.out, "policy": args.policy, "group_size": args.group_size,
        "calibration": args.calibration, "calibration_samples": args.calibration_samples,
        "allow_calibration_overlap": True if args.allow_calibration_overlap else None,
        "allow_outside_paths": True if args.allow_outside_paths else None,
        "max_items": args.max_items, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "threads": args.threads, "dtype": args.dtype, "seed": args.seed,
        "latency_requests": args.latency_requests, "memory_limit_gib": args.memory_limit_gib,
        "use_cache": False if args.no_cache else None, "fresh_after": time.time() if args.no_cache else None,
        "trust_remote_code": True if args.trust_remote_code else None,
        "executor": getattr(args, "executor", None), "ray_address": getattr(args, "ray_address", None),
        "cache_url": getattr(args, "cache_url", None),
        **vllm_values(args), **candidate_values(args),
    }
    return overrides, capacity


def candidate_values(args) -> dict:
    from harness.candidates import parse_candidates
    from harness.formats import known_formats

    given = getattr(args, "candidate", None)
    return {"candidates": parse_candidates(given, known_formats()) if given else None,
            "baseline_is_quantized": True if getattr(args, "baseline_is_quantized", False) else None,
            "allow_tokenizer_mismatch": True if getattr(args, "allow_tokenizer_mismatch", False) else None}


def vllm_values(args) -> dict:
    endpoints = None
    if getattr(args, "vllm_endpoint", None):
        endpoints = {}
        for given in args.vllm_endpoint:
            name, sep, url = given.partition("=")
            if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
                raise UserError(f"--vllm-endpoint {given}: expected FORMAT=URL, e.g. baseline=http://localhost:8000")
            endpoints[name.strip().lower()] = url.strip()
    concurrency = None
    if getattr(args, "concurrency", None):
        try:
            concurrency = [int(v) for v in args.concurrency.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--concurrency {args.concurrency}: expected integers, e.g. 1,8,32") from None
    backend = args.backend or ("vllm" if endpoints or args.vllm else None)
    devices = None
    if getattr(args, "devices", None):
        try:
            devices = [int(v) for v in args.devices.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--devices {args.devices}: expected device numbers, e.g. 0,1,2,3") from None
        from harness.runtime.device import is_cuda

        if not is_cuda():
            raise UserError(f"--devices {args.devices}: no CUDA device here; --devices spreads formats over GPUs")
    return {"backend": backend, "vllm": args.vllm, "vllm_endpoints": endpoints,
            "vllm_kv_cache_gib": args.vllm_kv_cache_gib, "max_num_seqs": args.max_num_seqs,
            "concurrency": concurrency, "tensor_parallel_size": args.tensor_parallel_size,
            "pipeline_parallel_size": args.pipeline_parallel_size, "devices": devices}


RESUMABLE_ELSEWHERE = ("executor", "ray_address", "cache_url")


def refuse_conflicting_flags(saved, overrides: dict, capacity: dict, config: str | None, saved_path: Path) -> None:
    """--resume continues a run exactly as it was started: a flag that would change it is refused, not dropped."""
    if config:
        raise UserError(f"--resume continues the run saved in {saved_path}; --config cannot change it (drop "
                        "--config, or start a new run in another --out)")
    values = saved.model_dump()
    differ = []
    for key, given in overrides.items():
        if given is None or key in ("out", "fresh_after", *RESUMABLE_ELSEWHERE):
            continue
        if given != values[key]:
            differ.append(f"--{key.replace('_', '-')} {_shown(given)} (saved: {_shown(values[key])})")
    for key, given in capacity.items():
        if given != values["capacity"][key]:
            flag = "capacity-overhead-gib" if key == "overhead_gib" else key.replace("_", "-")
            differ.append(f"--{flag} {given} (saved: {_shown(values['capacity'][key])})")
    if differ:
        raise UserError(f"--resume continues the run saved in {saved_path} with its own settings, and these flags "
                        f"differ from them: {'; '.join(differ)}; drop them to resume, or start a new run in another "
                        "--out")


def _shown(value) -> str:
    if value is None:
        return "not set"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def saved_spec(saved: Path):
    """The settings a run saved in its run.json, for --resume; a file that fails validation is a UserError."""
    from pydantic import ValidationError

    from harness.config import RunSpec

    try:
        values = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        values = None
    if not isinstance(values, dict):
        raise UserError(f"--resume: {saved} is missing, unreadable or not a run's settings; nothing to resume "
                        "(run without --resume)")
    try:
        return RunSpec(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"--resume: {saved}: field '{field}': {first['msg']}; fix that file or run without "
                        "--resume") from None


def run(args) -> int:
    from harness import progress
    from harness.pipeline import run_pipeline

    progress.configure(quiet=args.quiet)
    spec = spec_from_args(args)
    from harness.executors.registry import check_executor

    check_executor(spec)  # e.g. --executor ray without Ray installed: one line, exit 2, before any work
    if args.reviews:
        from harness.review.session import check_review_files

        check_review_files(args.reviews)
    report, code = run_pipeline(spec)
    if args.reviews:
        from harness.report import write_reports
        from harness.review.session import fold_and_write

        report, _ = fold_and_write(Path(spec.out), args.reviews)
        write_reports(Path(spec.out), report)
        code = report.exit_code
    print_summary(report, Path(spec.out))
    return code


def print_summary(report: RunReport, out_dir: Path) -> None:
    """The console table of verdicts (report is what run_pipeline returns)."""
    lines = ["", f"{'format':<10} {'verdict':<13} {'peak memory':>12}  reason"]
    for name, entry in report.formats.items():
        peak = entry.memory.peak_bytes if entry.memory else None
        peak_text = f"{peak / 2**20:,.0f} MiB" if peak else "-"
        reason = entry.reasons[0] if entry.reasons else ""
        lines.append(f"{name:<10} {entry.verdict:<13} {peak_text:>12}  {reason[:110]}")
    rec = report.recommendation
    lines.append(f"recommendation: {rec.format or 'none'} - {rec.why}")
    lines.append(f"report: {out_dir / 'report.md'}  (also summary.md, report.html, report.json, junit.xml, scores.csv)")
    print("\n".join(lines))
    sys.stdout.flush()
