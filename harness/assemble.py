"""Turn the stages' results into report.json's dict and the per-item samples: score, decide, plan capacity."""

from __future__ import annotations

import time

from harness import __version__
from harness.commands.plan import capacity_view
from harness.decide import FormatOutcome, ServingFit, baseline_scores, decide_format, exit_code, recommend
from harness.metrics import score_item
from harness.measure.capacity import (ConfigFieldError, EnginePlan, ModelShape, Target, TensorParallelError,
                                      WeightFormat, Workload, gpu_by_name, model_shape, plan_engine, plan_engines,
                                      resolve_version, weight_format)
from harness.measure.kv import kv_bytes_per_token, text_config
from harness.measure.latency import latency_block
from harness.runtime.base import BatchTiming


def assemble_report(inputs, runs: dict, wall_s: float) -> tuple[dict, list[dict]]:
    from harness.metrics import tokenizer_name
    from harness.pipeline import REPORT_SCHEMA_VERSION, environment
    from harness.runtime.device import device_info

    spec = inputs.spec
    samples: list[dict] = []
    outcomes = {}
    for name, run in runs.items():
        items = score_format(inputs, run, samples)
        budget_latency, latency_source = budget_latency_of(run, inputs.policy.latency_budgets_judge)
        served = getattr(run, "served", None) or {}
        outcomes[name] = FormatOutcome(
            name=name, status="ok" if run.status == "ok" else "failed", error=run.error, items=items,
            gates={e.name: list(e.gate) for e in inputs.evalsets},
            peak_bytes=_memory(run).get("peak_bytes"),
            ttft_p95_ms=budget_latency.get("ttft_ms", {}).get("p95"),
            tpot_p95_ms=budget_latency.get("tpot_ms", {}).get("p95"),
            latency_requests=budget_latency.get("requests"), latency_source=latency_source,
            served_refusal=served.get("reason") if served.get("status") == "unsupported" else None,
            saturation=served.get("saturation"),
            clusters={e.name: e.clusters() for e in inputs.evalsets},
            cluster_by={e.name: e.cluster_by for e in inputs.evalsets},
            calibration_overlap=_calibration_overlap(inputs, name),
            serving_fit=serving_fit(inputs, run) if name != "baseline" else None,
        )
    baseline = outcomes["baseline"]
    decisions = {name: decide_format(baseline, outcome, inputs.policy)
                 for name, outcome in outcomes.items() if name != "baseline"}
    max_model_len = spec.capacity.max_model_len or _longest_request(inputs)
    formats = {}
    for name, run in runs.items():
        entry = format_entry(inputs, run, max_model_len)
        if name == "baseline":
            entry.update(role="baseline", verdict="BASELINE" if run.status == "ok" else "NO-GO",
                         reasons=[] if run.status == "ok" else [f"baseline failed: {run.error}"],
                         checks=[], scores=baseline_scores(baseline))
        else:
            decision = decisions[name]
            entry.update(role="candidate", verdict=decision.verdict,
                         reasons=[*decision.reasons, *comparison_notes(inputs, name)],
                         checks=decision.checks, scores=decision.scores)
        formats[name] = entry
    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "quantgate", "version": __version__},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(wall_s, 1),
        "model": {**inputs.source.as_dict(), "architecture": (inputs.model_config.get("architectures") or ["?"])[0],
                  "num_parameters": _num_parameters(runs), "dtype": inputs.model_config.get("dtype")
                  or inputs.model_config.get("torch_dtype")},
        "device": device_info(spec.threads),
        "environment": environment(),
        "settings": {"seed": spec.seed, "batch_size": spec.batch_size, "max_items": spec.max_items,
                     "max_new_tokens": spec.max_new_tokens, "formats": spec.formats,
                     "candidates": spec.candidates, "dtype": spec.dtype,
                     "threads": spec.threads, "latency_requests": spec.latency_requests,
                     "warmup_requests": spec.warmup_requests, "resamples": inputs.policy.resamples,
                     "decoding": "greedy", "capacity": spec.capacity.model_dump(), "backend": spec.backend},
        "policy": inputs.policy.as_dict(),
        "evalsets": {e.name: {"task": e.task, "language": e.language, "n": len(e.items), "hash": e.content_hash,
                              "spec": str(e.spec_path), "metrics": list(e.metrics), "gate": list(e.gate),
                              "tokenizer": tokenizer_name(e.language, e.task),
                              "max_new_tokens": e.max_new_tokens} for e in inputs.evalsets},
        "formats": formats,
        "recommendation": recommend(decisions, {n: o.peak_bytes for n, o in outcomes.items()}),
        "exit_code": exit_code(decisions, inputs.policy),
        "samples": "samples.jsonl",
    }
    return report, samples


