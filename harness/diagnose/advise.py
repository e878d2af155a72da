"""From a log's facts to a Diagnosis: which memory ran out, the figures (quoted, with where each came from) and
the changes that would fix it, best first, each with its effect from the log's own numbers or the memory model.

Batch size is named only where it is the lever (the sampler warm-up allocates logits for --max-num-seqs sequences;
a profile run's peak follows --max-num-batched-tokens): where one sequence of --max-model-len does not fit the KV
cache, no batch size helps, and the answer says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from harness.diagnose.readers import (GIB, EngineFacts, Quoted, VllmFacts, read_nvidia_smi, read_other_engines,
                                      names_encoder_decoder, read_torch_oom, read_vllm, size_gib)
from harness.diagnose.colocated import colocated_trainer
from harness.diagnose.allocator import LIST_PROCESSES, allocator_verdict, free_other_process, held_elsewhere_gib
from harness.diagnose.engines import diagnose_sglang, diagnose_tgi, diagnose_trtllm, quoted_figures
from harness.diagnose.failures import (ENGINE_MARKERS, engine_of, failure_lines, identity_of, last_error,
                                      memory_failures)
from harness.diagnose.levers import untried_first, with_levers
from harness.diagnose.calibration import diagnose_calibration
from harness.diagnose.llamacpp import diagnose_llama_cpp
from harness.diagnose.lmdeploy import diagnose_lmdeploy
from harness.diagnose.measured import measured_first
from harness.diagnose.pytorch import diagnose_torch, quantized_model_dispatched
from harness.diagnose.scale import model_params_billion, quantized, vllm_by_scale, weights_16bit_gib
from harness.diagnose.records import Change, Diagnosis, Figure
from harness.diagnose.settings import Setting, is_on, merged, number, settings_given, settings_in, several_gpus

DEFAULT_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization (0.92 in some releases: the log's flag wins)
MAX_UTILIZATION = 0.95  # above this the CUDA context and other processes are left too little
FRAGMENTED_SHARE = 0.05  # reserved-but-unallocated above this share of the GPU (and the request): fragmentation
WATERMARK = 0.85  # the share of GPU memory a load test should stay under
BLOCK = 16


@dataclass(frozen=True)
class Context:
    """What the user told `diagnose` besides the log (the log wins where it says otherwise)."""

    kv_bytes_per_token: int | None = None  # from --model's config (memory model)
    weights_16bit_bytes: int | None = None
    weights_4bit_bytes: int | None = None
    model_source: str = ""
    gpu_total_gib: float | None = None  # --target-gpu
    gpu_name: str = ""
    engine: str | None = None  # --engine: read the text as this kind only
    version: str | None = None  # --version: the vLLM version, where the log does not print it
    flags: tuple[tuple[str, object], ...] = ()  # (key, value) pairs given by a caller
    flags_text: str = ""  # --flags as given: any engine's flags, KEY=VALUE environment variables


READERS = ("vllm", "sglang", "tgi", "trtllm", "llama.cpp", "lmdeploy", "pytorch-oom", "nvidia-smi")
V1_DEFAULT_FROM = (0, 8)  # vLLM 0.8.0 made the V1 engine the default; V0 could still be chosen (VLLM_USE_V1=0)
V0_REMOVED_IN = (0, 11)  # from 0.11.0 there is only V1


class NotADiagnosableLog(ValueError):
    """The text holds none of the messages diagnose reads, and no error line either."""


def diagnose_all(text: str, source: str, context: Context = Context()) -> list[Diagnosis]:
    """One diagnosis per distinct memory failure in the log (two engines' logs pasted together, an OOM after a
    server log), the first for the whole log."""
    main = diagnose_text(text, source, context)
    answered = {main.failing_line} | {f.source for f in main.figures}
    cited = {int(n) for f in main.figures for n in re.findall(r"log lines? (\d+)", f.source)}
    lines = text.splitlines()
    found = [main]
    for group in memory_failures(text):
        first = group[0]
        if first.identity.startswith("oom:"):  # PyTorch's figures: the same failure only where they were quoted
            tried = first.identity.split(":")[1]
            if any(d.figures and any(f.label == "tried to allocate" and f.value == tried for f in d.figures)
                   for d in found):
                continue
        elif first.identity in {identity_of(d.failing_line) for d in found if d.failing_line} \
                or first.text[:300] in answered:
            continue
        before = [n for n in cited if n < first.line]
        start = max(max(before, default=0), first.line - 1 - NEAR_LINES, 0)  # after what is already answered
        part = "\n".join(lines[start:group[-1].line + 5])
        try:
            extra = diagnose_text(part, source, context)
        except NotADiagnosableLog:
            continue
        if extra.kind == "not_recognised" or extra.kind in {d.kind for d in found}:
            continue  # the same failure read again (a wrapper's line, another process's copy)
        found.append(replace(extra, lines=f"{start + 1}-{min(len(lines), group[-1].line + 5)}"))
        cited |= {f.line for f in group}
    return found


LONG_CONTEXT = 65536  # a --max-model-len this long is a lever of its own at start-up
NEAR_LINES = 60  # a failure's own lines (traceback, the same error logged by each process) lie this close


def diagnose_text(text: str, source: str, context: Context = Context()) -> Diagnosis:
    given = settings_given(context.flags_text) if context.flags_text else {}
    given.update({key: Setting(value, 0) for key, value in context.flags if key not in given})
    settings = merged(settings_in(text), given)
    engine = engine_of(text, context.engine if context.engine in ENGINE_MARKERS else None)
    diagnosis = _read(text, source, context, settings, engine)
    failure = last_error(text)
    if diagnosis is None and failure is None and engine is not None:
        diagnosis = _engine_without_failure(text, source, engine, settings)
    if diagnosis is not None and diagnosis.kind == "fits" and failure is None and not _healthy_start(diagnosis):
        diagnosis = _engine_without_failure(text, source, engine or diagnosis.reader, settings)
    if diagnosis is None or (diagnosis.kind in ("fits", "within_watermark") and failure is not None):
        if failure is None:
            raise NotADiagnosableLog(f"{source}: no message diagnose reads (a PyTorch CUDA out-of-memory error, an "
                                     "engine's start-up or failure lines, nvidia-smi --query-gpu=timestamp,memory.used,"
                                     "memory.total --format=csv output); pass the server's whole log or the full error "
                                     "text")
        diagnosis = _not_recognised(failure, source, engine, diagnosis, settings)
    notes = []
    if context.engine and context.engine != diagnosis.reader and diagnosis.reader != "none":
        notes.append(f"--engine {context.engine}: no {context.engine} line in it; read as {diagnosis.reader}")
    if context.flags_text and not given:
        notes.append(f"--flags {context.flags_text!r}: no setting diagnose uses in it")
    changes = _split_before_quantizing(_sane_utilization(with_levers(diagnosis.changes, settings), diagnosis,
                                                         settings), diagnosis.kind, text, settings)
    shown = f"{text}\n{context.flags_text}"
    diagnosis = colocated_trainer(vllm_by_scale(replace(diagnosis, changes=changes), shown, settings), shown, settings)
    changes = measured_first(untried_first(with_levers(diagnosis.changes, settings), text), text)
    changes = with_levers(changes, settings)
    return replace(diagnosis, changes=changes, missing=diagnosis.missing + tuple(notes),
                   failing_line=diagnosis.failing_line or _answered_line(text, diagnosis, failure))


_SPLITS = ("tensor_parallel_up", "num_shard_up", "pipeline_parallel_up")


def _split_before_quantizing(changes: tuple[Change, ...], kind: str, text: str, settings: dict) -> tuple[Change, ...]:
    """Weights that do not fit one GPU, on a machine whose other GPUs the log or the flags show: splitting them over
    those GPUs (tensor parallel, shards) keeps the model as it is, so it comes before quantizing or offloading."""
    if kind not in ("weights_do_not_fit", "weights_loading") or not several_gpus(text, settings):
        return changes
    split = next((c for c in changes if c.lever in _SPLITS), None)
    if split is None or changes[0] is split:
        return changes
    return (split,) + tuple(c for c in changes if c is not split)


def _answered_line(text: str, diagnosis: Diagnosis, failure) -> str:
    """The failure line the diagnosis reads: the one nearest the log lines its figures quote, else the last error."""
    cited = [int(n) for f in diagnosis.figures for n in re.findall(r"log lines? (\d+)", f.source)]
    if cited:
        near = [f for f in failure_lines(text) if any(abs(f.line - n) <= NEAR_LINES for n in cited)]
        if near:
            return max(near, key=lambda f: (f.memory, -min(abs(f.line - n) for n in cited))).text[:300]
        return ""
    return failure.text[:300] if failure else ""


def _read(text, source, context, settings, engine) -> Diagnosis | None:
    """The engine's own reader first, then the others (a log may hold only PyTorch's error line)."""
    total = context.gpu_total_gib
    if engine == "vllm" or (engine is None and context.engine is None):
        facts = read_vllm(text)
        if facts is not None and (engine == "vllm" or _vllm_has_story(facts, without_oom=True)):
            return _vllm(_with_settings(facts, settings, context), source, context)
    if engine == "sglang" and (d := diagnose_sglang(text, source, settings, total)) is not None:
        return d
    if engine == "tgi" and (d := diagnose_tgi(text, source, settings, total)) is not None:
        return d
    if engine == "trtllm" and (d := diagnose_trtllm(text, source, settings, total)) is not None:
        return d
    if engine is None and (other := read_other_engines(text)) is not None:
        reader = {"sglang": diagnose_sglang, "tgi": diagnose_tgi, "trtllm": diagnose_trtllm}[other.engine]
        if (d := reader(text, source, settings, total)) is not None:
            return d
    if engine == "vllm":
        facts = read_vllm(text) or VllmFacts(text=text)
        return _vllm(_with_settings(facts, settings, context), source, context)
    if engine is None and (dispatched := quantized_model_dispatched(text, source)) is not None:
        return dispatched
    if engine is None and (ggml := diagnose_llama_cpp(text, source, context.flags_text)) is not None:
        return ggml
    if engine is None and (turbomind := diagnose_lmdeploy(text, source, context.flags_text)) is not None:
        return turbomind
    if engine is None and (calibration := diagnose_calibration(text, source, context.flags_text)) is not None:
        return calibration
    if (oom := read_torch_oom(text)) is not None:
        return diagnose_torch(text, oom[0], oom[1], source, _named_weights(text, context, settings),
                              bool(context.model_source), settings, context.flags_text)
    if (failure := last_error(text)) is not None and failure.memory and engine is None:
        return diagnose_torch(text, None, failure.line, source, _named_weights(text, context, settings),
                              bool(context.model_source), settings, context.flags_text)
    if (trace := read_nvidia_smi(text)) is not None:
        return _smi(trace, source, context)
    facts = read_vllm(text)
    if facts is not None:
        return _vllm(_with_settings(facts, settings, context), source, context)
    return None


def _named_weights(text: str, context: Context, settings: dict) -> int | None:
    """The 16-bit weights: --model's, else a model size the log names ("chatglm-6b", "Llama-2-13b") where nothing
    says the weights are quantized."""
    if context.weights_16bit_bytes:
        return context.weights_16bit_bytes
    named = f"{text}\n{context.flags_text}"
    params = model_params_billion(named)
    return int(weights_16bit_gib(params) * GIB) if params and not quantized(named, settings) else None


def _healthy_start(diagnosis: Diagnosis) -> bool:
    """'fits' needs positive evidence of a healthy start-up: the engine's own completed KV-cache line (what its cache
    holds), never only the absence of an out-of-memory line."""
    return any(f.label == "KV cache holds" for f in diagnosis.figures)


LOW_UTILIZATION = 0.8  # a --gpu-memory-utilization at or below this is clearly under vLLM's default 0.9


def _share_first(engine: str | None, settings: dict) -> tuple[Change, ...]:
    """A vLLM failure no reader places, where the user set --gpu-memory-utilization far from the default: clearly
    below it, vLLM's start-up failures are mostly the KV cache finding too little room inside that share (no blocks,
    one sequence too long), so the lowered share is the first suspect; at MAX_UTILIZATION or above, what vLLM
    allocates outside its share (CUDA graphs, the sampler, the CUDA context, buffers that grow while it generates)
    has 5% of the GPU or less, so the raised share is. Nothing is guessed for other engines or between the two."""
    batch = settings.get("batch_size")
    if batch is not None and str(batch.value).lower().startswith("auto"):
        # a batch size the tool detects itself (lm-eval, accelerate's find_executable_batch_size) probes memory once
        # and can overshoot on later, longer inputs: a fixed one is the first thing to try
        return (Change(f"an explicit batch size instead of {batch.value} (e.g. --batch_size 1, then up)",
                       "the automatic batch size is detected on a probe and can overshoot on later inputs; a fixed one "
                       "bounds what a step needs (a first guess: the log does not say which memory ran out)",
                       "batch_size_down"),)
    share = number(settings, "gpu_memory_utilization")
    if engine != "vllm" or share is None or LOW_UTILIZATION < share < MAX_UTILIZATION:
        return ()
    if share >= MAX_UTILIZATION:
        lower = min(DEFAULT_UTILIZATION, math.floor((share - 0.05) * 100) / 100)
        return (Change(f"--gpu-memory-utilization {lower:.2f}",
                       f"{share} leaves {1 - share:.0%} of the GPU outside vLLM's share for what it allocates besides "
                       "the KV cache (CUDA graphs, the sampler, the CUDA context, buffers that grow while it "
                       "generates): a little less share gives that room back (a first guess: the log does not say "
                       "which memory ran out)", "gpu_memory_utilization_down"),)
    return (Change(f"--gpu-memory-utilization {DEFAULT_UTILIZATION}",
                   f"{share} is well below vLLM's default {DEFAULT_UTILIZATION}: the KV cache gets "
                   f"{DEFAULT_UTILIZATION - share:.2f} of the GPU more, if nothing else uses it (a first guess: the log "
                   "does not say which memory ran out)", "gpu_memory_utilization_up"),)


def _not_recognised(failure, source: str, engine: str | None, seen: Diagnosis | None,
                    settings: dict | None = None) -> Diagnosis:
    what = "an out-of-memory line" if failure.memory else "an error"
    return Diagnosis(source, seen.reader if seen else (_READER.get(engine, "none")), "not_recognised",
                     f"not recognised: the log has {what} no reader knows (log line {failure.line}: "
                     f"{failure.text[:200]!r}), so it is not 'fits'",
                     seen.figures if seen else (), _share_first(engine, settings or {}),
                     ("the error's whole traceback and the server's start-up lines (its command line, the engine's "
                      "version, the memory lines before the error) would let diagnose decide",)
                     + (() if engine else ("which engine wrote it: --engine vllm|sglang|tgi|trtllm",)),
                     failing_line=failure.text[:300])


def _engine_without_failure(text: str, source: str, engine: str, settings: dict | None = None) -> Diagnosis:
    """An engine's log its reader knows, without a failure line or a memory figure it reads: said so, not refused
    (with the one first guess a share far from the default allows)."""
    last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    return Diagnosis(source, _READER[engine], "not_recognised",
                     f"not recognised: a {engine} log without an error line or a memory line diagnose reads (it ends "
                     f"with {last[:160]!r})", (), _share_first(engine, settings or {}) if engine == "vllm" else (),
                     ("the error the engine printed and the lines before it (the server's whole log) would let "
                      "diagnose decide",), failing_line=last[:300])


_READER = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi", "trtllm": "trtllm"}


def _vllm_has_story(facts: VllmFacts, without_oom: bool = False) -> bool:
    """Lines only vLLM prints (without_oom: a PyTorch OOM alone is not vLLM's)."""
    return any((facts.no_kv_memory, facts.kv_needed, facts.v0_too_long, facts.free_below,
                None if without_oom else facts.oom, facts.kv_tokens,
                facts.load, facts.oom_text if not without_oom or facts.oom_during == "sampler warm-up" else None,
                facts.profiling_disturbed, facts.mamba_blocks, facts.kv_check,
                facts.kv_memory_gib is not None and facts.kv_memory_gib.value <= 0))


def _with_settings(facts: VllmFacts, settings: dict, context: Context) -> VllmFacts:
    """The settings found anywhere (log lines in any syntax, then --flags) fill what vLLM's own lines do not show."""
    for key, setting in settings.items():
        if key in _VLLM_KEYS:
            facts.flags.setdefault(key, Quoted(setting.value, setting.line))
    if facts.version is None and context.version:
        facts.version = Quoted(context.version, 0)
    # the model a command line or --flags names (--model meta-llama/Llama-3.2-11B-Vision-Instruct) is read like one a
    # log line names: an encoder-decoder model's start-up profile runs one encoder input per sequence
    model = settings.get("model")
    facts.enc_dec = facts.enc_dec or (model is not None and names_encoder_decoder(str(model.value)))
    facts.settings = settings
    return facts


_VLLM_KEYS = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
              "enforce_eager", "tensor_parallel_size", "quantization", "dtype", "block_size", "enable_chunked_prefill",
              "max_logprobs", "max_loras", "max_lora_rank", "limit_mm_per_prompt", "cuda_graph_sizes",
              "vllm_use_v1", "pytorch_cuda_alloc_conf")


