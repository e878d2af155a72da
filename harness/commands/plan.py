"""`quantgate plan`: per format, the settings of vLLM, SGLang and TensorRT-LLM on a target GPU, and the numbers behind
them, from the model's config alone (no weights loaded, nothing runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.errors import UserError
from harness.formats import format_spec, known_formats, parse_format_names
from harness.capacity import (ConfigFieldError, EnginePlan, Gpu, ModelShape, Target, TensorParallelError,
                                      Workload, engine_names, engine_split_target, gpu_of_size, kernel_support,
                                      kv_bytes_per_sequence, kv_bytes_per_token, model_shape, parameter_count,
                                      plan_engines, resolve_version, weight_format)
from harness.capacity.common import planned_stage_shape
from harness.capacity.gpus import gpu_names_help
from harness.capacity.stages import UnevenPipelinePlan, plan_uneven_vllm
from harness.commands.gpu_args import target_gpus, uneven_stages_note
from harness.report.schema import capacity_view
from harness.capacity.checkpoint import checkpoint_format_at, plan_config
from harness.capacity.memory import GIB, KV_DTYPE_BYTES, WeightFormat, kv_split
from harness.measure.kv import DEMO_CONFIG, text_config
from harness.quantize import choose_group_size
from harness.units import format_bytes

DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_GPU_GIB = 80.0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="serving settings for vLLM, SGLang and TensorRT-LLM per format, from a model's config",
        description="From a model's config.json alone (no weights are loaded, nothing runs): weights per format, KV "
                    "cache per token, how many sequences fit on the target GPU(s), and the launch settings of vLLM "
                    "(by version), SGLang and TensorRT-LLM, or why nothing fits and what would.")
    parser.add_argument("--model", default="demo", metavar="PATH_OR_CONFIG_JSON",
                        help="a Hugging Face model directory, its config.json, or 'demo' (SmolLM2-135M; default)")
    parser.add_argument("--format", default=None, metavar="NAME[,NAME...]",
                        help="format(s) to plan, comma-separated: baseline, int8, gptq, awq, w8a8, fp8, fp8-block, "
                             "nvfp4, mxfp4, bnb-nf4 or a plugin's (default: a quantized checkpoint as its own "
                             "quantization_config stores it, else baseline, int8, gptq, awq, w8a8 and plugins')")
    parser.add_argument("--group-size", type=int, default=None,
                        help="gptq/awq group size (default: the largest of 128/64/32 dividing the layer widths)")
    parser.add_argument("--engine", default="all", choices=(*engine_names(), "all"),
                        help="serving engine(s) to plan for (default: all)")
    parser.add_argument("--target-gpu", metavar="NAME",
                        help=f"target GPU by name, as nvidia-smi prints it or as typed: {gpu_names_help()} (memory "
                             "as torch reports it, compute capability). A comma-separated list ('RTX 5070 Ti,RTX "
                             "5090') is one pipeline stage per GPU")
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help=f"target GPU memory in GiB (default {DEFAULT_GPU_GIB:g} without --target-gpu; with it, "
                             "overrides its memory, keeping its compute capability: a MIG slice or a shared card)")
    parser.add_argument("--num-gpus", type=int, default=1, help="GPUs, tensor parallel (default 1)")
    parser.add_argument("--pipeline-parallel-size", type=int, default=1,
                        help="pipeline stages, each on --num-gpus GPUs (default 1): the plans size the most-loaded "
                             "GPU, ceil(layers / stages) layers' weights and KV cache plus the embedding and lm_head")
    parser.add_argument("--vllm-version", default=None,
                        help="vLLM release whose memory accounting to plan with: any from 0.6 to 0.34, a minor "
                             "(0.8) or a release (0.6.4, 0.10.1.1); another is planned with the nearest and the plan "
                             "says so (default: the installed vLLM, else 0.34)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vLLM's --gpu-memory-utilization (default: the release's, 0.9 up to 0.19, 0.92 from "
                             "0.20; 0.34 sets --kv-cache-memory-bytes instead)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help=f"tokens per sequence (default {DEFAULT_MAX_MODEL_LEN}, or the model's limit if lower)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="tokens per forward step: vLLM's budget, SGLang's --chunked-prefill-size, TensorRT-LLM's "
                             "max_num_tokens (default: each engine's own)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="cap on concurrent sequences (default 256)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=tuple(KV_DTYPE_BYTES),
                        help="KV cache dtype: auto (the model's 16-bit) or fp8 (1 byte; compute capability 8.9+)")
    parser.add_argument("--no-chunked-prefill", action="store_true",
                        help="plan without chunked prefill (the token budget then covers a whole prompt)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (their pool is not reserved)")
    parser.add_argument("--shared-prefix-tokens", type=int, default=0, metavar="N",
                        help="tokens every request opens with alike (a system prompt, few-shot examples): the "
                             "engines' prefix caches keep them once, and each plan says how many more sequences fit "
                             "then (default 0: none counted)")
    parser.add_argument("--activation-gib", type=float, default=None,
                        help="a measured activation peak per GPU at the engines' token budget, in GiB (default: "
                             "estimated from the config: tokens x (4 x hidden + 3 x MLP width) x 2 bytes plus fp32 "
                             "sampler logits)")
    engine_flags = parser.add_argument_group("engine settings a deployment already has (default: each engine's own)")
    engine_flags.add_argument("--mem-fraction-static", type=float, default=None, metavar="F",
                              help="SGLang's --mem-fraction-static (weights + context + KV pool as a share of the GPU; "
                                   "default: the share SGLang chooses for this GPU and tensor-parallel size)")
    engine_flags.add_argument("--dp-size", type=int, default=1, metavar="N",
                              help="SGLang's --dp-size with --enable-dp-attention: attention over tp / N GPUs (a "
                                   "divisor of --num-gpus; default 1, no DP attention)")
    engine_flags.add_argument("--kv-cache-free-gpu-memory-fraction", type=float, default=None, metavar="F",
                              help="TensorRT-LLM's kv_cache_free_gpu_memory_fraction (share of the memory free after "
                                   "loading that the KV cache takes; default: its own, 0.9)")
    engine_flags.add_argument("--max-tokens-in-paged-kv-cache", type=int, default=None, metavar="N",
                              help="TensorRT-LLM's KvCacheConfig max_tokens (a cap on the KV cache's tokens)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, described = load_model_config(args.model)
    if args.format is not None:
        parse_format_names(args.format.split(","), "--format")
    _check_numbers(args)
    try:
        shape = model_shape(plan_config(config))
    except ConfigFieldError as exc:
        raise UserError(f"{described}: {exc}") from None
    target, stages = _target(args)
    own = checkpoint_format_at(args.model, config, described, target.gpu.compute_capability)
    from harness.capacity.checkpoint import FORMAT_STORAGE

    # Planning is cheap: without --format, every registered format but the FP8/FP4/bnb-4bit storages, which --format
    # names (a run makes only the default ones); a quantized checkpoint is planned as it is stored, from its own
    # quantization_config.
    formats = (parse_format_names(args.format.split(","), "--format") if args.format is not None
               else [own.name] if own is not None
               else [name for name in known_formats()
                     if name not in FORMAT_STORAGE and not format_spec(name).plan_only])
    workload = Workload(max_model_len=_max_model_len(shape, args.max_model_len),
                        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                        kv_cache_dtype=args.kv_cache_dtype, chunked_prefill=not args.no_chunked_prefill,
                        enforce_eager=args.enforce_eager,
                        activation_bytes=None if args.activation_gib is None else int(args.activation_gib * GIB),
                        shared_prefix_tokens=args.shared_prefix_tokens, shared_prefix_source="--shared-prefix-tokens",
                        mem_fraction_static=args.mem_fraction_static,
                        kv_cache_free_gpu_memory_fraction=args.kv_cache_free_gpu_memory_fraction,
                        max_tokens_in_paged_kv_cache=args.max_tokens_in_paged_kv_cache, dp_attention=args.dp_size)
    engines = engine_names() if args.engine == "all" else (args.engine,)
    try:
        version, version_note = resolve_version(args.vllm_version)
    except ValueError as exc:
        raise UserError(f"--vllm-version {args.vllm_version}: {exc}") from None
    plans = {}
    for name in formats:
        if own is not None and name == own.name:
            fmt = own
        else:
            group = choose_group_size(config, args.group_size, name) if format_spec(name).grouped else None
            fmt = weight_format(name, group)
        try:
            plans[name] = (fmt, plan_engines(shape, fmt, target, workload, engines, vllm_version=version,
                                             gpu_memory_utilization=args.gpu_memory_utilization))
        except TensorParallelError as exc:
            flag = (f"--num-gpus {target.num_gpus}" if target.pipeline_parallel_size == 1 else
                    f"--num-gpus {target.num_gpus} --pipeline-parallel-size {target.pipeline_parallel_size}")
            raise UserError(f"{flag}: {exc}") from None
    result = plan_result(config, described, shape, target, workload, plans, version, version_note)
    if stages and "vllm" in engines:
        for name, (fmt, _) in plans.items():
            uneven = plan_uneven_vllm(shape, fmt, stages, target.num_gpus, workload, version=version,
                                      gpu_memory_utilization=args.gpu_memory_utilization)
            if uneven is not None:
                result["formats"][name]["pipeline_stages"] = uneven_view(uneven)
    print(json.dumps(result, indent=2) if args.json else render_text(result))
    return 0


def load_model_config(model: str) -> tuple[dict, str]:
    """The text model's config fields and a description of where they came from."""
    if model == "demo":
        return text_config(DEMO_CONFIG), "demo (SmolLM2-135M config)"
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return text_config(_gguf_config(path)), f"{path} (GGUF metadata)"
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


