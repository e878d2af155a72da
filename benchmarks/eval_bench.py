"""Benchmarks 1 and 2: one evalset evaluated by quantgate, by lm-evaluation-harness, and by a bare generate loop.

Each side runs in its own process on the same checkpoint, dtype, thread count, batch size and max_new_tokens.
All outputs are scored with quantgate's metric functions (harness.metrics.score_item), so the scores compare
the generations, not two metric implementations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.common import ChildRun, run_child, say


@dataclass
class Side:
    name: str
    wall_s: float  # the whole process: imports, model load, data, generation, scoring
    cpu_s: float  # its CPU time (user + system, with its subprocesses)
    generate_s: float  # the generation loop alone
    generate_cpu_s: float  # its CPU time
    scores: dict[str, float]  # mean em/f1 (0-100) by quantgate's metrics
    predictions: dict[str, str]
    extra: dict = field(default_factory=dict)  # "runs": every run's times; lm-eval's own metrics


@dataclass
class EvalBench:
    items: int
    batch_size: int
    max_new_tokens: int
    dtype: str
    quantgate: Side
    lm_eval: Side
    bare: Side
    lm_eval_default: Side | None  # lm-eval at its own default batch size (1), when asked for
    prompts_identical: int  # items whose lm-eval prompt text equals quantgate's
    same_as_quantgate: dict[str, int]  # side -> items whose prediction equals quantgate's


def compute_dtype_name(model_path: Path) -> str:
    """The dtype quantgate's worker computes the baseline in (harness.runtime.device.compute_dtype)."""
    from harness.runtime.device import compute_dtype

    config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    chosen = compute_dtype("auto", config)
    if chosen != "auto":
        return chosen
    return config.get("dtype") or config.get("torch_dtype") or "float32"


def run_eval_bench(model_path: Path, evalset_spec: Path, items: int, batch_size: int, threads: int, work: Path,
                   repeats: int = 1, lm_eval_default_batch: bool = False) -> EvalBench:
    """Each side `repeats` times, round robin (quantgate, lm-eval, bare loop, then again), best time of each: on
    a shared machine another process can slow any single run; the fastest run is the least disturbed one."""
    from harness.evalsets import load_evalsets

    (evalset,) = load_evalsets([evalset_spec], allow_outside_paths=True)  # its data is ../shared/data
    evalset = replace(evalset, items=evalset.items[:items])
    dtype = compute_dtype_name(model_path)
    common = {"model_path": str(model_path), "max_items": items, "batch_size": batch_size, "threads": threads}
    say(f"eval: {len(evalset.items)} items of {evalset.name}, batch {batch_size}, {threads} thread(s), {dtype}, "
        f"each side {repeats} time(s)")
    runs: dict[str, list[ChildRun]] = {"quantgate": [], "lm-eval": [], "bare loop": []}
    for index in range(1, repeats + 1):
        here = work / f"run-{index}"
        qg = run_child("benchmarks.quantgate_eval_side", _quantgate_job(common, evalset_spec, here), here,
                       env={"QUANTGATE_CACHE": str(here / "cache")})  # fresh: nothing cached
        _done(runs, "quantgate", qg, index)
        max_new = qg.result["max_new_tokens"]
        lm_job = {**common, "dtype": dtype, "task_name": f"quantgate_bench_{evalset.name}",
                  "task_dir": str(here / "lmeval_tasks"), "data_path": str(evalset.data_path),
                  "prompt_template": evalset.prompt_template, "max_new_tokens": max_new}
        _done(runs, "lm-eval", run_child("benchmarks.lm_eval_side", lm_job, here), index)
        bare_job = {**common, "dtype": dtype, "prompts": qg.result["prompts"], "max_new_tokens": max_new}
        _done(runs, "bare loop", run_child("benchmarks.bare_loop", bare_job, here), index)
    if lm_eval_default_batch:
        say("eval: lm-evaluation-harness once more at its default batch size, 1")
        runs["lm-eval, batch 1"] = []
        _done(runs, "lm-eval, batch 1", run_child("benchmarks.lm_eval_side", {**lm_job, "batch_size": 1},
                                                  work / "lm-eval-batch-1"), 1)

    sides = {name: _side(name, done, evalset) for name, done in runs.items()}
    first = {name: done[0].result for name, done in runs.items()}
    sides["lm-eval"].extra.update(lm_eval_metrics=first["lm-eval"]["lm_eval_metrics"], version=first["lm-eval"]["version"])
    quantgate_prompts = {p["id"]: p["text"] for p in first["quantgate"]["prompts"]}
    identical = sum(quantgate_prompts.get(o["id"]) == o["prompt"] for o in first["lm-eval"]["outputs"])
    reference = sides["quantgate"].predictions
    same = {name: sum(side.predictions.get(i) == text for i, text in reference.items())
            for name, side in sides.items() if name != "quantgate"}
    return EvalBench(len(evalset.items), batch_size, first["quantgate"]["max_new_tokens"], dtype, sides["quantgate"],
                     sides["lm-eval"], sides["bare loop"], sides.get("lm-eval, batch 1"), identical, same)


