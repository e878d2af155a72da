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

Those direct measurements use this script's own loading code. The final step runs quantgate itself on the same
random-weight model: `python -m harness run --model DIR --formats baseline,int8` over a tiny QA evalset written to
a temporary directory (4 items, 16 new tokens, --no-cache, QUANTGATE_CACHE in a temporary directory), so
harness.measure.memory.track_peak, LoadedModel.generate_with_cache_bytes, harness.measure.probe.measure_format and
harness.report.build's memory/capacity entries run on the device. It prints formats.<name>.memory, the latency
percentiles and the capacity plan's vLLM flags from report.json and checks them: memory.device is "cuda", NVML used
>= allocator reserved >= allocator allocated, and measured KV bytes per token within 1% of the config's. The
model's outputs are garbage (random weights), so the verdicts mean nothing: `quantgate run` exiting 1 (not all
GO) is expected; any other non-zero exit is a failure.

Usage: python scripts/gpu_check.py [--formats baseline,int8,gptq] [--harness-formats baseline,int8]
                                   [--keep-model DIR] [--budget-s 470]
Exit codes: 0 every check passed; 1 a check failed or a format (other than the optional gptq) errored;
3 no CUDA device ("no CUDA device: nothing to check"), so a CPU-only CI can tell "skipped" from "passed".
`--cpu-smoke` runs the same code, the quantgate step included, on a tiny model on CPU (CUDA-only figures and
checks left out; formats baseline,int8 unless --formats says otherwise): a test of this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel  # noqa: E402

from harness.commands.plan import capacity_view  # noqa: E402
from harness.errors import UserError  # noqa: E402
from harness.measure.capacity import Target, Workload, gpu_of_size, model_shape, plan_vllm, weight_format  # noqa: E402
from harness.measure.kv import estimate_weights_bytes, kv_bytes_per_token  # noqa: E402
from harness.report.schema import FormatResult, load_report  # noqa: E402
from harness.units import format_bytes  # noqa: E402

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
REPO = Path(__file__).resolve().parents[1]
# The quantgate step: a tiny QA set through the real pipeline. The direct formats stop starting early enough to
# leave it this much of the budget.
HARNESS_ITEMS, HARNESS_NEW_TOKENS = 4, 16
HARNESS_RESERVE_S = {"cuda": 180.0, "cpu": 90.0}
HARNESS_CONTEXT_WORDS = {"cuda": (480, 360, 240, 120), "cpu": (48, 36, 24, 12)}  # the smoke model has 256 positions
MEMORY_FIELDS = ("device", "peak_bytes", "weights_bytes", "weights_bytes_measured", "kv_bytes_per_token",
                 "kv_bytes_per_token_measured", "activation_peak_bytes", "cuda_max_allocated_bytes",
                 "cuda_max_reserved_bytes", "nvml_peak_used_bytes")