def _gguf_config(path: Path) -> dict:
    """The config transformers reads from a GGUF file's metadata (as `run --model x.gguf` converts it), without
    dequantizing its weights."""
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    except Exception as exc:  # noqa: BLE001 - the gguf reader's errors vary; one line names the file
        raise UserError(f"--model {path}: transformers cannot read this GGUF file's config ({type(exc).__name__}: "
                        f"{str(exc)[:160]}); give the model's Hugging Face directory or its config.json") from None


def _check_numbers(args: argparse.Namespace) -> None:
    if args.gpu_memory_gib is not None and not 0 < args.gpu_memory_gib < 10_000:  # nan and inf too
        raise UserError(f"--gpu-memory-gib {args.gpu_memory_gib}: must be positive (e.g. 80)")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {args.gpu_memory_utilization}: must be in (0, 1] (e.g. 0.92)")
    for flag, value in (("--max-model-len", args.max_model_len), ("--num-gpus", args.num_gpus),
                        ("--pipeline-parallel-size", args.pipeline_parallel_size),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens),
                        ("--max-num-seqs", args.max_num_seqs)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} {value}: must be a positive number")
    for flag, value in (("--mem-fraction-static", args.mem_fraction_static),
                        ("--kv-cache-free-gpu-memory-fraction", args.kv_cache_free_gpu_memory_fraction)):
        if value is not None and not 0 < value < 1:  # nan too
            raise UserError(f"{flag} {value}: must be a share of the GPU's memory in (0, 1) (e.g. 0.85)")
    for flag, value in (("--dp-size", args.dp_size), ("--max-tokens-in-paged-kv-cache",
                                                       args.max_tokens_in_paged_kv_cache)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} {value}: must be a positive number")
    if args.num_gpus % args.dp_size:
        raise UserError(f"--dp-size {args.dp_size}: SGLang's DP attention needs a divisor of --num-gpus "
                        f"{args.num_gpus}")
    if args.activation_gib is not None and args.activation_gib < 0:
        raise UserError(f"--activation-gib {args.activation_gib}: must not be negative")
    if args.shared_prefix_tokens < 0:
        raise UserError(f"--shared-prefix-tokens {args.shared_prefix_tokens}: must not be negative (0: none)")


