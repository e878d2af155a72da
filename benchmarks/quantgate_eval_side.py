"""quantgate's evaluation of one evalset on the baseline, as its pipeline runs it: `python -m benchmarks.quantgate_eval_side JOB`.

Loads the evalset and renders the prompts (harness.pipeline.prepare_inputs), then hands the generate task that
harness.device_plan.pending_evaluation builds to a harness.worker subprocess (model load + batched generation) and
scores the outputs with harness.metrics.score_item. Only the memory/latency probe is left out: lm-eval has no
such stage, so it would not be the same work.
"""

from __future__ import annotations

import sys
import time

from benchmarks.common import read_job, write_result


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    job = read_job(argv)
    from harness import progress
    from harness.config import RunSpec
    from harness.launcher import run_worker
    from harness.device_plan import evaluate_job, pending_evaluation
    from harness.pipeline import prepare_inputs

    progress.configure(quiet=True)
    spec = RunSpec(model=job["model_path"], formats=["baseline"], evalsets=[job["evalset"]], out=job["out_dir"],
                   max_items=job["max_items"], batch_size=job["batch_size"], threads=job["threads"], use_cache=False)
    inputs = prepare_inputs(spec)
    plan = pending_evaluation(inputs, "baseline", inputs.source.fingerprint)
    worker_job = evaluate_job(inputs, "baseline", inputs.source.path, None, list(plan.generate))
    stage_dir = inputs.out_dir / "stages" / "baseline"
    worker_started = time.perf_counter()
    exit_ = run_worker(worker_job, stage_dir / "device.job.json", inputs.out_dir / "logs" / "baseline.log", "baseline")
    worker_wall = time.perf_counter() - worker_started
    if exit_.returncode != 0:
        raise SystemExit(f"quantgate worker failed (exit {exit_.returncode}); see {exit_.log_path}")
    (evalset,) = inputs.evalsets
    result = plan.generations[evalset.name].read("outputs")
    from harness.metrics import score_item

    items = {item.id: item for item in evalset.items}
    scores = [score_item(evalset, items[o["id"]], o["prediction"]) for o in result["outputs"]]
    prompts = inputs.prompts[evalset.name]
    write_result(job, {
        "generate_s": result["wall_s"],  # the generation loop (batches in, texts out), timed inside the worker
        "generate_cpu_s": result["cpu_s"],
        "worker_s": worker_wall,  # the worker process: imports, model load, tokenization, generation
        "in_process_s": time.perf_counter() - started,
        "outputs": [{**o, **s} for o, s in zip(result["outputs"], scores)],
        "prompts": [{"id": p.item_id, "text": p.text} for p in prompts],
        "max_new_tokens": prompts[0].max_new_tokens,
        "worker_log": str(exit_.log_path),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
