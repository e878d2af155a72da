"""What a log says about memory, per log kind. Each reader returns its facts with the line each came from, or None
when the text is not its kind. The message shapes are the engines' own strings (vLLM: vllm/v1/core/
kv_cache_utils.py, v1/worker/utils.py, v1/worker/gpu_model_runner.py, entrypoints/serve/utils/api_utils.py; V0:
worker/worker.py, engine/llm_engine.py; PyTorch: c10/cuda/CUDACachingAllocator.cpp, in harness.measure.oom)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.diagnose.failures import TORCH_OOM_BODY, says_oom
from harness.flags import command_words, flag_pairs
from harness.measure.oom import OomFigures, parse_cuda_oom, parse_size

GIB = 2**30
V0_BLOCK_TOKENS = 16  # vLLM's default --block-size


@dataclass
class Quoted:
    """A value and the log line (1-based) it came from."""

    value: float | int | str
    line: int


@dataclass
class VllmFacts:
    flags: dict[str, Quoted] = field(default_factory=dict)  # max_model_len, gpu_memory_utilization, ...
    weights_gib: Quoted | None = None
    kv_memory_gib: Quoted | None = None
    kv_tokens: Quoted | None = None
    kv_blocks: Quoted | None = None  # V0: the KV cache in blocks (tokens = blocks x --block-size)
    concurrency: Quoted | None = None  # (tokens per request, x) as "L:x"
    graph_gib: Quoted | None = None
    no_kv_memory: Quoted | None = None
    kv_needed: Quoted | None = None  # "max_len:needed_gib:available_gib:estimated_len"
    v0_too_long: Quoted | None = None  # "max_len:kv_tokens"
    free_below: Quoted | None = None  # "free:total:utilization:requested"
    oom: OomFigures | None = None
    oom_line: int | None = None
    oom_during: str | None = None  # "cuda graph capture", "sampler warm-up", "profile run", "mamba", "encoder", ...
    oom_text: Quoted | None = None  # an out-of-memory line without PyTorch's figures ("warming up sampler with N")
    initial_usage_gib: Quoted | None = None  # memory in use before this instance loaded anything (another process)
    profiling_disturbed: Quoted | None = None  # "Error in memory profiling. Initial free memory X, current Y"
    mamba_blocks: Quoted | None = None  # "max_num_seqs:blocks" from "exceeds available Mamba cache blocks"
    v0_lines: bool = False  # lines only V0 prints
    v1_lines: bool = False  # lines only V1 prints
    enc_dec: bool = False  # an encoder-decoder model runner (V0 enc_dec_model_runner)
    settings: dict = field(default_factory=dict)  # every setting the log and --flags show (harness.diagnose.settings)
    version: Quoted | None = None  # "0.6.3", from the server's version line
    total_gib: Quoted | None = None  # the GPU's total memory, from a memory-profiling line
    load: LoadFacts | None = None  # the periodic stats lines and preemption warnings, once serving
    serving_line: int | None = None  # the first line that shows the server serving
    runtime_said: Quoted | None = None  # words that place the failure after start-up, while serving (a prose report)
    answered_first: bool = False  # those words say the server answered (health, a first request) before it failed
    lm_eval: bool = False  # lm-eval drives this vLLM (lm_eval --model vllm): its requests, not a server's clients
    kv_check: Quoted | None = None  # a traceback through the KV-cache memory check, its message cut off
    utilization_hint: Quoted | None = None  # the --gpu-memory-utilization vLLM itself recommends (graph profiling)
    text: str = field(default="", repr=False)  # the log read (what its lines show beside the facts above)


@dataclass
class LoadFacts:
    """What the server logged while serving: the fullest KV cache, the longest queue, the preemptions."""

    stats_lines: int = 0
    kv_usage: Quoted | None = None  # the highest "KV cache usage" percentage
    running: Quoted | None = None  # requests running on the line of the highest usage
    waiting: Quoted | None = None  # the longest queue (V1 "Waiting", V0 "Pending")
    preemptions: Quoted | None = None  # V1 "Preemptions: N" or V0's cumulative count in its warning
    preemption_mode: str = ""  # V0: RECOMPUTE or SWAP


_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_SERVE = re.compile(r"vllm serve (\S+)((?: +--?[\w-]+(?:[ =](?!--)\S+)?)*)")
_FLAG_KEYS = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
              "enforce_eager", "tensor_parallel_size", "quantization", "dtype", "model", "block_size",
              "enable_chunked_prefill", "max_logprobs")


@dataclass(frozen=True)
class _FactLine:
    """A line vLLM prints that gives one fact: the VllmFacts attribute it sets, its value from the match, and whether
    the line alone shows the text is a vLLM log (the concurrency, version and initial-usage lines do not)."""

    attribute: str
    pattern: re.Pattern
    value: Callable[[re.Match], object]
    marks: bool = True


_FACT_LINES = (
    _FactLine("weights_gib",
              re.compile(r"(?:Model loading took|Loading model weights took) ([\d.]+) ?(GiB|GB)"),
              lambda m: float(m.group(1))),
    _FactLine("graph_gib",
              re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.-]+) GiB"),
              lambda m: float(m.group(1))),
    _FactLine("kv_memory_gib",
              re.compile(r"Available KV cache memory: (-?[\d.]+) ?GiB|the rest of the memory reserved for KV Cache is "
                         r"(-?[\d.]+) ?GiB|Explicitly set \((-?[\d.]+)/[\d.]+\) GiB for KV cache|kv_cache_size=(-?[\d.]+) ?GiB"),
              lambda m: float(next(g for g in m.groups() if g))),
    _FactLine("kv_tokens",
              re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"),
              lambda m: int(m.group(1).replace(",", ""))),
    _FactLine("concurrency",
              re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
              lambda m: f"{m.group(1).replace(',', '')}:{m.group(2)}", marks=False),
    _FactLine("no_kv_memory",
              re.compile(r"No available memory for the cache blocks"),
              lambda m: "no available memory for the cache blocks"),
    # the same failure in a person's words: a negative or zero KV budget ("KV cache allocation to fail with negative
    # available memory (-0.48 GiB)", "the KV cache is negative", "no memory for the cache blocks", "0 GPU blocks")
    _FactLine("kv_memory_gib",
              re.compile(r"\b(?:KV[- ]cache|cache blocks?)\b[^\n]{0,60}?\bnegative\b[^\n(]{0,40}\((-\d+(?:\.\d+)?) ?GiB\)|"
                         r"\bnegative (?:available |KV[- ]cache )?(?:memory|budget|KV[- ]cache)[^\n(]{0,40}\((-\d+(?:\.\d+)?) ?GiB\)",
                         re.I),
              lambda m: float(next(g for g in m.groups() if g))),
    _FactLine("no_kv_memory",
              re.compile(r"\bnegative (?:available )?(?:KV[- ]cache|KV|memory for the (?:KV )?cache|KV budget)|"
                         r"\bKV[- ]cache(?: memory| budget| size)? (?:is|was|went|goes|became|turn(?:s|ed)) negative|"
                         r"\bno (?:GPU )?memory (?:left )?for the (?:KV )?cache blocks|\b0 (?:GPU|KV[- ]cache) blocks\b", re.I),
              lambda m: m.group(0)),
    _FactLine("kv_needed",
              re.compile(r"To serve at least one request with the models?'?s?'? max seq len \((\d+)\), \(?([\d.]+) GI?B KV "
                         r"cache is needed, which is larger than the available KV cache memory \(([\d.]+) GI?B\)\.(?: "
                         r"Based on the available memory, the estimated maximum model length is (\d+)\.)?", re.I),
              lambda m: ":".join(g or "" for g in m.groups())),
    # V0's worker (raise_if_cache_size_invalid; llm_engine._init_cache before 0.4) and its copies for other devices;
    # the count in brackets may be missing where a user retyped the message ("maxinum", no figure)
    _FactLine("v0_too_long",
              re.compile(r"max seq len \((\d+)\) is larger than the max\w* number of tokens that can be stored in "
                         r"(?:the )?KV cache(?: \((\d+)\))?", re.I),
              lambda m: f"{m.group(1)}:{m.group(2) or ''}"),
    _FactLine("free_below",
              re.compile(r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than (?:desired "
                         r"GPU memory utilization ?|the engine's budget[^(]*)\(([\d.]+), ([\d.]+) GiB\)"),
              lambda m: ":".join(m.groups())),
    _FactLine("version",
              re.compile(r"vLLM (?:API )?server version (\d+\.\d+(?:\.\d+)?)"),
              lambda m: m.group(1), marks=False),
    _FactLine("initial_usage_gib",
              re.compile(r"initial_memory_usage=([\d.]+) ?GiB"),
              lambda m: float(m.group(1)), marks=False),
    _FactLine("profiling_disturbed",
              re.compile(r"Error in memory profiling\. Initial free memory ([\d.]+)(?: ?GiB)?, current free memory "
                         r"([\d.]+)"),
              lambda m: f"{m.group(1)}:{m.group(2)}"),
)

# V0's executors: "# GPU blocks: N, # CPU blocks: M" ("# cuda blocks", "# HPU blocks", ... by platform)
_V0_BLOCKS = re.compile(r"# (\w+) blocks: (\d+), # CPU blocks: \d+")
_PROFILE_TOTAL = re.compile(r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization \(([\d.]+)\)|Memory profiling "
                            r"results: total_gpu_memory=([\d.]+)GiB.*?gpu_memory_utilization=([\d.]+)")
_SAMPLER = re.compile(r"out of memory occurred when warming up sampler with (\d+) dummy requests", re.I)
_MAMBA = re.compile(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)|exceeds available Mamba "
                    r"cache blocks \((\d+)\)")
# V0's multiprocess executor names its workers "VllmWorkerProcess" (vllm/executor/multiproc_worker_utils.py) and its
# runner logs as "model_runner.py:N]"; V1's are "(VllmWorker rank=N pid=M)" and "gpu_model_runner.py"
_V0_ONLY = re.compile(r"# (?:GPU|cuda) blocks: \d+|Initializing an? (?:V0 )?LLM engine \(v[\d.]+\)|\[worker\.py|"
                      r"llm_engine\.py|(?<![\w/])model_runner\.py:\d+\]|Using V0|V0 LLM engine|VLLM_USE_V1=0|"
                      r"VllmWorkerProcess|multiproc_worker_utils")
_V1_ONLY = re.compile(r"EngineCore|Initializing a V1 LLM engine|GPU KV cache size: [\d,]+ tokens|\[gpu_model_runner\.py|"
                      r"VLLM_USE_V1=1|\(VllmWorker(?!Process)|v1/engine|v1/worker")
# a line without any of these matches none of read_vllm's patterns
_VLLM_WORDS = ("non-default", "serve", "took", "KV", "kv_cache", "oncurrency", "Graph", "No available", "To serve",
               "max seq len", "Free memory", "version", "blocks:", "total_gpu_memory", "startup complete",
               "throughput", "Uvicorn", "API server", "Running:", "preempted", "sampler", "initial_memory",
               "memory profiling", "Mamba", "enc_dec", "EncoderDecoder", "cross_attention", "mllama", "V0", "V1",
               "EngineCore", "gpu_model_runner", "VllmWorker", "v1/", "worker.py", "llm_engine", "model_runner",
               "memory", "Memory", "Capturing", "File \"", "Error", "ERROR", "USE_V1", "Tried to allocate")
# V0's encoder-decoder runner, or a model vLLM runs as one: Llama 3.2 Vision (model_type mllama,
# MllamaForConditionalGeneration: cross-attention to the image encoder's states) and Whisper
_ENC_DEC = re.compile(r"enc_dec_model_runner|EncoderDecoder|cross_attention|mllama|Llama-3\.2-\d+B-Vision|\bwhisper\b",
                      re.I)  # Whisper the model, not a path like envs/whisperx
# lm-eval's vLLM backend (lm_eval/models/vllm_causallms.py, registered as "vllm"), run from its command line
_LM_EVAL_VLLM = re.compile(r"lm[_-]eval\b[^\n]*--model[ =]vllm\b|vllm_causallms")
# the release as a user states it beside the log ("in vllm 0.2.7", "vllm==0.6.3", "vLLM version 0.5.4", "在0.5.4版本中":
# "in version 0.5.4", in a text read as vLLM's)
_VERSION_SAID = re.compile(r"\bvllm(?:==| version | v| )v?(\d+\.\d+\.\d+)\b|(?<![\d.])(\d+\.\d+\.\d+)\s*版本", re.I)
_CAPTURE = re.compile(r"captur|cudagraph|cuda_graph|cuda graph|vllm/compilation/", re.I)
# a setting whose name speaks of capture (max_seq_len_to_capture, cudagraph_capture_sizes, cuda_graph_sizes,
# --cuda-graph-max-bs), given in a command line or an args dump (a --flag, or name = value / 'name': value): it names
# what capture would use, not a capture that ran; once given, the same name in the person's words is the setting too
_CAPTURE_WORD = r"[\w-]*(?:captur|cudagraph|cuda[_-]graph)[\w-]*"
_CAPTURE_SETTING = re.compile(rf"--({_CAPTURE_WORD})|\b({_CAPTURE_WORD})[\"'`]?\s*[:=]", re.I)
# "CUDA graph (memory) profiling": the start-up profile estimating the graphs' memory (vLLM from 0.21), not a capture
_GRAPH_PROFILING = re.compile(r"(?:cuda[ _]?graph|cudagraph)s?(?: memory)? profil\w*", re.I)
# the functions that check the KV cache's memory at start-up and raise when none is left or one sequence does not fit
# (V1 kv_cache_utils: get_kv_cache_config(s) -> check_enough_kv_cache_memory; V0 worker: raise_if_cache_size_invalid);
# a traceback through them whose message was cut off is that failure
_KV_CHECK_FRAME = re.compile(r"(?:\bin |[\s.=])(?:get_kv_cache_configs?|_?check_enough_kv_cache_memory|"
                             r"raise_if_cache_size_invalid)\b(?:$|\()")
# vLLM's recommendation once it profiles CUDA-graph memory: "--gpu-memory-utilization=0.95 is equivalent to 0.9325
# without CUDA graph profiling", or "current gpu_memory_utilization=X is equivalent to Y without CUDA graph profiling;
# increase to Z"
_UTILIZATION_HINT = re.compile(r"(current )?gpu[-_]memory[-_]utilization=([\d.]+)\W{0,4}\s*is equivalent to [\d.]+\s+"
                               r"without CUDA graph profiling(?:; increase to ([\d.]+))?", re.I)
# an OOM line without PyTorch's figures ("CUDA error: out of memory"), or a traceback through a start-up phase
_BARE_OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", re.I)
_VLLM_FRAME = re.compile(r'File ".*vllm/[^"]+", line \d+, in ')
_PHASE_FRAME = re.compile(r"in (?:capture_model|_capture_cudagraphs|_dummy_sampler_run|profile_run|_dummy_run|"
                          r"determine_num_available_blocks|determine_available_memory)\b")
_EXCEPTION = re.compile(r"(?:^|\] |\s)((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")


def names_encoder_decoder(text: str) -> bool:
    """The text names V0's encoder-decoder runner or a model vLLM runs as one (a --model given in --flags as well as a
    line of the log)."""
    return bool(_ENC_DEC.search(text))


def _non_memory_exception(lines: list[str]) -> str | None:
    """The last exception a log raised, when it is not a memory failure (None: none, or a memory one)."""
    for line in reversed(lines):
        found = _EXCEPTION.search(line.strip())
        if found:
            return None if _BARE_OOM.search(line) or "memory" in line.lower() else found.group(0).strip()
    return None


# once serving: the first line that shows it, the periodic stats line, V0's preemption warning
_SERVING = re.compile(r"Application startup complete|Avg prompt throughput|Uvicorn running on|Starting vLLM API server")
# a failure placed at run time in words: EngineDeadError is what clients get once a started engine core died; a
# report that the server served for hours or days first, or calls the OOM a runtime one
_RUNTIME_SAID = re.compile(r"EngineDeadError|\bserv(?:es|ed|ing) (?:fine |normally |well )?for (?:\w+ )?(?:minutes|hours|"
                           r"days|weeks)|\bruntime (?:CUDA |GPU )?(?:OOM|out of memory|`?torch\.(?:cuda\.)?OutOfMemory"
                           r"Error)|\b(?:after|while) serving\b", re.I)
# a server that answered before it failed, said in words: its health check passed, or it died on its first request.
# Every start-up phase (profile, KV cache, CUDA-graph capture) had completed, so a phase those words name ("boots,
# captures graphs, answers /health 200, dies on the first prompt") is no place for the failure
_ANSWERED_THEN_FAILED = re.compile(r"/health`?\s+(?:returns?\s+|answers?\s+)?200\b|\b(?:dies|died|crash(?:es|ed)?|"
                                   r"fails?|failed|OOMs?|OOMed)\s+on\s+the\s+first\s+(?:\S+\s+)?"
                                   r"(?:prompt|request|query|generation)\b", re.I)
# the periodic stats line: V1 "Running: R reqs, Waiting: W reqs[, Preemptions: P], GPU KV cache usage: U%", V0
# "Running: R reqs, Swapped: S reqs, Pending: W reqs, GPU KV cache usage: U%, CPU KV cache usage: C%"
_STATS = re.compile(r"Running: (\d+) reqs.*?(?:Waiting|Pending): (\d+) reqs(?:.*?Preemptions: (\d+))?.*?\b(?:GPU|CPU|XPU|"
                    r"TPU|HPU) KV cache usage: ([\d.]+)%")
_V0_PREEMPTED = re.compile(r"is preempted by PreemptionMode\.(\w+) mode because there is not enough KV cache space.*?"
                           r"total_(?:num_)?cumulative_preemption(?:_cnt)?=(\d+)")


# a container image named in words ("the vLLM docker image") or as a field ("IMAGE: vllm/vllm-openai:0.8.4")
_CONTAINER_IMAGE = re.compile(r"\b(?:docker|container|vllm(?:/vllm-openai)?|openai)(?: docker)? images?\b|"
                              r"\bimage\s*[:=]\s*[\w.-]+/[\w./-]+(?::[\w.-]+)?")


def read_vllm(text: str) -> VllmFacts | None:
    facts = VllmFacts(text=text)
    seen = False
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not any(word in line for word in _VLLM_WORDS):
            continue  # most lines of a long log (requests, access lines) say nothing diagnose reads
        if "Running:" in line and (match := _STATS.search(line)):
            seen = True
            _read_load(facts, match, None, number)
            continue
        if (match := _NON_DEFAULT.search(line)):
            seen = True
            try:
                args = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError):
                args = {}
            for key in _FLAG_KEYS:
                if key in args:
                    facts.flags[key] = Quoted(args[key], number)
        elif (match := _SERVE.search(line)):
            seen = True
            facts.flags.setdefault("model", Quoted(match.group(1), number))
            for key, value in parse_flags(match.group(2)):
                facts.flags[key] = Quoted(value, number)
        for fact in _FACT_LINES:
            if (match := fact.pattern.search(line)):
                seen = seen or fact.marks
                setattr(facts, fact.attribute, Quoted(fact.value(match), number))
        if (match := _V0_BLOCKS.search(line)) and match.group(1) != "CPU" and facts.kv_tokens is None:
            seen = True
            facts.kv_blocks = Quoted(int(match.group(2)), number)
        if (match := _PROFILE_TOTAL.search(line)):
            total, utilization = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            facts.total_gib = Quoted(float(total), number)
            facts.flags.setdefault("gpu_memory_utilization", Quoted(float(utilization), number))
        if facts.serving_line is None and _SERVING.search(line):
            facts.serving_line = number
        if (match := _STATS.search(line)) or (preempted := _V0_PREEMPTED.search(line)):
            seen = True
            _read_load(facts, match, None if match else preempted, number)
        if (match := _SAMPLER.search(line)):
            seen = True
            facts.oom_text = facts.oom_text or Quoted(int(match.group(1)), number)
            facts.oom_during = "sampler warm-up"
        if (match := _MAMBA.search(line)):
            seen = True
            seqs, blocks = (match.group(1), match.group(2)) if match.group(1) else ("", match.group(3))
            facts.mamba_blocks = Quoted(f"{seqs}:{blocks}", number)
        facts.enc_dec = facts.enc_dec or names_encoder_decoder(line)
        facts.v0_lines = facts.v0_lines or bool(_V0_ONLY.search(line))
        facts.v1_lines = facts.v1_lines or bool(_V1_ONLY.search(line))
        if facts.oom is None and (oom := torch_oom_at(lines, number - 1)):
            seen = True
            facts.oom, facts.oom_line = oom, number
            if facts.oom_during is None:
                facts.oom_during = oom_phase(lines, number)
    if facts.oom is None and facts.oom_text is None:
        # a traceback through vLLM is read as a memory failure unless its exception says it is another one
        # ("ValueError: Failed to find a kernel that can implement the NVFP4 linear layer")
        other_failure = _non_memory_exception(lines)
        for number, line in enumerate(lines, 1):
            # "[Usage]: Llama-3.2-11B-Vision OOM" (a title), "it will exceed the memory limit" (a user's words)
            bare = bool(_BARE_OOM.search(line)) or says_oom(line)
            if bare or (not other_failure and (
                    (_PHASE_FRAME.search(line) and ("ERROR" in line or "Traceback" in text))
                    or _VLLM_FRAME.search(line))):
                seen = seen or bare or bool(_VLLM_FRAME.search(line)) \
                    or facts.weights_gib is not None or facts.v0_lines or facts.v1_lines
                facts.oom_text, facts.oom_line = Quoted(line.strip()[:300], number), number
                facts.oom_during = oom_phase(lines, len(lines))
                break
    facts.lm_eval = bool(_LM_EVAL_VLLM.search(text))
    for number, line in enumerate(lines, 1):
        if (said := _RUNTIME_SAID.search(line) or _ANSWERED_THEN_FAILED.search(line)):
            facts.runtime_said = Quoted(said.group(0), number)
            facts.answered_first = _ANSWERED_THEN_FAILED.search(line) is not None
            break
    for number, line in enumerate(lines, 1):
        if facts.kv_check is None and _KV_CHECK_FRAME.search(line):
            facts.kv_check = Quoted(line.strip()[:300], number)
            seen = True
    joined = " ".join(lines)  # the hint is often wrapped or quoted over two lines
    if (hint := _UTILIZATION_HINT.search(joined)):
        value = hint.group(3) or (None if hint.group(1) else hint.group(2))
        if value:
            facts.utilization_hint = Quoted(float(value), text.count("\n", 0, text.find("equivalent to")) + 1)
    if facts.version is None and (match := _VERSION_SAID.search(text)):
        facts.version = Quoted(match.group(1) or match.group(2), text.count("\n", 0, match.start()) + 1)
    if facts.kv_tokens is None and facts.kv_blocks is not None:
        block = facts.flags.get("block_size")
        facts.kv_tokens = Quoted(facts.kv_blocks.value * int(block.value if block else V0_BLOCK_TOKENS),
                                 facts.kv_blocks.line)
    return facts if seen else None


# PyTorch's own OOM message ("... with 128.00 MiB allocated in private pools (e.g., CUDA Graphs) ...") names CUDA graphs
# whatever phase ran out: not a sign of graph capture
_TORCH_POOLS = re.compile(r"allocated in private pools \(e\.g\., CUDA Graphs\)", re.I)


_MULTIMODAL_PHASE = re.compile(r"(?<![a-z])(?:encoder|enc_dec|dummy_mm|multi[-_ ]?modal|mm_data|vision|image|"
                               r"pixel_values)")


def _capture_settings(text: str) -> list[str]:
    """The names of arguments about capture that the log gives a value (an argument-shaped name: lower-case words
    joined by _ or -, or a --flag), longest first so that a name holding another is taken whole. Environment
    variables (in capitals) are not arguments and are read as before."""
    names = {m.group(1) or m.group(2) for m in _CAPTURE_SETTING.finditer(text)
             if m.group(1) or (re.search(r"\w[_-]\w", m.group(2)) and not m.group(2).isupper())}
    return sorted(names, key=len, reverse=True)


def oom_phase(lines: list[str], number: int) -> str | None:
    """What vLLM was doing when memory ran out, from the lines and traceback frames around the error."""
    around = _GRAPH_PROFILING.sub("", _TORCH_POOLS.sub("", "\n".join(lines[max(0, number - 40):min(len(lines),
                                                                                                number + 15)])))
    lowered = around.lower()
    if "cumem_allocator" in lowered or "wake_up" in lowered:
        return "wake up"
    if "sampler" in lowered:
        return "sampler warm-up"
    if "mamba" in lowered:
        return "mamba"
    if "lora" in lowered:
        return "lora"
    named = _capture_settings("\n".join(lines))
    if _CAPTURE.search(re.sub("|".join(map(re.escape, named)), "", around, flags=re.I) if named else around):
        return "cuda graph capture"
    # a container image ("the vLLM docker image") is no multimodal input; a word's start, not a substring: V0's
    # engine config line prints "revision=None, tokenizer_revision=None", which holds "vision"
    if _MULTIMODAL_PHASE.search(_CONTAINER_IMAGE.sub("", lowered)):
        return "encoder"
    if re.search(r"load_model|load_weights|weight_loader|model_loader|\.to\(|initialize_model", lowered):
        return "loading weights"
    if re.search(r"warm[-_ ]?up|warming up", lowered):
        return "warm-up"  # after the KV cache took its share: the sampler's or the model's warm-up
    if "profile" in lowered or "dummy" in lowered:
        return "profile run"
    return None


def _read_load(facts: VllmFacts, stats: re.Match | None, preempted: re.Match | None, number: int) -> None:
    load = facts.load = facts.load or LoadFacts()
    if preempted is not None:
        load.preemption_mode = preempted.group(1)
        load.preemptions = Quoted(int(preempted.group(2)), number)
        return
    load.stats_lines += 1
    running, waiting, preemptions, usage = stats.groups()
    if load.kv_usage is None or float(usage) > load.kv_usage.value:
        load.kv_usage, load.running = Quoted(float(usage), number), Quoted(int(running), number)
    if load.waiting is None or int(waiting) > load.waiting.value:
        load.waiting = Quoted(int(waiting), number)
    if preemptions and (load.preemptions is None or int(preemptions) > load.preemptions.value):
        load.preemptions = Quoted(int(preemptions), number)


def read_torch_oom(text: str) -> tuple[OomFigures, int] | None:
    lines = text.splitlines()
    for number in range(1, len(lines) + 1):
        if (figures := torch_oom_at(lines, number - 1)) is not None:
            return figures, number
    return None


_TORCH_BODY = re.compile(TORCH_OOM_BODY, re.I)
BODY_LINES = 4  # a message wrapped by a terminal or a quote spans a few lines


def torch_oom_at(lines: list[str], index: int) -> OomFigures | None:
    """PyTorch's OOM figures from the line at index: the whole message, or its body without the exception name in
    front ("Tried to allocate 136.00 MiB. GPU 0 has a total capacity of ...", quoted or wrapped over the next lines);
    the figures themselves say memory ran out."""
    line = lines[index][:4000]
    named = "out of memory" in line.lower()
    if not named and not _TORCH_BODY.search(line):
        return None
    figures = parse_cuda_oom(line if named else "CUDA out of memory. " + line)
    if figures is not None and figures.total:
        return figures
    window = [line]
    for following in lines[index + 1:index + BODY_LINES]:
        if not following.strip() or "out of memory" in following.lower() or "Tried to allocate" in following:
            break
        window.append(following.strip()[:4000])
    joined = " ".join(window)
    return parse_cuda_oom(joined if named else "CUDA out of memory. " + joined) or figures


@dataclass(frozen=True)
class SmiTrace:
    total_mib: float
    used_mib: tuple[float, ...]
    times: tuple[str, ...]


def read_nvidia_smi(text: str) -> SmiTrace | None:
    """`nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv[,noheader] [-l N]` (the first GPU's
    rows), or `nvidia-smi dmon` (its `fb` column, MiB)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    dmon = next((line for line in lines if line.startswith("#") and " fb" in f" {line} "), None)
    if dmon is not None:
        columns = dmon.lstrip("#").split()
        used = [float(parts[columns.index("fb")]) for parts in (line.split() for line in lines if not line.startswith("#"))
                if len(parts) == len(columns) and _is_float(parts[columns.index("fb")])]
        return SmiTrace(0.0, tuple(used), tuple(str(i) for i in range(len(used)))) if used else None
    used, times, total = [], [], 0.0
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[1].split() or not cells[2].split() or not _is_float(cells[1].split()[0]) \
                or not _is_float(cells[2].split()[0]):
            continue
        used.append(float(cells[1].split()[0]))
        total = float(cells[2].split()[0])
        times.append(cells[0])
    return SmiTrace(total, tuple(used), tuple(times)) if used else None


