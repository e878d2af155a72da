"""llama.cpp and the servers built on it (ollama, llama-server, LM Studio's runtime) read in their own terms: the
buffer ggml could not allocate on the GPU, the layers offloaded to it, and their settings (ollama's num_gpu and
num_ctx, llama.cpp's -ngl / --n-gpu-layers and -c / --ctx-size).

The strings are llama.cpp's own: ggml-cuda's `ggml_backend_cuda_buffer_type_alloc_buffer: allocating %.2f MiB on
device %d: cudaMalloc failed: %s`, llama_model_load's `error loading model: unable to allocate CUDA0 buffer`,
alloc_tensor_range's `failed to allocate CUDA0 buffer of size %zu`, the context's `failed to allocate buffer for kv
cache` / `failed to initialize the context`, llm_load_tensors' `offloaded %d/%d layers to GPU`; ollama's server log
adds `memory.required.full`, `layers.offload` and the num_gpu it chose."""

from __future__ import annotations

import re

from harness.diagnose.failures import first_line_matching
from harness.diagnose.records import Change, Diagnosis, Figure

# llama.cpp's own lines (ggml, its loader and context), and the servers that run it: ollama, llama-server
_MARKERS = re.compile(r"\bggml_|\bllama_model_load\b|\bllm_load_\w+|\bllama_(?:init_from_model|new_context\w*|"
                      r"load_model_from_file)\b|\bllama-server\b|\bllama runner\b|\bollama\b|\bOLLAMA_\w+|"
                      r"alloc_tensor_range", re.I)
# ggml's own allocation failures; a plain "out of memory" only beside ggml's or llama.cpp's loader lines (a GGUF
# model served by vLLM or transformers fails in PyTorch's words and is theirs to read)
_GGML_FAILED = re.compile(r"cudaMalloc failed: out of memory|unable to allocate (?:CUDA|ROCm)\d* buffer|"
                          r"failed to allocate (?:CUDA|ROCm)\d* buffer|failed to allocate buffer for kv cache", re.I)
_ALLOC_FAILED = re.compile(_GGML_FAILED.pattern + r"|out of memory", re.I)
_LOADER = re.compile(r"\bggml_|\bllama_model_load\b|\bllm_load_\w+|\bllama_(?:init_from_model|new_context\w*)\b|"
                     r"\bllama runner\b|\bollama\b", re.I)
_PYTORCH = re.compile(r"Tried to allocate|torch\.(?:cuda\.)?OutOfMemoryError|total capacity", re.I)
_KV_BUFFER = re.compile(r"failed to allocate buffer for kv cache|failed to initialize the context|"
                        r"llama_kv_cache\w*.*(?:failed|out of memory)", re.I)
_ALLOCATING = re.compile(r"allocating (\d+(?:\.\d+)?) MiB on device (\d+)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU", re.I)
_NGL = re.compile(r"(?:\bnum_gpu\b\W{0,3}|(?:^|\s)-ngl\s+|--n-gpu-layers[=\s]+|--gpu-layers[=\s]+)(\d+)", re.I | re.M)
_CTX = re.compile(r"(?:\bnum_ctx\b\W{0,3}|(?:^|\s)-c\s+|--ctx-size[=\s]+|\bn_ctx\s*=\s*)(\d+)", re.I | re.M)
_LAYERS_IN_MODEL = re.compile(r"\bn_layer\s*=\s*(\d+)")
# a report in words: llama.cpp named ("llama.cpp", "llama-cpp", its ./main or llama-server) and running out said in
# any spelling ("cuda-out-of-memory error"), with no PyTorch message
_NAMED = re.compile(r"\bllama[.-]cpp\b|\bllama-server\b|\bollama\b", re.I)
_SAID_OOM = re.compile(r"out[ -]of[ -]memory|\bOOM\b", re.I)


def diagnose_llama_cpp(text: str, source: str, flags_text: str = "") -> Diagnosis | None:
    """ggml could not allocate a buffer on the GPU: the model's layers placed there (all of them unless num_gpu /
    -ngl says fewer) or the KV cache of the context did not fit. Fewer layers on the GPU is llama.cpp's own lever (the
    rest run from CPU memory), a smaller quantization or context the next ones; a KV-cache buffer puts the context
    first."""
    context = f"{text}\n{flags_text}"
    named = _NAMED.search(text) is not None and _SAID_OOM.search(text) is not None and not _PYTORCH.search(text)
    if not (_MARKERS.search(text) or named) or not (_GGML_FAILED.search(text) or named or (
            _ALLOC_FAILED.search(text) and _LOADER.search(text) and not _PYTORCH.search(text))):
        return None
    failing = first_line_matching(text, _ALLOC_FAILED) or first_line_matching(text, _SAID_OOM)
    figures: list[Figure] = []
    if (found := _ALLOCATING.search(text)) is not None:
        figures.append(Figure("buffer it could not allocate", f"{found.group(1)} MiB on GPU {found.group(2)}",
                              f"log line {text.count(chr(10), 0, found.start()) + 1}"))
    offloaded = _OFFLOADED.search(text)
    if offloaded is not None:
        figures.append(Figure("layers on the GPU", f"{offloaded.group(1)} of {offloaded.group(2)}",
                              f"log line {text.count(chr(10), 0, offloaded.start()) + 1}"))
    set_layers = [int(m.group(1)) for m in _NGL.finditer(context)]
    on_gpu = min(set_layers) if set_layers else (int(offloaded.group(1)) if offloaded else None)
    total_layers = int(offloaded.group(2)) if offloaded else (
        int(m.group(1)) if (m := _LAYERS_IN_MODEL.search(text)) else None)
    fewer_to = max((on_gpu or total_layers or 0) // 2, 0) if (on_gpu or total_layers) else None
    fewer = Change(f"fewer layers on the GPU: ollama num_gpu {fewer_to} / llama.cpp -ngl {fewer_to}" if fewer_to
                   else "fewer layers on the GPU: ollama num_gpu (a Modelfile PARAMETER or the request's options) / "
                        "llama.cpp -ngl (--n-gpu-layers)",
                   "the other layers' weights stay in CPU memory and run there (slower): the GPU buffer shrinks with "
                   "the layers", "cpu_offload")
    contexts = [int(m.group(1)) for m in _CTX.finditer(context)]
    shorter = Change(f"a shorter context: ollama num_ctx / llama.cpp -c (below {min(contexts):,})" if contexts
                     else "a shorter context: ollama num_ctx / llama.cpp -c (--ctx-size)",
                     "the KV cache grows with the context", "max_model_len_down")
    smaller = Change("a smaller quantization of the weights (a Q4_K_M or Q3_K GGUF instead of Q8_0 / 16-bit)",
                     "fewer bytes per weight on the GPU", "quantize_smaller")
    kv = _KV_BUFFER.search(text) is not None
    changes = (shorter, fewer, smaller) if kv else (fewer, smaller, shorter)
    summary = ("llama.cpp could not allocate the KV cache for its context on the GPU, after the weights were placed"
               if kv else "llama.cpp could not allocate the model's weights on the GPU: the layers offloaded to it "
                          "do not fit beside what else it holds")
    return Diagnosis(source, "llama.cpp", "kv_cache_too_small" if kv else "weights_do_not_fit", summary,
                     tuple(figures), changes,
                     ("ollama's server log (OLLAMA_DEBUG=1: memory.required.full, layers.offload) or llama.cpp's "
                      "load lines (offloaded N/M layers to GPU) say how much of the model went to the GPU",)
                     if offloaded is None else (), failing_line=failing[1] if failing else "")