def _target(args: argparse.Namespace) -> tuple[Target, tuple[Gpu, ...]]:
    """The target (uneven stages: each planned as the smallest GPU) and, for stages of different GPUs, the GPU of
    each stage (vLLM's per-stage plan, stages.plan_uneven_vllm); () otherwise."""
    gpu: Gpu | None = None
    uneven: tuple[Gpu, ...] = ()
    pipeline = args.pipeline_parallel_size
    if args.target_gpu:
        stages = target_gpus(args.target_gpu)
        gpu = min(stages, key=lambda g: g.memory_bytes)
        if len(stages) > 1:
            if pipeline not in (1, len(stages)):
                raise UserError(f"--target-gpu {args.target_gpu!r} names {len(stages)} pipeline stages and "
                                f"--pipeline-parallel-size is {pipeline}: give one GPU per stage")
            pipeline = len(stages)
            if len({g.memory_bytes for g in stages}) > 1:
                print(f"note: {uneven_stages_note(stages)}", file=sys.stderr)
                uneven = tuple(stages)
    if args.gpu_memory_gib is not None:
        gpu, uneven = gpu_of_size(args.gpu_memory_gib, like=gpu), ()
    return Target(gpu or gpu_of_size(DEFAULT_GPU_GIB), args.num_gpus, pipeline), uneven


