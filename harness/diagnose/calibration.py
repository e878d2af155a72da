"""A quantization tool's calibration pass that ran out of GPU memory, read in the tool's own terms: AutoAWQ, AutoGPTQ,
GPTQModel, llm-compressor's oneshot, AutoRound and optimum's GPTQ run calibration samples through the model layer by
layer, and what a layer's forward holds is samples x sequence length x hidden size (AutoAWQ sends every sample through
a layer at once unless n_parallel_calib_samples splits them; AutoGPTQ caches each layer's inputs on the GPU unless
cache_examples_on_gpu=False). So the levers are the samples, their length, and keeping the cached inputs on the CPU.

Strings from the tools' source: AutoAWQ awq/quantize/quantizer.py (AwqQuantizer, init_quant(n_samples, seqlen),
_get_input_feat) and awq/models/base.py quantize(max_calib_samples=128, max_calib_seq_len=512,
n_parallel_calib_samples); AutoGPTQ auto_gptq/modeling/_base.py quantize(examples, batch_size,
cache_examples_on_gpu=True); GPTQModel gptqmodel/; llm-compressor llmcompressor/ oneshot(num_calibration_samples,
max_seq_length) and GPTQModifier(offload_hessians); AutoRound auto_round/ AutoRound(nsamples, seqlen,
low_gpu_mem_usage); optimum optimum/gptq/quantizer.py GPTQQuantizer(model_seqlen, cache_block_outputs)."""

from __future__ import annotations

import re

from harness.diagnose.failures import QUOTED_CHARS, first_line_matching
from harness.diagnose.records import Change, Diagnosis

_TOOL = re.compile(r"awq/quantize/|awq/models/|\bAwqQuantizer\b|_get_input_feat|\binit_quant\b|\bAutoAWQ\w*|"
                   r"auto_gptq/|\bAutoGPTQ\b|cache_examples_on_gpu|gptqmodel/|\bGPTQModel\b|llmcompressor/|"
                   r"\bllm-compressor\b|\boneshot\(|num_calibration_samples|auto_round/|\bAutoRound\b|optimum/gptq/|"
                   r"\bGPTQQuantizer\b|\bn_samples\b|\bnsamples\b|max_calib_samples|max_calib_seq_len", re.I)
_OOM = re.compile(r"out of memory|OutOfMemoryError|\bOOM\b", re.I)
# a traceback that stops inside the calibration forward, its error line not pasted
_CALIBRATION_FRAME = re.compile(r"_get_input_feat|\binit_quant\b|\badd_batch\b|\bfasterquant\b|cache_examples|"
                                r"calib\w*|layer\(self\.inps", re.I)
_SAMPLES = re.compile(r"(?<![\w-])(?:--?)?(?P<name>n_samples|nsamples|num_calibration_samples|max_calib_samples|"
                      r"num_samples|calib_samples)[\"'`]?\s*(?:[:=]\s*|\s+)[\"'`]?(?P<value>\d+)", re.I)
_LENGTH = re.compile(r"(?<![\w-])(?:--?)?(?P<name>seqlen|max_seq_length|max_calib_seq_len|model_seqlen|seq_len|"
                     r"max_length)[\"'`]?\s*(?:[:=]\s*|\s+)[\"'`]?(?P<value>\d+)", re.I)
_MASK = re.compile(r"masking_utils\.py|attention_mask|causal_mask|_prepare_4d|\b(?:sdpa|eager|and|or)_mask\b", re.I)
MANY_SAMPLES = 256  # above the tools' defaults (AutoAWQ, AutoRound, GPTQ: 128); llm-compressor's is 512
LONG_CALIBRATION = 4096  # tokens a sample

# each tool's switch that keeps calibration inputs (or GPTQ's Hessians) off the GPU, and the words that say it is on
_CPU_CACHE = (
    (re.compile(r"auto_gptq/|\bAutoGPTQ\b|cache_examples_on_gpu", re.I),
     re.compile(r"cache_examples_on_gpu\s*[=:]?\s*False", re.I), "quantize(..., cache_examples_on_gpu=False)",
     "AutoGPTQ keeps each layer's cached calibration inputs in CPU memory (slower)"),
    (re.compile(r"auto_round/|\bAutoRound\b", re.I), re.compile(r"low_gpu_mem_usage\s*[=:]?\s*True", re.I),
     "AutoRound(..., low_gpu_mem_usage=True)", "AutoRound caches the blocks' inputs in CPU memory (slower)"),
    (re.compile(r"llmcompressor/|\bllm-compressor\b|\boneshot\(|num_calibration_samples", re.I),
     re.compile(r"offload_hessians\s*[=:]?\s*True", re.I), "GPTQModifier(..., offload_hessians=True)",
     "llm-compressor keeps GPTQ's Hessians in CPU memory between layers"),
    (re.compile(r"optimum/gptq/|\bGPTQQuantizer\b", re.I), re.compile(r"cache_block_outputs\s*[=:]?\s*False", re.I),
     "GPTQQuantizer(..., cache_block_outputs=False)", "optimum recomputes a block's outputs instead of caching them"),
)


