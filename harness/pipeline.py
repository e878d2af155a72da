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

from harness import progress
from harness.artifacts import artifact_for
from harness.cache import atomic_write_json, atomic_write_text
from harness.calibration import load_calibration
from harness.collect import collect_results, failure_reason
from harness.config import RunSpec
from harness.device_plan import device_job, pending_evaluation
from harness.errors import Terminated, UserError, interrupted_exit_code
from harness.evalsets import load_evalsets
from harness.evalsets.prompts import check_prompt_lengths, render_prompts
from harness.executors.base import Placement, run_chains
from harness.executors.registry import executor_for
from harness.candidates import check_baseline_is_full_precision, read_candidates
from harness.jobs import stage_dir
from harness.launcher import run_worker
from harness.metrics import metric_names
from harness.policy import load_policy
from harness.quantize import recipe_for
from harness.quantize.base import Recipe
from harness.records import Artifact, DeviceRun, FormatRun, RunInputs
from harness.report.schema import RunReport, report_json
from harness.runtime.serving_engine import is_serving_engine, serving_engine
from harness.serving import serve, served_refusal_for
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
    placement = Placement()
    try:
        placement = run_all_formats(inputs, runs)
    except KeyboardInterrupt as exc:
        interrupted = interrupted_exit_code(exc)
        progress.say(f"{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: writing a partial report; "
                     f"`quantgate run --resume --out {inputs.out_dir}` continues from what finished")
        for fmt in spec.all_formats():
            runs.setdefault(fmt, FormatRun(fmt, status="interrupted", error="not run: the run was interrupted"))
    runs = {fmt: runs[fmt] for fmt in spec.all_formats()}  # report order, whichever lane finished first
    report = finish(inputs, runs, started, placement)
    return report, interrupted or report.exit_code


def finish(inputs: RunInputs, runs: dict[str, FormatRun], started: float,
           placement: Placement | None = None) -> RunReport:
    """Score, decide, plan, build and write the report. Should any of that fail, a report is still written, every
    format in it failed with that reason (the stages' results stay in the cache for --resume), before the error
    goes on to the CLI (exit 3)."""
    from harness.evaluate import evaluate_formats
    from harness.report.build import build_report

    try:
        evaluation = evaluate_formats(inputs, runs)
        report = build_report(inputs, runs, evaluation, wall_s=time.time() - started, placement=placement)
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


def run_all_formats(inputs: RunInputs, runs: dict[str, FormatRun]) -> Placement:
    """Every format's chain (run_format), run by the executor --executor names (harness.executors); where the
    chains ran comes back for the report."""
    with executor_for(inputs, run_format) as executor:
        run_chains(executor, inputs.spec.all_formats(), runs)
        return executor.placement()


def prepare_inputs(spec: RunSpec) -> RunInputs:
    """Everything that can be checked before expensive work starts is checked here."""
    engine = serving_engine(spec.backend) if is_serving_engine(spec.backend) else None
    if engine is not None:
        engine.check_endpoints(spec.vllm_endpoints)
    out_dir = prepare_output_dir(Path(spec.out))
    full_evalsets = load_evalsets(spec.evalsets, allow_outside_paths=spec.allow_outside_paths)
    evalsets = [replace(e, items=e.items[: spec.max_items]) for e in full_evalsets] if spec.max_items else full_evalsets
    policy = load_policy(spec.policy, known_metrics=metric_names(), known_evalsets=[e.name for e in evalsets],
                         known_languages=sorted({e.language for e in evalsets} - {"auto"}))
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
    serving_install = engine.locate(spec) if engine is not None else None
    # Only a run whose inputs passed every check is saved for --resume.
    atomic_write_json(out_dir / "run.json", spec.model_dump())
    inputs = RunInputs(spec, out_dir, source, model_config, evalsets, policy, recipes, prompts, calibration,
                       serving_install, candidates, candidate_notes)
    announce_served_refusals(inputs)
    return inputs


def announce_served_refusals(inputs: RunInputs) -> None:
    """A serving-engine backend: what the engine cannot serve is said before any model loads (the report repeats
    it per format)."""
    for fmt in inputs.spec.all_formats():
        refused = served_refusal_for(inputs, fmt)
        if refused:
            title = serving_engine(inputs.spec.backend).title
            progress.say(f"{fmt}: {title} will not serve it, so it is scored in transformers and cannot be GO on "
                         f"this backend: {refused}")


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
    artifact = artifact_for(inputs, fmt, devices)
    if artifact.error:
        return FormatRun(fmt, status="failed", error=artifact.error, artifact=artifact.entry,
                         stages_run=list(artifact.stages_run), devices=devices)
    refused = served_refusal_for(inputs, fmt)
    served_backend = is_serving_engine(inputs.spec.backend)
    device = run_on_device(inputs, fmt, artifact, devices, generate=not served_backend or bool(refused))
    served = None
    if served_backend and device.error is None:
        served = serve(inputs, fmt, artifact, device, refused, devices)
    return collect_results(fmt, artifact, device, served, devices)


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
        job = device_job(inputs, fmt, artifact.path, plan.measure, list(tasks), devices, fidelity)
        failure_path = Path(job.failure_path)
        failure_path.unlink(missing_ok=True)
        exit_ = run_worker(job, stage_dir(inputs.out_dir, fmt) / "device.job.json", inputs.out_dir / "logs" / f"{fmt}.log",
                           fmt, inputs.spec.memory_limit_bytes_for(fmt))
        stages_run = tuple((["measure"] if plan.measure else []) + [f"generate:{t.evalset}" for t in tasks]
                           + [f"fidelity:{t.evalset}" for t in fidelity])
        if exit_.returncode != 0:
            error = failure_reason(failure_path, exit_, "evaluation")
    else:
        progress.say(f"{fmt}: reusing cached results (measurement" + (
            f", generations on {len(plan.generations)} evalset(s))" if generate else ")"))
    return DeviceRun(plan.measurement, plan.generations, stages_run, error, plan.fidelity)


def write_outputs(out_dir: Path, report: RunReport, samples: tuple[dict, ...]) -> None:
    """samples.jsonl, report.json (the typed report as built, schema.report_json) and the reports rendered from
    that same report."""
    from harness.report import write_reports

    atomic_write_text(out_dir / "samples.jsonl", "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    atomic_write_text(out_dir / "report.json", report_json(report))
    write_reports(out_dir, report)