def _max_model_len(shape: ModelShape, requested: int | None) -> int:
    limit = shape.max_len
    if requested is None:
        return min(DEFAULT_MAX_MODEL_LEN, limit) if limit else DEFAULT_MAX_MODEL_LEN
    if limit and requested > limit:
        raise UserError(f"--max-model-len {requested}: longer than the model allows ({limit:,} tokens from "
                        "max_position_embeddings and its RoPE scaling); vLLM, SGLang and TensorRT-LLM refuse it: "
                        f"use --max-model-len {limit} or less")
    return requested


def plan_result(config: dict, described: str, shape: ModelShape, target: Target, workload: Workload,
                plans: dict[str, tuple[WeightFormat, dict[str, EnginePlan]]], version: str, version_note: str) -> dict:
    """The plan as one JSON-ready dict: model, target, workload, and per format each engine's plan. The KV figures
    are one GPU's: its pipeline stage's layers (target.pipeline_parallel_size, in `target` when above 1)."""
    attention, kv_bytes, tp = shape.attention, KV_DTYPE_BYTES[workload.kv_cache_dtype], target.num_gpus
    first_format, first = next(iter(plans.values()))
    vllm = first.get("vllm")
    any_plan = next(iter(first.values()))
    # one GPU's KV figures: the stage the engine plans (vLLM's where it is planned), its own split of the layers
    split = engine_split_target("vllm" if vllm else any_plan.engine, shape, target, version)
    stage = planned_stage_shape(shape, first_format, split).attention
    return {
        "model": {"source": described, "architecture": (config.get("architectures") or ["?"])[0],
                  "model_type": shape.model_type, "num_parameters": parameter_count(shape),
                  "experts": shape.experts, "experts_per_token": shape.experts_per_token,
                  "attention": "MLA" if attention.is_mla else "GQA", "layers": shape.layers,
                  "sliding_window_layers": attention.sliding_layers, "max_len": shape.max_len},
        "target": {"gpu": target.gpu.name, "nominal": target.gpu.nominal, "memory_bytes": target.gpu.memory_bytes,
                   "compute_capability": target.gpu.compute_capability, "arch": target.gpu.arch or None,
                   "num_gpus": tp,
                   "kernels": kernel_support(target.gpu), "kv_placement": kv_split(attention, tp),
                   **({"pipeline_parallel_size": target.pipeline_parallel_size, "pipeline_stage_layers": stage.layers}
                      if target.pipeline_parallel_size > 1 else {})},
        "workload": {"max_model_len": workload.max_model_len, "max_num_batched_tokens": workload.max_num_batched_tokens,
                     "max_num_seqs": workload.max_num_seqs, "kv_cache_dtype": workload.kv_cache_dtype,
                     "chunked_prefill": workload.chunked_prefill, "enforce_eager": workload.enforce_eager,
                     "shared_prefix_tokens": workload.shared_prefix_tokens},
        "vllm_version": version if vllm else None, "vllm_version_note": version_note if vllm else None,
        "kv_bytes_per_token": kv_bytes_per_token(stage, kv_bytes, tp),
        "kv_bytes_per_sequence": kv_bytes_per_sequence(stage, workload.max_model_len, kv_bytes, tp),
        "activation_peak_bytes": (vllm or any_plan).memory.activation_bytes,
        "activation_estimated": workload.activation_bytes is None,
        "max_num_batched_tokens": (vllm or any_plan).token_budget,
        "formats": {name: _format_entry(fmt, by_engine) for name, (fmt, by_engine) in plans.items()},
    }