# ----------------------------------------------------------------------------------------------- parent

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default=None, help="measured directly by this script (default "
                        "baseline,int8,gptq; with --cpu-smoke baseline,int8); 'none' for none")
    parser.add_argument("--harness-formats", default="baseline,int8",
                        help="run through `quantgate run` in the final step (default baseline,int8); 'none' skips it")
    parser.add_argument("--keep-model", metavar="DIR", help="build the random model into DIR and keep it there (a "
                        "gptq checkpoint goes to DIR-gptq); a DIR that already holds one of the same shape is reused")
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
    formats = _format_list(args.formats or ("baseline,int8" if args.cpu_smoke else "baseline,int8,gptq"))
    harness_formats = _format_list(args.harness_formats)
    shape = SMOKE_SHAPE if args.cpu_smoke else TINYLLAMA_SHAPE
    device = "cpu" if args.cpu_smoke else "cuda"
    batch, prompt_len = (2, 16) if args.cpu_smoke else (BATCH, PROMPT_LEN)
    # The direct formats stop starting (and a running one is stopped) in time to leave the quantgate step its share.
    formats_deadline = deadline - (HARNESS_RESERVE_S[device] if harness_formats else 0.0)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="qg-gpu-check-") as tmp:
        tmp_path = Path(tmp)
        model_dir = Path(args.keep_model).expanduser().resolve() if args.keep_model else tmp_path / "random-llama"
        job = {"shape": shape, "device": device, "model_dir": str(model_dir), "batch": batch,
               "prompt_len": prompt_len, "new_tokens": NEW_TOKENS, "gptq_group": 32 if args.cpu_smoke else 128}
        reused = _reusable_model(model_dir, shape)
        if reused is not None and reused is not True:
            print(f"--keep-model {model_dir}: {reused}")
            return 1
        shape_name = "tiny smoke" if args.cpu_smoke else "TinyLlama-1.1B"
        if reused:
            print(f"random Llama model ({shape_name} shape) reused from {model_dir}\n")
        else:
            built = _subprocess("build", job, tmp_path, deadline)
            if "error" in built:
                print(f"building the random model failed: {built['error']}")
                return 1
            print(f"random Llama model ({_params(built['parameters'])} parameters, {shape_name} shape) built in "
                  f"{built['wall_s']:.0f} s on {built['device_name']}" +
                  (f", kept in {model_dir}" if args.keep_model else "") + "\n")
        for fmt in formats:
            if time.monotonic() > formats_deadline - 30:
                results[fmt] = {"skipped": f"out of time (--budget-s {args.budget_s:g}, "
                                           f"{HARNESS_RESERVE_S[device]:g} s of it kept for the quantgate step)"
                                if harness_formats else f"out of time (--budget-s {args.budget_s:g})"}
                print(f"== {fmt}: skipped ({results[fmt]['skipped']})\n")
                continue
            if fmt == "gptq":
                quantized = _subprocess("quantize-gptq", job, tmp_path, formats_deadline)
                if "error" in quantized:
                    results[fmt] = {"skipped": f"GPTQ unavailable here: {quantized['error']}"}
                    print(f"== gptq: skipped ({results[fmt]['skipped']})\n")
                    continue
            results[fmt] = _subprocess("measure", {**job, "format": fmt}, tmp_path, formats_deadline)
            print(render_format(fmt, results[fmt]) + "\n")
        harness = None
        if harness_formats:
            harness = run_quantgate(model_dir, harness_formats, device, tmp_path, deadline)
            print(render_quantgate(harness) + "\n")
    if results:
        print(render_summary(results))
    # gptq is optional (GPTQModel's CUDA kernels may not be there); every other format must be measured and pass.
    failed = [f for f, r in results.items() if ("error" in r or "skipped" in r) and f != "gptq"] + \
             [f for f, r in results.items() if r.get("checks") and not all(c["ok"] for c in r["checks"])]
    if harness is not None and (harness.get("error") or not all(c["ok"] for c in harness["checks"])):
        failed.append("quantgate run")
    if failed:
        print(f"\nFAILED: {', '.join(dict.fromkeys(failed))}")
        return 1
    optional = [f"{f} ({'failed' if 'error' in r else 'skipped'}; optional)" for f, r in results.items()
                if "error" in r or "skipped" in r]
    print("\nall checks passed" + (f"; not checked: {', '.join(optional)}" if optional else ""))
    return 0


def _format_list(text: str) -> list[str]:
    names = [f.strip() for f in text.split(",") if f.strip()]
    return [] if names in ([], ["none"]) else names


def _reusable_model(model_dir: Path, shape: dict):
    """True: a model of this shape (with its tokenizer) is there; None: nothing there, build it; a str: why not."""
    config_path = model_dir / "config.json"
    if not model_dir.exists() or (model_dir.is_dir() and not any(model_dir.iterdir())):
        return None
    if not config_path.is_file():
        return "exists but holds no config.json; give an empty or new directory"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    different = {k: (config.get(k), v) for k, v in shape.items() if config.get(k) != v}
    if different:
        return ("holds a model of another shape (" + ", ".join(f"{k} {a} != {b}" for k, (a, b) in different.items())
                + "); give another directory")
    if not (model_dir / "tokenizer_config.json").is_file():
        return "holds a model without a tokenizer; give another directory"
    return True


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


# A plain chat template, so quantgate renders its prompts the way it does for instruct models.
CHAT_TEMPLATE = ("{% for message in messages %}<s> {{ message['role'] }} : {{ message['content'] }} </s>\n"
                 "{% endfor %}{% if add_generation_prompt %}<s> assistant :{% endif %}")


def _tokenizer_words(vocab_size: int) -> int:
    """How many made-up words (w0, w1, ...) the tokenizer knows: ids 4 and up, within the model's vocabulary."""
    return min(vocab_size, 4096) - 4