def _engine_generation(facts: VllmFacts) -> str | None:
    """V0 or V1: from 0.11 V1 only; from 0.8 V1 unless VLLM_USE_V1=0 or V0-only lines show; before 0.8 V0 unless
    VLLM_USE_V1=1 or V1-only lines show; without a version, from the lines only one of them prints."""
    use_v1 = str(facts.flags["vllm_use_v1"].value) if "vllm_use_v1" in facts.flags else ""
    if facts.version is not None:
        parts = tuple(int(p) for p in re.findall(r"\d+", str(facts.version.value))[:2])
        if parts >= V0_REMOVED_IN:
            return "V1"
        if parts >= V1_DEFAULT_FROM:
            return "V0" if use_v1 == "0" or (facts.v0_lines and not facts.v1_lines) else "V1"
        return "V1" if use_v1 == "1" or (facts.v1_lines and not facts.v0_lines) else "V0"
    if use_v1 in ("0", "1"):
        return f"V{use_v1}"
    if facts.kv_blocks is not None or (facts.v0_lines and not facts.v1_lines):
        return "V0"
    return "V1" if facts.kv_tokens is not None or facts.v1_lines else None


def _sane_utilization(changes: tuple[Change, ...], diagnosis: Diagnosis, settings: dict) -> tuple[Change, ...]:
    """A lower --gpu-memory-utilization must still hold the weights (the log's figure) and a margin for activations."""
    weights = next((_gib_of(f.value) for f in diagnosis.figures if f.label == "weights loaded"), None)
    total = next((_gib_of(f.value) for f in diagnosis.figures if f.label == "GPU total"), None)
    kept = []
    for change in changes:
        value = re.match(r"--gpu-memory-utilization (\d?\.\d+)", change.setting)
        if value and weights and total and float(value.group(1)) * total < weights + ACTIVATION_MARGIN_GIB:
            continue
        kept.append(change)
    return tuple(kept)


ACTIVATION_MARGIN_GIB = 1.0
ENC_DEC_PROFILE_SEQS = 16  # where the log does not show --max-num-seqs: a sixteenth of vLLM's default 256  # the least a share must hold beyond the weights: a profile run's activations


def _gib_of(text: str) -> float | None:
    match = re.match(r"([\d.]+) ?(GiB|GB)", text)
    return float(match.group(1)) if match else None


def _where(line: int | None) -> str:
    return "given on the command line" if line == 0 else f"log line {line}" if line else "log"


# --- vLLM ---------------------------------------------------------------------------------------------------------


# kinds where more of the GPU for vLLM is a remedy (not CUDA-graph capture or warm-ups outside the share, not memory
# another process holds)
_SHARE_HELPS = ("kv_cache_too_small", "no_kv_cache_memory", "weights_do_not_fit", "activation_peak", "out_of_memory")


def _vllm(facts: VllmFacts, source: str, context: Context) -> Diagnosis:
    """vLLM's own recommendation comes first where the log quotes it: once it profiles CUDA-graph memory (0.21 on) the
    same --gpu-memory-utilization leaves the KV cache less, and it names the share that gives back what it had."""
    diagnosis = _vllm_reading(facts, source, context)
    hint = facts.utilization_hint
    current = number(facts.settings, "gpu_memory_utilization") or DEFAULT_UTILIZATION
    if hint is None or diagnosis.kind not in _SHARE_HELPS or not current < hint.value <= MAX_UTILIZATION:
        return diagnosis
    first = Change(f"--gpu-memory-utilization {hint.value:.2f}",
                   f"vLLM's own figure (log line {hint.line}): with CUDA-graph memory profiled inside the share, "
                   f"{hint.value:.2f} leaves the KV cache what {current} left it before", "gpu_memory_utilization_up")
    return replace(diagnosis, changes=(first,) + tuple(
        c for c in diagnosis.changes if not c.setting.startswith("--gpu-memory-utilization")))


