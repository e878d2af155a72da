"""The raw results of a bench run as JSON (reports/bench/latest.json), and back: `run.py --render` rewrites the
Markdown from it without measuring again."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

from benchmarks.cache_bench import CacheBench
from benchmarks.eval_bench import EvalBench, Side
from benchmarks.quantize_bench import QuantizeBench


def save(path: Path, run: dict) -> None:
    """`run`: args (Namespace), eval_run, profile, cache_run, quantize_runs, load_before, load_after, total_s,
    measured_at."""
    run = {**run, "kept": {**run["kept"], "args": vars(run["kept"]["args"])}} if run.get("kept") else run
    data = {key: (vars(value) if isinstance(value, Namespace) else
                  [asdict(v) for v in value] if key == "quantize_runs" else
                  asdict(value) if hasattr(value, "__dataclass_fields__") else value)
            for key, value in run.items()}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    data["args"] = Namespace(**data["args"])
    if data.get("kept"):
        data["kept"] = {**data["kept"], "args": Namespace(**data["kept"]["args"])}
    if data.get("eval_run"):
        e = data["eval_run"]
        for key in ("quantgate", "lm_eval", "bare", "lm_eval_default"):
            e[key] = Side(**e[key]) if e.get(key) else None
        data["eval_run"] = EvalBench(**e)
    if data.get("cache_run"):
        data["cache_run"] = CacheBench(**{**data["cache_run"], "run_dir": Path(data["cache_run"]["run_dir"]),
                                          "cache": Path(data["cache_run"]["cache"])})
    data["quantize_runs"] = [QuantizeBench(**q) for q in data.get("quantize_runs") or []]
    return data


# the parts of a run each bench step measures (cache and quantize share the demo run in cache_run)
STEP_PARTS = {"eval": ("eval_run",), "profile": ("profile",), "cache": ("cache_run",), "quantize": ("quantize_runs",),
              "serve": ("serve_run",), "fidelity": ("fidelity_run",)}


def carry_over(run: dict, steps: list[str], previous_path: Path) -> dict:
    """`run` with the parts of the steps it did not run taken from the run saved at `previous_path` (the JSON beside
    the report), so `--steps fidelity` rewrites section 6 without dropping sections 1-5; `carried` names each kept
    step with when it was measured."""
    if not previous_path.is_file():
        return run
    previous = load(previous_path)
    earlier = previous.get("carried") or {}
    machine = (previous.get("machine") or {}).get("name", "a machine not recorded")
    measured = f"{previous.get('measured_at') or 'an earlier run'}, {machine}"
    carried = {}
    for step, parts in STEP_PARTS.items():
        if step in steps:
            continue
        for part in parts:
            if previous.get(part) and not run.get(part):
                run = {**run, part: previous[part]}
                carried[step] = earlier.get(step) or measured
    if not carried:
        return {**run, "carried": {}, "kept": None}
    # the kept sections' machine and settings: the earlier run's, or those it kept itself (one machine is named for
    # them all: a report whose kept sections came from two earlier runs names the older one's)
    kept = previous.get("kept") or {"machine": previous.get("machine"), "args": previous["args"]}
    return {**run, "carried": carried, "kept": {**kept, "steps": sorted(carried)}}


def carried_line(carried: dict) -> str:
    """The report's note on the sections kept from earlier runs ('' when every section was measured now)."""
    if not carried:
        return ""
    return ("Not measured in this run, kept from the last run that measured them: "
            + "; ".join(f"{step} ({when})" for step, when in carried.items()) + ".")
