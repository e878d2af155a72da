"""The scale a log shows: the model's size from its name ("Llama-2-70b-hf" is 70 billion parameters), the context its
name states ("glm-4-9b-chat-1m"), the GPUs named ("8 A100-40Gs", "2x RTX 2080 Ti") and what one of them holds. vLLM's
first change follows from them where the 16-bit weights alone exceed one GPU (tensor parallel over the GPUs shown),
where a 128k+ context is left as --max-model-len (a shorter one), where the KV room is a fraction of the
context asked for (more GPUs, not a context too short to use), and where the share the user set leaves nothing
outside vLLM (a lower share)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from harness.diagnose.records import Change, Diagnosis
from harness.diagnose.settings import Setting, number

GIB = 2**30
BYTES_16BIT = 2
# a model name's size: a letter-led name, then "-70b", "_13B", "-1.5b" ("a3b"/"e2b" are active or effective sizes)
_PARAMS = re.compile(r"[A-Za-z][\w.\-/]*?[-_/](\d{1,3}(?:\.\d{1,2})?)[bB](?![\w])")
_QUANTIZED = re.compile(r"awq|gptq|int4|int8|4bit|8bit|4-bit|8-bit|fp8|nf4|bnb|bitsandbytes|gguf|quantiz|w4a16|w8a8|"
                        r"exl2|marlin", re.I)
# a bare four-digit card is a GeForce model number (1080, 2080, 3090, 4090, 5090), never any number ("200000")
_CARD = r"(?:NVIDIA\s+|Tesla\s+|GeForce\s+)?(?:RTX\s*|GTX\s*)?(?:[AHLTV]\d{1,4}|[1-5]0[5-9]0)(?:\s*ti)?"
# "8 A100-40Gs", "2x RTX 2080 Ti", "4 x A100", "2*A00" (a count, a separator, then a card), "4 GPUs", "2 cards"
_COUNT = re.compile(rf"\b(\d{{1,2}})(?:\s*[x×*]\s*|\s+){_CARD}\b|\b(\d{{1,2}})\s*(?:GPUs|cards)\b", re.I)
# a card with its size written beside it: "A100-40G", "A100 80GB", "RTX 3090 24GB"
_SIZED_CARD = re.compile(rf"{_CARD}[\s-]*(?:SXM\d?[\s-]*|PCIe[\s-]*)?(\d{{1,3}})\s*G(?:B|iB)?s?\b", re.I)
# cards with one memory size (where a card comes in two, the larger: a weights-exceed verdict must not rest on the
# smaller variant)
_NOMINAL_GIB = ((r"H200", 141), (r"H100|H800|A100|A800", 80), (r"A6000|L40S?|RTX\s*6000", 48),
                (r"V100", 32), (r"A10G?\b|L4\b|3090|4090|A5000", 24), (r"T4\b|A4000|4080", 16),
                (r"2080\s*ti|1080\s*ti", 11), (r"3060", 12), (r"3070|3080|2080|1080|1070", 10))
_TP_SIZES = (2, 4, 8, 16)
# a context length a model's name states ("glm-4-9b-chat-1m", "Qwen2.5-7B-Instruct-1M", "Phi-3-mini-128k-instruct",
# "Yi-6B-200K"): the name says what its config's max_position_embeddings / seq_length holds
_CONTEXT_IN_NAME = re.compile(r"[-_](\d{1,4})([kKmM])(?=$|[-_.])")
# a word is a model's name only where it also says what model: its size ("-9b-", "-7B", "a3b"), an organisation's
# "org/Name", or a model family; "timeout-5m", "run-128k" or "cache-2m" are not
_NAME_WORD = re.compile(r"[^\s\"'`=,;:()\[\]{}<>|]+")
_SIZE_IN_NAME = re.compile(r"[-_](?:a|e)?\d{1,3}(?:\.\d{1,2})?[bB](?=$|[-_.])")
_ORG_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z][\w.-]*$")
_FAMILY = re.compile(r"llama|qwen|qwq|glm|mistral|mixtral|phi|gemma|deepseek|internlm|baichuan|falcon|\byi[-_]|jamba|"
                     r"minimax|granite|olmo|nemotron|hermes|vicuna|kimi|moonshot|ernie|hunyuan", re.I)


def model_params_billion(text: str) -> float | None:
    """The largest model size a name in the text states, in billions of parameters."""
    sizes = [float(m.group(1)) for m in _PARAMS.finditer(text)]
    return max(sizes) if sizes else None


def context_in_name(text: str) -> int | None:
    """The longest context (in tokens) a model name in the text states: a "-128k"/"-1m" part of a word that is a
    model's name (it states a size, an org/name or a model family), never of any hyphenated word."""
    tokens = []
    for word in _NAME_WORD.findall(text):
        name = word.rstrip(".")
        if not (_SIZE_IN_NAME.search(name) or _ORG_NAME.match(name) or _FAMILY.search(name)):
            continue
        tokens += [int(m.group(1)) * (1024 if m.group(2) in "kK" else 1024 * 1024)
                   for m in _CONTEXT_IN_NAME.finditer(name)]
    return max(tokens) if tokens else None


