"""Per format: score its outputs item by item, decide it against the baseline, plan its serving capacity.

What the report is built from (harness.report.build); nothing here writes a file."""

from __future__ import annotations

from dataclasses import dataclass

from harness.decide import FormatDecision, FormatOutcome, ServingFit, decide_format
from harness.evalsets.prompts import shared_prefix_tokens
from harness.fidelity.summary import FidelityItem
from harness.metrics import score_item
from harness.records import FormatRun, RunInputs
from harness.capacity import (ConfigFieldError, EnginePlan, ModelShape, Target, TensorParallelError,
                                      WeightFormat, Workload, gpu_by_name, model_shape, plan_engine, plan_engines,
                                      resolve_version, weight_format)
from harness.measure.kv import text_config


@dataclass(frozen=True)
class Evaluation:
    """Every format's scored outcome, every candidate's decision, and the per-item samples (samples.jsonl)."""

    outcomes: dict[str, FormatOutcome]
    decisions: dict[str, FormatDecision]
    samples: tuple[dict, ...]


def evaluate_formats(inputs: RunInputs, runs: dict[str, FormatRun]) -> Evaluation:
    samples: list[dict] = []
    outcomes = {name: score(inputs, run, samples) for name, run in runs.items()}
    return Evaluation(outcomes, decide(inputs, outcomes), tuple(samples))


def score(inputs: RunInputs, run: FormatRun, samples: list[dict]) -> FormatOutcome:
    """The format's per-item scores with what its budgets judge (samples gets one row per scored item)."""
    name = run.name
    items = score_format(inputs, run, samples)
    budget_latency, latency_source = budget_latency_of(run, inputs.policy.latency_budgets_judge)
    served = run.served
    return FormatOutcome(
        name=name, status=run.status if run.status in ("ok", "interrupted") else "failed", error=run.error,
        items=items,
        gates={e.name: list(e.gate) for e in inputs.evalsets},
        peak_bytes=memory_of(run).get("peak_bytes"),
        ttft_p95_ms=budget_latency.get("ttft_ms", {}).get("p95"),
        tpot_p95_ms=budget_latency.get("tpot_ms", {}).get("p95"),
        latency_requests=budget_latency.get("requests"), latency_source=latency_source,
        served_refusal=served.reason if served and served.status == "unsupported" else None,
        saturation=served.saturation if served else None,
        clusters={e.name: e.clusters() for e in inputs.evalsets},
        cluster_by={e.name: e.cluster_by for e in inputs.evalsets},
        calibration_overlap=_calibration_overlap(inputs, name),
        serving_fit=serving_fit(inputs, run) if name != "baseline" else None,
        fidelity=fidelity_items(run, samples), fidelity_note=run.fidelity_note,
        languages={e.name: e.language for e in inputs.evalsets},
    )


def fidelity_items(run: FormatRun, samples: list[dict]) -> dict[str, dict[str, FidelityItem]]:
    """The format's per-item fidelity (harness.fidelity), also added to its samples.jsonl rows as `fidelity`."""
    by_set = {name: {str(row["id"]): FidelityItem.from_json(row) for row in result["items"]}
              for name, result in run.fidelity.items()}
    for sample in samples:
        item = by_set.get(sample["evalset"], {}).get(sample["id"]) if sample["format"] == run.name else None
        if item is not None:
            sample["fidelity"] = {"kl": item.kl, "top1_agreement": item.top1_agreement,
                                  "first_flip": item.first_flip, "tokens": item.positions}
    return by_set


def decide(inputs: RunInputs, outcomes: dict[str, FormatOutcome]) -> dict[str, FormatDecision]:
    baseline = outcomes["baseline"]
    return {name: decide_format(baseline, outcome, inputs.policy)
            for name, outcome in outcomes.items() if name != "baseline"}


def plan_capacity(inputs: RunInputs, run: FormatRun, max_model_len: int) -> dict[str, EnginePlan] | None:
    """Each engine's plan at the report's capacity target (report_capacity); None when the format measured no
    weights or the planners cannot read the config."""
    if not memory_of(run).get("weights_bytes"):
        return None
    spec = inputs.spec
    capacity = report_capacity(inputs).settings
    return serving_plans(inputs, run, capacity.target(spec.tensor_parallel_size, spec.pipeline_parallel_size),
                         max_model_len, gpu_memory_utilization=capacity.gpu_memory_utilization)


def report_capacity(inputs: RunInputs):
    """The target of the report's serving plans: the run's own, with the policy's [serving] target for what the
    run leaves open (config.CapacitySettings.for_report)."""
    return inputs.spec.capacity.for_report(inputs.policy.serving)


