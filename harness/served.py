"""The served stage: each format as a serving engine (--backend NAME: vLLM, or one a plugin registers) runs it.

For one format: ask the engine whether it can serve it (before loading anything), start it with its planned
settings (or talk to the user's own server), send exactly the token ids the transformers backend would see, many
requests in flight, then time streamed requests at each concurrency, check the plan holds under load, and read the
engine's own start-up figures (KV cache, kernels). Results land in the cache like the transformers backend's: the
generations in the same shape (scored by the same code), the rest as the format's `served` block. Nothing here
names an engine: harness.runtime.serving_engine is the seam.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import ValidationError

from harness import progress
from harness.cache import atomic_write_json, cache_dir, read_json, stable_hash
from harness.capacity import PLANNERS, Target
from harness.capacity.gpus import this_gpu
from harness.evalsets.prompts import prompt_encoder
from harness.diagnose.advise import NotADiagnosableLog, diagnose_text
from harness.format_plans import longest_request, serving_plans
from harness.fidelity.served import (compare_served, served_comparison_path, served_reference_path,
                                     write_served_reference)
from harness.flags import flag_pairs
from harness.launcher import worker_environment
from harness.measure.kv import kv_bytes_per_token
from harness.measure.rss import RssSampler
from harness.formats import FormatSpec
from harness.records import FormatRun, ResultFile, RunInputs
from harness.report.schema import Served as ServedEntry
from harness.runtime.device import device_info, device_key
from harness.runtime.serving_engine import (LaunchPlan, PlanDoesNotFit, ServedFormat, ServerFailed, ServingEngine,
                                            serving_engine)
from harness.runtime.vllm.client import (CompletionRequest, Endpoint, RequestFailed, Sampling, complete,
                                         complete_all)
from harness.runtime.vllm.load import latency_at, saturation
from harness.source import load_tokenizer


def engine_of(inputs: RunInputs) -> ServingEngine:
    return serving_engine(inputs.spec.backend)


def served_refusal(inputs: RunInputs, spec: FormatSpec, endpoint: str | None) -> str | None:
    return engine_of(inputs).refusal(inputs.serving_install, spec, endpoint)


def launch_plan_for(inputs: RunInputs, served: ServedFormat, run: FormatRun | None = None) -> LaunchPlan:
    max_model_len = inputs.spec.capacity.max_model_len or longest_request(inputs)
    capacity_plan = lambda: local_gpu_plan(inputs, run, max_model_len) if run is not None else None  # noqa: E731
    return engine_of(inputs).launch_plan(inputs.spec, served, inputs.serving_install, max_model_len, capacity_plan)


def local_gpu_plan(inputs: RunInputs, run: FormatRun, max_model_len: int):
    """The capacity plan for the GPU(s) this server runs on: the report's plan for the serving engine (the planner
    registered under its name), on this device; None where no planner has its name."""
    engine = engine_of(inputs).name
    if engine not in PLANNERS:
        return None
    info = device_info(inputs.spec.threads)
    target = Target(this_gpu(info["name"], info["total_memory_bytes"], info.get("capability")),
                    num_gpus=inputs.spec.tensor_parallel_size,  # the plan splits by tensor parallelism
                    pipeline_parallel_size=inputs.spec.pipeline_parallel_size)  # and sizes the largest stage
    plans = serving_plans(inputs, run, target, max_model_len, engines=(engine,),
                          gpu_memory_utilization=inputs.spec.capacity.gpu_memory_utilization)
    return None if plans is None else plans[engine]


def served_key(inputs: RunInputs, served: ServedFormat, endpoint: str | None, plan: LaunchPlan, latency_workload: list,
               concurrencies: tuple[int, ...]) -> dict:
    """Everything a served figure depends on besides the prompts."""
    engine = engine_of(inputs)
    return {"artifact": served.artifact_key, "backend": engine.name, "endpoint": endpoint,
            engine.name: engine.cache_identity(inputs.serving_install),
            "args": list(plan.args), "env": plan.env, "sampling": [list(served.sampling.stop_token_ids),
                                                                   served.sampling.repetition_penalty],
            "device": device_key(1), "latency": latency_workload, "concurrency": list(concurrencies)}


def run_served(inputs: RunInputs, served: ServedFormat, endpoint_url: str | None,
               generations: dict[str, ResultFile], reusable, run: FormatRun | None = None, reference_reply: str | None = None,
               fidelity: dict[str, str] | None = None) -> ServedEntry:
    """Serve one format; fills generations[evalset] (its result file) and returns its `served` block (also
    cached; a cached block the schema refuses is served again). `reusable(path)` says whether a cache entry may be used (--no-cache). reference_reply (the baseline):
    transformers' greedy reply to the first latency prompt, which the server must reproduce
    (baseline_reproduced) before anything it answers is scored. fidelity gets evalset -> the path of the format's
    served fidelity (the baseline's: its reference; harness.fidelity.served)."""
    spec = inputs.spec
    try:
        plan = launch_plan_for(inputs, served, run)
    except PlanDoesNotFit as exc:
        return served_entry(inputs, endpoint_url, status="failed", reason=str(exc))
    concurrencies = tuple(dict.fromkeys(spec.concurrency or [1, plan.max_num_seqs]))
    latency_workload = [[list(ids), n] for ids, n in latency_requests(inputs)]
    base = served_key(inputs, served, endpoint_url, plan, latency_workload, concurrencies)
    key = stable_hash(base)
    block_path = cache_dir("results") / f"served-{key}.json"
    pending = []
    for evalset in inputs.evalsets:
        prompts = inputs.prompts[evalset.name]
        gen_key = stable_hash({"served": key, "evalset": evalset.content_hash,
                               "prompts": [[p.item_id, list(p.ids), p.max_new_tokens] for p in prompts]})
        path = cache_dir("results") / f"generate-{gen_key}.json"
        generations[evalset.name] = ResultFile(str(path), gen_key)
        cached = read_json(path) if endpoint_url is None else None
        if not (reusable(path) and isinstance(cached, dict) and "outputs" in cached):
            pending.append((evalset, prompts, gen_key, path))
    fidelity_pending = [] if fidelity is None else plan_served_fidelity(inputs, served, key, generations, reusable,
                                                                        fidelity)
    # A server the user runs may serve another build tomorrow under the same URL: it is asked anew every run.
    cached_block = _cached_entry(block_path) if endpoint_url is None else None
    if not pending and not fidelity_pending and reusable(block_path) and cached_block is not None:
        progress.say(f"{served.name}: reusing served results ({engine_of(inputs).title})")
        return cached_block
    block = serve_and_measure(inputs, served, endpoint_url, plan, concurrencies, pending, reference_reply,
                              fidelity_pending)
    entry = ServedEntry.model_validate(block)
    if entry.status == "ok":
        atomic_write_json(block_path, block)
    return entry


def _cached_entry(path: Path) -> ServedEntry | None:
    cached = read_json(path)
    try:
        return ServedEntry.model_validate(cached) if isinstance(cached, dict) else None
    except ValidationError:
        return None


def served_reference_map(inputs: RunInputs) -> Path:
    """Where the served baseline says which reference each evalset's served fidelity is measured against."""
    return inputs.out_dir / "stages" / "baseline" / "served-fidelity.json"


def plan_served_fidelity(inputs: RunInputs, served: ServedFormat, key: str, generations: dict[str, ResultFile], reusable,
                         fidelity: dict[str, str]) -> list[tuple]:
    """The served fidelity work still to do: the baseline's references, or this format's comparisons against the
    references the served baseline wrote. Fills `fidelity` (evalset -> result path)."""
    pending: list[tuple] = []
    if served.name == "baseline":
        for evalset in inputs.evalsets:
            reference = served_reference_path(generations[evalset.name].key)
            fidelity[evalset.name] = str(reference)
            if not (reusable(reference) and isinstance(read_json(reference), dict)):
                pending.append(("reference", evalset, Path(generations[evalset.name].path), reference))
        atomic_write_json(served_reference_map(inputs), fidelity)
        return pending
    references = read_json(served_reference_map(inputs)) or {}
    for evalset in inputs.evalsets:
        reference = Path(references[evalset.name]) if evalset.name in references else None
        if reference is None or not reference.is_file():
            continue
        comparison = served_comparison_path(key, reference)
        fidelity[evalset.name] = str(comparison)
        if not (reusable(comparison) and isinstance(read_json(comparison), dict)):
            pending.append(("compare", evalset, reference, comparison))
    return pending


def measure_served_fidelity(inputs: RunInputs, served: ServedFormat, endpoint: Endpoint, pending: list[tuple],
                            max_model_len: int) -> None:
    encode = None
    for kind, evalset, source, path in pending:
        label = f"{served.name}: fidelity {evalset.name} ({engine_of(inputs).title} prompt_logprobs)"
        if kind == "reference":
            if encode is None:  # as LoadedModel.encode does, with the baseline's tokenizer
                tokenizer = load_tokenizer(inputs.source.path, inputs.spec.trust_remote_code)
                encode = prompt_encoder(tokenizer)
            outputs = (read_json(source) or {}).get("outputs") or []
            write_served_reference(endpoint, evalset.name, inputs.prompts[evalset.name], outputs, encode, path, label,
                                   max_model_len)
        else:
            compare_served(endpoint, source, path, label)


def latency_requests(inputs: RunInputs) -> list[tuple[tuple[int, ...], int]]:
    """The transformers backend's batch-1 workload (RunInputs.probe_workload), as token ids."""
    by_text = {p.text: p for prompts in inputs.prompts.values() for p in prompts}
    batch1, _, _ = inputs.probe_workload()
    return [(by_text[text].ids, max_new) for text, max_new in batch1]


def serve_and_measure(inputs: RunInputs, served: ServedFormat, endpoint_url, plan: LaunchPlan, concurrencies, pending,
                      reference_reply: str | None = None, fidelity_pending: list[tuple] = ()) -> dict:
    engine, install = engine_of(inputs), inputs.serving_install
    log_path = inputs.out_dir / "logs" / f"{served.name}.{engine.name}.log"
    block = served_block(inputs, endpoint_url, status="ok", scored=True)
    if endpoint_url:
        try:
            return _measure(inputs, served, _endpoint_from(engine, endpoint_url, block), plan, concurrencies, pending,
                            block, alive=lambda: engine.answers(endpoint_url), reference_reply=reference_reply,
                            fidelity_pending=fidelity_pending)
        except ServerFailed as exc:
            return dict(block, status="failed", reason=str(exc))
    block.update(command=engine.shown_command(install, served, plan), flags=_flags(plan.args), log=str(log_path))
    offset = log_path.stat().st_size if log_path.exists() else 0
    try:
        with engine.start(install, served, plan, log_path, _worker_env(), inputs.spec.vllm_startup_timeout_s) \
                as server, RssSampler(server.pid, interval_s=0.5, tree=True) as rss:
            block.update(startup_s=server.startup_s)
            block.update(engine.startup_facts(install, plan, server, log_path, offset))
            block = _measure(inputs, served, Endpoint(server.base_url, served.name), plan, concurrencies, pending,
                             block, alive=server.alive, reference_reply=reference_reply,
                             fidelity_pending=fidelity_pending)
            if not server.alive():
                block.update(status="failed", reason=f"the {engine.title} server died: {server.failure_reason()} "
                                                     f"(log: {log_path})")
        block["rss_peak_bytes"] = rss.peak or None
    except ServerFailed as exc:
        block.update(status="failed", reason=str(exc) + diagnosed(log_path, offset))
    except RequestFailed as exc:
        block.update(status="failed", reason=f"a request to the {engine.title} server failed: {exc} (log: {log_path})")
    return block


def diagnosed(log_path: Path, offset: int) -> str:
    """What `quantgate diagnose` makes of this start's log, as a clause for the failure reason ('' when nothing)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            diagnosis = diagnose_text(log.read().decode("utf-8", errors="replace"), str(log_path))
    except (OSError, NotADiagnosableLog):
        return ""
    if diagnosis.kind == "fits" or not diagnosis.changes:
        return ""
    first = diagnosis.changes[0]
    return f"; diagnosis: {diagnosis.summary}; first change: {first.setting} ({first.effect})"


def served_entry(inputs: RunInputs, endpoint_url: str | None, **values) -> ServedEntry:
    """served_block as the schema's object."""
    return ServedEntry.model_validate(served_block(inputs, endpoint_url, **values))


def served_block(inputs: RunInputs, endpoint_url: str | None, **values) -> dict:
    """A format's `served` block with every key present (docs/report.md describes each)."""
    engine, install = engine_of(inputs), inputs.serving_install
    block = {"status": "ok", "reason": None, "engine": engine.name, "scored": False,
             "source": f"--vllm-endpoint {endpoint_url}" if endpoint_url else engine.source(install),
             "version": None if endpoint_url else engine.version(install), "endpoint": endpoint_url,
             "command": None, "flags": {}, "kernels": [], "cpu_kernel_library": None, "startup_s": None, "log": None,
             "kv_cache": None, "latency": {}, "saturation": None, "rss_peak_bytes": None, "baseline_probe": None}
    block.update(values)
    return block


def _measure(inputs: RunInputs, served: ServedFormat, endpoint: Endpoint, plan: LaunchPlan, concurrencies, pending, block, *, alive,
             reference_reply: str | None = None, fidelity_pending: list[tuple] = ()) -> dict:
    workload = [CompletionRequest(ids, n) for ids, n in latency_requests(inputs)]
    if reference_reply is not None and workload:
        reply = complete(endpoint, workload[0], served.sampling).text
        block["baseline_probe"] = baseline_reproduced(reference_reply, reply, where=endpoint.base_url)
    for evalset, prompts, gen_key, path in pending:
        requests = [CompletionRequest(p.ids, p.max_new_tokens) for p in prompts]
        started = time.time()
        done = complete_all(endpoint, requests, served.sampling, concurrency=plan.max_num_seqs,
                            label=f"{served.name}: generating {evalset.name} ({engine_of(inputs).title})",
                            alive=alive)
        outputs = [{"id": p.item_id, "prediction": c.text, "new_tokens": c.new_tokens,
                    "prompt_tokens": c.prompt_tokens} for p, c in zip(prompts, done)]
        atomic_write_json(path, {"evalset": evalset.name, "key": gen_key, "outputs": outputs,
                                 "backend": engine_of(inputs).name,
                                 "wall_s": round(time.time() - started, 3), "latency": {}, "batches": [],
                                 "prompt_tokens_max": max((o["prompt_tokens"] for o in outputs), default=0)})
    measure_served_fidelity(inputs, served, endpoint, list(fidelity_pending), plan.max_model_len)
    for concurrency in concurrencies:
        block["latency"][f"concurrency_{concurrency}"] = latency_at(
            endpoint, workload, served.sampling, concurrency,
            f"{served.name}: served latency at concurrency {concurrency}", alive=alive)
    filler = list(workload[0].prompt_ids) if workload else [1]
    block["saturation"] = saturation(endpoint, filler, served.sampling, concurrency=plan.max_num_seqs,
                                     max_model_len=plan.max_model_len, alive=alive,
                                     preemptions_metric=engine_of(inputs).preemptions_metric,
                                     engine=engine_of(inputs).title)
    return block


PROBE_PREFIX_CHARS = 5  # served vs transformers baseline agreed on at least this many leading characters on every
# item measured (16 items; 11 identical), where float32 and bf16 kernels may flip a near-tie later in the reply


def baseline_reproduced(transformers_reply: str, served_reply: str, *, where: str) -> str:
    """The served baseline's greedy reply to the first latency prompt must open as transformers' does: a server
    that serves another model, dtype or template answers differently from the first words. Returns the block's
    `baseline_probe` line; raises ServerFailed when they differ."""
    ours, theirs = " ".join(transformers_reply.split()), " ".join(served_reply.split())
    width = min(PROBE_PREFIX_CHARS, len(ours))
    if ours[:width] == theirs[:width] and (width or not theirs):
        return f"reproduced: the first {width} characters of transformers' reply ({ours[:40]!r})"
    raise ServerFailed(f"the served baseline does not reproduce the transformers baseline on the probe prompt: "
                       f"transformers answers {ours[:60]!r}, the server at {where} {theirs[:60]!r}; it may serve "
                       "another model, dtype or chat template, so its scores would not be the baseline's")


def _endpoint_from(engine: ServingEngine, url: str, block: dict) -> Endpoint:
    """The served model's name and the engine's version, as the server the user runs states them (recorded in the
    block)."""
    version, models = engine.identify(url)
    block.update(version=version, endpoint_models=[{"id": m.get("id"), "root": m.get("root"),
                                                    "max_model_len": m.get("max_model_len")} for m in models])
    return Endpoint(url.rstrip("/"), models[0]["id"])


def _flags(args: tuple[str, ...]) -> dict[str, str]:
    return dict(flag_pairs(args))


def _worker_env() -> dict[str, str]:
    return worker_environment(os.environ)


def served_format(inputs: RunInputs, fmt: str, artifact_key: str, artifact_path: Path, spec: FormatSpec,
                  devices: str | None = None) -> ServedFormat:
    """The dtype the engine runs the format in (the transformers backend's rule: float32 for a 16-bit checkpoint on a
    CPU without bf16 units), the KV bytes per token at that dtype, and greedy decoding with the checkpoint's
    stop tokens and repetition penalty, as LoadedModel decodes."""
    import json


    config = json.loads((artifact_path / "config.json").read_text(encoding="utf-8"))
    dtype = engine_of(inputs).served_dtype(inputs.spec.dtype, config, inputs.serving_install)
    stored = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    element = 4 if (dtype if dtype != "auto" else stored) == "float32" else 2
    return ServedFormat(fmt, artifact_key, artifact_path, dtype, kv_bytes_per_token(inputs.model_config,
                                                                                     kv_dtype_bytes=element),
                        greedy_sampling(artifact_path, inputs.spec.seed), spec, devices)


def greedy_sampling(artifact_path: Path, seed: int) -> Sampling:
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoTokenizer, GenerationConfig

        from harness.runtime.transformers_backend import stop_ids

        tokenizer = AutoTokenizer.from_pretrained(artifact_path)
        try:
            config = GenerationConfig.from_pretrained(artifact_path)
        except OSError:
            config = GenerationConfig()
    penalty = getattr(config, "repetition_penalty", None)
    return Sampling(tuple(sorted(stop_ids(config, tokenizer))), penalty if penalty not in (None, 1.0) else None, seed)
