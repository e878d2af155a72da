"""One format's work in its own process: `python -m harness.worker JOB.json`.

A fresh process per format keeps peak-memory figures clean and contains crashes and OOMs. The job file says
what to do; every finished piece is written atomically to the path the job names, so whatever finished before
a crash or a kill survives it. Progress goes to the parent as `@@progress` lines on the original stdout;
everything else (library banners, warnings) is redirected to the log on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from harness import progress
from harness.cache import atomic_write_json, remove_tree
from harness.jobs import DeviceJob, GenerateTask, QuantizeJob, read_job
from harness.runtime.base import Runtime


def main(argv: list[str]) -> int:
    job = read_job(Path(argv[0]))
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # library prints land in the log, not in the protocol pipe
    sys.stdout = sys.stderr
    progress.configure(protocol_stream=protocol)
    if job.devices:  # --devices: this format's lane; set before torch initializes CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = job.devices
    from harness.plugins import load_plugins
    from harness.quiet import quiet_repeated_library_logs
    from harness.runtime.device import configure_threads

    quiet_repeated_library_logs()
    configure_threads(job.threads)
    seed_everything(job.seed)
    try:
        load_plugins()  # a plugin's format must be known here too (QUANTGATE_PLUGINS is inherited)
        if isinstance(job, QuantizeJob):
            run_quantize(job)
        else:
            run_device_job(job)
    except BaseException as exc:  # noqa: BLE001 - the parent needs a reason whatever happened
        traceback.print_exc()
        atomic_write_json(Path(job.failure_path), {"status": "failed",
                                                      "error": describe_failure(exc, getattr(job, "batch_size", None)),
                                                      "exception": type(exc).__name__})
        return 1
    return 0


def seed_everything(seed: int) -> None:
    """--seed reaches every random number generator the engines use (Python, NumPy, torch on every device)."""
    import random

    import numpy
    import torch

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


def describe_failure(exc: BaseException, batch_size: int | None = None) -> str:
    """One line for the run's report; an OOM carries diagnose's answer, told the batch the worker ran (so a bare
    OOM line of quantgate's own generation is not read as weights that need quantizing)."""
    from harness.measure.oom import oom_reason, parse_cuda_oom
    from harness.quantize.smoke import ArtifactCheckFailed

    text = str(exc)
    if isinstance(exc, ArtifactCheckFailed):
        return text
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text.lower() or "can't allocate memory" in text:
        figures = parse_cuda_oom(text)
        if figures is not None:  # the same answer as `quantgate diagnose` gives for the message
            from harness.diagnose.advise import Context, diagnose_text

            context = Context(flags=(("batch_size", batch_size),)) if batch_size else Context()
            diagnosis = diagnose_text(text, "the worker", context)
            first = diagnosis.changes[0] if diagnosis.changes else None
            return (f"out of memory: {oom_reason(figures)}; diagnosis: {diagnosis.summary}"
                    + (f"; first change: {first.setting} ({first.effect})" if first else ""))[:700]
        return "out of memory: " + oom_reason(figures)
    if isinstance(exc, MemoryError):
        return "out of host memory: " + oom_reason(None)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:500]


