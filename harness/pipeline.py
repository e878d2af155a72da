"""The run, top to bottom: prepare inputs; per format quantize -> run on the device (one model load that measures
and generates) -> (backend vllm: serve); then score, decide and plan capacity (harness.evaluate), build the
report (harness.report.build) and write the outputs.

Each format's quantization and its measurement/evaluation run in fresh subprocesses (harness.worker). Every
stage result lives in the cache under a content-hash key, written atomically the moment it finishes, so a rerun
(or `--resume` after a crash, a kill or Ctrl-C) redoes only what is missing, and changing one input reruns
only the stages that depend on it.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from harness import __version__, progress
from harness.cache import SEAL, atomic_write_json, atomic_write_text, cache_dir, is_sealed, read_json, remove_tree, \
    seal_dir, stable_hash
from harness.cachekeys import (device_runtime, evaluation_settings, generate_key, measure_key, quantize_device_key,
                               reusable, valid_result)
from harness.calibration import load_calibration
from harness.config import RunSpec
from harness.errors import Terminated, UserError, interrupted_exit_code
from harness.evalsets import load_evalsets
from harness.evalsets.prompts import check_prompt_lengths, render_prompts
from harness.external import check_baseline_is_full_precision, read_candidates
from harness.fidelity.plan import FidelityPlan
from harness.jobs import EvaluateJob, FidelityTask, GenerateItem, GenerateTask, MeasureTask, QuantizeJob
from harness.launcher import run_worker
from harness.measure.probe import Measurement
from harness.metrics import metric_names
from harness.policy import load_policy
from harness.quantize import quantizer_for, recipe_for
from harness.quantize.base import Recipe
from harness.records import Artifact, DevicePlan, DeviceRun, FormatRun, ResultFile, RunInputs, Served
from harness.report.schema import RunReport, report_json
from harness.runtime.vllm.client import check_endpoints
from harness.source import check_remote_code, load_tokenizer, resolve_source


def run_pipeline(spec: RunSpec) -> tuple[RunReport, int]:
    started = time.time()
    out_existed = Path(spec.out).exists()
    try:
        inputs = prepare_inputs(spec)
    except BaseException:
        if not out_existed:  # a run refused up front leaves no empty output directory behind
            remove_if_empty(Path(spec.out))
        raise
    runs: dict[str, FormatRun] = {}
    interrupted = 0
    try:
        run_all_formats(inputs, runs)
    except KeyboardInterrupt as exc:
        interrupted = interrupted_exit_code(exc)
        progress.say(f"{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: writing a partial report; "
                     f"`quantgate run --resume --out {inputs.out_dir}` continues from what finished")
        for fmt in spec.all_formats():
            runs.setdefault(fmt, FormatRun(fmt, status="interrupted", error="not run: the run was interrupted"))
    runs = {fmt: runs[fmt] for fmt in spec.all_formats()}  # report order, whichever lane finished first
    report = finish(inputs, runs, started)
    return report, interrupted or report.exit_code


def finish(inputs: RunInputs, runs: dict[str, FormatRun], started: float) -> RunReport:
    """Score, decide, plan, build and write the report. Should any of that fail, a report is still written, every
    format in it failed with that reason (the stages' results stay in the cache for --resume), before the error
    goes on to the CLI (exit 3)."""
    from harness.evaluate import evaluate_formats
    from harness.report.build import build_report

    try:
        evaluation = evaluate_formats(inputs, runs)
        report = build_report(inputs, runs, evaluation, wall_s=time.time() - started)
    except Exception as exc:
        reason = (f"the report could not be built ({type(exc).__name__}: {exc}); every finished stage is kept in "
                  f"the cache: `quantgate run --resume --out {inputs.out_dir}` rebuilds it once this is fixed")
        progress.say(reason)
        failed = {fmt: FormatRun(fmt, status="failed", error=reason) for fmt in runs}
        try:
            evaluation = evaluate_formats(inputs, failed)
            write_outputs(inputs.out_dir, build_report(inputs, failed, evaluation, wall_s=time.time() - started),
                          evaluation.samples)
        except Exception:  # noqa: BLE001 - the same fault again: the first error is the one to report
            pass
        raise
    write_outputs(inputs.out_dir, report, evaluation.samples)
    return report


def run_all_formats(inputs: RunInputs, runs: dict[str, FormatRun]) -> None:
    """Each format's stages, one format after another; with --devices split into several device groups, one lane
    per group runs the next format not yet started (its workers and server see only that group's GPUs)."""
    formats = inputs.spec.all_formats()
    groups = inputs.spec.device_groups()
    if len(groups) <= 1:
        for fmt in formats:
            runs[fmt] = run_format(inputs, fmt, groups[0] if groups else None)
        return
    import threading

    waiting = list(formats)
    lock = threading.Lock()

    def lane(devices: str) -> None:
        while True:
            with lock:
                if not waiting:
                    return
                fmt = waiting.pop(0)
            try:
                runs[fmt] = run_format(inputs, fmt, devices)
            except Exception as exc:  # noqa: BLE001 - one lane's failure must not lose the other formats
                runs[fmt] = FormatRun(fmt, status="failed", error=f"internal error on devices {devices}: {exc}")

    progress.say(f"running formats in parallel on device groups {' | '.join(groups)}")
    lanes = [threading.Thread(target=lane, args=(group,), daemon=True) for group in groups]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        while thread.is_alive():
            thread.join(0.5)  # a short join keeps Ctrl-C deliverable to this thread
    # A format that ran beside the baseline found no reference to compare with: its fidelity runs now (all else
    # of it is cached, so only the comparison loads the model).
    for fmt in formats:
        run = runs.get(fmt)
        if fmt != "baseline" and run is not None and run.status == "ok" and run.fidelity_note \
                and run.fidelity_note.startswith("no baseline reference") and runs.get("baseline") \
                and runs["baseline"].status == "ok":
            runs[fmt] = run_format(inputs, fmt, run.devices)


def prepare_inputs(spec: RunSpec) -> RunInputs:
    """Everything that can be checked before expensive work starts is checked here."""
    check_endpoints(spec.vllm_endpoints)
    out_dir = prepare_output_dir(Path(spec.out))
    full_evalsets = load_evalsets(spec.evalsets, allow_outside_paths=spec.allow_outside_paths)
    evalsets = [replace(e, items=e.items[: spec.max_items]) for e in full_evalsets] if spec.max_items else full_evalsets
    policy = load_policy(spec.policy, known_metrics=metric_names(), known_evalsets=[e.name for e in evalsets])
    source = resolve_source(spec.model)
    check_remote_code(source.path, spec.trust_remote_code)
    config_path = source.path / "config.json"
    model_config = json.loads(config_path.read_text(encoding="utf-8"))
    check_baseline_is_full_precision(model_config, config_path, spec.baseline_is_quantized)
    recipes = {fmt: recipe_for(fmt, model_config, spec.group_size_for(fmt), spec.calibration_samples_for(fmt),
                               spec.seed, config_path=config_path) for fmt in spec.formats if fmt != "baseline"}
    candidates, candidate_notes = read_candidates(spec.candidates, model_config, source.path,
                                                  trust_remote_code=spec.trust_remote_code,
                                                  allow_tokenizer_mismatch=spec.allow_tokenizer_mismatch)
    recipes.update({name: Recipe(name, bits=c.bits, group_size=c.group_size, calibration_samples=0, seed=spec.seed,
                                 extra=c.recipe_extra()) for name, c in candidates.items()})
    tokenizer = load_tokenizer(source.path, spec.trust_remote_code)
    prompts = render_prompts(tokenizer, evalsets, spec.max_new_tokens)
    check_prompt_lengths(prompts, model_config)
    calibration = None
    if any(r.calibration_samples for r in recipes.values()):
        wanted = max(spec.calibration_samples_for(f) for f in spec.formats if f != "baseline")
        calibration = load_calibration(spec.calibration, full_evalsets, wanted, tokenizer,
                                       allow_overlap=spec.allow_calibration_overlap)
    vllm = None
    if spec.backend == "vllm":
        from harness.served import vllm_for_run

        vllm = vllm_for_run(spec)
    # Only a run whose inputs passed every check is saved for --resume.
    atomic_write_json(out_dir / "run.json", spec.model_dump())
    inputs = RunInputs(spec, out_dir, source, model_config, evalsets, policy, recipes, prompts, calibration, vllm,
                       candidates, candidate_notes)
    announce_served_refusals(inputs)
    return inputs


def announce_served_refusals(inputs: RunInputs) -> None:
    """Backend vllm: what vLLM cannot serve is said before any model loads (the report repeats it per format)."""
    for fmt in inputs.spec.all_formats():
        refused = served_refusal_for(inputs, fmt)
        if refused:
            progress.say(f"{fmt}: vLLM will not serve it, so it is scored in transformers and cannot be GO on this "
                         f"backend: {refused}")


def prepare_output_dir(out_dir: Path) -> Path:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot write there ({exc.strerror}); choose a writable directory") from None
    return out_dir.resolve()


def remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()  # only succeeds when empty
    except OSError:
        pass


# ---------------------------------------------------------------- one format's stages


def run_format(inputs: RunInputs, fmt: str, devices: str | None = None) -> FormatRun:
    artifact = quantize(inputs, fmt, devices)
    if artifact.error:
        return FormatRun(fmt, status="failed", error=artifact.error, artifact=artifact.entry,
                         stages_run=list(artifact.stages_run), devices=devices)
    refused = served_refusal_for(inputs, fmt)
    device = run_on_device(inputs, fmt, artifact, devices, generate=inputs.spec.backend != "vllm" or bool(refused))
    served = None
    if inputs.spec.backend == "vllm" and device.error is None:
        served = serve(inputs, fmt, artifact, device, refused, devices)
    return collect_results(fmt, artifact, device, served, devices)


def quantize(inputs: RunInputs, fmt: str, devices: str | None) -> Artifact:
    """The baseline and a --candidate are ready checkpoints; a built-in format is quantized (or taken from the
    cache)."""
    if fmt == "baseline":
        path = inputs.source.path
        return Artifact(inputs.source.fingerprint, path, {
            "path": str(path), "size_bytes": _weights_size(path), "cached": True,
            "manifest": {"engine": "none", "format": "baseline", "source": inputs.source.fingerprint}})
    if fmt in inputs.candidates:
        from harness.external import not_runnable_here
        from harness.runtime.device import is_cuda

        candidate = inputs.candidates[fmt]
        entry = {"path": str(candidate.path), "size_bytes": _weights_size(candidate.path), "cached": True,
                 "manifest": {**candidate.provenance(), "recipe": inputs.recipes[fmt].as_dict()}}
        blocked = None if inputs.spec.backend == "vllm" else not_runnable_here(candidate, cuda=is_cuda())
        if blocked:
            progress.say(f"{fmt}: not runnable on this device: {blocked}")
            return Artifact(None, None, entry, error=f"not runnable on this device: {blocked}")
        return Artifact(candidate.fingerprint, candidate.path, entry)
    return ensure_artifact(inputs, fmt, devices)


def run_on_device(inputs: RunInputs, fmt: str, artifact: Artifact, devices: str | None, *,
                  generate: bool) -> DeviceRun:
    """One worker, one model load: the memory/latency probe and the evalsets' generations this run still lacks
    (with `generate` False, the vLLM server generates instead)."""
    plan = pending_evaluation(inputs, fmt, artifact.key)
    tasks = plan.generate if generate else ()
    fidelity = plan.fidelity.tasks
    stages_run: tuple[str, ...] = ()
    error = None
    if plan.measure or tasks or fidelity:
        progress.say(f"{fmt}: loading the model to " + " and ".join(
            (["measure memory and latency"] if plan.measure else []) +
            ([f"generate on {len(tasks)} evalset(s)"] if tasks else []) +
            ([f"measure fidelity on {len(fidelity)} evalset(s)"] if fidelity else [])))
        job = evaluate_job(inputs, fmt, artifact.path, plan.measure, list(tasks), devices, fidelity)
        failure_path = Path(job.failure_path)
        failure_path.unlink(missing_ok=True)
        exit_ = run_worker(job, _stage_dir(inputs, fmt) / "evaluate.job.json", inputs.out_dir / "logs" / f"{fmt}.log",
                           fmt, inputs.spec.memory_limit_bytes_for(fmt))
        stages_run = tuple((["measure"] if plan.measure else []) + [f"generate:{t.evalset}" for t in tasks]
                           + [f"fidelity:{t.evalset}" for t in fidelity])
        if exit_.returncode != 0:
            error = _failure_reason(failure_path, exit_, "evaluation")
    else:
        progress.say(f"{fmt}: reusing cached results (measurement" + (
            f", generations on {len(plan.generations)} evalset(s))" if generate else ")"))
    return DeviceRun(plan.measurement, plan.generations, stages_run, error, plan.fidelity)


def evaluate_job(inputs: RunInputs, fmt: str, artifact_path: Path, measure: MeasureTask | None,
                 generate: list[GenerateTask], devices: str | None = None,
                 fidelity: tuple[FidelityTask, ...] = ()) -> EvaluateJob:
    spec = inputs.spec
    return EvaluateJob(format=fmt, devices=devices, artifact_path=str(artifact_path), dtype=spec.dtype,
                       trust_remote_code=spec.trust_remote_code, threads=spec.threads, seed=spec.seed,
                       runtime=device_runtime(spec), batch_size=spec.batch_size, measure=measure, generate=tuple(generate),
                       fidelity=tuple(fidelity),
                       failure_path=str(_stage_dir(inputs, fmt) / "evaluate.failed.json"))


def served_refusal_for(inputs: RunInputs, fmt: str) -> str | None:
    if inputs.spec.backend != "vllm":
        return None
    from harness.served import served_refusal

    return served_refusal(inputs.vllm, format_spec_of(inputs, fmt), inputs.spec.vllm_endpoints.get(fmt))


def format_spec_of(inputs: RunInputs, fmt: str):
    """The FormatSpec of a built-in format, or the one a candidate's quantization_config describes."""
    from harness.formats import format_spec

    return inputs.candidates[fmt].format_spec() if fmt in inputs.candidates else format_spec(fmt)


def serve(inputs: RunInputs, fmt: str, artifact: Artifact, device: DeviceRun, refused: str | None,
          devices: str | None) -> Served:
    """Backend vllm: score and time the format through a vLLM server; one vLLM cannot serve is scored in
    transformers (its report row says why vLLM cannot serve it, and it cannot be GO)."""
    from harness.served import run_served, served_block, served_format

    endpoint = inputs.spec.vllm_endpoints.get(fmt)
    if refused:
        progress.say(f"{fmt}: not served by vLLM: {refused}")
        return Served(served_block(inputs.vllm, endpoint, status="unsupported", reason=refused), {})
    served = served_format(inputs, fmt, artifact.key, artifact.path, format_spec_of(inputs, fmt), devices)
    generations: dict[str, dict] = {}
    # The server is planned before the measurement is read back (the format as run_served has always seen it).
    planned = FormatRun(fmt, artifact=artifact.entry, measurement=Measurement(**device.measurement.as_dict()),
                        devices=devices)
    reference = (device.measurement.read() or {}).get("probe_reply") if fmt == "baseline" else None
    refused_fidelity = TOKENIZER_DIFFERS if inputs.candidate_notes.get(fmt) else None
    fidelity: dict[str, str] | None = None if refused_fidelity else {}
    block = run_served(inputs, served, inputs.vllm, endpoint, generations, lambda path: reusable(inputs.spec, path),
                       planned, reference_reply=reference, fidelity=fidelity)
    error = None if block["status"] == "ok" else f"serving with vLLM failed: {block['reason']}"
    missing = [e.name for e in inputs.evalsets if e.name not in (fidelity or {})]
    note = refused_fidelity or ((f"not measured through vLLM for {', '.join(missing)}: the served baseline left no "
                                 "reference there (it was not served, or failed)") if missing and fmt != "baseline"
                                else None)
    return Served(block, {name: ResultFile(**entry) for name, entry in generations.items()}, ("serve",), error,
                  FidelityPlan((), fidelity or {}, note))


def ensure_artifact(inputs: RunInputs, fmt: str, devices: str | None) -> Artifact:
    recipe = inputs.recipes[fmt]
    quantizer = quantizer_for(fmt)
    calibration = list(inputs.calibration.texts[: recipe.calibration_samples]) if recipe.calibration_samples else []
    manifest = {"engine": quantizer.engine, "versions": quantizer.versions(), "format": fmt,
                "recipe": recipe.as_dict(), "source": inputs.source.fingerprint,
                "calibration_hash": "sha256:" + stable_hash(calibration), "calibration_texts": len(calibration),
                "calibration_source": inputs.calibration.source if calibration else None,
                "device": quantize_device_key(quantizer, inputs.source.path), "quantgate": __version__}
    key = stable_hash({k: v for k, v in manifest.items() if k != "quantgate"})
    out_dir = cache_dir("artifacts") / f"{fmt}-{key[:20]}"
    cached = reusable(inputs.spec, out_dir / SEAL) and is_sealed(out_dir, required=("quantgate_manifest.json",))
    if not cached:
        remove_tree(out_dir)
        progress.say(f"{fmt}: quantizing ({manifest['engine']} {manifest['versions'].get(manifest['engine'], '')}, "
                     f"{_recipe_text(recipe)})")
        calibration_path = _stage_dir(inputs, fmt) / "calibration.json"
        atomic_write_json(calibration_path, calibration)
        failure_path = _stage_dir(inputs, fmt) / "quantize.failed.json"
        failure_path.unlink(missing_ok=True)
        job = QuantizeJob(format=fmt, devices=devices, source_path=str(inputs.source.path),
                          recipe=recipe.as_dict(), calibration_path=str(calibration_path), out_dir=str(out_dir),
                          manifest=manifest, trust_remote_code=inputs.spec.trust_remote_code,
                          threads=inputs.spec.threads, failure_path=str(failure_path))
        started = time.time()
        exit_ = run_worker(job, _stage_dir(inputs, fmt) / "quantize.job.json", inputs.out_dir / "logs" / f"{fmt}.log",
                           fmt, inputs.spec.memory_limit_bytes_for(fmt))
        if exit_.returncode != 0 or not (out_dir / "quantgate_manifest.json").is_file():
            return Artifact(None, None, None, ("quantize",), _failure_reason(failure_path, exit_, "quantization"))
        seal_dir(out_dir)
        progress.say(f"{fmt}: quantized in {time.time() - started:.0f}s -> {out_dir}")
    else:
        progress.say(f"{fmt}: reusing cached artifact {out_dir.name}")
    entry = {"path": str(out_dir), "size_bytes": _weights_size(out_dir), "cached": cached,
             "manifest": read_json(out_dir / "quantgate_manifest.json")}
    return Artifact(key, out_dir, entry, () if cached else ("quantize",))


def profile_request(inputs: RunInputs) -> tuple[int, int] | None:
    """(tokens, sequences) of the profile forward the measure stage runs (evaluate.profile_budget); None where it
    runs none (a CPU unless QUANTGATE_PROFILE_ON_CPU=1: harness.measure.profile)."""
    from harness.evaluate import profile_budget
    from harness.measure.profile import profile_wanted

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
    from harness.fidelity.plan import plan_comparison, plan_reference

    if inputs.spec.backend == "vllm":  # measured through the servers instead (harness.served)
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
    from harness.runtime.registry import runtime_class

    runtime = device_runtime(inputs.spec)
    if not hasattr(runtime_class(runtime), "next_token_logprobs"):
        return f"not measured: the {runtime} runtime gives no next-token log-probabilities (TeacherForcing)"
    if inputs.candidate_notes.get(fmt):
        return TOKENIZER_DIFFERS
    return None


TOKENIZER_DIFFERS = "not measured: its tokenizer differs from the baseline's, so their tokens cannot be compared"


def collect_results(fmt: str, artifact: Artifact, device: DeviceRun, served: Served | None,
                    devices: str | None) -> FormatRun:
    """The format's result: its stages' records with the measurement and the generations read back."""
    generations = {**device.generations, **(served.generations if served else {})}
    fidelity = served.fidelity if served else device.fidelity  # backend vllm: the server's (harness.fidelity.served)
    error = device.error or (served.error if served else None)
    run = FormatRun(fmt, status="failed" if error else "ok", error=error, artifact=artifact.entry,
                    measurement=Measurement(**device.measurement.as_dict(), result=device.measurement.read()),
                    generations={name: dict(file.as_dict(), result=file.read("outputs"))
                                 for name, file in generations.items()},
                    stages_run=[*artifact.stages_run, *device.stages_run, *(served.stages_run if served else ())],
                    served=served.block if served else None, devices=devices,
                    fidelity=read_fidelity(fmt, fidelity), fidelity_note=fidelity.note)
    missing = [n for n, e in run.generations.items() if e["result"] is None]
    if run.status == "ok" and (missing or run.measurement.result is None):
        return replace(run, status="failed",
                       error="evaluation finished without results for " + ", ".join(missing or ["measurement"]))
    degenerate = degenerate_outputs(run.generations, served=served is not None and bool(served.generations))
    if run.status == "ok" and degenerate:
        return replace(run, status="failed", error=degenerate)
    return run


def read_fidelity(fmt: str, plan: FidelityPlan) -> dict[str, dict]:
    """A format's comparisons read back (the baseline's references are read by the others' workers only)."""
    if fmt == "baseline":
        return {}
    results = {name: read_json(Path(path)) for name, path in plan.results.items()}
    return {name: value for name, value in results.items() if isinstance(value, dict) and "items" in value}


def degenerate_outputs(generations: dict[str, dict], *, served: bool = False) -> str | None:
    """Why outputs cannot be scored at all: every prediction empty, or (over 4 items or more) one text for every
    item. Garbage like that is a failure with its reason, never a verdict."""
    predictions = [o["prediction"] for g in generations.values() if g.get("result") for o in g["result"]["outputs"]]
    who = "the vLLM server" if served else "the model"
    if len(predictions) >= 2 and not any(p.strip() for p in predictions):
        return (f"{who} answered nothing: every one of its {len(predictions)} predictions is empty, so nothing can "
                "be scored; read the format's log (a server or kernel that fails quietly does this)")
    if len(predictions) >= 4 and len(set(predictions)) == 1:
        return (f"{who} gave one answer to every item ({len(predictions)} predictions, all "
                f"{predictions[0][:60]!r}), so nothing can be scored; read the format's log")
    return None


def _failure_reason(failure_path: Path, exit_, stage: str) -> str:
    failure = read_json(failure_path)
    if isinstance(failure, dict) and failure.get("error"):
        return f"{stage} failed: {failure['error']} (log: {exit_.log_path})"
    if exit_.over_memory_limit:
        return (f"{stage} ran out of memory: the subprocess reached {exit_.over_memory_limit / 2**30:.2f} GiB RSS, "
                "past its memory limit, and was killed; lower --batch-size or --max-new-tokens, use a smaller "
                f"format, or raise memory_limit_gib (log: {exit_.log_path})")
    if exit_.killed_by == "SIGKILL":
        from harness.measure.oom import oom_reason

        return (f"{stage} subprocess was killed by SIGKILL (the kernel's out-of-memory killer, or kill -9): "
                f"{oom_reason(None, killed_signal=9, rss_peak_bytes=exit_.rss_peak_bytes)} (log: {exit_.log_path})")
    if exit_.killed_by:
        return f"{stage} subprocess was killed by {exit_.killed_by} (log: {exit_.log_path})"
    return f"{stage} subprocess exited with code {exit_.returncode} (log: {exit_.log_path})"


def _stage_dir(inputs: RunInputs, fmt: str) -> Path:
    path = inputs.out_dir / "stages" / fmt
    path.mkdir(parents=True, exist_ok=True)
    return path


def _weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin"))


def _recipe_text(recipe: Recipe) -> str:
    parts = [f"{recipe.bits}-bit"]
    if recipe.group_size:
        parts.append(f"group {recipe.group_size}")
    if recipe.calibration_samples:
        parts.append(f"{recipe.calibration_samples} calibration texts")
    return ", ".join(parts)


def write_outputs(out_dir: Path, report: RunReport, samples: tuple[dict, ...]) -> None:
    """samples.jsonl, report.json (the typed report as built, schema.report_json) and the reports rendered from
    that same report."""
    from harness.report import write_reports

    atomic_write_text(out_dir / "samples.jsonl", "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    atomic_write_text(out_dir / "report.json", report_json(report))
    write_reports(out_dir, report)