def size_gib(text: str | None) -> float | None:
    size = parse_size(text)
    return None if size is None else size / GIB


def parse_flags(text: str) -> list[tuple[str, object]]:
    """The memory-relevant flags of a `vllm serve` command line ("--max-model-len 8192 --enforce-eager"), as
    (key, value) with numbers as numbers and a bare switch as True."""
    pairs = [(flag[2:].replace("-", "_"), value) for flag, value in flag_pairs(command_words(text))]
    return [(key, _number(value) if value else True) for key, value in pairs if key in _FLAG_KEYS]


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class EngineFacts:
    """SGLang, TGI and TensorRT-LLM lines (their own strings: sglang srt/model_executor/model_runner.py and
    mem_cache/memory_pool.py; text-generation-inference server/.../flash_causal_lm.py; TensorRT-LLM
    kvCacheManager.cpp)."""

    engine: str
    not_enough: Quoted | None = None  # SGLang: no room for the KV pool
    mem_fraction_static: Quoted | None = None
    weights_gb: Quoted | None = None  # SGLang "mem usage" at weight load end
    available_gb: Quoted | None = None  # SGLang "avail mem" after the weights
    kv_tokens: Quoted | None = None
    context_len: Quoted | None = None
    prefill_tokens: Quoted | None = None  # TGI: the warm-up prefill that did not fit
    buffers_gib: dict = field(default_factory=dict)  # TensorRT-LLM: "runtime buffers" / "decoder" -> Quoted GiB
    kv_gib: Quoted | None = None  # TensorRT-LLM: the paged KV cache


