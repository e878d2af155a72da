"""SGLang, TGI and TensorRT-LLM logs, each read with its own engine's strings and answered in its own flag names.

SGLang (python/sglang/srt/model_executor/model_runner.py, docs "Troubleshooting"): "Not enough memory. Please try to
increase --mem-fraction-static" is raised at start-up when the KV pool would be empty: raise it. A CUDA OOM
(prefill, decode, CUDA-graph capture) is the opposite case: the static share leaves too little for activations and
graphs: lower --mem-fraction-static, --chunked-prefill-size (prefill), --max-running-requests (decode),
--cuda-graph-max-bs (capture). TGI (server/text_generation_server/models/flash_causal_lm.py warmup): "Not enough
memory to handle N prefill tokens. You need to decrease `--max-batch-prefill-tokens`". TensorRT-LLM
(kvCacheManager.cpp, executor): the KV cache takes kv_cache_free_gpu_memory_fraction of the memory free after the
engine loads; an OOM after that needs a smaller fraction, max_num_tokens or max_batch_size."""

from __future__ import annotations

import math
import re

from harness.diagnose.allocator import allocator_verdict, oom_figures
from harness.diagnose.failures import first_line_matching, says_oom
from harness.diagnose.readers import EngineFacts, read_other_engines, read_torch_oom
from harness.diagnose.records import Change, Diagnosis, Figure
from harness.diagnose.settings import Setting, number

SGLANG_DEFAULT_FRACTION = 0.88
TRTLLM_DEFAULT_FRACTION = 0.9
TRTLLM_LARGE_BATCH = 64  # a max_batch_size this large sets the build's largest shapes: it comes down first


def quoted_figures(facts: EngineFacts | None) -> list[Figure]:
    """The figures an SGLang/TGI/TensorRT-LLM log stated, each with its line."""
    if facts is None:
        return []
    return [Figure(label, text, f"log line {quoted.line}") for label, quoted, text in (
        ("--mem-fraction-static", facts.mem_fraction_static, f"{facts.mem_fraction_static.value}"
         if facts.mem_fraction_static else ""),
        ("weights loaded", facts.weights_gb, f"{facts.weights_gb.value:.2f} GB" if facts.weights_gb else ""),
        ("free after the weights", facts.available_gb, f"{facts.available_gb.value:.2f} GB" if facts.available_gb
         else ""),
        ("KV cache holds", facts.kv_tokens, f"{facts.kv_tokens.value:,} tokens" if facts.kv_tokens else ""),
        ("KV cache", facts.kv_gib, f"{facts.kv_gib.value:.2f} GiB" if facts.kv_gib else ""),
        ("context length", facts.context_len, f"{facts.context_len.value:,} tokens" if facts.context_len else ""),
        ("prefill tokens of the warm-up", facts.prefill_tokens, f"{facts.prefill_tokens.value:,}"
         if facts.prefill_tokens else "")) if quoted is not None]


def _engine_facts(text: str, source: str, engine: str) -> tuple[EngineFacts | None, list[Figure], Diagnosis | None]:
    """The engine's own lines and their figures, and the answer where PyTorch's OOM line alone decides it (another
    process holds the memory, or fragmentation): the same first step for SGLang, TGI and TensorRT-LLM."""
    facts = read_other_engines(text)
    facts = facts if facts is not None and facts.engine == engine else None
    figures = quoted_figures(facts)
    oom = read_torch_oom(text)
    if oom is not None:
        figures += oom_figures(*oom)
        if (verdict := allocator_verdict(oom[0])) is not None:
            return facts, figures, Diagnosis(source, engine, verdict.kind, verdict.summary, tuple(figures),
                                             verdict.changes)
    return facts, figures, None


def _kv_shorter_than_a_sequence(facts: EngineFacts | None) -> bool:
    return bool(facts is not None and facts.kv_tokens and facts.context_len
                and facts.kv_tokens.value < facts.context_len.value)