def _vllm_reading(facts: VllmFacts, source: str, context: Context) -> Diagnosis:
    figures: list[Figure] = []

    def quote(label: str, value: str, line: int | None) -> None:
        figures.append(Figure(label, value, _where(line)))

    if facts.version:
        quote("vLLM version", str(facts.version.value), facts.version.line)
    generation = _engine_generation(facts)
    if generation:
        figures.append(Figure("engine", generation, "vLLM version" if facts.version else "the lines it prints"))
    for key, quoted in facts.flags.items():
        quote(f"--{key.replace('_', '-')}", str(quoted.value), quoted.line)
    if facts.weights_gib:
        quote("weights loaded", f"{facts.weights_gib.value:.2f} GiB", facts.weights_gib.line)
    if facts.kv_memory_gib:
        quote("KV cache memory", f"{facts.kv_memory_gib.value:.2f} GiB", facts.kv_memory_gib.line)
    if facts.kv_tokens:
        quote("KV cache holds", f"{facts.kv_tokens.value:,} tokens", facts.kv_tokens.line)
    if facts.graph_gib:
        quote("CUDA graphs", f"{facts.graph_gib.value:.2f} GiB", facts.graph_gib.line)
    utilization = float(facts.flags["gpu_memory_utilization"].value) if "gpu_memory_utilization" in facts.flags \
        else None
    per_token = _kv_bytes_per_token(facts, context)
    if per_token:
        figures.append(Figure("KV bytes per token", f"{per_token[0]:,}", per_token[1]))
    total_gib = context.gpu_total_gib
    if facts.total_gib:
        total_gib = facts.total_gib.value
        quote("GPU total", f"{total_gib:.2f} GiB", facts.total_gib.line)
    if facts.free_below:
        free, total, wanted_u, requested = (float(v) for v in str(facts.free_below.value).split(":"))
        total_gib = total
        quote("free at start-up", f"{free:.2f} of {total:.2f} GiB", facts.free_below.line)
        held = total - free
        most = math.floor((free / total - 0.01) * 100) / 100
        weights = facts.weights_gib.value if facts.weights_gib else (
            (context.weights_4bit_bytes if facts.flags.get("quantization") else context.weights_16bit_bytes) or 0) / GIB
        changes = [free_other_process(held)]
        if most > 0 and (not weights or most * total >= weights + ACTIVATION_MARGIN_GIB):
            changes.append(Change(f"--gpu-memory-utilization {most:.2f}",
                                  f"asks for {most * total:.2f} GiB, within the {free:.2f} GiB free, if the other "
                                  "process must stay (less KV cache than planned: the next start's log says how "
                                  "many tokens)"))
        cannot = (f"; what is free ({free:.2f} GiB) cannot hold the weights ({weights:.2f} GiB) and their "
                  "activations: no --gpu-memory-utilization helps until it is freed"
                  if weights and most * total < weights + ACTIVATION_MARGIN_GIB else "")
        return Diagnosis(source, "vllm", "memory_held_elsewhere",
                         f"another process holds {held:.2f} GiB of the GPU: vLLM wants {wanted_u} x {total:.2f} = "
                         f"{requested:.2f} GiB but only {free:.2f} GiB is free" + cannot, tuple(figures),
                         tuple(changes), (f"which process holds the memory: {LIST_PROCESSES}",))
    if facts.profiling_disturbed:
        before, after = str(facts.profiling_disturbed.value).split(":")
        quote("free memory before / after profiling", f"{before} / {after}", facts.profiling_disturbed.line)
        return Diagnosis(source, "vllm", "profiling_disturbed",
                         "another process on the GPU changed its memory while vLLM profiled (free memory went from "
                         f"{before} to {after}): several instances starting on one GPU, or one still exiting",
                         tuple(figures), (
                             free_other_process(),
                             Change("start the instances one after another, each with its own "
                                    "--gpu-memory-utilization share", "each profiles a GPU that holds still")),
                         (f"which processes hold the GPU: {LIST_PROCESSES}",))
    if facts.initial_usage_gib and facts.initial_usage_gib.value > 1.0 and (
            facts.no_kv_memory or (facts.kv_memory_gib and facts.kv_memory_gib.value <= 0)):
        held = facts.initial_usage_gib.value
        quote("in use before this instance loaded", f"{held:.2f} GiB", facts.initial_usage_gib.line)
        return Diagnosis(source, "vllm", "memory_held_elsewhere",
                         f"{held:.2f} GiB was in use on the GPU before this instance loaded anything (another instance "
                         "or process): it counts against this one's --gpu-memory-utilization share",
                         tuple(figures), (
                             free_other_process(held),
                             Change(f"--gpu-memory-utilization {min(MAX_UTILIZATION, (utilization or DEFAULT_UTILIZATION) + held / total_gib):.2f}"
                                    if total_gib else "--gpu-memory-utilization higher",
                                    "the share must cover what the other process holds as well as this one's weights "
                                    "and KV cache")))
    if facts.mamba_blocks:
        seqs, blocks = str(facts.mamba_blocks.value).split(":")
        quote("Mamba cache blocks", blocks, facts.mamba_blocks.line)
        return Diagnosis(source, "vllm", "state_cache",
                         f"the Mamba (recurrent) state cache holds {blocks} sequences, fewer than --max-num-seqs"
                         + (f" {seqs}" if seqs else "") + ": each running sequence needs its own state block",
                         tuple(figures), (
                             Change(f"--max-num-seqs {int(blocks) // 8 * 8 or int(blocks)}",
                                    f"no more sequences than the {blocks} state blocks"),
                             Change(f"--max-model-len {int(number(facts.settings, 'max_model_len') // 2):,}"
                                    if number(facts.settings, "max_model_len") else "--max-model-len lower",
                                    "the attention layers' KV cache takes less, leaving more for state blocks"),
                             Change(f"--gpu-memory-utilization {min(MAX_UTILIZATION, (utilization or DEFAULT_UTILIZATION) + 0.03):.2f}",
                                    "more memory for the state blocks")))
    if facts.kv_needed or facts.v0_too_long:
        return _kv_too_small(facts, source, figures, per_token, utilization, total_gib, context)
    if facts.no_kv_memory or (facts.kv_memory_gib is not None and facts.kv_memory_gib.value <= 0) or (
            facts.kv_blocks is not None and facts.kv_blocks.value == 0) or (
            facts.kv_check is not None and facts.oom is None and facts.oom_text is None):
        return _no_kv_memory(facts, source, figures, utilization, total_gib, context)
    if facts.oom is not None or facts.oom_text is not None:
        if facts.oom is not None and facts.serving_line and facts.oom_line > facts.serving_line:
            return _oom_under_load(facts, source, figures, utilization, total_gib)
        if facts.oom is None and facts.runtime_said is not None and (facts.oom_during is None
                                                                     or facts.answered_first):
            return _oom_under_load(facts, source, figures, utilization, total_gib)
        return _vllm_oom(facts, source, figures, generation)
    if facts.load is not None and _kv_exhausted(facts.load):
        return _kv_exhausted_under_load(facts, source, figures, per_token, utilization, total_gib, context)
    if facts.kv_memory_gib is not None and facts.kv_tokens is None and facts.serving_line is None:
        length = number(facts.settings, "max_model_len")
        changes = (Change(f"--max-model-len {int(length // 2):,}", f"{facts.kv_memory_gib.value:.2f} GiB of KV cache "
                          f"must hold one sequence of --max-model-len {int(length):,}: check with --model DIR"),) \
            if length and length >= LONG_CONTEXT else ()
        return Diagnosis(source, "vllm", "not_recognised",
                         f"not recognised: the log stops during start-up, after the KV cache was sized "
                         f"({facts.kv_memory_gib.value:.2f} GiB) and before the server served, without an error line",
                         tuple(figures), changes,
                         ("the rest of the log (the error after this line) would let diagnose decide",))
    length = facts.flags.get("max_model_len")
    summary = (f"the server started: its KV cache holds {facts.kv_tokens.value:,} tokens"
               + (f", {facts.kv_tokens.value / float(length.value):.2f} sequences of --max-model-len {length.value}"
                  if length else "")) if facts.kv_tokens else "no memory failure in this log"
    return Diagnosis(source, "vllm", "fits", summary, tuple(figures))


def _kv_bytes_per_token(facts: VllmFacts, context: Context) -> tuple[int, str] | None:
    """From the log where it gives both sides (KV memory over the tokens it holds, or the memory one max-len sequence
    needs), else from --model's config."""
    if facts.kv_needed:
        length, needed = str(facts.kv_needed.value).split(":")[:2]
        return round(float(needed) * GIB / int(length)), f"log line {facts.kv_needed.line}: {needed} GiB / {length} tokens"
    if facts.kv_memory_gib and facts.kv_tokens and facts.kv_tokens.value:
        return (round(facts.kv_memory_gib.value * GIB / facts.kv_tokens.value),
                f"log lines {facts.kv_memory_gib.line}, {facts.kv_tokens.line}")
    if context.kv_bytes_per_token:
        return context.kv_bytes_per_token, f"memory model of {context.model_source}"
    return None