def run_quantize(job: QuantizeJob) -> None:
    from harness.quantize import quantizer_for
    from harness.quantize.base import Recipe
    from harness.quantize.smoke import check_artifact_generates

    out_dir = Path(job.out_dir)
    partial = out_dir.with_name(out_dir.name + ".part")
    remove_tree(partial)
    partial.mkdir(parents=True)
    calibration = json.loads(Path(job.calibration_path).read_text(encoding="utf-8"))
    recipe = Recipe(**job.recipe)
    progress.say(f"quantizing with {job.manifest['engine']} ({len(calibration)} calibration texts)")
    started = time.time()
    quantizer_for(recipe.format).quantize(Path(job.source_path), recipe, calibration, partial,
                                          trust_remote_code=job.trust_remote_code)
    seconds = round(time.time() - started, 1)
    progress.say("checking that the saved artifact loads and generates")
    smoke = check_artifact_generates(partial, source=Path(job.source_path), trust_remote_code=job.trust_remote_code)
    manifest = dict(job.manifest, quantize_seconds=seconds, smoke_replies=list(smoke.replies),
                    smoke_perplexity={"artifact": smoke.perplexity, "source": smoke.source_perplexity},
                    created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    atomic_write_json(partial / "quantgate_manifest.json", manifest)
    remove_tree(out_dir)
    partial.rename(out_dir)


def run_device_job(job: DeviceJob) -> None:
    """Load, measure (when the job has a measure task) and generate, then (when the task asks) the profile forward.
    A measured job runs inside a MemoryTimeline from the load to the profile: the measurement is written as soon as
    it is taken (it survives a crash in generation), again with the profile, and again at the end with the whole
    job's series as `memory_timeline`. A job of generate tasks only (measurement cached) samples nothing: the
    cached measurement keeps the timeline of the run that measured."""
    import contextlib
    import importlib

    from harness.measure.timeline import MemoryTimeline, whole_job_peaks
    from harness.runtime.registry import runtime_class

    runtime = runtime_class(job.runtime)
    for library in runtime.preload:  # before the load phase, so their RSS is not counted as weights
        importlib.import_module(library)
    measure = job.measure
    with MemoryTimeline(stage="load") if measure else contextlib.nullcontext() as timeline:
        result = _load_measure_generate(job, runtime, timeline)
    if measure and result is not None:
        result["memory_timeline"] = timeline.as_dict()
        result["memory"] = whole_job_peaks(result["memory"], result["memory_timeline"])
        atomic_write_json(Path(measure.result_path), result)


def _load_measure_generate(job: DeviceJob, runtime: type[Runtime], timeline) -> dict | None:
    from harness.measure.memory import memory_in_use, track_peak
    from harness.measure.probe import measure_format

    with track_peak() as load_peak:
        model = runtime.load(Path(job.artifact_path), dtype=job.dtype, trust_remote_code=job.trust_remote_code)
    loaded_bytes = memory_in_use() - load_peak.in_use_start_bytes
    progress.say("model loaded")
    encoded: dict[str, list[int]] = {}

    def tokens(prompt: str) -> list[int]:
        if prompt not in encoded:
            encoded[prompt] = model.encode(prompt)
        return encoded[prompt]

    result = None
    if job.measure:
        result = measure_format(model, job.measure, tokens, load_peak, model.weights_bytes(), loaded_bytes,
                                timeline=timeline)
        atomic_write_json(Path(job.measure.result_path), result)
    caches = _prompt_cache_dirs(model, job)
    try:
        for task in job.generate:
            if timeline is not None:
                timeline.mark(f"generate:{task.evalset}")
            atomic_write_json(Path(task.result_path), generate_evalset(model, task, tokens, job.batch_size,
                                                                       caches.get(task.evalset)))
        if result is not None and job.measure.profile_tokens:
            result["profile"] = _profile(model, job.measure, timeline)
            atomic_write_json(Path(job.measure.result_path), result)
        if job.fidelity:
            _fidelity(model, job.fidelity, timeline, job.batch_size, caches)
    finally:
        for directory in caches.values():
            remove_tree(directory)
    return result


def _prompt_cache_dirs(model, job: DeviceJob) -> dict[str, Path]:
    """evalset -> a fresh directory for its generation's prompt caches (harness.fidelity.prompt_cache), for the
    evalsets this job both generates and teacher-forces, when the runtime can hand its caches over."""
    import tempfile

    if not hasattr(model, "generate_keeping_prompt_cache"):
        return {}
    wanted = {task.evalset: task for task in job.fidelity}
    dirs = {}
    for task in job.generate:
        fidelity = wanted.get(task.evalset)
        if fidelity is not None:
            near = Path(fidelity.result_path or fidelity.reference_path).parent
            near.mkdir(parents=True, exist_ok=True)
            dirs[task.evalset] = Path(tempfile.mkdtemp(prefix=".prompt-cache-", dir=near))
    return dirs


def _fidelity(model, tasks, timeline, batch_size: int, caches: dict[str, Path] | None = None) -> None:
    """The fidelity tasks (harness.fidelity), last and outside the timeline: their full-vocabulary forwards are
    not the evaluated workload, and must not raise the peaks its memory budget is judged on. They are batched as
    generation is (--batch-size), the reference and every comparison alike."""
    from harness.fidelity import TOP_K
    from harness.fidelity.teacher import compare_to_reference, write_reference

    if timeline is not None:
        timeline.stop()
    for task in tasks:
        cache = (caches or {}).get(task.evalset)
        if task.mode == "reference":
            write_reference(model, task, TOP_K, batch_size, cache)
        else:
            compare_to_reference(model, task, batch_size, cache)


def _profile(model, measure, timeline) -> dict:
    """The profile forward at the serving plan's token budget (harness.measure.profile), last: the timeline stops
    first, so that the job's peaks (and the memory budget judged on them) stay the evaluated workload's, and what
    the profile leaves in the allocator or the RSS cannot raise the generations' figures."""
    from harness.measure.profile import measure_profile

    if timeline is not None:
        timeline.stop()
    return measure_profile(model, measure.profile_tokens, measure.profile_sequences)


def generate_evalset(model, task: GenerateTask, tokens, batch_size: int, prompt_cache_dir: Path | None = None) -> dict:
    """Every item of the task, greedy, in batches of prompts of similar length. With prompt_cache_dir, each batch's
    prompt KV cache is kept there for the fidelity stage (harness.fidelity.prompt_cache); the time that takes is
    left out of wall_s and cpu_s and reported as prompt_cache_s."""
    from dataclasses import asdict

    from harness.measure.latency import latency_block

    items = task.items
    # Longest first: the biggest batch (peak memory, any OOM) comes first, and similar lengths share a batch.
    order = sorted(range(len(items)), key=lambda i: (-len(tokens(items[i].prompt)), i))
    outputs: list[dict | None] = [None] * len(items)
    timings = []
    started, cpu_started = time.time(), time.process_time()
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    label = f"generating {task.evalset}"
    progress.step(label, 0, len(items))
    done = 0
    writer = None
    if prompt_cache_dir is not None:
        from harness.fidelity.prompt_cache import PromptCacheWriter

        writer = PromptCacheWriter(prompt_cache_dir)
    cache_wall = cache_cpu = 0.0
    for batch in batches:
        prompts = [tokens(items[i].prompt) for i in batch]
        if writer is None:
            generations, timing = model.generate(prompts, task.max_new_tokens)
        else:
            def keep(width, cache, batch=batch, prompts=prompts):
                nonlocal cache_wall, cache_cpu
                wall, cpu = time.time(), time.process_time()
                writer.save([items[i].id for i in batch], [len(p) for p in prompts], width, cache)
                cache_wall += time.time() - wall
                cache_cpu += time.process_time() - cpu

            generations, timing = model.generate_keeping_prompt_cache(prompts, task.max_new_tokens, keep)
        timings.append(timing)
        for index, generation in zip(batch, generations):
            outputs[index] = {"id": items[index].id, "prediction": generation.text,
                              "new_tokens": generation.new_tokens, "prompt_tokens": generation.prompt_tokens,
                              "token_ids": list(generation.token_ids)}
        done += len(batch)
        progress.step(label, done, len(items))
    return {"evalset": task.evalset, "key": task.key, "outputs": outputs,
            "latency": latency_block(timings), "batches": [asdict(t) for t in timings],
            "wall_s": round(time.time() - started - cache_wall, 3),
            # CPU time of the loop: on a shared machine, unlike wall time, it does not count other jobs' turns
            "cpu_s": round(time.process_time() - cpu_started - cache_cpu, 3),
            "prompt_cache_s": round(cache_cpu, 3) if writer is not None else None,
            "prompt_tokens_max": max((o["prompt_tokens"] for o in outputs), default=0)}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
