"""The run's typed report (harness.report.schema.RunReport), built from the stages' results and their evaluation
(harness.evaluate)."""

from __future__ import annotations

import time

from harness import __version__
from harness.decide import baseline_scores, exit_code, recommend
from harness.environment import environment
from harness.evaluate import Evaluation
from harness.format_plans import ELEMENT_BYTES, max_model_len_of, plan_capacity, report_capacity
from harness.measure.kv import kv_bytes_per_token
from harness.measure.latency import latency_block
from harness.records import FormatRun, RunInputs
from harness.report.schema import (SCHEMA_VERSION, Calibration, CapacityTarget, Cluster, ClusterNode, Device,
                                   FormatPlacement,
                                   EvalsetInfo, EvalsetLatency, FormatResult, Generation, LatencyRun, Memory, Model,
                                   Recommendation, RunReport, ServingPlan, Settings, SpotCheckEntry, Tool)
from harness.report.schema import Policy as SchemaPolicy


def build_report(inputs: RunInputs, runs: dict[str, FormatRun], evaluation: Evaluation, wall_s: float,
                 placement=None) -> RunReport:
    """The report as report.json will hold it, built block by block as the schema's objects (each block keeps the
    order its fields are given in: schema.report_json writes it back byte for byte). A value that is not what its
    field declares fails here, naming the block, rather than being written as a string. `placement`
    (harness.executors.base.Placement): where the chains ran; a cluster's is the report's `cluster` block
    (cluster_block), which a run on one machine lacks, its report byte for byte what it was."""
    from harness.metrics import tokenizer_name
    from harness.runtime.device import device_info

    spec = inputs.spec
    outcomes, decisions = evaluation.outcomes, evaluation.decisions
    baseline = outcomes["baseline"]
    planned = report_capacity(inputs)
    max_model_len = max_model_len_of(inputs)
    formats = {name: across_nodes(format_result(inputs, run, evaluation, max_model_len), spec, placement)
               for name, run in runs.items()}
    return RunReport(
        schema_version=SCHEMA_VERSION,
        tool=Tool(name="quantgate", version=__version__),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        wall_s=round(wall_s, 1),
        model=Model(**inputs.source.as_dict(),
                    architecture=(inputs.model_config.get("architectures") or ["?"])[0],
                    num_parameters=_num_parameters(runs),
                    dtype=inputs.model_config.get("dtype") or inputs.model_config.get("torch_dtype")),
        device=Device.model_validate(device_info(spec.threads)),
        environment=environment(),
        **({"cluster": cluster} if (cluster := cluster_block(placement, runs)) else {}),
        settings=Settings(seed=spec.seed, batch_size=spec.batch_size, max_items=spec.max_items,
                          max_new_tokens=spec.max_new_tokens, formats=list(spec.formats),
                          candidates=dict(spec.candidates), dtype=spec.dtype, threads=spec.threads,
                          latency_requests=spec.latency_requests, warmup_requests=spec.warmup_requests,
                          resamples=inputs.policy.resamples, decoding="greedy", backend=spec.backend,
                          capacity=CapacityTarget(**planned.settings.model_dump(), target_source=planned.target_source,
                                                  tensor_parallel_size=spec.tensor_parallel_size,
                                                  pipeline_parallel_size=spec.pipeline_parallel_size)),
        policy=SchemaPolicy.model_validate(inputs.policy.as_dict()),
        evalsets={e.name: EvalsetInfo(task=e.task, language=e.language, n=len(e.items), hash=e.content_hash,
                                      spec=str(e.spec_path), metrics=list(e.metrics), gate=list(e.gate),
                                      tokenizer=tokenizer_name(e.language, e.task), max_new_tokens=e.max_new_tokens)
                  for e in inputs.evalsets},
        formats=formats,
        recommendation=Recommendation(**recommend({n: d.verdict for n, d in decisions.items()},
                                                  {n: o.peak_bytes for n, o in outcomes.items()})),
        # a baseline that failed leaves nothing judged, whatever the candidates' (or no candidates') verdicts
        exit_code=exit_code({n: d.verdict for n, d in decisions.items()}, inputs.policy)
        or int(baseline.status != "ok"),
        samples="samples.jsonl",
    )