def _kv_too_small(facts, source, figures, per_token, utilization, total_gib, context) -> Diagnosis:
    if facts.kv_needed:
        length_text, needed_text, available_text, estimated_text = str(facts.kv_needed.value).split(":")
        length, needed, available = int(length_text), float(needed_text), float(available_text)
        holds = int(estimated_text) if estimated_text else int(length * available / needed) // BLOCK * BLOCK
        line = facts.kv_needed.line
        summary = (f"the KV cache is too small for --max-model-len {length:,}: one sequence needs {needed:.2f} GiB, "
                   f"the cache has {available:.2f} GiB (about {holds:,} tokens)")
    else:
        length_text, tokens_text = str(facts.v0_too_long.value).split(":")
        if not tokens_text:
            return _kv_too_small_uncounted(int(length_text), facts, source, figures, utilization)
        length, holds, line = int(length_text), int(tokens_text), facts.v0_too_long.line
        available = holds * per_token[0] / GIB if per_token else None
        needed = length * per_token[0] / GIB if per_token else None
        summary = f"the KV cache holds {holds:,} tokens, fewer than one sequence of --max-model-len {length:,}"
    figures.append(Figure("max seq len vs KV cache", f"{length:,} tokens vs about {holds:,}", f"log line {line}"))
    changes = [Change(f"--max-model-len {holds // BLOCK * BLOCK:,}",
                      f"the KV cache holds about {holds:,} tokens: one sequence of that length fits, at concurrency 1")]
    if needed is not None and available is not None:
        short = needed - available
        current = utilization or DEFAULT_UTILIZATION
        if total_gib:
            wanted = current + short / total_gib
            rounded = math.ceil(wanted * 100) / 100
            if rounded <= MAX_UTILIZATION:
                added = (rounded - current) * total_gib
                tokens = f" = {int(added * GIB / per_token[0]):,} tokens" if per_token else ""
                changes.append(Change(f"--gpu-memory-utilization {rounded:.2f}",
                                      f"adds {added:.2f} GiB{tokens} to the KV cache ({short:.2f} GiB were missing, on "
                                      f"{total_gib:.1f} GiB)"))
            else:
                changes.append(Change("--gpu-memory-utilization (not enough)",
                                      f"{short:.2f} GiB more would need {wanted:.2f} of the GPU, above "
                                      f"{MAX_UTILIZATION}: change something else"))
        changes.append(Change("--kv-cache-dtype fp8",
                              f"halves the KV bytes per token: the cache then holds about {2 * holds:,} tokens"
                              + (" (enough for one sequence)" if 2 * holds >= length else " (still short)")))
    if context.weights_16bit_bytes and context.weights_4bit_bytes:
        freed = (context.weights_16bit_bytes - context.weights_4bit_bytes) / GIB
        tokens = f" = about {int(freed * GIB / per_token[0]):,} more tokens" if per_token else ""
        changes.append(Change("quantize the weights (awq or gptq 4-bit)",
                              f"weights {context.weights_4bit_bytes / GIB:.2f} GiB instead of "
                              f"{context.weights_16bit_bytes / GIB:.2f}: {freed:.2f} GiB for the KV cache{tokens}"))
    changes.append(Change("--tensor-parallel-size 2", "splits the weights and the KV heads over two GPUs: about twice "
                          "the KV room per sequence"))
    changes = _share_before_context(changes, length, holds, utilization, facts.settings)
    missing = () if total_gib else ("the GPU's total memory, for the --gpu-memory-utilization arithmetic: "
                                     "pass --target-gpu, or the log's 'Free memory on device' line",)
    return Diagnosis(source, "vllm", "kv_cache_too_small",
                     summary + "; a smaller batch (--max-num-seqs) does not help: one sequence does not fit",
                     tuple(figures), tuple(changes), missing)


SMALL_SHORTFALL = 0.15  # the KV cache holds at least 85% of one sequence: a small share bump covers the rest


def _share_before_context(changes: list[Change], length: int, holds: int, utilization: float | None,
                          settings: dict) -> list[Change]:
    """Where the share vLLM may use is what is short, raise it before cutting the context (vLLM's own message names
    gpu_memory_utilization first): the user set it clearly below the default 0.9 (the memory they held back is
    there to take), or the context is the model's own (not set by the user) and the cache holds all but a small
    share of one sequence, with room left under 0.95. Another process on the GPU is read before this and answered on
    its own. A context the user chose, or a share at its top, leaves --max-model-len first."""
    current = utilization or DEFAULT_UTILIZATION
    low_share = utilization is not None and utilization <= LOW_UTILIZATION
    small_gap = ("max_model_len" not in settings and holds >= (1 - SMALL_SHORTFALL) * length
                 and current < MAX_UTILIZATION)
    if not (low_share or small_gap):
        return changes
    share = next((c for c in changes if re.match(r"--gpu-memory-utilization \d", c.setting)), None)
    if share is None:
        wanted = DEFAULT_UTILIZATION if low_share else min(MAX_UTILIZATION, round(current + 0.05, 2))
        share = Change(f"--gpu-memory-utilization {wanted:.2f}",
                       f"the cache holds {holds:,} of the {length:,} tokens one sequence needs "
                       f"({1 - holds / length:.0%} short): more of the GPU for the KV cache, as vLLM's message "
                       "suggests first, if nothing else uses the GPU", "gpu_memory_utilization_up")
    return [share] + [c for c in changes if c is not share]


def _kv_too_small_uncounted(length: int, facts, source, figures, utilization) -> Diagnosis:
    """V0's 'max seq len ... larger than the maximum number of tokens that can be stored in KV cache' without the
    count (retyped, or cut): the length is still the lever vLLM's own message names first, by how much is unknown."""
    figures.append(Figure("max seq len", f"{length:,} tokens, more than the KV cache holds",
                          f"log line {facts.v0_too_long.line}"))
    current = utilization or DEFAULT_UTILIZATION
    tp = int(number(facts.settings, "tensor_parallel_size") or 1)
    changes = [Change(f"--max-model-len {length // 2:,}", "one sequence must fit the KV cache; the message does not say "
                      "how many tokens it holds (the next start's '# GPU blocks' line does: x 16 tokens)"),
               Change(f"--tensor-parallel-size {2 * tp}", "splits the weights and the KV heads over more GPUs: more KV "
                      "room per sequence")]
    if current < MAX_UTILIZATION:
        changes.insert(1, Change(f"--gpu-memory-utilization {min(MAX_UTILIZATION, current + 0.05):.2f}",
                                 "more of the GPU for the KV cache, as vLLM's message suggests, if nothing else uses "
                                 "the GPU"))
    return Diagnosis(source, "vllm", "kv_cache_too_small",
                     f"the KV cache holds fewer tokens than one sequence of --max-model-len {length:,}; a smaller batch "
                     "(--max-num-seqs) does not help: one sequence does not fit", tuple(figures), tuple(changes),
                     ("how many tokens the KV cache holds: the error's figure in brackets, or the '# GPU blocks' "
                      "start-up line",))


def _no_kv_memory(facts, source, figures, utilization, total_gib, context) -> Diagnosis:
    weights = facts.weights_gib.value if facts.weights_gib else (
        context.weights_16bit_bytes / GIB if context.weights_16bit_bytes else None)
    current = utilization or DEFAULT_UTILIZATION
    summary = ("nothing is left for the KV cache (0 blocks, or a negative KV budget): the weights, the profile run's "
               f"activation peak and CUDA graphs fill the {current} share of the GPU"
               + (f" (weights alone {weights:.2f} GiB)" if weights else ""))
    settings = facts.settings
    seqs = number(settings, "max_num_seqs")
    multimodal = "limit_mm_per_prompt" in settings or facts.oom_during == "encoder"
    raise_to = min(MAX_UTILIZATION, round(current + max(0.05, min(0.3, current)), 2))
    utilization_up = Change(f"--gpu-memory-utilization {raise_to:.2f}",
                            f"{'%.2f GiB' % ((raise_to - current) * total_gib) if total_gib else 'more of the GPU'} "
                            "for vLLM, if nothing else needs it (V1 counts everything in use on the GPU against this "
                            "share)")
    fewer_seqs = Change(f"--max-num-seqs {int(seqs // 4) if seqs and seqs >= 8 else 64}",
                        "the profile run warms up this many dummy sequences (and their encoder inputs): fewer "
                        "lower its peak")
    changes = []
    weights_dominate = bool(context.weights_16bit_bytes and context.weights_4bit_bytes and weights and total_gib
                            and weights > 0.6 * current * total_gib)
    if _small_kv_deficit(facts, current, raise_to, total_gib):
        changes.append(utilization_up)  # the budget is short by less than the raise gives: the share covers it
    elif multimodal or (current >= DEFAULT_UTILIZATION and "gpu_memory_utilization" in settings
                        and not weights_dominate):
        changes.append(fewer_seqs)  # the share is already near its top: the profile's batch is the lever
    if weights_dominate:
        changes.append(Change("quantize the weights (awq or gptq 4-bit)",
                              f"weights {context.weights_4bit_bytes / GIB:.2f} GiB instead of "
                              f"{context.weights_16bit_bytes / GIB:.2f}: the difference goes to the KV cache"))
    if current < MAX_UTILIZATION:
        changes.append(utilization_up)
    changes += [fewer_seqs,
                Change("--max-num-batched-tokens 2048", "lowers the profile run's activation peak (it scales with "
                       "the tokens of one forward step)"),
                Change("--enforce-eager", "drops the CUDA-graph pool"),
                Change("--max-model-len 8192", "a shorter max length lowers the profile's peak"),
                Change(f"--tensor-parallel-size {2 * int(number(settings, 'tensor_parallel_size') or 1)}",
                       "splits the weights over more GPUs")]
    if context.weights_16bit_bytes and context.weights_4bit_bytes and not any(
            c.setting.startswith("quantize") for c in changes):
        changes.append(Change("quantize the weights (awq or gptq 4-bit)",
                              f"weights {context.weights_4bit_bytes / GIB:.2f} GiB instead of "
                              f"{context.weights_16bit_bytes / GIB:.2f}"))
    return Diagnosis(source, "vllm", "weights_do_not_fit" if weights and total_gib and weights > current * total_gib
                     else "no_kv_cache_memory", summary, tuple(figures), tuple(changes),
                     () if weights else ("the weights' size: the log's 'Model loading took' line, or --model DIR",))


SMALL_KV_DEFICIT_GIB = 1.0  # a negative KV budget this small: 0.05 of any GPU of 40 GiB and up covers it twice


def _small_kv_deficit(facts, current: float, raise_to: float, total_gib: float | None) -> bool:
    """The log states a negative KV budget (vLLM's 'Available KV cache memory: -0.48 GiB', or in words) that raising
    the share covers with as much again left for the KV cache (on a GPU of unknown size: under SMALL_KV_DEFICIT_GIB):
    the share is the lever that changes nothing else; fewer sequences or tokens only trim the profile's peak."""
    if facts.kv_memory_gib is None or facts.kv_memory_gib.value >= 0 or current >= MAX_UTILIZATION:
        return False
    deficit = -facts.kv_memory_gib.value
    return deficit * 2 <= (raise_to - current) * total_gib if total_gib else deficit < SMALL_KV_DEFICIT_GIB


