"""Each format's serving plans: what it needs on the report's capacity target and on the policy's [serving] target,
from its measured weights and profiled activations (the capacity planner, harness.capacity, applied to the run)."""

from __future__ import annotations

from harness.capacity import (ConfigFieldError, EnginePlan, ModelShape, Target, TensorParallelError, WeightFormat,
                              Workload, gpu_by_name, model_shape, plan_engine, plan_engines, resolve_version,
                              weight_format)
from harness.capacity.common import DEFAULT_MAX_NUM_SEQS
from harness.capacity.vllm_versions import rules_for
from harness.decide import ServingFit
from harness.evalsets.prompts import shared_prefix_tokens
from harness.measure.kv import text_config
from harness.records import FormatRun, RunInputs


def plan_capacity(inputs: RunInputs, run: FormatRun, max_model_len: int) -> dict[str, EnginePlan] | None:
    """Each engine's plan at the report's capacity target (report_capacity); None when the format measured no
    weights or the planners cannot read the config."""
    if not run.measurement.memory.weights_bytes:
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
    """(tokens, sequences) of the profile forward (harness.measure.profile): the --max-num-batched-tokens the vLLM
    release that plans the run (vllm_rules_of) picks for `vllm serve` on the report's target GPU
    (VllmRules.default_token_budget: 2048 / 8192 / 16384 by GPU and release in V1, max(max_model_len, 2048)
    unchunked in V0), so the measured peak is the one the vLLM plan reads unscaled; over min(--max-num-seqs or
    DEFAULT_MAX_NUM_SEQS, tokens) sequences. Other engines' budgets differ; their planners scale the figure
    (capacity.common.measured_activation)."""
    spec = inputs.spec
    gpu = report_capacity(inputs).settings.target(spec.tensor_parallel_size, spec.pipeline_parallel_size).gpu
    rules = rules_for(vllm_rules_of(inputs))[0]
    tokens, _ = rules.default_token_budget(max_model_len_of(inputs), gpu.memory_bytes, gpu.name, chunked=True)
    return tokens, min(spec.max_num_seqs or DEFAULT_MAX_NUM_SEQS, tokens)


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
    upcast = ELEMENT_BYTES.get(run.measurement.compute_dtype, 2) / 2
    weights, activation = run.measurement.memory.weights_bytes, run.measurement.profile.activation_bytes
    return (int(weights / upcast) if weights else None, int(activation / upcast) if activation else None)



def weight_format_of(inputs: RunInputs, name: str) -> WeightFormat:
    """The storage the planners size, with how each engine serves it: a registered format's, or a candidate's as its
    checkpoint stores it (Candidate.weight_format: its quantization_config read by harness.capacity.checkpoint, as
    `quantgate plan` sizes it); where that config says nothing the planners can size, its bits and group size (the
    registered format of the same storage where there is one, else its own FormatSpec)."""
    recipe = inputs.recipes.get(name)
    candidate = inputs.candidates.get(name) if recipe is not None and recipe.extra.get("external") else None
    stored = candidate.weight_format() if candidate is not None else None
    if stored is not None:  # the checkpoint as stored (Candidate.weight_format), as `plan` sizes it
        return stored
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
                        activation_tokens=profile.tokens if activation is not None else None,
                        activation_sequences=profile.sequences if activation is not None else None,
                        non_torch_bytes=None if overhead is None else int(overhead * 2**30),
                        shared_prefix_tokens=shared, shared_prefix_source=shared_source)
    version = vllm_rules_of(inputs)
    options = {"vllm_version": version, "gpu_memory_utilization": gpu_memory_utilization}
    try:
        if engines is None:
            return plan_engines(shape, weight_format_of(inputs, run.name), target, workload, **options)
        return {e: plan_engine(e, shape, weight_format_of(inputs, run.name), target, workload, **options)
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



def longest_request(inputs: RunInputs) -> int:
    """The longest request of the run, tokens: a prompt plus its max new tokens (512 without prompts)."""
    return max((p.tokens + p.max_new_tokens for prompts in inputs.prompts.values() for p in prompts), default=512)