# SGLang's start-up check (model_runner.py): "RuntimeError: Not enough memory. Please try to increase
# --mem-fraction-static." (quoted with or without the advice; TGI's "Not enough memory to handle N ..." is its own)
_SGLANG_NOT_ENOUGH = re.compile(r"(?:Not enough memory\. Please try to increase --mem-fraction-static\.|"
                                r"RuntimeError: Not enough memory(?! to handle)\b)(?:.*?mem_fraction_static=([\d.]+))?")
_SGLANG_FRACTION = re.compile(r"mem[_-]fraction[_-]static[=: ]+([\d.]+)")
_SGLANG_WEIGHTS = re.compile(r"Load weight end\..*?avail mem=([\d.]+) GB, mem usage=([\d.]+) GB")
_SGLANG_KV = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")
_SGLANG_CONTEXT = re.compile(r"max_total_num_tokens=(\d+).*?context_len=(\d+)")
_TGI_PREFILL = re.compile(r"Not enough memory to handle (\d+) prefill tokens")
_TRTLLM_KV = re.compile(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache \((\d+)\)")
_TRTLLM_LEN = re.compile(r"max_seq_len=(\d+)")
_TRTLLM_BUFFERS = re.compile(r"Allocated ([\d.]+) ?(GB|GiB|MiB|MB) GPU memory for (runtime buffers|decoder)")


def read_other_engines(text: str) -> EngineFacts | None:
    facts: EngineFacts | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if (match := _SGLANG_NOT_ENOUGH.search(line)):
            facts = facts or EngineFacts("sglang")
            facts.not_enough = Quoted(line.strip()[-200:], number)
            if match.group(1):
                facts.mem_fraction_static = Quoted(float(match.group(1)), number)
        elif (match := _SGLANG_FRACTION.search(line)) and (facts is None or facts.engine == "sglang"):
            facts = facts or EngineFacts("sglang")
            facts.mem_fraction_static = facts.mem_fraction_static or Quoted(float(match.group(1)), number)
        if (match := _SGLANG_WEIGHTS.search(line)):
            facts = facts or EngineFacts("sglang")
            facts.available_gb, facts.weights_gb = Quoted(float(match.group(1)), number), Quoted(float(match.group(2)),
                                                                                                 number)
        if (match := _SGLANG_KV.search(line)):
            facts = facts or EngineFacts("sglang")
            facts.kv_tokens = Quoted(int(match.group(1)), number)
        if (match := _SGLANG_CONTEXT.search(line)):
            facts = facts or EngineFacts("sglang")
            facts.context_len = Quoted(int(match.group(2)), number)
        if (match := _TGI_PREFILL.search(line)):
            facts = EngineFacts("tgi") if facts is None or facts.engine != "tgi" else facts
            facts.prefill_tokens = Quoted(int(match.group(1)), number)
        if (match := _TRTLLM_KV.search(line)):
            facts = EngineFacts("trtllm") if facts is None or facts.engine != "trtllm" else facts
            facts.kv_gib, facts.kv_tokens = Quoted(float(match.group(1)), number), Quoted(int(match.group(2)), number)
        if (match := _TRTLLM_BUFFERS.search(line)):
            facts = EngineFacts("trtllm") if facts is None or facts.engine != "trtllm" else facts
            scale = 1 / 1024 if match.group(2) in ("MiB", "MB") else 1
            facts.buffers_gib[match.group(3)] = Quoted(float(match.group(1)) * scale, number)
        if facts is not None and facts.engine == "trtllm" and (match := _TRTLLM_LEN.search(line)):
            facts.context_len = Quoted(int(match.group(1)), number)
    return facts