def max_model_len_of(inputs: RunInputs) -> int:
    """The report plans' context length: --max-model-len, else the policy's [serving] max_model_len when it names
    a target, else the longest request of the run (prompt plus new tokens)."""
    return report_capacity(inputs).settings.max_model_len or longest_request(inputs)


def profile_budget(inputs: RunInputs) -> tuple[int, int]:
    """(tokens, sequences) of the profile forward (harness.measure.profile): vLLM's --max-num-batched-tokens for the
    run's capacity target (max(max_model_len, 8192) with chunked prefill, capacity.vllm.token_budget) over
    min(--max-num-seqs or DEFAULT_MAX_NUM_SEQS, tokens) sequences. Other engines' budgets differ; their planners
    scale the figure (capacity.common.measured_activation)."""
    from harness.capacity.common import DEFAULT_MAX_NUM_SEQS
    from harness.capacity.vllm import token_budget

    tokens = token_budget(Workload(max_model_len=max_model_len_of(inputs)))
    return tokens, min(inputs.spec.max_num_seqs or DEFAULT_MAX_NUM_SEQS, tokens)


def budget_latency_of(run: FormatRun, judge: str = "served") -> tuple[dict, str]:
    """The latency the policy's budgets judge: with judge "served", the vLLM server's at concurrency 1 where the
    format was served; else (and for formats not served) transformers' batch-1 figures."""
    at_one = run.served.latency.get("concurrency_1") if run.served and run.served.status == "ok" else None
    if judge == "served" and at_one is not None:
        return at_one.model_dump(mode="json"), "vLLM server, concurrency 1"
    return latency_of(run).get("batch_1") or {}, "transformers"


