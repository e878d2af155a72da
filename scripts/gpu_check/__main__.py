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
    shows) sampled every 10 ms in a thread (harness's NVML sampler),
  - the capacity plan for an 80 GiB GPU from the measured figures.

Those direct measurements use this check's own loading code (direct.py). The final step (quantgate_run.py) runs
quantgate itself on the same random-weight model: `python -m harness run --model DIR --formats baseline,int8` over
a tiny QA evalset written to a temporary directory (4 items, 16 new tokens, --no-cache, QUANTGATE_CACHE in a
temporary directory), so harness.measure.memory.track_peak, LoadedModel.generate_with_cache_bytes,
harness.measure.probe.measure_format and harness.report.build's memory/capacity entries run on the device. It
prints formats.<name>.memory, the latency percentiles and the capacity plan's vLLM flags from report.json and
checks them: memory.device is "cuda", NVML used >= allocator reserved >= allocator allocated, and measured KV bytes
per token within 1% of the config's. The model's outputs are garbage (random weights), so the verdicts mean
nothing: `quantgate run` exiting 1 (not all GO) is expected; any other non-zero exit is a failure.

Usage: python -m scripts.gpu_check [--formats baseline,int8,gptq] [--harness-formats baseline,int8]
                                   [--keep-model DIR] [--budget-s 470]
(from the project root; `python scripts/gpu_check` runs it from anywhere; scripts/gpu_check.sh wraps it.)
Exit codes: 0 every check passed; 1 a check failed or a format (other than the optional gptq) errored;
3 no CUDA device ("no CUDA device: nothing to check"), so a CPU-only CI can tell "skipped" from "passed".
`--cpu-smoke` runs the same code, the quantgate step included, on a tiny model on CPU (CUDA-only figures and
checks left out; formats baseline,int8 unless --formats says otherwise): a test of this check only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/gpu_check`: the project root is not on sys.path yet
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu_check.direct import BATCH, NEW_TOKENS, PROMPT_LEN  # noqa: E402
from scripts.gpu_check.model import SMOKE_SHAPE, TINYLLAMA_SHAPE, reusable_model  # noqa: E402
from scripts.gpu_check.quantgate_run import run_quantgate  # noqa: E402
from scripts.gpu_check.render import params, render_format, render_quantgate, render_summary  # noqa: E402
from scripts.gpu_check.worker import run_step  # noqa: E402

EXIT_NO_GPU = 3
# The direct formats stop starting early enough to leave the quantgate step this much of the budget.
HARNESS_RESERVE_S = {"cuda": 180.0, "cpu": 90.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default=None, help="measured directly by this check (default "
                        "baseline,int8,gptq; with --cpu-smoke baseline,int8); 'none' for none")
    parser.add_argument("--harness-formats", default=None,
                        help="run through `quantgate run` in the final step (default baseline,int8,fp8,nvfp4 on a "
                        "GPU: the FP8 and NVFP4 formats as a GPU serves them; with --cpu-smoke baseline,int8); "
                        "'none' skips it")
    parser.add_argument("--keep-model", metavar="DIR", help="build the random model into DIR and keep it there (a "
                        "gptq checkpoint goes to DIR-gptq); a DIR that already holds one of the same shape is reused")
    parser.add_argument("--budget-s", type=float, default=470.0, help="stop starting formats after this long")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
    harness_formats = _format_list(args.harness_formats or ("baseline,int8" if args.cpu_smoke
                                                            else "baseline,int8,fp8,nvfp4"))
    shape = SMOKE_SHAPE if args.cpu_smoke else TINYLLAMA_SHAPE
    device = "cpu" if args.cpu_smoke else "cuda"
    batch, prompt_len = (2, 16) if args.cpu_smoke else (BATCH, PROMPT_LEN)
    # The direct formats stop starting (and a running one is stopped) in time to leave the quantgate step its share.
    formats_deadline = deadline - (HARNESS_RESERVE_S[device] if harness_formats else 0.0)
    budget_note = (f"--budget-s {args.budget_s:g}, {HARNESS_RESERVE_S[device]:g} s of it kept for the quantgate step"
                   if harness_formats else f"--budget-s {args.budget_s:g}")
    with tempfile.TemporaryDirectory(prefix="qg-gpu-check-") as tmp:
        tmp_path = Path(tmp)
        model_dir = Path(args.keep_model).expanduser().resolve() if args.keep_model else tmp_path / "random-llama"
        job = {"shape": shape, "device": device, "model_dir": str(model_dir), "batch": batch,
               "prompt_len": prompt_len, "new_tokens": NEW_TOKENS, "gptq_group": 32 if args.cpu_smoke else 128}
        reused = reusable_model(model_dir, shape)
        if reused is not None and reused is not True:
            print(f"--keep-model {model_dir}: {reused}")
            return 1
        shape_name = "tiny smoke" if args.cpu_smoke else "TinyLlama-1.1B"
        if reused:
            print(f"random Llama model ({shape_name} shape) reused from {model_dir}\n")
        else:
            built = run_step("build", job, tmp_path, deadline)
            if "error" in built:
                print(f"building the random model failed: {built['error']}")
                return 1
            print(f"random Llama model ({params(built['parameters'])} parameters, {shape_name} shape) built in "
                  f"{built['wall_s']:.0f} s on {built['device_name']}" +
                  (f", kept in {model_dir}" if args.keep_model else "") + "\n")
        results = measure_directly(formats, job, tmp_path, formats_deadline, budget_note)
        harness = None
        if harness_formats:
            harness = run_quantgate(model_dir, harness_formats, device, tmp_path, deadline)
            print(render_quantgate(harness) + "\n")
    if results:
        print(render_summary(results))
    return exit_code(results, harness)


def measure_directly(formats: list[str], job: dict, tmp: Path, deadline: float, budget_note: str) -> dict[str, dict]:
    """Each format in its own subprocess (gptq quantized first), printed as it finishes; a format that would
    start within 30 s of `deadline` is skipped."""
    results: dict[str, dict] = {}
    for fmt in formats:
        if time.monotonic() > deadline - 30:
            results[fmt] = {"skipped": f"out of time ({budget_note})"}
            print(f"== {fmt}: skipped ({results[fmt]['skipped']})\n")
            continue
        if fmt == "gptq":
            quantized = run_step("quantize-gptq", job, tmp, deadline)
            if "error" in quantized:
                results[fmt] = {"skipped": f"GPTQ unavailable here: {quantized['error']}"}
                print(f"== gptq: skipped ({results[fmt]['skipped']})\n")
                continue
        results[fmt] = run_step("measure", {**job, "format": fmt}, tmp, deadline)
        print(render_format(fmt, results[fmt]) + "\n")
    return results


def exit_code(results: dict[str, dict], harness: dict | None) -> int:
    """0 every check passed; 1 a check failed or a format errored. gptq is optional (GPTQModel's CUDA kernels may
    not be there); every other format must be measured and pass, and so must the quantgate step."""
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


if __name__ == "__main__":
    raise SystemExit(main())
