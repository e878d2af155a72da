"""The per-format direct measurement, in its own subprocess (scripts/gpu_check/worker.py): load the model with this
module's own code, then weights from the allocator after loading, KV bytes from the cache tensors a prefill returns
and from the allocator delta, prefill and per-step decode times between torch.cuda.synchronize calls, and the
allocator's and NVML's peaks; checked against harness's predictions (harness.measure.kv) and planned for an 80 GiB
GPU with harness's vLLM planner.

Independent of harness's measurement code on purpose (that is what the check checks): only the NVML sampler
(harness.measure.memory.NvmlSampler, a thread reading what nvidia-smi shows) is shared.
"""

from __future__ import annotations

import statistics
import time

from harness.commands.plan import capacity_view
from harness.formats import format_spec
from harness.capacity import Target, Workload, gpu_of_size, model_shape, plan_vllm, weight_format
from harness.measure.kv import estimate_weights_bytes, kv_bytes_per_token
from harness.measure.memory import NvmlSampler
from scripts.gpu_check.model import gptq_dir, gptqmodel_env

BATCH, PROMPT_LEN, NEW_TOKENS = 8, 512, 32
KV_TOLERANCE = 0.01       # cache tensors vs config arithmetic: should be exact
ALLOC_TOLERANCE = 0.05    # allocator delta vs prediction: block rounding and the next-token tensor
WEIGHTS_TOLERANCE = 0.05  # allocator after load vs estimate_weights_bytes
MEASURED_FORMATS = ("baseline", "int8", "gptq")  # those _load knows how to load


def measure_format(job: dict) -> dict:
    import torch

    fmt, device, cuda = job["format"], job["device"], job["device"] == "cuda"
    nvml = NvmlSampler() if cuda else None
    if nvml:
        nvml.start()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    allocated = torch.cuda.memory_allocated if cuda else (lambda: 0)
    if cuda:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
    before_load = allocated()
    start = time.perf_counter()
    model = _load(fmt, job["model_dir"], device)
    sync()
    load_s = time.perf_counter() - start
    config = model.config
    weights_allocated = allocated() - before_load
    load_peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (0, 0)
    weights_tensors = _tensor_bytes(model)
    group = job["gptq_group"] if fmt == "gptq" else None
    weights_predicted = estimate_weights_bytes(config, format_spec(fmt).bits, group, fmt=fmt)

    vocab, batch, prompt_len, new_tokens = config.vocab_size, job["batch"], job["prompt_len"], job["new_tokens"]
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, vocab, (batch, prompt_len), generator=generator).to(device)
    _decode(model, prompt[:1, :16], 2, sync)  # warm-up: kernels, cuBLAS handles, bnb state
    if cuda:
        torch.cuda.empty_cache()
    sync()
    before_prefill = allocated()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    run = _decode(model, prompt, new_tokens, sync, measure_prefill_alloc=allocated)
    gen_peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (0, 0)
    kv_final = run["kv_final_bytes"]
    del run["cache"]
    single = _decode(model, prompt[:1], new_tokens, sync)
    del single["cache"]
    nvml_peak = nvml.stop() if nvml else None

    kv_per_token = kv_bytes_per_token(config)
    prefill_tokens, final_tokens = batch * prompt_len, batch * (prompt_len + new_tokens)
    activation = max(gen_peak[0] - before_prefill - kv_final, 0)
    # The report's vLLM planner on the measured weights and activation peak, for an 80 GiB GPU at 0.90.
    capacity = capacity_view(plan_vllm(
        model_shape(config.to_dict()), weight_format(fmt, group), Target(gpu_of_size(80.0)),
        Workload(max_model_len=config.max_position_embeddings, activation_bytes=activation,
                 weights_bytes=weights_allocated or weights_tensors), version="0.32", gpu_memory_utilization=0.90))
    result = {
        "format": fmt, "load_s": load_s,
        "weights_predicted_bytes": weights_predicted, "weights_allocated_bytes": weights_allocated,
        "weights_tensor_bytes": weights_tensors,
        "kv_bytes_per_token_predicted": kv_per_token,
        "prefill_tokens": prefill_tokens, "final_tokens": final_tokens,
        "kv_prefill_predicted_bytes": kv_per_token * prefill_tokens, "kv_prefill_tensor_bytes": run["kv_prefill_bytes"],
        "kv_prefill_allocator_delta_bytes": run["prefill_alloc_delta"],
        "kv_final_predicted_bytes": kv_per_token * final_tokens, "kv_final_tensor_bytes": kv_final,
        "ttft_ms": run["prefill_ms"], "tpot_ms_p50": statistics.median(run["step_ms"]),
        "tpot_ms_mean": statistics.fmean(run["step_ms"]),
        "batch1_ttft_ms": single["prefill_ms"], "batch1_tpot_ms_p50": statistics.median(single["step_ms"]),
        "cuda_max_allocated_bytes": max(load_peak[0], gen_peak[0]) if cuda else None,
        "cuda_max_reserved_bytes": max(load_peak[1], gen_peak[1]) if cuda else None,
        "nvml_start_used_bytes": nvml.start_used if nvml else None, "nvml_peak_used_bytes": nvml_peak,
        "activation_peak_bytes": activation, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "capacity_80gib": capacity,
    }
    result["checks"] = _checks(result, cuda)
    return result