def quantized(text: str, settings: dict[str, Setting]) -> bool:
    return bool(_QUANTIZED.search(text)) or "quantization" in settings


def gpus_named(text: str) -> int | None:
    counts = [int(m.group(1) or m.group(2)) for m in _COUNT.finditer(text)]
    counts = [c for c in counts if 1 <= c <= 64]
    return max(counts) if counts else None


def gpu_gib(text: str) -> float | None:
    """One GPU's memory as the log names it: a size written beside the card, else the card's nominal size."""
    sized = [int(m.group(1)) for m in _SIZED_CARD.finditer(text) if 4 <= int(m.group(1)) <= 200]
    if sized:
        return float(max(sized))
    for pattern, gib in _NOMINAL_GIB:
        if re.search(rf"\b(?:{pattern})", text, re.I):
            return float(gib)
    return None


def weights_16bit_gib(params_billion: float) -> float:
    return params_billion * 1e9 * BYTES_16BIT / GIB


def _tensor_parallel(weights: float, per_gpu: float, most: int | None, current: int) -> int:
    """The fewest GPUs (a power of two above the current TP) whose share of the weights leaves room for the KV cache
    (at most half of each GPU's default 0.9 share), no more than the GPUs shown."""
    for size in _TP_SIZES:
        if size > current and (weights / size <= 0.45 * per_gpu or (most is not None and size >= most)):
            return min(size, most) if most and most > current else size
    return _TP_SIZES[-1]


def _tp_change(tp: int, effect: str) -> Change:
    return Change(f"--tensor-parallel-size {tp}", effect, "tensor_parallel_up")


def _first(diagnosis: Diagnosis, change: Change, kind: str | None = None, summary: str | None = None) -> Diagnosis:
    rest = tuple(c for c in diagnosis.changes if c.lever != change.lever)
    return replace(diagnosis, kind=kind or diagnosis.kind, summary=summary or diagnosis.summary,
                   changes=(change,) + rest)


# vLLM kinds where what ran out is the weights' room or the memory left beside them (not another process, not KV room)
_WEIGHTS_ROOM = ("activation_peak", "out_of_memory", "weights_do_not_fit", "weights_loading", "not_recognised",
                 "cuda_graph_capture", "oom_under_load")
# the command that started vLLM, shown: only then does a missing --tensor-parallel-size say it was not set
_LAUNCH = re.compile(r"\bvllm serve\b|vllm\.entrypoints|api_server\b|\bLLM\(|benchmark_(?:latency|throughput)|"
                     r"--infer_backend\s+vllm", re.I)
# a consumer card (24 GB and under) whose 16-bit weights take this much of it: the rest is too small for any of what
# vLLM allocates beside them, so smaller weights come before tuning that rest
CONSUMER_GPU_GIB = 24.5
MOST_OF_A_CARD = 0.6
_BESIDE_WEIGHTS = ("activation_peak", "out_of_memory", "cuda_graph_capture", "oom_under_load", "not_recognised")
SHARE_AT_THE_TOP = 0.98  # a share this high leaves nothing outside vLLM: CUDA context, NCCL buffers, the sampler
SHORTEST_USEFUL_CONTEXT = 2048
# a native context this long (the "-128k"/"-1m" long-context variants) left as vLLM's --max-model-len is the first
# suspect of a start-up OOM (vLLM's SchedulerConfig without chunked prefill: max_num_batched_tokens =
# max(max_model_len, 2048), so the profile run prefills the whole context)
LONG_NATIVE_CONTEXT = 128 * 1024
USUAL_CONTEXT = 32768