# "if I run with cache_examples_on_gpu=False it works": a switch said to have worked is the person's finding, not the
# setting the failed run had
_SAID_WORKED = re.compile(r"^[`'\")\s,]{0,4}(?:it\s+|that\s+)?(?:works?|worked|runs?|ran|fits?|helps?|helped)\b", re.I)


def _in_place(switch: re.Pattern, context: str) -> bool:
    return any(not _SAID_WORKED.search(context[m.end():m.end() + 40]) for m in switch.finditer(context))


def _largest(pattern: re.Pattern, context: str) -> tuple[str, int] | None:
    found = [(m.group("name"), int(m.group("value"))) for m in pattern.finditer(context)]
    return max(found, key=lambda f: f[1]) if found else None


def _failed(text: str) -> tuple[bool, str]:
    """(a failure is shown, the line quoted): an out-of-memory line, or a traceback cut inside the calibration pass."""
    if (said := first_line_matching(text, _OOM)) is not None:
        return True, said[1]
    lines = [line for line in text.splitlines() if line.strip()]
    if "Traceback" in text and lines and _CALIBRATION_FRAME.search("\n".join(lines[-4:])) and \
            not re.match(r"\s*\w+(?:\.\w+)*(?:Error|Exception)\b", lines[-1]):
        return True, lines[-1].strip()[:QUOTED_CHARS]
    return False, ""


def diagnose_calibration(text: str, source: str, flags_text: str = "") -> Diagnosis | None:
    context = f"{text}\n{flags_text}"
    if not _TOOL.search(context):
        return None
    failed, quoted = _failed(text)
    if not failed:
        return None
    samples, length = _largest(_SAMPLES, context), _largest(_LENGTH, context)
    awq = re.search(r"awq/|\bAutoAWQ|\bAwqQuantizer\b", context, re.I) is not None
    fewer = Change(f"fewer calibration samples: {samples[0]} {max(samples[1] // 2, 1)} (from {samples[1]})"
                   + (", or n_parallel_calib_samples to send them through a layer in parts" if awq else "")
                   if samples else "fewer calibration samples (n_samples / nsamples / num_calibration_samples)",
                   "a layer's calibration forward holds every sample at once: its activations grow with the samples",
                   "batch_size_down")
    shorter = Change(f"a shorter calibration sequence: {length[0]} {max(length[1] // 2, 128)} (from {length[1]})"
                     if length else "a shorter calibration sequence (max_seq_length / seqlen, e.g. 2048): samples "
                                    "are otherwise as long as they come",
                     "activations grow with the length, an attention mask with its square", "max_model_len_down")
    cache = next(((setting, effect) for tool, on, setting, effect in _CPU_CACHE
                  if tool.search(context) and not _in_place(on, context)), None)
    on_cpu = (Change(cache[0], cache[1], "calibration_cache_on_cpu"),) if cache else ()
    if _MASK.search(text) or (length is not None and length[1] >= LONG_CALIBRATION):
        changes, why = (shorter, fewer) + on_cpu, "the sequence length"
    elif samples is not None and samples[1] >= MANY_SAMPLES:
        changes, why = (fewer, shorter) + on_cpu, f"{samples[1]} samples, above the tools' default of 128"
    elif cache is not None:
        changes, why = on_cpu + (fewer, shorter), "inputs cached on the GPU"
    else:
        changes, why = (fewer, shorter), "the samples x length of a layer's forward"
    cut = not _OOM.search(quoted)
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     f"a quantization tool's calibration pass ran out of GPU memory ({why}): a layer's forward over "
                     "the calibration samples holds samples x length activations"
                     + (" (the traceback stops inside the calibration forward before its error line: read as memory, "
                        "the usual failure there)" if cut else ""), (), changes,
                     ("the error line at the end of the traceback",) if cut else (), failing_line=quoted)