def comparison_notes(inputs, name: str) -> list[str]:
    """What a verdict was compared with when that is not a full-precision baseline of the same tokenizer."""
    notes = list(getattr(inputs, "candidate_notes", {}).get(name, []))
    quant = inputs.model_config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        bits = quant.get("bits") if isinstance(quant, dict) else None
        notes.append(f"compared with a quantized baseline ({method}{f' {bits}-bit' if bits else ''}, "
                     "--baseline-is-quantized), not the full-precision model")
    return notes


def budget_latency_of(run, judge: str = "served") -> tuple[dict, str]:
    """The latency the policy's budgets judge: with judge "served", the vLLM server's at concurrency 1 where the
    format was served; else (and for formats not served) transformers' batch-1 figures."""
    served = getattr(run, "served", None) or {}
    at_one = None
    if judge == "served" and served.get("status") == "ok":
        at_one = (served.get("latency") or {}).get("concurrency_1")
    if at_one:
        return at_one, "vLLM server, concurrency 1"
    return _latency(run).get("batch_1") or {}, "transformers"


def score_format(inputs, run, samples: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    items_by_set: dict[str, dict[str, dict[str, float]]] = {}
    for evalset in inputs.evalsets:
        result = (run.generations.get(evalset.name) or {}).get("result")
        if not result:
            continue
        prompts = {p.item_id: p.text for p in inputs.prompts[evalset.name]}
        outputs = {o["id"]: o for o in result["outputs"]}
        scores = {}
        for item in evalset.items:
            output = outputs.get(item.id)
            if output is None:
                continue
            metrics = score_item(evalset, item, output["prediction"])
            scores[item.id] = metrics
            samples.append({"format": run.name, "evalset": evalset.name, "id": item.id, "prompt": prompts[item.id],
                            "prediction": output["prediction"],
                            "references": list(item.answers if evalset.task == "qa" else item.references),
                            "new_tokens": output["new_tokens"], **metrics})
        items_by_set[evalset.name] = scores
    return items_by_set


def format_entry(inputs, run, max_model_len: int) -> dict:
    memory = dict(_memory(run))
    latency = dict(_latency(run))
    compute_dtype = ((run.measurement or {}).get("result") or {}).get("compute_dtype")
    # Predicted in the dtype the run computed in, so it is comparable with the measured figure; the capacity plan
    # assumes vLLM's 16-bit KV cache and 16-bit weights whatever this host computed in.
    upcast = _ELEMENT_BYTES.get(compute_dtype, 2) / 2
    kv_predicted = kv_bytes_per_token(inputs.model_config, kv_dtype_bytes=2 * upcast)
    recipe = inputs.recipes.get(run.name)
    calibrated = inputs.calibration is not None and recipe is not None and recipe.calibration_samples
    entry = {"status": run.status, "error": run.error, "artifact": run.artifact, "stages_run": run.stages_run,
             "compute_dtype": compute_dtype,
             "calibration": inputs.calibration.summary(recipe.calibration_samples) if calibrated else None}
    if memory:
        memory.update(device="cuda" if memory.get("cuda_max_allocated_bytes") is not None else "cpu",
                      kv_bytes_per_token=kv_predicted,
                      figures=("NVML device used memory (what nvidia-smi shows); allocator peaks alongside"
                               if memory.get("nvml_peak_used_bytes") is not None else
                               "CUDA allocator reserved peak" if memory.get("cuda_max_reserved_bytes") is not None
                               else "peak RSS of the format's subprocess (CPU)"))
        timeline = ((run.measurement or {}).get("result") or {}).get("memory_timeline")
        if timeline:  # the measured run's series (measurements cached before it was kept have none)
            memory["timeline"] = timeline
    else:
        memory = {"device": None, "peak_bytes": None, "weights_bytes": None, "kv_bytes_per_token": kv_predicted}
    entry["memory"] = memory
    generated = [g["result"] for g in run.generations.values() if g.get("result")]
    if latency:
        batches = [BatchTiming(**b) for g in generated for b in g.get("batches", [])]
        if batches:  # the evaluation's own batches: every request of every evalset at the evaluation batch size
            latency["batched"] = dict(latency_block(batches), workload="evaluation batches, all evalsets")
        latency.update(device=memory.get("device"), threads=inputs.spec.threads)
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            latency[key] = latency["batch_1"][key]
    entry["latency"] = latency or {k: {"p50": None, "p95": None} for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    entry["capacity"] = entry["serving"] = None
    if memory.get("weights_bytes"):
        capacity = inputs.spec.capacity
        plans = serving_plans(inputs, run, capacity.target(), max_model_len,
                              gpu_memory_utilization=capacity.gpu_memory_utilization)
        if plans is not None:
            entry["capacity"] = capacity_view(plans["vllm"])
            entry["serving"] = {engine: plain(plan.as_dict()) for engine, plan in plans.items()}
    if getattr(run, "served", None) is not None:
        entry["served"] = run.served
    entry["generation"] = {"items": sum(len(g["outputs"]) for g in generated),
                           "new_tokens": sum(o["new_tokens"] for g in generated for o in g["outputs"]),
                           "wall_s": round(sum(g.get("wall_s", 0) for g in generated), 2),
                           "batched_latency": [{"evalset": g["evalset"], **g["latency"]} for g in generated
                                               if g.get("latency")]}
    return entry


def shape_of(inputs) -> ModelShape | None:
    """The planners' shape of the run's model; None when its config is not one they read (no plan, no guess)."""
    try:
        return model_shape(text_config(inputs.model_config))
    except ConfigFieldError:
        return None


def serving_sizes(run) -> tuple[int | None, int | None]:
    """(weights, activation peak) the format measured, at the 16-bit size it serves with (None: not measured).

    A host that computed a 16-bit checkpoint in float32 measured twice the bytes; both figures are halved then."""
    memory = _memory(run)
    compute_dtype = ((run.measurement or {}).get("result") or {}).get("compute_dtype")
    upcast = _ELEMENT_BYTES.get(compute_dtype, 2) / 2
    weights, activation = memory.get("weights_bytes"), memory.get("activation_peak_bytes")
    return (int(weights / upcast) if weights else None, int(activation / upcast) if activation else None)


def _weight_format(inputs, name: str):
    """The storage the planners size: a built-in format's, or a candidate's from its quantization_config (its
    real bits and group size; a method the memory model has no layout for counts as its bits per weight)."""
    recipe = inputs.recipes.get(name)
    if recipe is not None and recipe.extra.get("external"):
        kind = recipe.extra.get("kind")
        if kind in ("gptq", "awq") and recipe.bits == 4:
            return weight_format(kind, recipe.group_size)
        if kind == "int8":
            return weight_format("int8")
        return WeightFormat(name, recipe.bits or 16, recipe.group_size)
    return weight_format(name, recipe.group_size if recipe is not None and name in ("gptq", "awq") else None)


def serving_plans(inputs, run, target: Target, max_model_len: int, *, engines: tuple[str, ...] | None = None,
                  gpu_memory_utilization: float | None = None) -> dict[str, EnginePlan] | None:
    """Each engine's plan (capacity.plan_engines) for the format on `target`, from its measured weights and
    activation peak (estimated from the config where not measured), at the installed (else newest) vLLM's rules.
    None when the planners cannot read the model's config."""
    shape = shape_of(inputs)
    if shape is None:
        return None
    weights, activation = serving_sizes(run)
    overhead = inputs.spec.capacity.overhead_gib
    workload = Workload(max_model_len=max_model_len, activation_bytes=activation, weights_bytes=weights,
                        non_torch_bytes=None if overhead is None else int(overhead * 2**30))
    version, _ = resolve_version(None)
    options = {"vllm_version": version, "gpu_memory_utilization": gpu_memory_utilization}
    try:
        if engines is None:
            return plan_engines(shape, _weight_format(inputs, run.name), target, workload, **options)
        return {e: plan_engine(e, shape, _weight_format(inputs, run.name), target, workload, **options)
                for e in engines}
    except TensorParallelError:
        return None


def serving_fit(inputs, run) -> ServingFit | None:
    """The vLLM plan at the policy's serving target (not the run's capacity target), for the capacity check;
    None when the policy sets no target or the planners cannot read the config. Weights not measured (a format
    that did not get that far) are estimated from the config."""
    serving = inputs.policy.serving
    if not serving.checked:
        return None
    plans = serving_plans(inputs, run, Target(gpu_by_name(serving.target_gpu)), serving.length, engines=("vllm",))
    if plans is None:
        return None
    plan = plans["vllm"]
    return ServingFit(gpu=serving.target_gpu, max_model_len=plan.max_model_len,
                      max_concurrency=plan.max_concurrency if plan.servable else 0, servable=plan.servable,
                      reason=plan.reason, weights_source=plan.memory.weights_source if plan.memory else "")


def plain(value):
    """A dataclass's asdict with tuples as lists: what json.dumps writes and the strict schema validates."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# A 16-bit checkpoint computed in float32 (a CPU without bf16 units) holds twice the bytes it would serve with.
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _calibration_overlap(inputs, name: str) -> tuple[str, ...]:
    """The evaluated items a format's calibration texts contained (only ever non-empty when the run allowed it)."""
    recipe = inputs.recipes.get(name)
    if inputs.calibration is None or recipe is None or not recipe.calibration_samples:
        return ()
    overlap = inputs.calibration.overlap
    return overlap.overlapping if overlap and overlap.items_overlapping else ()


def _memory(run) -> dict:
    return ((run.measurement or {}).get("result") or {}).get("memory") or {}


def _latency(run) -> dict:
    return ((run.measurement or {}).get("result") or {}).get("latency") or {}


def _longest_request(inputs) -> int:
    return max((p.tokens + p.max_new_tokens for prompts in inputs.prompts.values() for p in prompts), default=512)


def _num_parameters(runs) -> int | None:
    return _memory(runs["baseline"]).get("parameters") if "baseline" in runs else None