def _save_tokenizer(model_dir: str, vocab_size: int) -> None:
    """A word-level tokenizer over made-up words, with a chat template: GPTQModel wants one beside the weights,
    quantgate loads it with AutoTokenizer; nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3,
             **{f"w{i}": i + 4 for i in range(_tokenizer_words(vocab_size))}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)


def _gptqmodel_env() -> None:
    # GPTQModel asks for more CPU workers than small machines have unless told (as quantgate's workers are).
    from harness.launcher import set_gptqmodel_cpu_workers

    set_gptqmodel_cpu_workers(os.environ)


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


# ----------------------------------------------------------------------------------------------- quantgate step

def write_tiny_evalset(directory: Path, words: int, context_words: tuple[int, ...]) -> Path:
    """One QA spec and its JSONL: contexts of made-up words the random model's tokenizer knows, answers copied
    from the context. Returns the spec's path."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(words)]
    rows = []
    for number, length in enumerate(context_words, 1):
        context = [rng.choice(vocab) for _ in range(length)]
        rows.append({"id": f"gpu-check-{number}", "context": " ".join(context),
                     "question": " ".join(rng.choice(vocab) for _ in range(8)), "answers": [" ".join(context[3:5])]})
    (directory / "gpu_check_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    spec = directory / "gpu_check_qa.toml"
    spec.write_text("\n".join([
        'name = "gpu_check_qa"',
        'task = "qa"',
        'language = "en"',
        'data = "gpu_check_qa.jsonl"',
        'description = "made-up words for the GPU check random-weight model; its scores mean nothing"',
        f"max_new_tokens = {HARNESS_NEW_TOKENS}",
        'metrics = ["em", "f1"]',
        'gate = ["f1"]',
        r'prompt_template = "Context: {context}\n\nQuestion: {question}"',
    ]) + "\n", encoding="utf-8")
    return spec


def run_quantgate(model_dir: Path, formats: list[str], device: str, tmp: Path, deadline: float) -> dict:
    """`python -m harness run` on the random model: the real pipeline, each format in quantgate's own worker."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    spec = write_tiny_evalset(tmp / "quantgate-evalsets", _tokenizer_words(config["vocab_size"]),
                              HARNESS_CONTEXT_WORDS[device])
    out = tmp / "quantgate-out"
    command = [sys.executable, "-m", "harness", "run", "--model", str(model_dir), "--formats", ",".join(formats),
               "--evalsets", str(spec), "--max-items", str(HARNESS_ITEMS), "--max-new-tokens",
               str(HARNESS_NEW_TOKENS), "--no-cache", "--out", str(out)]
    env = {**os.environ, "QUANTGATE_CACHE": str(tmp / "quantgate-cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        env["QUANTGATE_DEVICE"] = "cpu"  # the smoke stays on CPU even where a GPU exists
    timeout = max(deadline - time.monotonic(), 60.0)
    log = tmp / "quantgate-run.log"
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as log_file:
        try:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    result = {"command": "python " + " ".join(command[1:]), "formats": formats, "device": device,
              "exit_code": code, "wall_s": time.monotonic() - start, "report": None, "checks": [], "error": None}
    report_path = out / "report.json"
    if code is None:
        result["error"] = f"`quantgate run` timed out after {timeout:.0f} s"
    elif code not in (0, 1):  # 1: not every format is GO, expected of random weights; 2 usage, 3 a failure
        result["error"] = f"`quantgate run` exited with code {code}"
    elif not report_path.is_file():
        result["error"] = f"`quantgate run` exited with code {code} but wrote no {report_path.name}"
    if result["error"]:
        result["log_tail"] = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-25:]
        return result
    try:
        report = load_report(report_path)
    except UserError as exc:
        result["error"] = str(exc)
        return result
    result["report"] = {name: _figures_of(entry) for name, entry in report.formats.items()}
    result["checks"] = quantgate_checks(result["report"], formats, device)
    return result


def _figures_of(entry: FormatResult) -> dict:
    """What the checks and the printout read of one format, as the JSON report.json holds."""
    def as_json(block: BaseModel | None) -> dict | None:
        return None if block is None else block.model_dump(mode="json", exclude_unset=True)

    return {"status": entry.status, "error": entry.error, "verdict": entry.verdict,
            "compute_dtype": entry.compute_dtype, "memory": as_json(entry.memory) or {},
            "latency": as_json(entry.latency) or {}, "capacity": as_json(entry.capacity)}


def quantgate_checks(report: dict, formats: list[str], device: str) -> list[dict]:
    """Per format: it ran, its figures name the device it ran on, the peaks nest, and the KV prediction holds."""
    checks = []

    def check(fmt: str, name: str, ok: bool, detail: str = "") -> None:
        checks.append({"format": fmt, "name": name, "ok": bool(ok), "detail": detail})

    for fmt in formats:
        entry = report.get(fmt)
        if entry is None:
            check(fmt, "in report.json", False, "missing")
            continue
        check(fmt, "ran", entry["status"] == "ok", entry["error"] or "")
        memory = entry["memory"]
        check(fmt, f'memory.device == "{device}"', memory.get("device") == device, f"got {memory.get('device')!r}")
        if device == "cuda":
            nvml, reserved, allocated = (memory.get(k) for k in ("nvml_peak_used_bytes", "cuda_max_reserved_bytes",
                                                                  "cuda_max_allocated_bytes"))
            nested = None not in (nvml, reserved, allocated) and nvml >= reserved >= allocated
            check(fmt, "NVML peak used >= allocator reserved peak >= allocated peak", nested,
                  f"{_b(nvml)} >= {_b(reserved)} >= {_b(allocated)}")
        else:
            recorded = bool(memory.get("peak_bytes")) and bool(memory.get("weights_bytes"))
            check(fmt, "peak RSS and weights recorded", recorded,
                  f"peak {_b(memory.get('peak_bytes'))}, weights {_b(memory.get('weights_bytes'))}")
        predicted, measured = memory.get("kv_bytes_per_token"), memory.get("kv_bytes_per_token_measured")
        off = abs(measured - predicted) / predicted if predicted and measured is not None else float("inf")
        check(fmt, "KV bytes per token: measured vs predicted from the config", off <= KV_TOLERANCE,
              f"{measured} vs {predicted}, off by {off:.2%}, tolerance {KV_TOLERANCE:.0%}")
        capacity = entry["capacity"] or {}
        if capacity.get("servable") is False:  # int8: vLLM 0.32+ has no bitsandbytes, so no flags, and says so
            check(fmt, "capacity plan says vLLM cannot serve it (no flags)",
                  not capacity.get("vllm_flags") and "cannot serve" in str(capacity.get("note")),
                  capacity.get("note") or "no note")
        else:
            check(fmt, "capacity plan with vLLM flags", bool(capacity.get("vllm_flags")),
                  capacity.get("note") or "no capacity plan")
    return checks


def render_quantgate(result: dict) -> str:
    head = f"== quantgate run on the same model ({result['device']}): formats {','.join(result['formats'])}"
    if result["error"]:
        return "\n".join([head, f"  FAILED: {result['error']}", "  [quantgate run output, last lines]",
                          *("    " + line for line in result["log_tail"])])
    rows = [head, f"  {result['command']}",
            f"  exit code {result['exit_code']} in {result['wall_s']:.0f} s (1 = not every format GO: expected of "
            "random weights; verdicts and scores mean nothing here, the figures do)"]
    for fmt, entry in result["report"].items():
        rows.append(f"  -- {fmt}: status {entry['status']}, verdict {entry['verdict']}, "
                    f"compute dtype {entry['compute_dtype']}")
        memory = entry["memory"]
        for name in MEMORY_FIELDS:
            value = memory.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                text = f"{value:,}" if name.startswith("kv_bytes_per_token") else f"{_b(value)} ({value:,})"
            else:
                text = "-" if value is None else str(value)
            rows.append(f"    memory.{name:<28} {text}")
        for key, label in (("batch_1", "batch 1"), ("batched", "batched")):
            block = entry["latency"].get(key) or {}
            parts = [f"{metric[:-3].upper()} p50 {_ms((block.get(metric) or {}).get('p50'))} "
                     f"p95 {_ms((block.get(metric) or {}).get('p95'))}" for metric in ("ttft_ms", "tpot_ms", "e2e_ms")]
            size = f" (batch size {block.get('batch_size')})" if key == "batched" and block else ""
            rows.append(f"    latency {label}{size}: " + "; ".join(parts))
        rows.append(f"    capacity.vllm_flags: {(entry['capacity'] or {}).get('vllm_flags') or '-'}")
    for c in result["checks"]:
        rows.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['format']}: {c['name']}" +
                    (f": {c['detail']}" if c["detail"] else ""))
    return "\n".join(rows)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f} ms"


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
    return format_bytes(size, missing="-", smallest="MiB")


def _params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


if __name__ == "__main__":
    raise SystemExit(main())
