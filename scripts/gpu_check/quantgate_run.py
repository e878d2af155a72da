"""The check's last step: quantgate itself (`python -m harness run`) on the same random-weight model, over a tiny QA
evalset written for it, each format in quantgate's own worker; then its report.json, read through
harness.report.schema (load_report, FormatResult), is checked: every format ran, its memory figures name the device,
the peaks nest (NVML used >= allocator reserved >= allocated on CUDA), measured KV bytes per token match the
config's, and the capacity plan has vLLM flags (or says vLLM cannot serve the format)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from harness.errors import UserError
from harness.report.schema import FormatResult, load_report
from scripts.gpu_check import REPO
from scripts.gpu_check.direct import KV_TOLERANCE
from scripts.gpu_check.model import tokenizer_words
from scripts.gpu_check.render import size

HARNESS_ITEMS, HARNESS_NEW_TOKENS = 4, 16
HARNESS_CONTEXT_WORDS = {"cuda": (480, 360, 240, 120), "cpu": (48, 36, 24, 12)}  # the smoke model has 256 positions


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
    spec = write_tiny_evalset(tmp / "quantgate-evalsets", tokenizer_words(config["vocab_size"]),
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
                  f"{size(nvml)} >= {size(reserved)} >= {size(allocated)}")
        else:
            recorded = bool(memory.get("peak_bytes")) and bool(memory.get("weights_bytes"))
            check(fmt, "peak RSS and weights recorded", recorded,
                  f"peak {size(memory.get('peak_bytes'))}, weights {size(memory.get('weights_bytes'))}")
        predicted, measured = memory.get("kv_bytes_per_token"), memory.get("kv_bytes_per_token_measured")
        off = abs(measured - predicted) / predicted if predicted and measured is not None else float("inf")
        check(fmt, "KV bytes per token: measured vs predicted from the config", off <= KV_TOLERANCE,
              f"{measured} vs {predicted}, off by {off:.2%}, tolerance {KV_TOLERANCE:.0%}")
        capacity = entry["capacity"] or {}
        if capacity.get("servable") is False:  # a format the planned vLLM cannot serve: no flags, and says so
            check(fmt, "capacity plan says vLLM cannot serve it (no flags)",
                  not capacity.get("vllm_flags") and "cannot serve" in str(capacity.get("note")),
                  capacity.get("note") or "no note")
        else:
            check(fmt, "capacity plan with vLLM flags", bool(capacity.get("vllm_flags")),
                  capacity.get("note") or "no capacity plan")
    return checks
