"""Where a log failed, and which engine wrote it. A log with an error, a traceback or an out-of-memory line has
failed, whatever else it says; each distinct memory failure in it (two engines' logs pasted together, an OOM after a
server log) is answered on its own."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from harness.logtext import is_cause
from harness.measure.oom import parse_cuda_oom

# PyTorch's OOM message without its exception name in front (quoted, wrapped or cut): its figures say it ran out
TORCH_OOM_BODY = r"Tried to allocate \d+(?:\.\d+)?\s*(?:bytes|[KMGT]i?B|B)\b|total capac(?:i)?ty of \d"
# a user's own words for it ("the system will exceed the memory limit", "exceeded GPU memory")
EXCEEDS_MEMORY = (r"\bexceed(?:s|ed|ing)?\s+(?:(?:the|its|our|available|total|GPU|device|VRAM|CUDA|host|system)\s+){0,3}"
                  r"memory|\bmemory\s+(?:limit\s+|budget\s+)?(?:was\s+|is\s+)?exceeded")
# OOM as the failure, also as a verb and in any case ("OOMs at the KV-cache check", "OOMed", "OOM'd", "it ooms")
OOM_WORD = r"(?<![A-Za-z])OOM(?:s|ed|ing|'d|'s)?(?![A-Za-z])"
# a stated shortage in other words ("ran out of GPU memory", "insufficient VRAM", "a CUDA out-of-memory error")
SHORT_OF_MEMORY = (r"out[ -]of[ -](?:GPU |CUDA |device |video )?(?:memory|VRAM)|"
                   r"insufficient (?:GPU |device )?(?:memory|VRAM)|"
                   r"(?:memory|VRAM) is insufficient|显存不足|显存不够|内存不足|内存不够|爆显存|显存爆|显存炸|显存溢出|"
                   r"内存溢出|メモリ不足|메모리 부족")
_MEMORY = re.compile(SHORT_OF_MEMORY + r"|OutOfMemoryError|Not enough memory|No available memory for the cache blocks|"
                     r"KV cache is needed, which is larger than|is larger than the maximum number of tokens that can be "
                     r"stored in KV cache|Free memory on device .* is less than|Error in memory profiling|"
                     r"CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|Failed to allocate memory|"
                     r"memory allocation failed|insufficient memory|not enough GPU memory|"
                     r"Cannot allocate memory|can't allocate memory|component creation attempt|No free blocks left|OOM|"
                     + TORCH_OOM_BODY + "|" + EXCEEDS_MEMORY, re.I)
VLLM_STARTUP_FRAMES = (r"(?:^|\.\.\.|\bin )\s*(?:_initialize_kv_caches|determine_num_available_blocks|"
                       r"determine_available_memory|initialize_from_config|_dummy_sampler_run|capture_model)\b")
_ERROR = re.compile(r"^\s*(?:\S+ )?(?:[\w.]+\.)?\w*(?:Error|Exception)(?:\(| ?: | ?:$)|Traceback \(most recent call last\)|"
                    r"^\s*(?:\S+ )?File \"[^\"]+\", line \d+, in |"
                    r"\bERROR\b|\bFATAL\b|panicked at|core dumped|Killed\b|exited with|died\b|\berror:|"
                    # a failure stated in words, in any language: "failed to start", "refuses to launch", "报错" (raised
                    # an error), "错误" (error), "失败" (failed), "异常" (exception), "出错" (went wrong)
                    r"\bfail(?:ed|s|ure)\b(?!\s*[:=]\s*0\b)|refuses? to (?:launch|start|load|run)|"
                    r"报错|错误|失败|异常|出错|エラー|오류|에러|실패|"
                    # a traceback pasted as its frames' names only ("... _initialize_kv_caches ..."): vLLM's start-up
                    # steps that only a failure prints (the memory profile, the KV cache's sizing, graph capture)
                    + VLLM_STARTUP_FRAMES, re.I)
_NOISE = re.compile(r"ERROR 0 |error_rate|errors?=0\b|\b0 errors\b|on_error|ErrorHandler|error_code=0|"
                    # a logger's WARNING/INFO line that mentions an error (vLLM's "Found ulimit ... with error")
                    r"\b(?:WARNING|INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d", re.I)

# markers of each engine in its logs (logger names, module paths, banners)
ENGINE_MARKERS = {
    "vllm": re.compile(r"\bvllm[./ ]|\bvLLM\b|EngineCore|cumem_allocator|\[gpu_model_runner\.py|\(VllmWorker|vllm serve|"
                       r"\bLLMEngine\b|\bAsyncLLM|_initialize_kv_caches|determine_num_available_blocks", re.I),
    "sglang": re.compile(r"sglang|\bsgl[_-]|\bTP\d+\] (?:Load weight|Init torch|Memory pool|Capture)|ServerArgs\(|"
                         r"mem_fraction_static"),
    "tgi": re.compile(r"text[_-]generation[_-](?:launcher|router|server|inference)|\bShard \d+|\bwebserver\b.*router|"
                      r"text_generation|max_batch_prefill_tokens|Args \{ model_id"),
    "trtllm": re.compile(r"tensorrt_llm|TensorRT-LLM|\[TRT-LLM\]|\bTRTLLM|trtllm-|\bKVCacheManager\b|"
                         r"kv_cache_free_gpu_mem_fraction|free_gpu_memory_fraction|\[TRT\]"),
}


MARKER_SAMPLE = 1_000_000  # characters from each end of a long log to count engine markers in


@dataclass(frozen=True)
class FailureLine:
    line: int  # 1-based
    text: str
    memory: bool  # an out-of-memory or memory-budget message, not just any error
    identity: str  # equal for the same failure repeated (each process of a server logs it again)


_FAILURE_WORDS = ("error", "exception", "memory", "oom", "traceback", "file \"", "fatal", "panicked", "dumped",
                  "killed", "exited", "died", "alloc", "not enough", "larger than", "component", "less than",
                  "capacity", "exceed", "insufficient", "vram", "fail", "refuse", "报错", "错误", "失败", "异常", "出错",
                  "显存", "内存", "エラー", "오류", "에러", "실패", "メモリ", "메모리", "_initialize_kv_caches",
                  "determine_num_available_blocks", "determine_available_memory", "initialize_from_config",
                  "_dummy_sampler_run", "capture_model")


QUOTED_CHARS = 300  # of a line a diagnosis quotes


def quoted_line(text: str, position: int) -> tuple[int, str]:
    """The number (from 1) of the line that holds text[position], and that line as a diagnosis quotes it."""
    number = text.count("\n", 0, position) + 1
    return number, text.splitlines()[number - 1].strip()[:QUOTED_CHARS]


def first_line_matching(text: str, pattern: re.Pattern) -> tuple[int, str] | None:
    """The first line on which pattern matches (searched line by line, so no match spans two lines): its number (from
    1) and the line as a diagnosis quotes it; None where no line matches."""
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.search(line):
            return number, line.strip()[:QUOTED_CHARS]
    return None


@functools.lru_cache(maxsize=4)
def failure_lines(text: str) -> tuple[FailureLine, ...]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line[:4000]
        lowered = line.lower()
        if not any(word in lowered for word in _FAILURE_WORDS):
            continue
        memory = bool(_MEMORY.search(line)) and not _benign_oom_word(line)
        if not memory and (not _ERROR.search(line) or _NOISE.search(line)):
            continue
        found.append(FailureLine(number, line.strip(), memory, identity_of(line) if memory else ""))
    return tuple(found)


def _benign_oom_word(line: str) -> bool:
    """'OOM' in a word (ROOM, BLOOM) or in advice ('to avoid OOM', 'to avoid exceeding memory'), not an
    out-of-memory failure."""
    if re.search(SHORT_OF_MEMORY + r"|OutOfMemory|Not enough memory|No available memory|is larger than|less than|"
                 r"component creation attempt|No free blocks left|"
                 r"Error in memory profiling|ALLOC_FAILED|MemoryAllocation|allocate memory|allocation failed|"
                 r"not enough GPU memory|" + TORCH_OOM_BODY, line, re.I):
        return False
    return not (re.search(OOM_WORD, line, re.I) or re.search(EXCEEDS_MEMORY, line, re.I)) or bool(
        re.search(r"(?:avoid|prevent|reduce|against) (?:an? )?(?:OOM|exceed)|OOM risk", line, re.I))


def says_oom(line: str) -> bool:
    """The word OOM standing alone as the failure ("[Bug] OOM when running bench_serving"), or a person's words for
    it ("will exceed the memory limit"), not advice about it."""
    return bool(re.search(OOM_WORD, line, re.I) or re.search(EXCEEDS_MEMORY, line, re.I)) and not _benign_oom_word(line)


def identity_of(line: str) -> str:
    """The same failure logged by several processes reads the same once its prefix (time, pid, rank) is dropped."""
    figures = parse_cuda_oom(line)
    if figures is not None and (figures.tried or figures.total):
        return f"oom:{figures.tried}:{figures.total}:{figures.free}:{figures.allocated}"
    core = re.sub(r"^.*?(?=[A-Z][\w.]*(?:Error|Exception)\b|Not enough|No available|CUDA out of memory|"
                  r"To serve|Free memory|The model)", "", line)
    return re.sub(r"\d+(?:\.\d+)?", "#", core)[:200]


def engine_of(text: str, wanted: str | None = None) -> str | None:
    """The engine that wrote the log: --engine where given, else the one whose markers occur most."""
    if wanted in ENGINE_MARKERS:
        return wanted
    sample = text if len(text) <= 2 * MARKER_SAMPLE else text[:MARKER_SAMPLE] + "\n" + text[-MARKER_SAMPLE:]
    counts = {engine: len(pattern.findall(sample)) for engine, pattern in ENGINE_MARKERS.items()}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def memory_failures(text: str) -> list[list[FailureLine]]:
    """The distinct memory failures, each as its repeated lines, in the order they first occur."""
    groups: dict[str, list[FailureLine]] = {}
    for failure in failure_lines(text):
        if failure.memory:
            groups.setdefault(failure.identity, []).append(failure)
    return list(groups.values())


def last_error(text: str) -> FailureLine | None:
    """The line that best names why the log failed: the last memory line, else the last exception line."""
    lines = failure_lines(text)
    memory = [f for f in lines if f.memory]
    if memory:
        return memory[-1]
    raised = [f for f in lines if re.search(r"(?:Error|Exception)\b", f.text) and "Traceback" not in f.text]
    causes = [f for f in raised if is_cause(f.text)]
    return (causes or raised or lines or [None])[-1]
