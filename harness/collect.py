"""A format's result from its stages: records read back into a FormatRun, with outputs that cannot be scored and
worker failures turned into one readable reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.cache import read_json
from harness.logtext import last_cause
from harness.fidelity.plan import FidelityPlan
from harness.measure.probe import Measurement
from harness.records import Artifact, DeviceRun, EvalsetGeneration, FormatRun, ResultFile, Served


def collect_results(fmt: str, artifact: Artifact, device: DeviceRun, served: Served | None,
                    devices: str | None) -> FormatRun:
    """The format's result: its stages' records with the measurement and the generations read back."""
    generations = {**device.generations, **(served.generations if served else {})}
    fidelity = served.fidelity if served else device.fidelity  # backend vllm: the server's (harness.fidelity.served)
    error = device.error or (served.error if served else None)
    run = FormatRun(fmt, status="failed" if error else "ok", error=error, artifact=artifact.entry,
                    measurement=Measurement(**device.measurement.as_dict(), result=device.measurement.read()),
                    generations={name: read_generation(file) for name, file in generations.items()},
                    stages_run=[*artifact.stages_run, *device.stages_run, *(served.stages_run if served else ())],
                    served=served.block if served else None, devices=devices,
                    fidelity=read_fidelity(fmt, fidelity), fidelity_note=fidelity.note)
    missing = [n for n, g in run.generations.items() if g is None]
    if run.status == "ok" and (missing or run.measurement.result is None):
        return replace(run, status="failed",
                       error="evaluation finished without results for " + ", ".join(missing or ["measurement"]))
    unreadable = unreadable_measurement(run.measurement)
    if unreadable:
        return replace(run, status="failed" if run.status == "ok" else run.status, error=run.error or unreadable,
                       measurement=Measurement(run.measurement.path, run.measurement.key, None))
    degenerate = degenerate_outputs(run.generations, served=served is not None and bool(served.generations))
    if run.status == "ok" and degenerate:
        return replace(run, status="failed", error=degenerate)
    return run


def unreadable_measurement(measurement: Measurement) -> str | None:
    """Why a measurement file's figures cannot be read as the report's blocks (None: they can)."""
    problem = measurement.unreadable()
    return (f"the measurement in {measurement.path} is not one quantgate wrote ({problem}); delete it or run with "
            "--no-cache") if problem else None


def read_generation(file: ResultFile) -> EvalsetGeneration | None:
    result = file.read("outputs")
    return EvalsetGeneration.from_result(result) if result is not None else None


def read_fidelity(fmt: str, plan: FidelityPlan) -> dict[str, dict]:
    """A format's comparisons read back (the baseline's references are read by the others' workers only)."""
    if fmt == "baseline":
        return {}
    results = {name: read_json(Path(path)) for name, path in plan.results.items()}
    return {name: value for name, value in results.items() if isinstance(value, dict) and "items" in value}


def degenerate_outputs(generations: dict[str, EvalsetGeneration | None], *, served: bool = False) -> str | None:
    """Why outputs cannot be scored at all: every prediction empty, or (over 4 items or more) one text for every
    item. Garbage like that is a failure with its reason, never a verdict."""
    predictions = [o.prediction for g in generations.values() if g for o in g.outputs]
    who = "the vLLM server" if served else "the model"
    if len(predictions) >= 2 and not any(p.strip() for p in predictions):
        return (f"{who} answered nothing: every one of its {len(predictions)} predictions is empty, so nothing can "
                "be scored; read the format's log (a server or kernel that fails quietly does this)")
    if len(predictions) >= 4 and len(set(predictions)) == 1:
        return (f"{who} gave one answer to every item ({len(predictions)} predictions, all "
                f"{predictions[0][:60]!r}), so nothing can be scored; read the format's log")
    return None


def failure_reason(failure_path: Path, exit_, stage: str, engine: str | None = None) -> str:
    """One line: why the stage's subprocess failed (its own account, else the log's last exception line), with
    `engine` ("GPTQModel 7.6.0") when it names what did the work, and what to try."""
    failure = read_json(failure_path)
    by = f" in {engine}" if engine else ""
    if isinstance(failure, dict) and failure.get("error"):
        return f"{stage} failed{by}: {failure['error']} (log: {exit_.log_path})"
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
    last = last_exception(Path(exit_.log_path)) if exit_.log_path else None
    if last:
        return (f"{stage} failed{by}: {last} (the subprocess exited with code {exit_.returncode}); the engine "
                "cannot handle this model or setting: try another format or engine version, and read the log "
                f"for the traceback ({exit_.log_path})")
    return f"{stage} subprocess exited with code {exit_.returncode} (log: {exit_.log_path})"




def last_exception(log_path: Path, tail_bytes: int = 256 * 1024) -> str | None:
    """The last line of the log that states an exception ("TypeError: ... missing 1 required positional
    argument: 'layer_type'"), cut to 300 characters; None when there is none or no log."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - tail_bytes))
            lines = handle.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    cause = last_cause(lines)
    return cause[:300] if cause else None