def _lm_eval_oom(source: str, figures: list[Figure], seqs: float | None, utilization: float) -> Diagnosis:
    """lm-eval driving vLLM: its model_args reach vllm.LLM, and its loglikelihood requests ask for prompt
    log-probabilities (lm_eval/models/vllm_causallms.py: SamplingParams(prompt_logprobs=1, max_tokens=1)): vocabulary-
    sized logits for every prompt token of a step, which vLLM's start-up profile (the last token's logits only) did not
    count. With --batch_size auto lm-eval hands vLLM every request at once, so a step holds up to max_num_seqs prompts:
    fewer sequences per step is the lever, set in --model_args."""
    fewer = (int(seqs // 4) if seqs >= 8 else max(1, int(seqs // 2))) if seqs else 16
    return Diagnosis(source, "vllm", "oom_under_load",
                     "lm-eval's requests ran vLLM out of memory after start-up: prompt log-probabilities "
                     "(loglikelihood tasks) keep logits over the vocabulary for every prompt token of a step, up to "
                     "max_num_seqs prompts at once, beyond what vLLM's start-up profile counted", tuple(figures), (
                         Change(f"max_num_seqs={fewer} in --model_args", "fewer prompts per step: their logits shrink "
                                "in proportion (lm-eval passes model_args to vllm.LLM)", "max_num_seqs_down"),
                         Change("max_num_batched_tokens=2048 in --model_args", "caps the prompt tokens of one step",
                                "max_num_batched_tokens_down"),
                         Change(f"gpu_memory_utilization={math.floor((utilization - 0.1) * 100) / 100:.2f} in "
                                "--model_args", "a smaller KV cache leaves room for the logits",
                                "gpu_memory_utilization_down")),
                     ("which task ran out: loglikelihood tasks (prompt log-probabilities) need far more than "
                      "generate_until ones",))


LORA_DEFAULT_SLOTS = 1  # vLLM's --max-loras default
LORA_DEFAULT_RANK = 16  # vLLM's --max-lora-rank default


def _share_above_the_top_first(changes: list[Change], current: float) -> tuple[Change, ...]:
    """A --gpu-memory-utilization above MAX_UTILIZATION leaves the CUDA context, the graphs and the warm-up buffers
    allocated outside vLLM's share almost nothing: bringing the share down is the first change, before any other."""
    if current <= MAX_UTILIZATION:
        return tuple(changes)
    lower = min(MAX_UTILIZATION, math.floor((current - 0.03) * 100) / 100)
    return (Change(f"--gpu-memory-utilization {lower:.2f}",
                   f"{current} leaves {1 - current:.0%} of the GPU outside vLLM's share for what it allocates after "
                   "sizing the KV cache (CUDA graphs, the sampler's warm-up, the CUDA context): a little less share, "
                   "a little less KV cache", "gpu_memory_utilization_down"),) + tuple(
        c for c in changes if not c.setting.startswith("--gpu-memory-utilization"))


def _vllm_oom(facts: VllmFacts, source: str, figures: list[Figure], generation: str | None) -> Diagnosis:
    oom = facts.oom
    settings = facts.settings
    if oom is not None:
        figures.append(Figure("tried to allocate", oom.tried or "?", f"log line {facts.oom_line}"))
        if (verdict := allocator_verdict(oom)) is not None:
            return Diagnosis(source, "vllm", verdict.kind, verdict.summary, tuple(figures),
                             verdict.changes + _share_beside(oom, number(settings, "gpu_memory_utilization"))
                             if verdict.kind == "memory_held_elsewhere" else verdict.changes)
        if (shared := _share_over_what_others_leave(oom, number(settings, "gpu_memory_utilization"))) is not None:
            outside, total, current, fits = shared
            figures.append(Figure("outside this process's PyTorch memory", f"{outside:.2f} GiB",
                                  f"log line {facts.oom_line}"))
            return Diagnosis(source, "vllm", "memory_held_elsewhere",
                             f"{outside:.2f} GiB of the {total:.2f} GiB GPU lies outside vLLM's own (PyTorch) memory "
                             f"and the CUDA context: another process (or a shared GPU slice) holds it, yet vLLM's "
                             f"{current} share counts {current * total:.2f} GiB of the GPU as its own", tuple(figures), (
                                 Change(f"--gpu-memory-utilization {fits:.2f}",
                                        f"a share that leaves the other {outside:.2f} GiB outside vLLM's budget, if "
                                        "the other process must stay", "gpu_memory_utilization_down"),
                                 free_other_process(outside)),
                             (f"which processes hold the GPU: {LIST_PROCESSES}",))
    tried = oom.tried if oom is not None else "?"
    seqs = number(settings, "max_num_seqs")
    tried_gib, total_gib, allocated_gib = (size_gib(oom.tried), size_gib(oom.total), size_gib(oom.allocated)) \
        if oom is not None else (None, None, None)
    if facts.oom_during is None and tried_gib and total_gib and tried_gib > total_gib:
        facts.oom_during = "encoder"  # one allocation above the whole GPU: a profile input sized from the maximums
    if facts.oom_during is None and _before_mm_limits(facts) and _VISION_MODEL.search(facts.text or ""):
        # a vision-language model on a release without --limit-mm-per-prompt: its start-up profile gives each of
        # --max-num-seqs dummy sequences an image of the largest size, and nothing else placed the failure
        facts.oom_during = "encoder"
    if facts.oom_during in (None, "profile run") and facts.enc_dec:
        # an encoder-decoder or audio model (Whisper, Llama 3.2 Vision) and nothing else placing the failure, or the
        # profile run: its start-up profile (V0 EncoderDecoderModelRunner.profile_run) builds one sequence group with
        # an encoder input per sequence, up to --max-num-seqs, beside the decoder's tokens; this branch, not the
        # profile's tokens below, since V0 refuses chunked prefill for an encoder-decoder model (worker/utils.py
        # assert_enc_dec_mr_supported_scenario)
        facts.oom_during = "encoder"
    share = number(settings, "gpu_memory_utilization") or DEFAULT_UTILIZATION
    if facts.oom_during in (None, "profile run", "loading weights") and facts.weights_gib is None and allocated_gib \
            and total_gib and allocated_gib >= share * total_gib:
        tp = int(number(settings, "tensor_parallel_size") or 1)
        return Diagnosis(source, "vllm", "weights_do_not_fit",
                         f"{allocated_gib:.2f} GiB was allocated before the weights finished loading, above vLLM's "
                         f"{share} x {total_gib:.2f} GiB share: the weights do not fit", tuple(figures), (
                             Change("quantize the weights (awq or gptq 4-bit, a pre-quantized checkpoint)",
                                    "a quarter of the 16-bit weights"),
                             Change(f"--tensor-parallel-size {2 * tp}", "splits the weights over more GPUs"),
                             Change("--cpu-offload-gb 4", "keeps part of the weights in CPU memory (slower)")))
    current = number(settings, "gpu_memory_utilization") or DEFAULT_UTILIZATION
    lower = f"{math.floor((current - 0.05) * 100) / 100:.2f}"
    if facts.lm_eval and facts.oom_during in (None, "profile run"):
        return _lm_eval_oom(source, figures, seqs, current)
    if facts.oom_during == "sampler warm-up":
        warmed = facts.oom_text.value if facts.oom_text else (int(seqs) if seqs else 256)
        return Diagnosis(source, "vllm", "sampler_warm_up",
                         f"the sampler warm-up ran out of memory: it allocates logits for {warmed} dummy sequences "
                         "(--max-num-seqs) over the vocabulary", tuple(figures), _share_above_the_top_first([
                             Change(f"--max-num-seqs {max(1, int(warmed) // 4)}", "a quarter of the warm-up's logits "
                                    "(here the batch size is the lever, as the log says)"),
                             Change(f"--gpu-memory-utilization {lower}", "leaves more outside vLLM's share for the "
                                    "warm-up")], current))
    if facts.oom_during == "warm-up":
        # vLLM warms the model and the sampler up after the KV cache took its share (gpu_worker.compile_or_warm_up_model
        # runs after initialize_from_config), so the warm-up's room is what the share leaves outside it: a little less
        # share gives it back, at the cost of a little KV cache; fewer sequences shrink the sampler's dummy batch
        return Diagnosis(source, "vllm", "sampler_warm_up",
                         f"the warm-up after the KV cache was allocated ran out of memory (tried {tried}): it runs in "
                         f"what the {current} share leaves outside vLLM's budget", tuple(figures), (
                             Change(f"--gpu-memory-utilization {math.floor((current - 0.1) * 100) / 100:.2f}",
                                    "leaves more of the GPU outside vLLM's share for the warm-up (less KV cache)",
                                    "gpu_memory_utilization_down"),
                             Change(f"--max-num-seqs {int(seqs // 4) if seqs and seqs >= 8 else 64}",
                                    "the sampler warms up this many dummy sequences over the vocabulary"),
                             Change("--enforce-eager", "no CUDA graphs or compilation beside the warm-up")))
    if facts.oom_during == "mamba":
        return Diagnosis(source, "vllm", "state_cache",
                         f"the Mamba (recurrent) state cache ran out of memory (tried {tried}): it holds a state per "
                         "sequence, for --max-num-seqs sequences", tuple(figures), (
                             Change(f"--max-num-seqs {int(seqs // 4) if seqs and seqs >= 8 else 64}",
                                    "fewer state blocks"),
                             Change("--max-model-len lower", "less KV cache beside the states")))
    if facts.oom_during == "cuda graph capture":
        eager = Change("--enforce-eager", "no CUDA graphs: their pool is not allocated (slower decode at small "
                       "batches)")
        fewer = [Change(f"--max-num-seqs {int(seqs // 4) if seqs and seqs >= 8 else 64}",
                        "fewer and smaller graph sizes to capture (they go up to --max-num-seqs)"),
                 Change("--cuda-graph-sizes 1 2 4 8 16 32 (older: --compilation-config "
                        "'{\"cudagraph_capture_sizes\": [1, 2, 4, 8, 16, 32]}')", "captures fewer sizes")]
        share = Change(f"--gpu-memory-utilization {lower}", "leaves the graphs room outside vLLM's share")
        largest, count = _capture_shown(facts.text, seqs)
        if largest >= LARGE_CAPTURE_BATCH or count >= MANY_CAPTURE_SIZES:
            # the log shows a default-sized capture (up to batch 256, 35 sizes): its largest graphs are most of the
            # pool, so fewer/smaller sizes keep graphs for the common small batches; eager drops them all, and speed
            figures.append(Figure("graphs captured", f"{count or '?'} sizes up to batch {largest or '?'}",
                                  "the log or the settings"))
            changes = fewer + [eager, share]
        else:
            changes = [eager] + fewer + [share]
        return Diagnosis(source, "vllm", "cuda_graph_capture",
                         f"CUDA-graph capture ran out of memory (tried {tried})", tuple(figures),
                         _share_above_the_top_first(changes, current))
    if facts.oom_during == "lora":
        # vLLM's defaults are --max-loras 1 and --max-lora-rank 16 (EngineArgs): at or under them those are no lever.
        # The LoRA buffers also sit in every CUDA graph captured after the KV cache took its share (one per batch
        # size), so where graphs are on, eager mode is what is left
        loras = number(settings, "max_loras") or LORA_DEFAULT_SLOTS
        rank = number(settings, "max_lora_rank") or LORA_DEFAULT_RANK
        changes = []
        if loras > 1:
            changes.append(Change(f"--max-loras {max(1, int(loras // 2))}", "fewer adapter slots"))
        if rank > LORA_DEFAULT_RANK:
            changes.append(Change(f"--max-lora-rank {max(8, int(rank // 2))}", "smaller slots"))
        changes += [Change("--enforce-eager", "no CUDA graphs: each captured batch size keeps its own LoRA "
                           "intermediate buffers, outside the share the KV cache was sized from"),
                    Change(f"--max-num-seqs {int(seqs // 2) if seqs else 64}", "fewer sequences")]
        return Diagnosis(source, "vllm", "activation_peak",
                         f"LoRA buffers ran out of memory (tried {tried}): vLLM preallocates --max-loras adapters of "
                         "--max-lora-rank for every layer", tuple(figures),
                         _share_above_the_top_first(changes, current))
    if facts.oom_during == "encoder":
        fewer_seqs = Change(f"--max-num-seqs {int(seqs // 4) if seqs and seqs >= 8 else ENC_DEC_PROFILE_SEQS}",
                            "fewer dummy inputs in the profile run (an encoder-decoder model profiles one encoder "
                            "input per sequence, up to --max-num-seqs, 256 by default)")
        fewer_items = Change("--limit-mm-per-prompt '{\"image\": 1, \"video\": 0}'",
                             "fewer and smaller multimodal items in the profile run")
        shorter = Change("--max-model-len 8192", "shorter dummy sequences")
        # Llama 3.2 Vision (vllm#8879, a maintainer): "set max_num_seqs=16 and enforce_eager=True": the cross-attention
        # layers' block tables multiply with --max-num-seqs, and their image-dependent cross-attention does not suit
        # the CUDA graphs V0 captures for decoder-only models
        eager = Change("--enforce-eager", "no CUDA graphs beside the encoder's buffers")
        if facts.enc_dec:
            changes = (fewer_seqs, eager, fewer_items, shorter)
        elif _before_mm_limits(facts):  # no --limit-mm-per-prompt yet: the profile's images come one per sequence
            changes = (Change(f"--max-num-seqs {int(seqs // 8) if seqs and seqs >= 16 else 32}",
                              "fewer dummy sequences in the profile run: before 0.5.5 (no --limit-mm-per-prompt) "
                              "each one carries an image of the largest size (256 by default)"), shorter)
        else:
            changes = (fewer_items, shorter, fewer_seqs)
        items = settings.get("limit_mm_per_prompt")
        if not facts.enc_dec and tried_gib and total_gib and tried_gib > total_gib and not _HIP.search(facts.text):
            # one allocation larger than the whole GPU is no weight, KV block or graph pool: it is an attention matrix
            # the vision tower materialises (eager or SDPA with a full mask over all patches of the profile's items)
            # where a memory-efficient kernel keeps none (dots.ocr#179: without flash-attn vLLM profiles the vision
            # encoder's 14,400 tokens with eager/SDPA attention). It comes before fewer items: one item of the
            # largest size already builds it, and the item count the user chose (--limit-mm-per-prompt) stays
            kernel = Change("install flash-attn (pip install flash-attn) so the vision encoder uses a memory-efficient "
                            "attention kernel (recent vLLM: --mm-encoder-attn-backend FLASH_ATTN)",
                            f"{tried_gib:,.0f} GiB in one allocation, {tried_gib / total_gib:.1f} times the GPU, is a "
                            "full attention matrix over the profile's patches: a flash kernel never builds it"
                            + (f", and the --limit-mm-per-prompt {items.value} you set stays" if items is not None
                               else ""), "attention_kernel")
            changes = (kernel,) + changes
        return Diagnosis(source, "vllm", "activation_peak",
                         f"the encoder's (vision, audio or encoder-decoder) profile run ran out of memory (tried "
                         f"{tried}): it profiles --max-num-seqs inputs of the largest size"
                         + (" (an encoder-decoder model: one encoder input per sequence)" if facts.enc_dec else ""),
                         tuple(figures), changes)
    if facts.oom_during == "wake up":
        # the KV cache sized in bytes (vLLM's kv_cache_memory_bytes, which takes precedence over the share): what the
        # start-up profile measures beside a colocated trainer, or a release that profiles differently, no longer
        # decides the pool re-mapped at wake-up; not offered where the run sizes it in bytes already
        kv_bytes = () if _KV_BYTES_SET.search(facts.text) else (
            Change("--kv-cache-memory-bytes (a fixed KV-cache budget, e.g. what the cache took when wake-up still "
                   "fitted)", "the sleep pool stops growing with what profiling sees", "max_total_tokens_down"),)
        return Diagnosis(source, "vllm", "memory_held_elsewhere",
                         "vLLM's sleep-mode allocator (cumem) ran out of memory waking up: it shares the GPU with "
                         "another user of it (a trainer colocated with the rollout engine)", tuple(figures), (
                             Change(f"--gpu-memory-utilization {min(0.5, float(lower)):.2f}",
                                    "vLLM's share must leave the colocated process its memory when both are awake"),
                             *kv_bytes, free_other_process()))
    if facts.oom_during == "loading weights":
        tp = int(number(settings, "tensor_parallel_size") or 1)
        return Diagnosis(source, "vllm", "weights_do_not_fit",
                         f"the weights ran out of memory while loading (tried {tried})", tuple(figures), (
                             Change(f"--tensor-parallel-size {2 * tp}", "splits the weights over more GPUs"),
                             Change("quantize the weights (awq, gptq or fp8)", "smaller weights")))
    changes = [Change(f"--max-num-batched-tokens {int(number(settings, 'max_num_batched_tokens') // 2) if number(settings, 'max_num_batched_tokens') else 4096}",
                      "the profile peak scales with the tokens of one step"),
               Change(f"--gpu-memory-utilization {lower}", "leaves more outside vLLM's share")]
    length = number(settings, "max_model_len")
    if length and length >= LONG_CONTEXT:
        changes.insert(0, Change(f"--max-model-len {int(length // 2):,}", "a long --max-model-len raises the start-up "
                                 "profile's inputs (multimodal and long-context budgets) and the KV cache one "
                                 "sequence needs"))
    if generation != "V0" and (seqs or 256) <= 8 and (length or LONG_CONTEXT) <= 4096:
        changes.insert(0, Change("--enforce-eager", "the batch and length are already small: what is left at start-up "
                                 "is torch.compile's and CUDA graphs' memory"))
    chunked = facts.flags.get("enable_chunked_prefill")
    release = _release(facts)
    if generation != "V1" and not (chunked and chunked.value not in (False, "False", "false")):
        if release is None or release >= CHUNKED_PREFILL_FROM:
            changes.insert(0, Change("--enable-chunked-prefill --max-num-batched-tokens 2048",
                                     "V0 without chunked prefill profiles a whole --max-model-len prompt in one "
                                     "forward; chunked, the peak follows 2,048 tokens (V1 always chunks)"))
        if "max_model_len" not in settings:
            changes.insert(0, Change("--max-model-len 8192", "V0 profiles one prompt of --max-model-len (by default "
                                     "the model's whole context) in one forward: a shorter one lowers the peak"))
    if generation == "V0" and release is not None and release >= CUDA_GRAPHS_FROM and oom is None \
            and facts.oom_during is None and not is_on(settings, "enforce_eager"):
        # V0 sizes the KV cache from the profile run (its peak is inside the share), then captures CUDA graphs on top
        # of the share (model_runner.capture_model: "CUDA graphs can take additional 1~3 GiB memory per GPU. If you
        # are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode"): with no
        # figure and no frame to place the failure, the allocation outside the share comes first
        changes.insert(0, Change("--enforce-eager", f"vLLM {facts.version.value} (V0) captures CUDA graphs after the KV "
                                 "cache took its share, outside what it profiled: no graphs, no such allocation"))
        return Diagnosis(source, "vllm", "out_of_memory",
                         f"vLLM {facts.version.value} ran out of memory; the log shows no figure or frame placing "
                         "it: the start-up allocation its profile does not count is the CUDA-graph pool",
                         tuple(figures), tuple(changes),
                         ("the traceback (capture_model, profile_run or load_model in its frames) would settle which "
                          "phase ran out",))
    if _said_in_words_only(facts):
        # nothing places the failure and nothing was set: the defaults are all there is, and the default share (0.9)
        # is the one setting whose lowering helps wherever the failure lies after the KV cache took it (CUDA graphs,
        # the sampler's warm-up, the encoder's cache, a running step), at the cost of some KV cache; the context the
        # user would lose comes after
        share_down = Change(f"--gpu-memory-utilization {math.floor((current - 0.1) * 100) / 100:.2f}",
                            f"the default {current} share leaves {1 - current:.0%} of the GPU for all vLLM allocates "
                            "outside it; a lower share gives that room back (less KV cache)",
                            "gpu_memory_utilization_down")
        return Diagnosis(source, "vllm", "out_of_memory",
                         "vLLM ran out of memory, said in words only: no figure, frame, version or setting places it",
                         tuple(figures), (share_down,) + tuple(
                             c for c in changes if not c.setting.startswith("--gpu-memory-utilization")),
                         ("the error's whole text (PyTorch's 'Tried to allocate' figures, the traceback) and the "
                          "server's start-up lines would let diagnose decide which phase ran out",))
    return Diagnosis(source, "vllm", "activation_peak",
                     f"a forward ran out of memory (tried {tried}): the profile run at --max-num-batched-tokens",
                     tuple(figures), tuple(changes))


CUDA_CONTEXT_GIB = 1.0  # the CUDA context, cuBLAS/NCCL workspaces: non-PyTorch memory of vLLM's own process
LEAST_SHARE_LEFT = 0.3  # below this the other process leaves vLLM too little: freeing it is the only lever


def _share_over_what_others_leave(oom, share: float | None) -> tuple[float, float, float, float] | None:
    """PyTorch's older OOM message (".. GiB total capacity; .. already allocated; .. free; .. reserved in total by
    PyTorch") gives no per-process figure, but total - free - reserved is what neither this process's tensors nor its
    allocator hold: beyond the CUDA context it is another process's (an embedding model beside the server, a shared
    vGPU slice). vLLM sizes its budget as share x total whatever else is there, so where that memory is more than the
    share leaves outside, the share cannot be met: (outside, total, share, a share that fits) or None."""
    total, free, reserved = size_gib(oom.total), size_gib(oom.free), size_gib(oom.reserved)
    if not oom.reserved_is_total or None in (total, free, reserved) or oom.in_use:
        return None
    current = share or DEFAULT_UTILIZATION
    outside = total - free - reserved
    if outside - CUDA_CONTEXT_GIB <= (1 - current) * total:
        return None
    fits = _share_leaving(outside, total, current)
    return (outside, total, current, fits) if fits is not None else None


def _share_leaving(held_gib: float, total_gib: float, current: float) -> float | None:
    """The vLLM share (in hundredths, 0.05 of headroom) that leaves held_gib of the GPU outside its budget, where it is
    below the share in place and still a useful part of the GPU; else None."""
    fits = math.floor(((total_gib - held_gib) / total_gib - 0.05) * 100) / 100
    return fits if LEAST_SHARE_LEFT <= fits < current else None


def _share_beside(oom, share: float | None) -> tuple[Change, ...]:
    """Beside freeing another process's memory (first): the vLLM share that leaves it outside, where the other process
    must stay and that share still leaves vLLM a useful part of the GPU."""
    held, total = held_elsewhere_gib(oom), size_gib(oom.total)
    if held is None or not total or (fits := _share_leaving(held, total, share or DEFAULT_UTILIZATION)) is None:
        return ()
    return (Change(f"--gpu-memory-utilization {fits:.2f}", f"if the other process must stay: a share that leaves its "
                   f"{held:.2f} GiB outside vLLM's budget", "gpu_memory_utilization_down"),)


def _said_in_words_only(facts: VllmFacts) -> bool:
    """An out-of-memory report with nothing else: no PyTorch figures, no vLLM line (weights, version, V0/V1 lines),
    no phase and no setting from the log or --flags."""
    return (facts.oom is None and facts.oom_during is None and facts.version is None and facts.weights_gib is None
            and not facts.v0_lines and not facts.v1_lines and not facts.enc_dec and not facts.settings)


# a KV cache already fixed in bytes (a flag or config line of the run; a diff's added line is the fix, not the run)
_KV_BYTES_SET = re.compile(r"^(?![ \t]*\+).*\bkv[-_]cache[-_]memory(?:[-_]bytes)?\b[\"']?\s*[:=\s]\s*\d", re.I | re.M)
# PyTorch on ROCm says "HIP out of memory": pip's flash-attn wheels are CUDA builds (its ROCm port covers MI200/MI300
# only), so a kernel is no first change there and fewer or smaller items come first
_HIP = re.compile(r"\bHIP out of memory|\bhipMalloc|\bROCm\b")
LARGE_CAPTURE_BATCH = 128  # half of vLLM's default --max-num-seqs 256, the largest size it captures by default
MANY_CAPTURE_SIZES = 32  # vLLM captures 35 sizes by default (1, 2, 4, then every 8 up to 256)
# the capture as the log shows it: "35 FULL graphs", "FULL=35 (largest=256)", "Capturing CUDA graphs ... 0/51",
# "cudagraph_capture_sizes": [1, 2, ...]
_CAPTURE_SHOWN = re.compile(r"\b(\d+) (?:FULL |PIECEWISE )?(?:CUDA[- ]?)?graphs\b|\b(?:FULL|PIECEWISE)=(\d+) \(largest=(\d+)\)|"
                            r"Capturing CUDA graphs[^\n]*?\b\d+/(\d+)|cudagraph_capture_sizes[\"']?\s*[:=]\s*\[([\d,\s]+)\]",
                            re.I)


def _capture_shown(text: str, seqs: float | None) -> tuple[int, int]:
    """(the largest batch, the number of sizes) the log or the settings show the capture went to; 0 where unseen."""
    largest, count = int(seqs or 0), 0
    for match in _CAPTURE_SHOWN.finditer(text or ""):
        graphs, listed, top, progress, sizes = match.group(1), match.group(2), match.group(3), match.group(4), \
            match.group(5)
        numbers = [int(n) for n in re.findall(r"\d+", sizes or "")]
        count = max(count, int(graphs or listed or progress or 0), len(numbers))
        largest = max(largest, int(top or 0), max(numbers, default=0))
    return largest, count


CUDA_GRAPHS_FROM = (0, 2, 6)  # vLLM PR #1926 (CUDA graphs, --enforce-eager), in the release of 12-2023
CHUNKED_PREFILL_FROM = (0, 4, 1)  # --enable-chunked-prefill
# --limit-mm-per-prompt came with vLLM 0.5.5 (vllm-project/vllm#7126, profiling with several items per prompt); before
# it the multimodal profile run gives each of --max-num-seqs dummy sequences one item of the largest size
MM_LIMIT_FROM = (0, 5, 5)
# a vision-language model by its name (the image tower's profile input comes with it)
_VISION_MODEL = re.compile(r"(?<![a-z])(?:minicpm[-_]?v(?![a-z])|llava|qwen2?(?:\.5)?[-_]?vl(?![a-z])|internvl|"
                           r"phi[-_]?3(?:\.5)?[-_]?vision|pixtral|idefics|paligemma|fuyu|blip[-_]?2)", re.I)


def _before_mm_limits(facts: VllmFacts) -> bool:
    release = _release(facts)
    return release is not None and release < MM_LIMIT_FROM


def _release(facts: VllmFacts) -> tuple[int, ...] | None:
    if facts.version is None:
        return None
    parts = tuple(int(p) for p in re.findall(r"\d+", str(facts.version.value))[:3])
    return parts or None


# --- vLLM under load ----------------------------------------------------------------------------------------------

FULL_KV_USAGE = 99.0  # percent: a KV cache this full with requests waiting has run out


def _kv_exhausted(load) -> bool:
    return bool((load.preemptions and load.preemptions.value > 0)
                or (load.kv_usage and load.kv_usage.value >= FULL_KV_USAGE and load.waiting and load.waiting.value))


def _kv_exhausted_under_load(facts, source, figures, per_token, utilization, total_gib, context) -> Diagnosis:
    load = facts.load
    figures.append(Figure("highest KV cache usage", f"{load.kv_usage.value:.1f}% with {load.running.value} running",
                          _where(load.kv_usage.line)) if load.kv_usage else Figure("stats lines", "0", "log"))
    if load.waiting:
        figures.append(Figure("longest queue", f"{load.waiting.value} waiting", _where(load.waiting.line)))
    if load.preemptions:
        figures.append(Figure("preemptions", f"{load.preemptions.value:,}" + (
            f" ({load.preemption_mode})" if load.preemption_mode else ""), _where(load.preemptions.line)))
    tokens = facts.kv_tokens.value if facts.kv_tokens else None
    per_request = (tokens * load.kv_usage.value / 100 / load.running.value
                   if tokens and load.kv_usage and load.running and load.running.value else None)
    summary = ("under load the KV cache ran out: " + (
        f"{load.preemptions.value:,} requests were preempted and recomputed" if load.preemptions
        else f"it was {load.kv_usage.value:.0f}% full with {load.waiting.value} requests waiting")
        + (f"; it holds {tokens:,} tokens, about {per_request:,.0f} per running request" if per_request else "")
        + ". The server did not fail: latency did (preempted work is done twice, queued requests wait)")
    changes = []
    if per_request:
        seats = max(1, int(tokens // per_request))
        changes.append(Change(f"--max-num-seqs {seats}",
                              f"{tokens:,} tokens / about {per_request:,.0f} per request: the batch the cache holds, "
                              "so requests queue instead of being preempted (here the batch size is the lever; more "
                              "throughput needs more KV cache, below)"))
    changes.append(Change("--kv-cache-dtype fp8", "halves the KV bytes per token" + (
        f": about {2 * tokens:,} tokens, twice the requests at once" if tokens else "")))
    current = utilization or DEFAULT_UTILIZATION
    if total_gib and current < MAX_UTILIZATION:
        added = (MAX_UTILIZATION - current) * total_gib
        more = f" = about {int(added * GIB / per_token[0]):,} tokens" if per_token else ""
        changes.append(Change(f"--gpu-memory-utilization {MAX_UTILIZATION:.2f}",
                              f"adds {added:.2f} GiB{more} to the KV cache, if nothing else uses the GPU"))
    if context.weights_16bit_bytes and context.weights_4bit_bytes:
        freed = (context.weights_16bit_bytes - context.weights_4bit_bytes) / GIB
        changes.append(Change("quantize the weights (awq or gptq 4-bit)", f"{freed:.2f} GiB more for the KV cache"))
    changes.append(Change("another replica, or --tensor-parallel-size 2", "spreads the load: each server's KV cache "
                          "serves fewer requests"))
    missing = (() if tokens else ("the KV cache's size: the start-up line 'GPU KV cache size: N tokens' (V1) or "
                                  "'# GPU blocks: N' (V0); pass the log from the server's start",)) + (
        () if total_gib else ("the GPU's total memory, for the --gpu-memory-utilization arithmetic: pass --target-gpu",))
    return Diagnosis(source, "vllm", "kv_exhausted_under_load", summary, tuple(figures), tuple(changes), missing)


V1_STEP_TOKENS = 8192  # the largest --max-num-batched-tokens vLLM V1 picks itself for a server (on large GPUs)
LARGE_STEP_TOKENS = 2 * V1_STEP_TOKENS


def _oom_under_load(facts, source, figures, utilization, total_gib) -> Diagnosis:
    """An OOM after the server served (its lines, or a report that says so in words): the KV cache was sized at
    start-up and --max-model-len is no lever now; a step's activations and kernel workspaces are, and they scale with
    the tokens of one step, so a step budget the user set large comes down first (their context length stays)."""
    oom = facts.oom
    if oom is not None:
        figures.append(Figure("tried to allocate", oom.tried or "?", _where(facts.oom_line)))
    if facts.serving_line:
        figures.append(Figure("the server was serving", "before the error", _where(facts.serving_line)))
    elif facts.runtime_said:
        figures.append(Figure("the failure came while serving", repr(facts.runtime_said.value),
                              _where(facts.runtime_said.line)))
    current = utilization or DEFAULT_UTILIZATION
    lower = math.floor((current - 0.05) * 100) / 100
    headroom = f" ({0.05 * total_gib:.2f} GiB on {total_gib:.1f} GiB)" if total_gib else ""
    changes = [Change(f"--gpu-memory-utilization {lower:.2f}",
                      f"leaves 5% more of the GPU{headroom} outside vLLM's share for what its start-up profile did "
                      "not see"),
               Change("--max-num-batched-tokens 4096", "caps the tokens of one forward step, and so its activations"),
               Change("--max-logprobs 5", "a request for many (prompt) log-probabilities materialises "
                      "vocabulary-sized rows per token; cap what clients may ask for")]
    step = number(facts.settings, "max_num_batched_tokens")
    if step and step >= LARGE_STEP_TOKENS:
        changes = [Change(f"--max-num-batched-tokens {V1_STEP_TOKENS}",
                          f"vLLM's own budget on large GPUs instead of {int(step):,} tokens in one step: its activations and the attention and MoE kernels' "
                          "workspaces scale with them, and only the largest steps (long prompts, many decodes at once) "
                          "reach that peak; --max-model-len stays (the KV cache was sized at start-up)")] + [
            c for c in changes if not c.setting.startswith("--max-num-batched-tokens")]
    unallocated = (oom.reserved_unallocated_bytes or 0) / GIB if oom is not None else 0.0
    tried = size_gib(oom.tried) if oom is not None else None
    if tried and unallocated >= tried:
        changes.insert(0, Change("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                 f"{unallocated:.2f} GiB is reserved but unallocated, more than the {tried:.2f} GiB "
                                 "asked for: fragmentation"))
    return Diagnosis(source, "vllm", "oom_under_load",
                     f"the server ran out of memory while serving (tried {oom.tried if oom else '?'}), after a start-up "
                     "that fitted: "
                     "the KV cache was allocated at start-up, so this is a step's activations or memory outside "
                     "vLLM's share; a smaller batch only hides it", tuple(figures), tuple(changes))


# --- SGLang, TGI, TensorRT-LLM ------------------------------------------------------------------------------------


def _other_engine(facts: EngineFacts, source: str, context: Context) -> Diagnosis:
    figures = quoted_figures(facts)
    if facts.engine == "tgi" and facts.prefill_tokens:
        half = facts.prefill_tokens.value // 2
        return Diagnosis(source, "tgi", "activation_peak",
                         f"the warm-up prefill of {facts.prefill_tokens.value:,} tokens did not fit: the activation peak "
                         "of one prefill batch", tuple(figures), (
                             Change(f"--max-batch-prefill-tokens {half:,}", "halves the warm-up batch's activations "
                                    "(here the batch is the lever)"),))
    if facts.engine == "sglang" and facts.not_enough:
        current = facts.mem_fraction_static.value if facts.mem_fraction_static else 0.88
        total = (facts.weights_gb.value + facts.available_gb.value) if facts.weights_gb and facts.available_gb \
            else context.gpu_total_gib
        changes = []
        if total and facts.weights_gb:
            fraction = min(0.95, math.ceil((facts.weights_gb.value / total + 0.1) * 100) / 100)
            changes.append(Change(f"--mem-fraction-static {max(fraction, current + 0.02):.2f}",
                                  f"the KV pool gets fraction x {total:.1f} GB - {facts.weights_gb.value:.1f} GB of "
                                  f"weights = {max(fraction, current + 0.02) * total - facts.weights_gb.value:.1f} GB "
                                  "(mem_fraction_static counts the weights and the KV pool together)"))
        else:
            changes.append(Change(f"--mem-fraction-static {min(0.95, current + 0.05):.2f}",
                                  "mem_fraction_static counts the weights and the KV pool together: raise it"))
        changes += [Change("quantize the weights (awq or gptq 4-bit)", "about a quarter of the 16-bit weights"),
                    Change("--tp 2", "splits the weights over two GPUs")]
        return Diagnosis(source, "sglang", "no_kv_cache_memory",
                         "nothing is left for the KV pool: --mem-fraction-static leaves no room after the weights",
                         tuple(figures), tuple(changes))
    if facts.kv_tokens and facts.context_len and facts.kv_tokens.value < facts.context_len.value:
        flag = "--max_seq_len" if facts.engine == "trtllm" else "--context-length"
        lever = ("kv_cache_config.free_gpu_memory_fraction 0.95 (a share of the memory free after the weights)"
                 if facts.engine == "trtllm" else "--mem-fraction-static +0.05")
        return Diagnosis(source, facts.engine, "kv_cache_too_small",
                         f"the KV cache holds {facts.kv_tokens.value:,} tokens, fewer than one sequence of "
                         f"{facts.context_len.value:,}", tuple(figures), (
                             Change(f"{flag} {facts.kv_tokens.value:,}", "one sequence of that length fits"),
                             Change(lever, "a larger KV cache")))
    held = f"its KV cache holds {facts.kv_tokens.value:,} tokens" if facts.kv_tokens else "no memory failure"
    return Diagnosis(source, facts.engine, "fits", f"{facts.engine}: {held}", tuple(figures))


# --- PyTorch ------------------------------------------------------------------------------------------------------


def _torch(oom, line: int, source: str, context: Context) -> Diagnosis:
    where = f"log line {line}"
    figures = [Figure(label, value, where) for label, value in (
        ("tried to allocate", oom.tried), ("GPU total", oom.total), ("free", oom.free),
        ("allocated by PyTorch", oom.allocated), ("reserved but unallocated" if not oom.reserved_is_total
                                                  else "reserved in total", oom.reserved),
        ("this process in use", oom.in_use)) if value]
    tried, total, free = size_gib(oom.tried), size_gib(oom.total), size_gib(oom.free)
    unallocated = (oom.reserved_unallocated_bytes or 0) / GIB
    in_use = size_gib(oom.in_use)
    if tried and total and unallocated >= tried and unallocated >= FRAGMENTED_SHARE * total:
        return Diagnosis(source, "pytorch-oom", "fragmentation",
                         f"fragmentation: {unallocated:.2f} GiB is reserved by PyTorch but unallocated, more than the "
                         f"{tried:.2f} GiB asked for, yet no block of that size is free", tuple(figures), (
                             Change("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                    "lets the allocator grow segments instead of needing one free block of "
                                    f"{tried:.2f} GiB"),
                             Change("torch.cuda.empty_cache() between phases", "returns the cached blocks")))
    if total and free is not None and in_use is not None and total - free - in_use > 0.5:
        held = total - free - in_use
        return Diagnosis(source, "pytorch-oom", "memory_held_elsewhere",
                         f"another process holds {held:.2f} GiB of the {total:.2f} GiB GPU (this process {in_use:.2f},"
                         f" free {free:.2f})", tuple(figures), (
                             Change("stop the other process (nvidia-smi --query-compute-apps=pid,used_memory "
                                    "--format=csv names it)", f"frees {held:.2f} GiB"),))
    changes = []
    if context.weights_16bit_bytes and total and context.weights_16bit_bytes / GIB > 0.8 * total:
        kind, summary = "weights_do_not_fit", (f"the weights ({context.weights_16bit_bytes / GIB:.2f} GiB at 16 bits) "
                                               f"nearly fill the {total:.2f} GiB GPU")
        changes.append(Change("quantize (awq or gptq 4-bit)",
                              f"weights {(context.weights_4bit_bytes or 0) / GIB:.2f} GiB"))
    else:
        kind, summary = "out_of_memory", (f"this process's own tensors filled the GPU ({oom.allocated or '?'} allocated"
                                          f" of {oom.total or '?'}); the {oom.tried} asked for is the last straw, "
                                          "not necessarily the culprit")
    changes += [Change("lower the tokens per step (batch x sequence length)", "the activation peak and the KV cache "
                       "grow with both: the lever when the weights fit"),
                Change("--tensor-parallel-size 2 (serving) or a larger GPU", "splits the weights")]
    return Diagnosis(source, "pytorch-oom", kind, summary, tuple(figures), tuple(changes),
                     () if context.weights_16bit_bytes else ("which model: --model DIR tells weights from activations",))


# --- nvidia-smi ---------------------------------------------------------------------------------------------------


def _smi(trace, source: str, context: Context) -> Diagnosis:
    used = trace.used_mib
    total = trace.total_mib or ((context.gpu_total_gib or 0) * 1024)
    peak_at = max(range(len(used)), key=lambda i: used[i])
    peak = used[peak_at]
    rise = next((i for i in range(1, len(used)) if used[i] - used[i - 1] > 0.02 * max(peak, 1)), 0)
    plateau = next((i for i in range(rise + 1, len(used)) if abs(used[i] - used[i - 1]) <= 0.01 * max(peak, 1)),
                   len(used) - 1)
    figures = [Figure("samples", str(len(used)), "trace"),
               Figure("after load", f"{used[plateau]:,.0f} MiB", f"sample {plateau + 1} ({trace.times[plateau]})"),
               Figure("peak", f"{peak:,.0f} MiB", f"sample {peak_at + 1} ({trace.times[peak_at]})")]
    if not total:
        return Diagnosis(source, "nvidia-smi", "within_watermark",
                         f"peak {peak:,.0f} MiB; the GPU's total is not in the trace", tuple(figures), (),
                         ("the GPU's total: add memory.total to --query-gpu, or pass --target-gpu",))
    figures.append(Figure("total", f"{total:,.0f} MiB", "trace"))
    headroom = WATERMARK * total - peak
    figures.append(Figure(f"headroom to the {WATERMARK:.0%} watermark", f"{headroom:,.0f} MiB", "arithmetic"))
    if headroom < 0:
        return Diagnosis(source, "nvidia-smi", "over_watermark",
                         f"the peak {peak / total:.1%} of the GPU is above the {WATERMARK:.0%} a load test should stay "
                         f"under ({-headroom:,.0f} MiB over)", tuple(figures), (
                             Change(f"--gpu-memory-utilization {math.floor((WATERMARK - (peak - used[plateau]) / total) * 100) / 100:.2f}",
                                    "vLLM preallocates its share: lower it so the peak stays under the watermark"),))
    return Diagnosis(source, "nvidia-smi", "within_watermark",
                     f"the peak {peak / total:.1%} of the GPU stays under the {WATERMARK:.0%} watermark "
                     f"({headroom:,.0f} MiB to spare)", tuple(figures))