def _done(runs: dict[str, list[ChildRun]], name: str, run: ChildRun, index: int) -> None:
    runs[name].append(run)
    say(f"eval: {name} run {index}: {run.wall_s:.1f}s wall, {run.cpu_s:.1f}s CPU (generation {run.result['generate_s']:.1f}s "
        f"wall, {run.result['generate_cpu_s']:.1f}s CPU)")


def _quantgate_job(common: dict, evalset_spec: Path, work: Path) -> dict:
    return {**common, "evalset": str(evalset_spec), "out_dir": str(work / "quantgate-run")}


def profile_quantgate(model_path: Path, evalset_spec: Path, items: int, batch_size: int, threads: int,
                      work: Path) -> dict[str, float]:
    """quantgate's side once more, under py-spy: CPU seconds by category (benchmarks.pyspy_profile)."""
    from benchmarks.pyspy_profile import profile_child, summarize

    work.mkdir(parents=True, exist_ok=True)
    common = {"model_path": str(model_path), "max_items": items, "batch_size": batch_size, "threads": threads}
    job_path = work / "quantgate_eval_side.job.json"
    job_path.write_text(json.dumps({**_quantgate_job(common, evalset_spec, work),
                                    "result_path": str(work / "result.json")}), encoding="utf-8")
    say(f"profile: quantgate's side on {items} items under py-spy")
    raw = profile_child("benchmarks.quantgate_eval_side", job_path, work / "pyspy.txt",
                        env={"QUANTGATE_CACHE": str(work / "cache")})
    return summarize(raw)


def _side(name: str, runs: list[ChildRun], evalset) -> Side:
    """Best time of each kind over the runs; outputs of the first run (every run must agree)."""
    from harness.metrics import score_item

    items = {item.id: item for item in evalset.items}
    predictions = {o["id"]: o["prediction"] for o in runs[0].result["outputs"]}
    for run in runs[1:]:
        if {o["id"]: o["prediction"] for o in run.result["outputs"]} != predictions:
            raise RuntimeError(f"{name}: a repeated run generated different outputs; greedy decoding should not")
    per_item = [score_item(evalset, items[i], p) for i, p in predictions.items()]
    scores = {m: sum(s[m] for s in per_item) / len(per_item) for m in ("em", "f1")}
    return Side(name, min(r.wall_s for r in runs), min(r.cpu_s for r in runs), min(r.result["generate_s"] for r in runs),
                min(r.result["generate_cpu_s"] for r in runs), scores, predictions,
                {"runs": [(r.cpu_s, r.wall_s, r.result["generate_cpu_s"], r.result["generate_s"]) for r in runs]})