def vllm_by_scale(diagnosis: Diagnosis, text: str, settings: dict[str, Setting]) -> Diagnosis:
    if diagnosis.reader != "vllm" or not diagnosis.changes:
        return diagnosis
    tp = int(number(settings, "tensor_parallel_size") or 1)
    params = model_params_billion(text)
    per_gpu = gpu_gib(text)
    count = gpus_named(text)
    share = number(settings, "gpu_memory_utilization")
    if diagnosis.kind in _WEIGHTS_ROOM and tp == 1 and params and per_gpu and not quantized(text, settings) and \
            _LAUNCH.search(text) and "tensor_parallel_size" not in settings:
        weights = weights_16bit_gib(params)
        if weights > 0.9 * per_gpu and (count or 1) >= 2:
            size = _tensor_parallel(weights, per_gpu, count, tp)
            return _first(diagnosis, _tp_change(size, f"a {params:g}B model's 16-bit weights are about {weights:.0f} "
                                                      f"GiB, above one {per_gpu:.0f} GiB GPU; over {size} of the "
                                                      f"{count} GPUs shown each holds {weights / size:.0f} GiB"),
                          "weights_do_not_fit",
                          f"the {params:g}B model's 16-bit weights (about {weights:.0f} GiB) do not fit one "
                          f"{per_gpu:.0f} GiB GPU, and no --tensor-parallel-size spreads them over the {count} shown")
    if tp > 1 and diagnosis.kind in _WEIGHTS_ROOM and (unsharded := _unsharded_by_transformers_backend(
            text, tp, params)) is not None:
        return _first(diagnosis, unsharded, "weights_do_not_fit",
                      "the Transformers backend (--model-impl transformers) holds more of the weights on one GPU than "
                      f"tensor parallel {tp} leaves it: layers the model's tensor-parallel plan does not name are "
                      "replicated on every GPU")
    if diagnosis.kind in _BESIDE_WEIGHTS and tp == 1 and params and per_gpu and per_gpu <= CONSUMER_GPU_GIB and \
            not quantized(text, settings) and weights_16bit_gib(params) >= MOST_OF_A_CARD * per_gpu and \
            (count or 1) == 1:
        weights = weights_16bit_gib(params)
        return _first(diagnosis, Change(
            "a 4/8-bit checkpoint of the model (awq, gptq, fp8) or a smaller model",
            f"a {params:g}B model's 16-bit weights are about {weights:.0f} GiB of the {per_gpu:.0f} GiB card: what is "
            "left for the KV cache, CUDA graphs and a step's activations is a few GiB, which any of them outgrows; "
            "8-bit weights give back half of them", "quantize_smaller"))
    context = context_in_name(text)
    if diagnosis.kind in _WEIGHTS_ROOM and diagnosis.kind != "weights_do_not_fit" and context and \
            context >= LONG_NATIVE_CONTEXT and "max_model_len" not in settings:
        return _first(diagnosis, Change(
            f"--max-model-len {USUAL_CONTEXT:,}",
            f"the model's name states a {context:,}-token context and no --max-model-len is set, so vLLM takes that "
            "from its config: without chunked prefill its profile run prefills that many tokens at once, and the KV "
            f"cache must hold one sequence of it; {USUAL_CONTEXT:,} asks {context // USUAL_CONTEXT}x less",
            "max_model_len_down"))
    if share is not None and share >= SHARE_AT_THE_TOP and diagnosis.kind in _WEIGHTS_ROOM and \
            diagnosis.kind != "weights_do_not_fit":
        lower = min(0.95, math.floor((share - 0.03) * 100) / 100)
        already = next((c for c in diagnosis.changes if c.lever == "gpu_memory_utilization_down"), None)
        return _first(diagnosis, already or Change(
            f"--gpu-memory-utilization {lower:.2f}", f"at {share} vLLM preallocates (nearly) the whole GPU, leaving "
            "nothing for the CUDA context, NCCL buffers and the activations it does not profile; "
            f"{lower:.2f} leaves {1 - lower:.0%} outside its share", "gpu_memory_utilization_down"))
    if diagnosis.kind == "kv_cache_too_small":
        return _kv_room_by_scale(diagnosis, tp, params, count)
    return diagnosis