def _kv_short_or_fits(source: str, engine: str, cache: str, facts: EngineFacts | None, figures: list[Figure],
                      length_flag: str, larger: Change | None) -> Diagnosis | None:
    """No failure line: a KV cache (SGLang's pool, TensorRT-LLM's paged cache) smaller than one sequence of the
    context length is the failure; else what it holds."""
    if _kv_shorter_than_a_sequence(facts) and larger is not None:
        return Diagnosis(source, engine, "kv_cache_too_small",
                         f"the {cache} holds {facts.kv_tokens.value:,} tokens, fewer than one sequence of "
                         f"{facts.context_len.value:,}", tuple(figures), (
                             Change(f"{length_flag} {facts.kv_tokens.value:,}", "one sequence of that length fits"),
                             larger))
    if facts is None:
        return None
    held = f"its {cache} holds {facts.kv_tokens.value:,} tokens" if facts.kv_tokens else "no memory failure"
    return Diagnosis(source, engine, "fits", f"{engine}: {held}", tuple(figures))


def _around(text: str, line: int, before: int = 40, after: int = 15) -> str:
    lines = text.splitlines()
    return "\n".join(lines[max(0, line - before):line + after])


def _oom_line(text: str) -> tuple[int, str] | None:
    """The first out-of-memory line, with or without PyTorch's figures."""
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|"
                     r"Failed to allocate|std::bad_alloc|component creation attempt|"
                     # TensorRT's builder: "Device memory is insufficient to use tactic", "insufficient memory on
                     # requested size" (tactics skipped for want of memory)
                     r"memory is insufficient|insufficient memory", line, re.I) or says_oom(line):
            return number, line.strip()
    return None


# --- SGLang -------------------------------------------------------------------------------------------------------


