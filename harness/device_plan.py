"""What a format's device stage still has to do (the rest is in the cache): the measurement, each evalset's
generation, the fidelity tasks, and the worker job that does them in one model load."""

from __future__ import annotations

from pathlib import Path

from harness.cache import cache_dir
from harness.cachekeys import device_runtime, evaluation_settings, generate_key, measure_key, reusable, valid_result
from harness.format_plans import profile_budget
from harness.fidelity.plan import FidelityPlan, plan_comparison, plan_reference
from harness.jobs import DeviceJob, FidelityTask, GenerateItem, GenerateTask, MeasureTask, stage_dir
from harness.measure.profile import profile_wanted
from harness.records import DevicePlan, ResultFile, RunInputs
from harness.runtime.registry import runtime_class
from harness.runtime.serving_engine import is_serving_engine


def device_job(inputs: RunInputs, fmt: str, artifact_path: Path, measure: MeasureTask | None,
               generate: list[GenerateTask], devices: str | None = None,
               fidelity: tuple[FidelityTask, ...] = ()) -> DeviceJob:
    """The worker job of a format's device stage: one model load that measures, generates and runs the fidelity
    tasks still to do."""
    spec = inputs.spec
    return DeviceJob(format=fmt, devices=devices, artifact_path=str(artifact_path), dtype=spec.dtype,
                     trust_remote_code=spec.trust_remote_code, threads=spec.threads, seed=spec.seed,
                     runtime=device_runtime(spec), batch_size=spec.batch_size, measure=measure, generate=tuple(generate),
                     fidelity=tuple(fidelity),
                     failure_path=str(stage_dir(inputs.out_dir, fmt) / "evaluate.failed.json"))


def profile_request(inputs: RunInputs) -> tuple[int, int] | None:
    """(tokens, sequences) of the profile forward the measure stage runs (format_plans.profile_budget); None where it
    runs none (a CPU unless QUANTGATE_PROFILE_ON_CPU=1: harness.measure.profile)."""
    return profile_budget(inputs) if profile_wanted() else None


def pending_evaluation(inputs: RunInputs, fmt: str, artifact_key: str) -> DevicePlan:
    spec = inputs.spec
    settings = evaluation_settings(spec)
    batch1, batched, batched_new = workload = inputs.probe_workload()
    profile = profile_request(inputs)
    key = measure_key(artifact_key, settings, workload, spec.warmup_requests, profile)
    measure_path = cache_dir("results") / f"measure-{key}.json"
    measure_task = None
    # A measurement written before a crash in generation lacks the profile that runs last: measured again.
    if not (reusable(spec, measure_path) and valid_result(measure_path, "profile" if profile else "memory")):
        profile_tokens, profile_sequences = profile or (0, 0)
        measure_task = MeasureTask(str(measure_path), tuple((text, n) for text, n in batch1), tuple(batched),
                                   batched_new, spec.warmup_requests, profile_tokens, profile_sequences)
    generate_tasks, generations = [], {}
    for evalset in inputs.evalsets:
        prompts = inputs.prompts[evalset.name]
        gen_key = generate_key(artifact_key, settings, evalset.content_hash, prompts)
        path = cache_dir("results") / f"generate-{gen_key}.json"
        generations[evalset.name] = ResultFile(str(path), gen_key)
        if not (reusable(spec, path) and valid_result(path, "outputs")):
            generate_tasks.append(GenerateTask(evalset.name, gen_key, prompts[0].max_new_tokens if prompts else 1,
                                               tuple(GenerateItem(p.item_id, p.text) for p in prompts), str(path)))
    return DevicePlan(measure_task, tuple(generate_tasks), ResultFile(str(measure_path), key), generations,
                      fidelity_plan(inputs, fmt, artifact_key, settings, generations))


def fidelity_plan(inputs: RunInputs, fmt: str, artifact_key: str, settings: dict,
                  generations: dict[str, ResultFile]) -> FidelityPlan:
    """The format's fidelity tasks (harness.fidelity.plan), or a plan with the reason it measures none."""
    if is_serving_engine(inputs.spec.backend):  # measured through the servers instead (harness.served)
        return FidelityPlan((), {})
    refused = fidelity_refusal(inputs, fmt)
    if refused:
        return FidelityPlan((), {}, refused)
    may_reuse = lambda path: reusable(inputs.spec, path)  # noqa: E731
    if fmt == "baseline":
        return plan_reference({name: file.key for name, file in generations.items()},
                              {name: file.path for name, file in generations.items()},
                              {e.name: [(p.item_id, p.ids) for p in inputs.prompts[e.name]] for e in inputs.evalsets},
                              may_reuse)
    baseline = {e.name: generate_key(inputs.source.fingerprint, settings, e.content_hash, inputs.prompts[e.name])
                for e in inputs.evalsets}
    return plan_comparison(artifact_key, settings, baseline, may_reuse)


def fidelity_refusal(inputs: RunInputs, fmt: str) -> str | None:
    """Why this run measures no fidelity for the format, in one line; None when it does."""
    runtime = device_runtime(inputs.spec)
    if not hasattr(runtime_class(runtime), "next_token_logprobs"):
        return f"not measured: the {runtime} runtime gives no next-token log-probabilities (TeacherForcing)"
    if inputs.candidate_notes.get(fmt):
        return TOKENIZER_DIFFERS
    return None


TOKENIZER_DIFFERS = "not measured: its tokenizer differs from the baseline's, so their tokens cannot be compared"
