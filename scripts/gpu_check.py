"""GPU check: do quantgate's memory predictions hold on a real CUDA device? No network, no downloaded weights.

Builds a random-weight Llama model of TinyLlama-1.1B's shape (hidden 2048, intermediate 5632, 22 layers, 32 heads,
4 KV heads, vocab 32000) in bf16, saves it to a temporary directory, and then, per format, in a fresh subprocess
(so no format inherits another's allocations):
  - loads it (baseline bf16; int8 via bitsandbytes LLM.int8; gptq 4-bit when GPTQModel and its CUDA kernels work),
  - weights: torch.cuda.memory_allocated after loading vs harness.measure.kv.estimate_weights_bytes,
  - prefills 8 x 512 tokens with use_cache=True: KV bytes from the returned cache tensors and from the allocator
    delta vs kv_bytes_per_token x tokens,
  - decodes 32 tokens (batch 8, then batch 1) timing each step between torch.cuda.synchronize calls (TPOT),
  - peaks: torch.cuda.max_memory_allocated / max_memory_reserved, and NVML device used memory (what nvidia-smi
    shows) sampled every 10 ms in a thread,
  - the capacity plan for an 80 GiB GPU from the measured figures.

Usage: python scripts/gpu_check.py [--formats baseline,int8,gptq] [--budget-s 470]
Exit codes: 0 every check passed; 1 a check failed or a format (other than the optional gptq) errored;
3 no CUDA device ("no CUDA device: nothing to check"), so a CPU-only CI can tell "skipped" from "passed".
`--cpu-smoke` runs the same code on a tiny model on CPU (CUDA-only figures left out): a test of this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.measure.capacity import plan_capacity  # noqa: E402
from harness.measure.kv import estimate_weights_bytes, kv_bytes_per_token  # noqa: E402

EXIT_NO_GPU = 3
TINYLLAMA_SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                       tie_word_embeddings=False)
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=False)
BATCH, PROMPT_LEN, NEW_TOKENS = 8, 512, 32
KV_TOLERANCE = 0.01       # cache tensors vs config arithmetic: should be exact
ALLOC_TOLERANCE = 0.05    # allocator delta vs prediction: block rounding and the next-token tensor
WEIGHTS_TOLERANCE = 0.05  # allocator after load vs estimate_weights_bytes
BITS = {"baseline": 16, "int8": 8, "gptq": 4}
_GIB, _MIB = 2**30, 2**20


# ----------------------------------------------------------------------------------------------- parent

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default="baseline,int8,gptq")
    parser.add_argument("--budget-s", type=float, default=470.0, help="stop starting formats after this long")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "JOB_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        return worker(args.worker[0], json.loads(args.worker[1]))
    try:
        import torch
    except ImportError:
        print("no CUDA device: nothing to check (torch is not installed)")
        return EXIT_NO_GPU
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return EXIT_NO_GPU
    deadline = time.monotonic() + args.budget_s
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    shape = SMOKE_SHAPE if args.cpu_smoke else TINYLLAMA_SHAPE
    device = "cpu" if args.cpu_smoke else "cuda"
    batch, prompt_len = (2, 16) if args.cpu_smoke else (BATCH, PROMPT_LEN)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="qg-gpu-check-") as tmp:
        tmp_path = Path(tmp)
        model_dir = tmp_path / "random-llama"
        job = {"shape": shape, "device": device, "model_dir": str(model_dir), "batch": batch,
               "prompt_len": prompt_len, "new_tokens": NEW_TOKENS, "gptq_group": 32 if args.cpu_smoke else 128}
        built = _subprocess("build", job, tmp_path, deadline)
        if "error" in built:
            print(f"building the random model failed: {built['error']}")
            return 1
        print(f"random Llama model ({_params(built['parameters'])} parameters, "
              f"{'tiny smoke' if args.cpu_smoke else 'TinyLlama-1.1B'} shape) built in "
              f"{built['wall_s']:.0f} s on {built['device_name']}\n")
        for fmt in formats:
            if time.monotonic() > deadline - 30:
                results[fmt] = {"skipped": f"out of time (--budget-s {args.budget_s:g})"}
                print(f"== {fmt}: skipped ({results[fmt]['skipped']})\n")
                continue
            if fmt == "gptq":
                quantized = _subprocess("quantize-gptq", job, tmp_path, deadline)
                if "error" in quantized:
                    results[fmt] = {"skipped": f"GPTQ unavailable here: {quantized['error']}"}
                    print(f"== gptq: skipped ({results[fmt]['skipped']})\n")
                    continue
            results[fmt] = _subprocess("measure", {**job, "format": fmt}, tmp_path, deadline)
            print(render_format(fmt, results[fmt]) + "\n")
    print(render_summary(results))
    # gptq is optional (GPTQModel's CUDA kernels may not be there); every other format must be measured and pass.
    failed = [f for f, r in results.items() if ("error" in r or "skipped" in r) and f != "gptq"] + \
             [f for f, r in results.items() if r.get("checks") and not all(c["ok"] for c in r["checks"])]
    if failed:
        print(f"\nFAILED: {', '.join(dict.fromkeys(failed))}")
        return 1
    optional = [f"{f} ({'failed' if 'error' in r else 'skipped'}; optional)" for f, r in results.items()
                if "error" in r or "skipped" in r]
    print("\nall checks passed" + (f"; not checked: {', '.join(optional)}" if optional else ""))
    return 0


def _subprocess(kind: str, job: dict, tmp: Path, deadline: float) -> dict:
    out = tmp / f"{kind}-{job.get('format', 'model')}.json"
    log = tmp / f"{kind}-{job.get('format', 'model')}.log"
    job = {**job, "out": str(out)}
    timeout = max(deadline - time.monotonic(), 10)
    with open(log, "w", encoding="utf-8") as log_file:
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", kind, json.dumps(job)],
                                  stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    if code is None:
        result = {"error": f"{kind} timed out after {timeout:.0f} s"}
    elif out.is_file():
        result = json.loads(out.read_text(encoding="utf-8"))
    elif code < 0:
        from harness.measure.oom import oom_reason

        result = {"error": f"{kind}: {oom_reason(None, killed_signal=-code)}"}
    else:
        result = {"error": f"{kind} subprocess exited with code {code} and wrote no result"}
    if "error" not in result:
        return result
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
    print(f"[{kind} {job.get('format', '')} log, last lines]\n  " + "\n  ".join(tail), file=sys.stderr)
    return result


# ----------------------------------------------------------------------------------------------- worker

def worker(kind: str, job: dict) -> int:
    import torch

    torch.manual_seed(0)
    if job["device"] == "cpu":
        torch.set_num_threads(1)  # the smoke run shares small machines
    try:
        if kind == "build":
            result = build_model(job)
        elif kind == "quantize-gptq":
            result = quantize_gptq(job)
        else:
            result = measure_format(job)
        code = 0
    except Exception as exc:  # noqa: BLE001 - the parent prints the reason
        traceback.print_exc()
        result, code = {"error": _describe(exc)}, 1
    Path(job["out"]).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return code


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    if "out of memory" in text.lower():
        from harness.measure.oom import oom_reason, parse_cuda_oom

        return "out of memory: " + oom_reason(parse_cuda_oom(text))
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:400]


def build_model(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    start = time.perf_counter()
    config = LlamaConfig(**job["shape"], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(job["device"]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(job["model_dir"])
    _save_tokenizer(job["model_dir"], config.vocab_size)
    name = torch.cuda.get_device_name(0) if job["device"] == "cuda" else "cpu"
    return {"parameters": sum(p.numel() for p in model.parameters()), "wall_s": time.perf_counter() - start,
            "device_name": name}


def _save_tokenizer(model_dir: str, vocab_size: int) -> None:
    """A word-level tokenizer over made-up words: GPTQModel wants one beside the weights; nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(min(vocab_size, 4096) - 4)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(model_dir)