def diagnose_sglang(text: str, source: str, settings: dict[str, Setting], total_gib: float | None) -> Diagnosis | None:
    facts, figures, decided = _engine_facts(text, source, "sglang")
    if decided is not None:
        return decided
    current = (facts.mem_fraction_static.value if facts and facts.mem_fraction_static
               else number(settings, "mem_fraction_static"))
    hit = _oom_line(text)
    pool_at_start = hit is not None and _SGLANG_POOL_FAILED.search(_around(text, hit[0])) is not None \
        and _last_batch(text) is None
    if (facts is not None and facts.not_enough) or pool_at_start:
        # the highest value the log shows is the one in place (ServerArgs and the error may both print it)
        fraction = max(v for v in (current, number(settings, "mem_fraction_static"), 0.0) if v is not None) \
            or SGLANG_DEFAULT_FRACTION
        total = (facts.weights_gb.value + facts.available_gb.value) if facts and facts.weights_gb and \
            facts.available_gb else total_gib
        changes = []
        if total and facts and facts.weights_gb:
            wanted = min(0.95, max(math.ceil((facts.weights_gb.value / total + 0.1) * 100) / 100, fraction + 0.02))
            changes.append(Change(f"--mem-fraction-static {wanted:.2f}",
                                  f"the KV pool gets {wanted:.2f} x {total:.1f} GB - {facts.weights_gb.value:.1f} GB of "
                                  f"weights = {wanted * total - facts.weights_gb.value:.1f} GB (mem_fraction_static "
                                  "counts the weights and the KV pool together)", "mem_fraction_static_up"))
        else:
            changes.append(Change(f"--mem-fraction-static {min(0.95, fraction + 0.05):.2f}",
                                  "mem_fraction_static counts the weights and the KV pool together: raise it",
                                  "mem_fraction_static_up"))
        changes += [Change("quantize the weights (awq or gptq 4-bit)", "about a quarter of the 16-bit weights"),
                    Change(f"--tp {2 * int(number(settings, 'tensor_parallel_size') or 1)}",
                           "splits the weights over more GPUs")]
        return Diagnosis(source, "sglang", "no_kv_cache_memory",
                         "nothing is left for the KV pool: --mem-fraction-static leaves no room after the weights "
                         "(SGLang's start-up check: raise it, the opposite of a CUDA OOM)", tuple(figures),
                         tuple(changes), failing_line=facts.not_enough.value if facts and facts.not_enough
                         else hit[1][:300])
    if hit is not None:
        line, quoted = hit
        around = _around(text, line).lower()
        lower = math.floor(((current or SGLANG_DEFAULT_FRACTION) - 0.08) * 100) / 100
        fraction = Change(f"--mem-fraction-static {lower:.2f}",
                          "a smaller static share (weights + KV pool) leaves more for activations and CUDA graphs "
                          "(a CUDA OOM needs it lower; only SGLang's 'Not enough memory' start-up error needs it "
                          "higher)", "mem_fraction_static_down")
        if re.search(r"captur|cuda.?graph", around):
            # capture runs after the static share (weights + KV pool) was taken, one graph per batch size up to
            # --cuda-graph-max-bs: the largest sizes are what ran out, so fewer of them is the lever that keeps the
            # KV pool (mem_fraction_static is the start-up lever; it trades KV pool for graph room)
            kind, summary = "cuda_graph_capture", ("CUDA-graph capture ran out of memory at start-up: the graphs for "
                                                   "the largest batch sizes (up to --cuda-graph-max-bs) did not fit "
                                                   "beside the static share")
            fewer = _fewer_graph_sizes(text, settings)
            changes = [fewer, fraction, Change("--disable-cuda-graph", "no graph memory (slower decode)")]
            if not _captured_bs(text, settings) and (current or 0) >= SGLANG_RAISED_FRACTION:
                # no captured batch size in the log, and a static share raised above SGLang's own (0.88): the share
                # is what left the graphs no room, and lowering it comes first in SGLang's own capture-failure advice
                # (cuda_graph_runner's CUDA_GRAPH_CAPTURE_FAILED_MSG: "1. set --mem-fraction-static to a smaller
                # value (e.g., 0.8 or 0.7) 2. set --cuda-graph-max-bs to a smaller value")
                changes = [fraction, fewer, changes[2]]
        elif re.search(r"load_model|load_weights|weight_loader|model_loader", around) and not (
                facts and facts.weights_gb):
            kind, summary = "weights_do_not_fit", "the weights did not fit while loading"
            changes = [Change(f"--tp {2 * int(number(settings, 'tensor_parallel_size') or 1)}",
                              "splits the weights over more GPUs"),
                       Change("quantize the weights (awq, gptq or fp8)", "smaller weights")]
        elif (batch := _last_batch(text)) is not None and batch[0] == "prefill":
            kind, summary, changes = _sglang_prefill(batch[1], settings, fraction)
        elif re.search(r"decode|forward_decode|bench_serving|#running-req", around):
            # decoding, or a load test's many running requests (SGLang's FAQ: an OOM while decoding needs a lower
            # --max-running-requests)
            kind, summary = "oom_under_load", ("a decode step ran out of memory: too many running requests"
                                               if "decode" in around else "the server ran out of memory under a load "
                                               "test: too many requests running at once")
            changes = [Change("--max-running-requests 32", "fewer sequences decode at once"), fraction]
        else:
            kind, summary = "activation_peak", ("a forward ran out of memory after the static share (weights + KV "
                                                "pool) was taken: activations and buffers did not fit in the rest")
            changes = [fraction, Change("--chunked-prefill-size 2048", "the prefill's activations follow the chunk"),
                       Change("--max-running-requests 32", "fewer sequences at once")]
        return Diagnosis(source, "sglang", kind, summary, tuple(figures), tuple(changes), failing_line=quoted[:300])
    larger = Change(f"--mem-fraction-static {min(0.95, (current or SGLANG_DEFAULT_FRACTION) + 0.05):.2f}",
                    "a larger KV pool")
    return _kv_short_or_fits(source, "sglang", "KV pool", facts, figures, "--context-length", larger)


# SGLang's capture logs its batch sizes ("Capture cuda graph bs [1, 2, 4, ... 256]", "cuda_graph_max_bs=256")
_SGLANG_CAPTURE_BS = re.compile(r"\bbs\s*\[([\d,\s]+)\]|cuda[-_]graph[-_]max[-_]bs[-_a-z]*[=: ]+(\d+)|\bbs ?= ?(\d+)",
                                re.I)