# vLLM's Transformers backend (vllm/model_executor/models/transformers.py, replace_linear_class) turns each nn.Linear
# into a vLLM parallel linear by the style the model's base_model_tp_plan gives it, and into ReplicatedLinear (the
# whole weight on every GPU) where the plan names none: under tensor parallel, a model whose transformers class has no
# or a partial plan keeps whole layers on each GPU. The fix is a vLLM release with a native implementation of the
# architecture (or a plan), i.e. an upgrade, not a smaller share
_TRANSFORMERS_BACKEND = re.compile(r"--model[-_]impl(?:\s+|=)['\"]?transformers|model_impl\s*[=:]\s*['\"]?transformers|"
                                   r"Using Transformers backend|\bTransformersForCausalLM\b|\bTransformersModel\b", re.I)
UNSHARDED = 1.2  # a GPU holding this many times its tensor-parallel share of the 16-bit weights (and 2 GiB more)


def _unsharded_by_transformers_backend(text: str, tp: int, params: float | None) -> Change | None:
    if not _TRANSFORMERS_BACKEND.search(text):
        return None
    from harness.diagnose.readers import read_torch_oom  # the reader imports nothing from here; a lazy import anyway
    found = read_torch_oom(text)
    allocated = found[0].bytes_of("allocated") if found else None
    if params and allocated is not None:
        share = weights_16bit_gib(params) / tp
        if allocated / GIB < UNSHARDED * share + 2.0:
            return None
        held = f"{allocated / GIB:.1f} GiB allocated on one GPU against a {share:.1f} GiB share of the weights"
    elif found is None:
        return None
    else:
        held = "the GPU filled at start-up"
    return Change("upgrade vLLM to a release that implements this architecture natively, then start it without "
                  "--model-impl transformers (or with a transformers release whose model class has a tensor-parallel "
                  "plan)", f"{held}: the Transformers backend replicates the layers its TP plan does not cover, so "
                  f"tensor parallel {tp} does not split them", "upgrade")


def _kv_figures(diagnosis: Diagnosis) -> tuple[int, int] | None:
    for figure in diagnosis.figures:
        numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", figure.value)]
        if figure.label == "max seq len vs KV cache" and len(numbers) == 2:
            return numbers[0], numbers[1]
    return None


def _useless_context(change: Change, asked: int) -> bool:
    value = re.search(r"--max-model-len (\d[\d,]*)", change.setting)
    if change.lever != "max_model_len_down" or value is None:
        return False
    length = int(value.group(1).replace(",", ""))
    return length < SHORTEST_USEFUL_CONTEXT


def _kv_room_by_scale(diagnosis: Diagnosis, tp: int, params: float | None, count: int | None) -> Diagnosis:
    """KV room a fraction of the context asked for: a context cut to that fraction is no use to anyone, while over
    more GPUs each holds a smaller share of the weights and the KV room grows by what that frees."""
    figures = _kv_figures(diagnosis)
    if figures is None:
        return diagnosis
    asked, holds = figures
    changes = diagnosis.changes
    if holds < asked / 2 and _useless_context(changes[0], asked) and \
            tp <= 2 and ((count or 1) > tp or (params or 0) >= 30):
        size = count if count and count > tp and tp == 1 else 2 * tp
        diagnosis = _first(diagnosis, _tp_change(size, f"the KV cache holds {holds:,} tokens, under half the "
                                                       f"{asked:,} asked for: over {size} GPUs each holds a "
                                                       f"{size}th of the weights, and what that frees goes to the KV "
                                                       "cache"))
        changes = diagnosis.changes
    if len(changes) > 1 and _useless_context(changes[0], asked):
        changes = changes[1:] + changes[:1]
    return replace(diagnosis, changes=changes)