def _gptqmodel_env() -> None:
    # GPTQModel asks for more CPU workers than small machines have unless told (as harness/quantize does).
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, os.cpu_count() or 1)))


def quantize_gptq(job: dict) -> dict:
    import torch

    _gptqmodel_env()
    from gptqmodel import GPTQModel
    from gptqmodel.quantization import GPTQConfig

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    calibration = [{"input_ids": ids, "attention_mask": [1] * len(ids)}
                   for ids in torch.randint(4, 4096, (32, 256), generator=generator).tolist()]
    model = GPTQModel.load(job["model_dir"], GPTQConfig(bits=4, group_size=job["gptq_group"]), device=job["device"])
    model.quantize(calibration, batch_size=4)
    model.save(job["model_dir"] + "-gptq")
    return {"wall_s": time.perf_counter() - start}


class NvmlPeak(threading.Thread):
    """Device-level used memory (all processes, what nvidia-smi shows), sampled every 10 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
        self._pynvml = pynvml
        self.start_used = self.peak = self.used()
        self._stop_event = threading.Event()

    def used(self) -> int:
        return int(self._pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            self.peak = max(self.peak, self.used())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, self.used())


def measure_format(job: dict) -> dict:
    import torch

    fmt, device, cuda = job["format"], job["device"], job["device"] == "cuda"
    nvml = NvmlPeak() if cuda else None
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
    weights_predicted = estimate_weights_bytes(config, BITS[fmt], group, fmt=fmt)

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
    capacity = plan_capacity(weights_allocated or weights_tensors, activation,
                             round(run["kv_prefill_bytes"] / prefill_tokens), gpu_memory_gib=80.0,
                             gpu_memory_utilization=0.90, max_model_len=config.max_position_embeddings,
                             quantization=fmt)
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
        "capacity_80gib": capacity.as_dict(),
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
        _gptqmodel_env()
        from gptqmodel import GPTQModel

        wrapper = GPTQModel.load(model_dir + "-gptq", device=device)
        return getattr(wrapper, "model", wrapper).eval()
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(BITS)})")


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


# ----------------------------------------------------------------------------------------------- printing

def render_format(fmt: str, r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"== {fmt}: {'FAILED: ' + r['error'] if 'error' in r else 'skipped: ' + r['skipped']}"
    cap = r["capacity_80gib"]
    rows = [
        f"== {fmt} (loaded in {r['load_s']:.1f} s)",
        f"  {'':40} {'predicted':>12} {'measured':>12}",
        f"  {'weights (allocator after load)':40} {_b(r['weights_predicted_bytes']):>12} "
        f"{_b(r['weights_allocated_bytes']):>12}   params+buffers {_b(r['weights_tensor_bytes'])}",
        f"  {'KV after prefill ' + str(r['batch']) + 'x' + str(r['prompt_len']) + ' (cache tensors)':40} "
        f"{_b(r['kv_prefill_predicted_bytes']):>12} {_b(r['kv_prefill_tensor_bytes']):>12}",
        f"  {'KV after prefill (allocator delta)':40} {_b(r['kv_prefill_predicted_bytes']):>12} "
        f"{_b(r['kv_prefill_allocator_delta_bytes']):>12}",
        f"  {'KV after +' + str(r['new_tokens']) + ' tokens (cache tensors)':40} "
        f"{_b(r['kv_final_predicted_bytes']):>12} {_b(r['kv_final_tensor_bytes']):>12}",
        f"  {'KV bytes per token':40} {r['kv_bytes_per_token_predicted']:>12,} "
        f"{round(r['kv_prefill_tensor_bytes'] / r['prefill_tokens']):>12,}",
        f"  peak allocated {_b(r['cuda_max_allocated_bytes'])}, reserved {_b(r['cuda_max_reserved_bytes'])}; "
        f"NVML used {_b(r['nvml_start_used_bytes'])} -> peak {_b(r['nvml_peak_used_bytes'])}; "
        f"activation peak {_b(r['activation_peak_bytes'])}",
        f"  batch {r['batch']}: TTFT {r['ttft_ms']:.1f} ms, TPOT p50 {r['tpot_ms_p50']:.2f} ms "
        f"(mean {r['tpot_ms_mean']:.2f}); batch 1: TTFT {r['batch1_ttft_ms']:.1f} ms, "
        f"TPOT p50 {r['batch1_tpot_ms_p50']:.2f} ms",
        f"  80 GiB GPU @ 0.90, max-model-len {cap['max_model_len']}: {cap['note']}",
        f"    vllm serve MODEL {cap['vllm_flags']}" if cap["vllm_flags"] else "",
    ]
    for c in r["checks"]:
        rows.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: off by {c['off']:.2%} "
                    f"(tolerance {c['tolerance']:.0%})")
    return "\n".join(row for row in rows if row)


def render_summary(results: dict) -> str:
    lines = [f"{'format':<9} {'weights':>10} {'peak alloc':>11} {'NVML peak':>10} {'TPOT b1':>9} {'TPOT b8':>9} "
             f"{'seqs@80G':>9}  checks"]
    lines[0] = lines[0].replace("TPOT b8", f"TPOT b{next((r['batch'] for r in results.values() if 'batch' in r), 8)}")
    for fmt, r in results.items():
        if "error" in r or "skipped" in r:
            lines.append(f"{fmt:<9} {'failed' if 'error' in r else 'skipped'}")
            continue
        ok = all(c["ok"] for c in r["checks"])
        lines.append(f"{fmt:<9} {_b(r['weights_allocated_bytes']):>10} {_b(r['cuda_max_allocated_bytes']):>11} "
                     f"{_b(r['nvml_peak_used_bytes']):>10} {r['batch1_tpot_ms_p50']:>6.2f} ms "
                     f"{r['tpot_ms_p50']:>6.2f} ms {r['capacity_80gib']['max_num_seqs']:>9}  "
                     f"{'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def _b(size) -> str:
    if size is None:
        return "-"
    return f"{size / _GIB:.2f} GiB" if abs(size) >= _GIB else f"{size / _MIB:.1f} MiB"


def _params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


if __name__ == "__main__":
    raise SystemExit(main())