def score_format(inputs: RunInputs, run: FormatRun, samples: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    items_by_set: dict[str, dict[str, dict[str, float]]] = {}
    for evalset in inputs.evalsets:
        generation = run.generations.get(evalset.name)
        if not generation:
            continue
        prompts = {p.item_id: p.text for p in inputs.prompts[evalset.name]}
        outputs = {o.id: o for o in generation.outputs}
        scores = {}
        for item in evalset.items:
            output = outputs.get(item.id)
            if output is None:
                continue
            metrics = score_item(evalset, item, output.prediction)
            scores[item.id] = metrics
            samples.append({"format": run.name, "evalset": evalset.name, "id": item.id, "prompt": prompts[item.id],
                            "prediction": output.prediction,
                            "references": list(item.answers if evalset.task == "qa" else item.references),
                            "new_tokens": output.new_tokens, **metrics})  # schema.SAMPLE_FIELDS, then metrics
        items_by_set[evalset.name] = scores
    return items_by_set


def shape_of(inputs: RunInputs) -> ModelShape | None:
    """The planners' shape of the run's model; None when its config is not one they read (no plan, no guess)."""
    try:
        return model_shape(text_config(inputs.model_config))
    except ConfigFieldError:
        return None


def serving_sizes(run: FormatRun) -> tuple[int | None, int | None]:
    """(weights, profiled activation peak) the format measured, at the 16-bit size it serves with (None: not
    measured; an activation of 0, which only RSS can read, counts as not measured). The activation is the profile
    forward's at the plan's token budget (harness.measure.profile), never the generation's peak (the evaluation's
    largest batch, a few thousand tokens, and RSS on a CPU): that one stays in the report's memory breakdown only.

    A host that computed a 16-bit checkpoint in float32 measured twice the bytes; both figures are halved then."""
    memory = memory_of(run)
    upcast = ELEMENT_BYTES.get(run.measurement.compute_dtype, 2) / 2
    weights, activation = memory.get("weights_bytes"), run.measurement.profile.get("activation_profile_bytes")
    return (int(weights / upcast) if weights else None, int(activation / upcast) if activation else None)


def _weight_format(inputs: RunInputs, name: str) -> WeightFormat:
    """The storage the planners size, with how each engine serves it: a registered format's, or a candidate's from
    its quantization_config (its real bits and group size; the registered format of the same storage where there is
    one, else its own FormatSpec, its method counting as its bits per weight)."""
    recipe = inputs.recipes.get(name)
    if recipe is not None and recipe.extra.get("external"):
        kind = recipe.extra.get("kind")
        if kind in ("gptq", "awq") and recipe.bits == 4:
            return weight_format(kind, recipe.group_size)
        if kind in ("int8", "w8a8"):
            return weight_format(kind)
        return WeightFormat(name, recipe.bits or 16, recipe.group_size, spec=inputs.candidates[name].format_spec())
    return weight_format(name, recipe.group_size if recipe is not None else None)


def serving_plans(inputs: RunInputs, run: FormatRun, target: Target, max_model_len: int, *, engines: tuple[str, ...] | None = None,
                  gpu_memory_utilization: float | None = None) -> dict[str, EnginePlan] | None:
    """Each engine's plan (capacity.plan_engines) for the format on `target`, from its measured weights and its
    profile forward's activation peak, which each planner scales to its own token budget (estimated from the config
    where not measured), at the installed (else newest) vLLM's rules. None when the planners cannot read the
    model's config."""
    shape = shape_of(inputs)
    if shape is None:
        return None
    weights, activation = serving_sizes(run)
    profile = run.measurement.profile
    overhead = inputs.spec.capacity.overhead_gib
    shared, shared_source = shared_prefix_of(inputs)
    workload = Workload(max_model_len=max_model_len, activation_bytes=activation, weights_bytes=weights,
                        activation_tokens=profile.get("profile_tokens") if activation is not None else None,
                        activation_sequences=profile.get("profile_sequences") if activation is not None else None,
                        non_torch_bytes=None if overhead is None else int(overhead * 2**30),
                        shared_prefix_tokens=shared, shared_prefix_source=shared_source)
    version = vllm_rules_of(inputs)
    options = {"vllm_version": version, "gpu_memory_utilization": gpu_memory_utilization}
    try:
        if engines is None:
            return plan_engines(shape, _weight_format(inputs, run.name), target, workload, **options)
        return {e: plan_engine(e, shape, _weight_format(inputs, run.name), target, workload, **options)
                for e in engines}
    except TensorParallelError:
        return None


def shared_prefix_of(inputs: RunInputs) -> tuple[int, str]:
    """(tokens every rendered prompt of the run opens with, where the figure comes from): the token prefix common to
    all of them (a chat template's system prompt, a shared instruction), which the engines' prefix caches keep
    once. Each evalset's own prefix may be longer; the plans count only what every request shares."""
    prompts = [p for rendered in inputs.prompts.values() for p in rendered]
    return shared_prefix_tokens(prompts), f"common to the run's {len(prompts):,} rendered prompts"


def vllm_rules_of(inputs: RunInputs) -> str:
    """The vLLM version whose rules plan the run: --vllm-version, else the vLLM serving it (--backend vllm), else
    the installed one (the project's .venv-vllm included), else the newest known."""
    served = getattr(inputs.serving_install, "version", None) if inputs.spec.backend == "vllm" else None
    return resolve_version(inputs.spec.capacity.vllm_version, installed=served)[0]


def serving_fit(inputs: RunInputs, run: FormatRun) -> ServingFit | None:
    """The vLLM plan at the policy's serving target (whatever target the run's own plans name), at the run's
    --gpu-memory-utilization (else the vLLM version's default), for the capacity check;
    None when the policy sets no target or the planners cannot read the config. Weights not measured (a format
    that did not get that far) are estimated from the config."""
    serving = inputs.policy.serving
    if not serving.checked:
        return None
    plans = serving_plans(inputs, run, Target(gpu_by_name(serving.target_gpu)), serving.length, engines=("vllm",),
                          gpu_memory_utilization=inputs.spec.capacity.gpu_memory_utilization)
    if plans is None:
        return None
    plan = plans["vllm"]
    return ServingFit(gpu=serving.target_gpu, max_model_len=plan.max_model_len,
                      max_concurrency=plan.max_concurrency if plan.servable else 0, servable=plan.servable,
                      reason=plan.reason, weights_source=plan.memory.weights_source if plan.memory else "")


# A 16-bit checkpoint computed in float32 (a CPU without bf16 units) holds twice the bytes it would serve with.
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _calibration_overlap(inputs: RunInputs, name: str) -> tuple[str, ...]:
    """The evaluated items a format's calibration texts contained (only ever non-empty when the run allowed it)."""
    recipe = inputs.recipes.get(name)
    if inputs.calibration is None or recipe is None or not recipe.calibration_samples:
        return ()
    overlap = inputs.calibration.overlap
    return overlap.overlapping if overlap and overlap.items_overlapping else ()


def memory_of(run: FormatRun) -> dict:
    return run.measurement.memory


def latency_of(run: FormatRun) -> dict:
    return run.measurement.latency


def longest_request(inputs: RunInputs) -> int:
    """The longest request of the run, tokens: a prompt plus its max new tokens (512 without prompts)."""
    return max((p.tokens + p.max_new_tokens for prompts in inputs.prompts.values() for p in prompts), default=512)