def _load(fmt: str, model_dir: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    if fmt == "baseline":
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map=device).eval()
    if fmt == "int8":
        from transformers import BitsAndBytesConfig

        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map=device,
                                                    quantization_config=BitsAndBytesConfig(load_in_8bit=True)).eval()
    if fmt == "gptq":
        gptqmodel_env()
        from gptqmodel import GPTQModel

        wrapper = GPTQModel.load(gptq_dir(model_dir), device=device)
        return getattr(wrapper, "model", wrapper).eval()
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(MEASURED_FORMATS)})")


def _decode(model, prompt, new_tokens: int, sync, measure_prefill_alloc=None) -> dict:
    """Prefill `prompt` keeping the cache, then greedy-decode step by step, timing each step."""
    import inspect

    import torch

    # transformers 5.x renames forward's past_key_values to cache (the old name warns until 5.40).
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        sync()
        start_alloc = measure_prefill_alloc() if measure_prefill_alloc else 0
        start = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)  # 1: no [batch, len, vocab] logits
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        cache = _returned_cache(out)
        del out
        sync()
        prefill_ms = (time.perf_counter() - start) * 1000
        prefill_alloc_delta = measure_prefill_alloc() - start_alloc if measure_prefill_alloc else None
        kv_prefill = cache_bytes(cache)
        steps = []
        for _ in range(new_tokens):
            sync()
            step_start = time.perf_counter()
            out = model(input_ids=next_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
            next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
            cache = _returned_cache(out)
            del out
            sync()
            steps.append((time.perf_counter() - step_start) * 1000)
    return {"prefill_ms": prefill_ms, "prefill_alloc_delta": prefill_alloc_delta, "kv_prefill_bytes": kv_prefill,
            "kv_final_bytes": cache_bytes(cache), "step_ms": steps, "cache": cache}


def _returned_cache(output):
    for name in ("past_key_values", "cache"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    raise RuntimeError("the model returned no KV cache although use_cache=True")


def cache_bytes(cache) -> int:
    """Bytes of the key/value tensors in a transformers cache (DynamicCache layers, older key_cache lists, tuples)."""
    if hasattr(cache, "layers"):
        tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    elif hasattr(cache, "key_cache"):
        tensors = list(cache.key_cache) + list(cache.value_cache)
    else:
        tensors = [t for pair in cache for t in pair]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None and hasattr(t, "numel"))


def _tensor_bytes(model) -> int:
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def _checks(r: dict, cuda: bool) -> list[dict]:
    def check(name: str, measured: float, predicted: float, tolerance: float) -> dict:
        off = abs(measured - predicted) / predicted if predicted else float("inf")
        return {"name": name, "ok": off <= tolerance, "off": off, "tolerance": tolerance}

    checks = [check("KV after prefill: cache tensors vs config", r["kv_prefill_tensor_bytes"],
                    r["kv_prefill_predicted_bytes"], KV_TOLERANCE),
              check("KV after decode: cache tensors vs config", r["kv_final_tensor_bytes"],
                    r["kv_final_predicted_bytes"], KV_TOLERANCE)]
    if cuda:
        checks.append(check("KV after prefill: allocator delta vs config", r["kv_prefill_allocator_delta_bytes"],
                            r["kv_prefill_predicted_bytes"], ALLOC_TOLERANCE))
        checks.append(check("weights: allocator after load vs estimate", r["weights_allocated_bytes"],
                            r["weights_predicted_bytes"], WEIGHTS_TOLERANCE))
    return checks