SGLANG_GRAPH_BS = 32  # where neither the log nor the flags say how large the captured batches went
SGLANG_RAISED_FRACTION = 0.9  # a --mem-fraction-static at or above this was raised above SGLang's default (0.88)
# the KV pool's allocation at start-up failing, in the engine's words or a person's ("the KV pool allocation fails",
# "failed to allocate the memory pool", init_memory_pool in a traceback): SGLang's start-up check, raise the share
_SGLANG_POOL_FAILED = re.compile(r"\b(?:KV|memory|token(?:_to_kv)?)[ _-]?pool(?: allocation)?\b[^.\n]{0,40}?\b(?:fail|"
                                 r"OOM|out of memory)|\b(?:fail\w*|unable|cannot|can't) (?:to )?allocat\w* (?:the )?"
                                 r"(?:KV|memory|token) pool|init_memory_pool", re.I)


def _captured_bs(text: str, settings: dict[str, Setting]) -> float:
    """The largest batch size the log or the flags show the capture went to; 0 where neither shows it."""
    seen = [int(n) for m in _SGLANG_CAPTURE_BS.finditer(text) for n in re.findall(r"\d+", next(filter(None, m.groups())))]
    return number(settings, "cuda_graph_max_bs") or max(seen, default=0)


def _fewer_graph_sizes(text: str, settings: dict[str, Setting]) -> Change:
    """--cuda-graph-max-bs at half the largest batch size the log or the flags show (capture went that high)."""
    largest = _captured_bs(text, settings)
    target = max(1, int(largest // 2)) if largest else SGLANG_GRAPH_BS
    return Change(f"--cuda-graph-max-bs {target}", f"captures graphs only up to batch {target}"
                  + (f" instead of {int(largest)}" if largest else "") + ": the largest graphs' memory is what ran "
                  "out, and the KV pool keeps its size", "cuda_graph_max_bs_down")


# the scheduler's batch lines (sglang srt/managers/scheduler.py, tp_worker.py before it): "Prefill batch. #new-seq: N,
# #new-token: T, #cached-token: C, ..." and "Decode batch. #running-req: R, #token: T, ..."
_SGLANG_BATCH = re.compile(r"(Prefill|Decode) batch\.(?:.*?#new-token: (\d+))?")
# the new tokens one prefill batch may take where chunked prefill is on: --chunked-prefill-size, 8192 by default
SGLANG_CHUNK = 8192


def _last_batch(text: str) -> tuple[str, int | None] | None:
    """The phase of the last batch the scheduler logged ("prefill" with its new tokens, or "decode"), if any."""
    found = None
    for line in text.splitlines():
        if "batch." in line and (match := _SGLANG_BATCH.search(line)):
            found = (match.group(1).lower(), int(match.group(2)) if match.group(2) else None)
    return found


def _sglang_prefill(new_tokens: int | None, settings: dict[str, Setting], fraction: Change):
    """An OOM right after a prefill batch: the batch's activations, bounded by --max-prefill-tokens (the new tokens
    of one prefill batch: PrefillAdder's rem_input_tokens) and, where chunked prefill is on, --chunked-prefill-size
    (rem_chunk_tokens). A batch above the default chunk shows chunking was off: --max-prefill-tokens is the bound in
    place. SGLang's tuning guide: an OOM in prefill lowers these before --mem-fraction-static moves."""
    chunk = number(settings, "chunked_prefill_size")
    target = 2 ** int(math.log2(max(new_tokens // 2, 512))) if new_tokens else 4096
    seen = f"the last prefill batch took {new_tokens:,} new tokens" if new_tokens else "a prefill batch ran out"
    prefill_cap = Change(f"--max-prefill-tokens {target}", f"{seen}: this caps the new tokens of one prefill batch, "
                         "and so its activations", "max_prefill_tokens_down")
    chunked = Change(f"--chunked-prefill-size {int(chunk // 2) if chunk else target}",
                     "prefills long prompts in chunks of this many tokens", "chunked_prefill_size_down")
    chunking_off = chunk is None and new_tokens is not None and new_tokens > SGLANG_CHUNK
    changes = [prefill_cap, chunked] if chunking_off else [chunked, prefill_cap]
    return ("activation_peak", f"a prefill batch ran out of memory ({seen}): the activations of one prefill batch, "
            "beside the static share (weights + KV pool)", changes + [fraction])


# --- TGI ----------------------------------------------------------------------------------------------------------

_TGI_TOTAL = re.compile(r"Not enough memory to handle (\d+) total tokens|max_batch_total_tokens")


def diagnose_tgi(text: str, source: str, settings: dict[str, Setting], total_gib: float | None) -> Diagnosis | None:
    facts, figures, decided = _engine_facts(text, source, "tgi")
    if decided is not None:
        return decided
    shards = int(number(settings, "tensor_parallel_size") or 1)
    prefill = facts.prefill_tokens.value if facts and facts.prefill_tokens else number(settings,
                                                                                          "max_batch_prefill_tokens")
    total_tokens = number(settings, "max_total_tokens")
    if facts is not None and facts.prefill_tokens:
        half = facts.prefill_tokens.value // 2
        changes = [Change(f"--max-batch-prefill-tokens {half:,}", "halves the warm-up batch's activations (here the "
                          "batch is the lever)")]
        if total_tokens and total_tokens > half:
            changes.append(Change(f"--max-total-tokens {int(min(total_tokens, half)):,}",
                                  "with --max-input-tokens below it: --max-batch-prefill-tokens must hold one input"))
        changes.append(Change(f"--num-shard {2 * shards}", "splits the weights and activations over more GPUs"))
        return Diagnosis(source, "tgi", "activation_peak",
                         f"the warm-up prefill of {facts.prefill_tokens.value:,} tokens did not fit: the activation "
                         "peak of one prefill batch", tuple(figures), tuple(changes),
                         failing_line=f"Not enough memory to handle {facts.prefill_tokens.value} prefill tokens")
    named = _named_quantization(settings)
    hit = _oom_line(text)
    if hit is None:
        if named is None:
            return None
        return Diagnosis(source, "tgi", "not_recognised",
                         "not recognised: no error line, but the launcher's Args load a model whose name says it is "
                         f"quantized ({named[0]}) with quantize: None, so at 16 bits", tuple(figures), (named[1],),
                         ("the error the shard printed (the launcher's whole log) would let diagnose decide",))
    line, quoted = hit
    around = "\n".join(x for x in _around(text, line).lower().splitlines() if "args {" not in x)
    if re.search(r"warmup|warm_up", around) and not re.search(r"shard \d+ failed to start|shardcannotstart", around):
        target = int(prefill // 2) if prefill else 4096
        changes = [Change(f"--max-batch-prefill-tokens {target:,}", "the warm-up's prefill batch is the peak"),
                   Change(f"--max-total-tokens {int(total_tokens // 2) if total_tokens else 4096:,}",
                          "a shorter request bounds the prefill"),
                   Change(f"--num-shard {2 * shards}", "splits the model over more GPUs")]
        kind, summary = "activation_peak", "TGI's warm-up prefill ran out of memory"
    elif re.search(r"load|weights|from_pretrained|get_model|shard \d+ failed to start|shardcannotstart", around):
        changes = [Change(f"--num-shard {2 * shards}", "splits the weights over more GPUs"),
                   Change("--quantize awq (a pre-quantized model) or --quantize eetq", "smaller weights")]
        if named is not None:
            changes.insert(0, named[1])
        kind, summary = "weights_do_not_fit", "the weights did not fit while the shard loaded them"
    else:
        changes = [Change(f"--max-batch-prefill-tokens {int(prefill // 2) if prefill else 4096:,}",
                          "bounds the tokens of one prefill"),
                   Change(f"--max-total-tokens {int(total_tokens // 2) if total_tokens else 4096:,}",
                          "bounds one request's tokens"),
                   Change(f"--num-shard {2 * shards}", "more GPUs")]
        kind, summary = "out_of_memory", "a TGI shard ran out of GPU memory"
    return Diagnosis(source, "tgi", kind, summary, tuple(figures), tuple(changes), failing_line=quoted[:300])


# a checkpoint named as quantized ("...-8bit", "-4bit", "-int8", "-nf4"): bitsandbytes quantizes at load time, so TGI
# loads it at --dtype unless --quantize bitsandbytes(-nf4) says otherwise; the name is not a setting (AWQ/GPTQ
# checkpoints carry a quantization_config TGI reads itself, so they are left out)
_QUANTIZED_NAME = re.compile(r"(?<![a-z0-9])(8bit|8-bit|int8|4bit|4-bit|nf4|bnb)(?![a-z0-9])", re.I)


def _named_quantization(settings: dict[str, Setting]) -> tuple[str, Change] | None:
    model = settings.get("model")
    if model is None or settings.get("quantization") is not None:
        return None
    found = _QUANTIZED_NAME.search(str(model.value))
    if found is None:
        return None
    four = found.group(1).lower() in ("4bit", "4-bit", "nf4")
    flag = "--quantize bitsandbytes-nf4" if four else "--quantize bitsandbytes"
    return found.group(1), Change(flag, f"the model id says {found.group(1)} but quantize is None: TGI loads it at "
                                        f"16 bits; {flag} loads it at {'4' if four else '8'} bits, "
                                        f"{'a quarter' if four else 'half'} of the 16-bit weights", "quantize_smaller")


# --- TensorRT-LLM -------------------------------------------------------------------------------------------------


def diagnose_trtllm(text: str, source: str, settings: dict[str, Setting], total_gib: float | None) -> Diagnosis | None:
    facts, figures, decided = _engine_facts(text, source, "trtllm")
    if decided is not None:
        return decided
    fraction = number(settings, "kv_cache_free_gpu_memory_fraction") or TRTLLM_DEFAULT_FRACTION
    if (exhausted := first_line_matching(text, _TRTLLM_NO_BLOCKS)) is not None:
        return _trtllm_blocks_exhausted(source, settings, fraction, tuple(figures), exhausted[1])
    hit = _oom_line(text)
    if hit is not None:
        line, quoted = hit
        around = _around(text, line).lower()
        tokens = number(settings, "max_num_tokens")
        batch = number(settings, "max_batch_size")
        lower = math.floor((fraction - 0.2) * 100) / 100 if fraction > 0.3 else round(fraction / 2, 2)
        if re.search(r"trtllm-build|builder|build_engine|engine build|tactic", around):
            changes = [Change(f"--max_num_tokens {int(tokens // 2) if tokens else 4096}", "the engine's activation "
                              "buffers follow max_num_tokens"),
                       Change(f"--max_batch_size {int(batch // 2) if batch else 64}", "smaller buffers")]
            if batch and batch >= TRTLLM_LARGE_BATCH:
                # the builder sizes each tactic's workspace for the largest shapes of the optimization profile, which
                # a large max_batch_size sets; those tactics are what asked for more than the GPU holds
                changes.reverse()
            kind, summary = "activation_peak", ("building the engine ran out of memory (the builder's tactics for "
                                                "the profile's largest shapes asked for more than the GPU holds)")
        else:
            changes = [Change(f"kv_cache_config.free_gpu_memory_fraction {lower:.2f}",
                              f"the KV cache takes {fraction} of the memory free after the engine loads; a smaller "
                              "share leaves room for activations and other allocations",
                              "kv_cache_free_gpu_memory_fraction_down"),
                       Change(f"--max_num_tokens {int(tokens // 2) if tokens else 4096}", "bounds one step's tokens"),
                       Change(f"--max_batch_size {int(batch // 2) if batch else 64}", "fewer sequences at once")]
            seq_len = number(settings, "max_seq_len")
            if _TRTLLM_ESTIMATION.search(around) and (seq_len is None or seq_len > TRTLLM_LONG_SEQ):
                changes.insert(0, Change(f"--max_seq_len {int(seq_len // 4) if seq_len else 8192}",
                                         "the KV-cache size estimation runs dummy context requests and a temporary KV "
                                         "cache sized for max_seq_len, which defaults to the model's whole context: "
                                         "a bounded length bounds that warm-up", "max_seq_len_down"))
            if batch and batch > 8:  # an engine built for a large batch preallocates its runtime buffers for it
                changes.insert(0, changes.pop())
            kind, summary = "out_of_memory", ("TensorRT-LLM ran out of GPU memory after its KV cache took its share "
                                              "of the free memory")
        return Diagnosis(source, "trtllm", kind, summary, tuple(figures), tuple(changes), failing_line=quoted[:300])
    if _kv_shorter_than_a_sequence(facts):
        larger = Change(f"kv_cache_config.free_gpu_memory_fraction {min(0.95, fraction + 0.05):.2f}",
                        "a share of the memory free after the weights: a larger KV cache",
                        "kv_cache_free_gpu_memory_fraction_up")
        return _kv_short_or_fits(source, "trtllm", "KV cache", facts, figures, "--max_seq_len", larger)
    if facts is not None and facts.buffers_gib:
        figures += [Figure(label, f"{quoted.value:.2f} GiB", f"log line {quoted.line}")
                    for label, quoted in facts.buffers_gib.items()]
        buffers = sum(q.value for q in facts.buffers_gib.values())
        kv = facts.kv_gib.value if facts.kv_gib else 0.0
        return Diagnosis(source, "trtllm", "preallocated",
                         f"TensorRT-LLM preallocated {buffers:.2f} GiB of runtime buffers and decoder state (sized by "
                         f"max_batch_size, max_num_tokens and max_seq_len) and a {kv:.2f} GiB KV cache (a "
                         f"{fraction} share of the memory free after them): together they fill the GPU", tuple(figures),
                         (Change(f"kv_cache_config.free_gpu_memory_fraction {max(0.1, round(fraction / 2, 2)):.2f}",
                                 "a smaller KV cache share leaves the rest of the GPU free",
                                 "kv_cache_free_gpu_memory_fraction_down"),
                          Change(f"--max_num_tokens {int(number(settings, 'max_num_tokens') // 2) if number(settings, 'max_num_tokens') else 2048}",
                                 "smaller runtime buffers"),
                          Change(f"--max_batch_size {int(number(settings, 'max_batch_size') // 2) if number(settings, 'max_batch_size') else 8}",
                                 "smaller decoder state and buffers")))
    return _kv_short_or_fits(source, "trtllm", "KV cache", facts, figures, "--max_seq_len", None)


# the PyTorch backend sizes its KV cache by a profiling pass before the real one (tensorrt_llm/_torch/pyexecutor/
# _util.py, KvCacheCreator): a temporary KV cache and dummy context requests of up to max_num_tokens / max_seq_len
# tokens, and max_seq_len defaults to the model's max_position_embeddings; an OOM there needs a bounded length first
_TRTLLM_ESTIMATION = re.compile(r"estimat|warm-?up|kv ?cache ?creator|_create_dummy|profil")
TRTLLM_LONG_SEQ = 32768  # a max_seq_len above this is a long-context model's default, not a workload's bound


# kvCacheManager.cpp (BlockManager::allocateBlock): TLLM_CHECK_WITH_INFO(hasFreeBlocks(...), "Can't allocate new blocks.
# No free blocks left."); the runtime docs (gpt_runtime.md, "KV cache"): raised when the paged KV cache is not large
# enough for the whole batch
_TRTLLM_NO_BLOCKS = re.compile(r"Can't allocate new blocks\. No free blocks left")


def _trtllm_blocks_exhausted(source: str, settings: dict[str, Setting], fraction: float, figures: tuple,
                             line: str) -> Diagnosis:
    """The paged KV cache ran out of blocks mid-batch: the batch's sequences need more blocks than the cache holds.
    A smaller max_batch_size shrinks both the batch and the runtime buffers the engine preallocates for it (which
    leave the KV cache its share of what is free after them); a larger share or shorter sequences come next."""
    batch = number(settings, "max_batch_size")
    seq_len = number(settings, "max_seq_len")
    changes = [Change(f"--max_batch_size {int(batch // 2) if batch else 64}",
                      "fewer sequences hold KV blocks at once, and the engine's buffers sized for the batch shrink"),
               Change(f"kv_cache_config.free_gpu_memory_fraction {min(0.95, fraction + 0.05):.2f}",
                      f"the KV cache takes {fraction} of the memory free after the engine loads: a larger share, more "
                      "blocks", "kv_cache_free_gpu_memory_fraction_up")]
    if seq_len:
        changes.append(Change(f"--max_seq_len {int(seq_len // 2)}", "fewer blocks per sequence"))
    return Diagnosis(source, "trtllm", "kv_cache_full",
                     "the paged KV cache ran out of blocks for the running batch (kvCacheManager: 'No free blocks "
                     "left'): the batch's sequences need more KV blocks than the cache holds", figures,
                     tuple(changes), failing_line=line[:300])