def _format_entry(fmt: WeightFormat, by_engine: dict[str, EnginePlan]) -> dict:
    vllm = by_engine.get("vllm")
    return {"bits": fmt.bits, "group_size": fmt.group_size, "label": fmt.label(), "storage": fmt.description,
            "weights_bytes": next(iter(by_engine.values())).memory.weights_bytes,
            "capacity": capacity_view(vllm) if vllm else None,
            "engines": {engine: plan.as_dict() for engine, plan in by_engine.items()}}


def render_text(result: dict) -> str:
    return "\n".join(_header(result) + [""] + _table(result) + [""] + _details(result))


def _header(result: dict) -> list[str]:
    model, target, work = result["model"], result["target"], result["workload"]
    kind = (f"MoE, {model['experts']} experts ({model['experts_per_token']} per token), every expert counted"
            if model["experts"] else "dense")
    sliding = f", {model['sliding_window_layers']} sliding-window layers" if model["sliding_window_layers"] else ""
    gpu, cc, nominal = target["gpu"], target["compute_capability"], target["nominal"]
    lines = [
        f"model: {model['source']}, {model['architecture']} ({model['model_type']}), "
        f"{model['num_parameters'] / 1e6:,.1f}M parameters, {kind}; {model['attention']}, {model['layers']} layers"
        f"{sliding}",
        f"KV cache: {format_bytes(result['kv_bytes_per_token'])} per token "
        f"({'fp8' if work['kv_cache_dtype'] == 'fp8' else '16-bit'}"
        f", {target['kv_placement']}), {format_bytes(result['kv_bytes_per_sequence'])} per sequence of "
        f"{work['max_model_len']:,} tokens (per GPU"
        + (f", {target['pipeline_stage_layers']} of {model['layers']} layers)" if "pipeline_parallel_size" in target
           else ")"),
        f"target: {_gpu_count(target)} x {gpu}{f' ({nominal})' if nominal else ''}, "
        f"{target['memory_bytes'] / GIB:.2f} GiB "
        + (f"as the driver reports it, compute capability {cc:.1f}" if cc is not None else
           f"as ROCm reports it, {target['arch']}" if target.get("arch") else
           "(by size: compute capability unknown; --target-gpu names the GPU)"),
        f"activation peak {'estimated from the config' if result['activation_estimated'] else 'given (measured)'}: "
        f"{format_bytes(result['activation_peak_bytes'])} at {result['max_num_batched_tokens']:,} batched tokens, "
        "the first engine's budget (each engine's below)"
        + ("; --activation-gib gives a measured figure" if result["activation_estimated"] else ""),
    ]
    if result["vllm_version_note"]:
        lines.append(f"{result['vllm_version_note']}")
    return lines


def _gpu_count(target: dict) -> str:
    """'2' (tensor parallel), or '4 (tensor parallel 2 x pipeline parallel 2)'."""
    pp = target.get("pipeline_parallel_size", 1)
    if pp == 1:
        return str(target["num_gpus"])
    return f"{target['num_gpus'] * pp} (tensor parallel {target['num_gpus']} x pipeline parallel {pp})"