def cluster_block(placement, runs: dict[str, FormatRun]) -> Cluster | None:
    """The cluster a run's formats ran on: its nodes when the run started, and each format's node and the GPUs its
    task was given. None for a run on one machine."""
    cluster = placement.cluster if placement is not None else None
    if cluster is None:
        return None
    return Cluster(executor=cluster.executor, version=cluster.version,
                   nodes=[ClusterNode(node=n.node, cpus=n.cpus, gpus=n.gpus, memory_bytes=n.memory_bytes)
                          for n in cluster.nodes],
                   formats={name: FormatPlacement(node=placement.nodes[name], devices=runs[name].devices)
                            for name in runs if name in placement.nodes})


def across_nodes(result: FormatResult, spec, placement) -> FormatResult:
    """On a cluster whose largest node has fewer GPUs than tensor x pipeline parallel size, the vLLM plan's command
    serves the format across nodes as the run's served server would (harness.runtime.vllm.multinode), and says so."""
    from harness.runtime.vllm.multinode import DISTRIBUTED_BACKEND, spanning_note, spans_nodes

    cluster = placement.cluster if placement is not None else None
    plan = (result.serving or {}).get("vllm")
    parallel = (spec.tensor_parallel_size, spec.pipeline_parallel_size)
    if cluster is None or plan is None or not plan.command or not spans_nodes(*parallel, cluster.gpus_per_node()):
        return result
    flag, value = DISTRIBUTED_BACKEND
    spanning = plan.model_copy(update={"command": f"{plan.command} {flag} {value}", "args": [*plan.args, [flag, value]],
                                       "notes": [*plan.notes, spanning_note(parallel, cluster.gpus_per_node())]})
    return result.model_copy(update={"serving": {**result.serving, "vllm": spanning}})


def format_result(inputs: RunInputs, run: FormatRun, evaluation: Evaluation, max_model_len: int) -> FormatResult:
    """One format's block: what its stages measured (measured_fields), then its verdict and why."""
    measured = measured_fields(inputs, run, max_model_len)
    if run.name == "baseline":
        judged = dict(role="baseline", verdict="BASELINE" if run.status == "ok" else "NO-GO",
                      reasons=[] if run.status == "ok" else [f"baseline failed: {run.error}"],
                      checks=[], scores=baseline_scores(evaluation.outcomes["baseline"]), rule=None, fidelity=None)
    else:
        decision = evaluation.decisions[run.name]
        judged = dict(role="candidate", verdict=decision.verdict,
                      reasons=[*decision.reasons, *comparison_notes(inputs, run.name)],
                      checks=decision.checks, scores=decision.scores, rule=decision.rule or None,
                      fidelity=decision.fidelity or None)
        if decision.spot_checks is not None:  # required and none judged yet (otherwise absent from report.json)
            judged["spot_checks"] = SpotCheckEntry.model_validate(decision.spot_checks)
    return FormatResult(**measured, **judged)


def comparison_notes(inputs: RunInputs, name: str) -> list[str]:
    """What a verdict was compared with when that is not a full-precision baseline of the same tokenizer, and what
    it rests on when transformers ran the format by decompressing it."""
    notes = list(inputs.candidate_notes.get(name, []))
    if decompressed_here(inputs, name):
        notes.append(f"{name}: transformers ran this compressed-tensors checkpoint by decompressing its weights to "
                     "16 bits on this CPU: the scores and fidelity are the format's numerics, while its speed and "
                     "memory here are a 16-bit model's (the serving plans size its weights as stored)")
    quant = inputs.model_config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        bits = quant.get("bits") if isinstance(quant, dict) else None
        notes.append(f"compared with a quantized baseline ({method}{f' {bits}-bit' if bits else ''}, "
                     "--baseline-is-quantized), not the full-precision model")
    return notes


