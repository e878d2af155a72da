"""A format's serving stage (--backend NAME of a serving engine: vllm, or a plugin's): whether the engine can serve
it, and the served run (scores, latency, load, fidelity through the server) as a Served record; a format the engine
cannot serve is scored in transformers and its report row says why."""

from __future__ import annotations

from harness import progress
from harness.cachekeys import reusable
from harness.device_plan import TOKENIZER_DIFFERS
from harness.fidelity.plan import FidelityPlan
from harness.formats import format_spec
from harness.measure.probe import Measurement
from harness.records import Artifact, DeviceRun, FormatRun, ResultFile, RunInputs, Served
from harness.runtime.serving_engine import is_serving_engine, serving_engine
from harness.served import run_served, served_entry, served_format, served_refusal


def served_refusal_for(inputs: RunInputs, fmt: str) -> str | None:
    if not is_serving_engine(inputs.spec.backend):
        return None
    return served_refusal(inputs, format_spec_of(inputs, fmt), inputs.spec.vllm_endpoints.get(fmt))


def format_spec_of(inputs: RunInputs, fmt: str):
    """The FormatSpec of a built-in format, or the one a candidate's quantization_config describes."""
    return inputs.candidates[fmt].format_spec() if fmt in inputs.candidates else format_spec(fmt)


def serve(inputs: RunInputs, fmt: str, artifact: Artifact, device: DeviceRun, refused: str | None,
          devices: str | None) -> Served:
    """Score and time the format through the serving engine's server; one the engine cannot serve is scored in
    transformers (its report row says why the engine cannot serve it, and it cannot be GO)."""
    engine = serving_engine(inputs.spec.backend)
    endpoint = inputs.spec.vllm_endpoints.get(fmt)
    if refused:
        progress.say(f"{fmt}: not served by {engine.title}: {refused}")
        return Served(served_entry(inputs, endpoint, status="unsupported", reason=refused), {},
                      fidelity=FidelityPlan((), {}, f"not measured: {engine.title} does not serve this format"))
    served = served_format(inputs, fmt, artifact.key, artifact.path, format_spec_of(inputs, fmt), devices)
    generations: dict[str, ResultFile] = {}
    # The server is planned before the measurement is read back (the format as run_served has always seen it).
    planned = FormatRun(fmt, artifact=artifact.entry, measurement=Measurement(**device.measurement.as_dict()),
                        devices=devices)
    reference = (device.measurement.read() or {}).get("probe_reply") if fmt == "baseline" else None
    refused_fidelity = TOKENIZER_DIFFERS if inputs.candidate_notes.get(fmt) else None
    if not (refused_fidelity or engine.prompt_logprobs):
        refused_fidelity = f"not measured: {engine.title} gives no prompt log-probabilities"
    fidelity: dict[str, str] | None = None if refused_fidelity else {}
    block = run_served(inputs, served, endpoint, generations, lambda path: reusable(inputs.spec, path), planned,
                       reference_reply=reference, fidelity=fidelity)
    error = None if block.status == "ok" else f"serving with {engine.title} failed: {block.reason}"
    missing = [e.name for e in inputs.evalsets if e.name not in (fidelity or {})]
    note = refused_fidelity or ((f"not measured through {engine.title} for {', '.join(missing)}: the served "
                                 "baseline left no reference there (it was not served, or failed)")
                                if missing and fmt != "baseline" else None)
    return Served(block, generations, ("serve",), error,
                  FidelityPlan((), fidelity or {}, note))