def _table(result: dict) -> list[str]:
    engines = list(next(iter(result["formats"].values()))["engines"])
    titles = [f"vllm {result['vllm_version']}" if e == "vllm" else e for e in engines]
    lines = [(f"{'format':<10} {'weights/GPU':>11}  " + "".join(f"{t:<19}" for t in titles)).rstrip()]
    capped = False
    for entry in result["formats"].values():
        cells = [_cell(entry["engines"][e]) for e in engines]
        capped = capped or any("(of" in cell for cell in cells)
        lines.append(f"{entry['label']:<10} {format_bytes(entry['weights_bytes']):>11}  "
                     + "".join(f"{c:<19}" for c in cells).rstrip())
    if capped:
        lines.append("N seqs (of M): the KV cache holds M sequences of max-model-len; the commands cap concurrency at "
                     "N (--max-num-seqs raises the cap)")
    return lines


def _cell(plan: dict) -> str:
    if not plan["servable"]:
        return "cannot serve"
    if not plan["fits"]:
        return "NO"
    more = f" (of {plan['max_concurrency']:,})" if plan["max_concurrency"] > plan["max_num_seqs"] else ""
    return f"{plan['max_num_seqs']} seqs{more}"


def _details(result: dict) -> list[str]:
    lines: list[str] = []
    notes: list[str] = []
    for name, entry in result["formats"].items():
        lines.append(entry["label"] + (f" ({entry['storage']})" if entry.get("storage") else ""))
        for engine, plan in entry["engines"].items():
            title = f"{engine} {plan['engine_version']}".strip()
            if plan["command"]:
                lines.append(f"  {title}: {plan['command']}")
                shared = plan["max_concurrency_shared_prefix"]
                with_prefix = (f" ({shared:,} sharing the {plan['shared_prefix_tokens']:,}-token prefix)"
                               if shared is not None else "")
                lines.append(f"    {plan['formula']}; holds {plan['kv_tokens']:,} tokens: {plan['max_concurrency']:,} "
                             f"sequences of {plan['max_model_len']:,}{with_prefix}")
                if plan["config_yaml"]:
                    lines += ["    with trtllm-extra.yaml:"] + [f"      {row}" for row in
                                                                     plan["config_yaml"].splitlines()]
            else:
                lines.append(f"  {title}: {'cannot serve it: ' if not plan['servable'] else ''}{plan['reason']}")
                if plan["servable"]:
                    lines.append(f"    {plan['formula']}")
            notes += [n for n in plan["notes"] if n not in notes]
        staged = entry.get("pipeline_stages")
        if staged:
            lines += _stage_lines(staged)
            notes += [n for n in staged["notes"] if n not in notes]
    return lines + ([""] + ["notes:"] + [f"  - {n}" for n in notes] if notes else [])


def uneven_view(uneven: UnevenPipelinePlan) -> dict:
    return {"engine": "vllm", "partition": list(uneven.partition), "fits": uneven.fits, "command": uneven.command,
            "kv_tokens": uneven.kv_tokens, "max_concurrency": uneven.max_concurrency,
            "even_split_kv_tokens": uneven.even_kv_tokens, "reason": uneven.reason, "notes": list(uneven.notes),
            "stages": [{"gpu": stage.gpu.name, "memory_bytes": stage.gpu.memory_bytes, "layers": stage.layers,
                        "kv_tokens": stage.plan.kv_tokens, "formula": stage.plan.formula,
                        "weights_bytes": stage.plan.memory.weights_bytes if stage.plan.memory else None}
                       for stage in uneven.stages]}


def _stage_lines(staged: dict) -> list[str]:
    """The per-stage vLLM plan under a format's details."""
    title = "  vllm over uneven pipeline stages"
    lines = [f"{title}: {staged['command']}" if staged["command"] else f"{title}: {staged['reason']}"]
    for number, stage in enumerate(staged["stages"], 1):
        lines.append(f"    stage {number}, {stage['gpu']}, {stage['layers']} layers: {stage['formula']}; "
                     f"{stage['kv_tokens']:,} tokens")
    even = staged["even_split_kv_tokens"]
    lines.append(f"    every worker keeps the smallest stage's {staged['kv_tokens']:,} tokens "
                 f"({staged['max_concurrency']:,} sequences); an even split: "
                 + (f"{even:,} tokens" if even else "does not fit"))
    return lines