def decompressed_here(inputs: RunInputs, name: str) -> bool:
    """Whether the format is a compressed-tensors checkpoint (fp8, nvfp4, w8a8, or such a candidate) that this run
    scored in transformers on a CPU, where compressed-tensors decompresses it."""
    from harness.formats import FORMAT_SPECS
    from harness.runtime.device import is_cuda

    if inputs.spec.backend != "transformers" or is_cuda():
        return False
    candidate = inputs.candidates.get(name)
    if candidate is not None:
        return str(candidate.method).replace("_", "-") == "compressed-tensors"
    spec = FORMAT_SPECS.get(name)
    return spec is not None and spec.engine == "compressed-tensors"


def measured_fields(inputs: RunInputs, run: FormatRun, max_model_len: int) -> dict:
    """A format block's fields from its stages, in report order, each block a schema object."""
    measurement = run.measurement
    compute_dtype = measurement.compute_dtype
    # Predicted in the dtype the run computed in, so it is comparable with the measured figure; the capacity plan
    # assumes vLLM's 16-bit KV cache and 16-bit weights whatever this host computed in.
    upcast = ELEMENT_BYTES.get(compute_dtype, 2) / 2
    kv_predicted = kv_bytes_per_token(inputs.model_config, kv_dtype_bytes=2 * upcast)
    recipe = inputs.recipes.get(run.name)
    calibrated = inputs.calibration is not None and recipe is not None and recipe.calibration_samples
    entry = {"status": run.status, "error": run.error,
             "artifact": run.artifact,
             "stages_run": list(run.stages_run), "compute_dtype": compute_dtype,
             "calibration": Calibration.model_validate(inputs.calibration.summary(recipe.calibration_samples))
             if calibrated else None}
    if measurement.measured:
        measured = measurement.memory
        memory = measured.model_copy(update=dict(
            device="cuda" if measured.cuda_max_allocated_bytes is not None else "cpu",
            kv_bytes_per_token=kv_predicted,
            figures=("NVML device used memory (what nvidia-smi shows); allocator peaks alongside"
                     if measured.nvml_peak_used_bytes is not None else
                     "CUDA allocator reserved peak" if measured.cuda_max_reserved_bytes is not None
                     else "peak RSS of the format's subprocess (CPU)"),
            **({"timeline": measurement.timeline} if measurement.timeline else {})))
    else:
        memory = Memory(device=None, peak_bytes=None, weights_bytes=None, kv_bytes_per_token=kv_predicted)
    entry["memory"] = memory
    generated = [g for g in run.generations.values() if g]
    entry["latency"] = None
    if measurement.timed:
        update: dict = {}
        batches = [b for g in generated for b in g.batches]
        if batches:  # the evaluation's own batches: every request of every evalset at the evaluation batch size
            update["batched"] = LatencyRun.model_validate(dict(latency_block(batches),
                                                               workload="evaluation batches, all evalsets"))
        entry["latency"] = measurement.latency.model_copy(update=dict(update, device=memory.device,
                                                                      threads=inputs.spec.threads))
    # Each plan once: the report writes `capacity`, version 1's shape of the vllm plan, from it (FormatResult).
    plans = plan_capacity(inputs, run, max_model_len)
    entry["serving"] = None if plans is None else {engine: ServingPlan.model_validate(plan.as_dict())
                                                   for engine, plan in plans.items()}
    if run.served is not None:
        entry["served"] = run.served
    entry["generation"] = Generation(
        items=sum(len(g.outputs) for g in generated), new_tokens=sum(g.new_tokens for g in generated),
        wall_s=round(sum(g.wall_s for g in generated), 2),
        batched_latency=[EvalsetLatency.model_validate({"evalset": g.evalset, **g.latency})
                         for g in generated if g.latency])
    return entry


def _num_parameters(runs: dict[str, FormatRun]) -> int | None:
    return runs["baseline"].measurement.memory.parameters if "baseline" in runs else None
