"""quantgate's speed, measured in one run on one machine: `nox -s bench` or `.venv/bin/python benchmarks/run.py`.

1. evaluation: quantgate vs lm-evaluation-harness (hf backend) on the same 200 SQuAD items, same everything
2. overhead: quantgate's generation loop vs a bare `model.generate` loop over the same batches
3. cache: the full demo run repeated unchanged vs cold
4. quantization: quantgate's GPTQ and AWQ stages vs GPTQModel called directly
5. serve: the same SQuAD items through the transformers backend and the vLLM backend (a real vllm serve)
6. fidelity: the calibration of the fidelity rule, KL and top-1 agreement against task drops on a ladder of formats
   (benchmarks/fidelity_bench.py); not a speed figure, the defaults of the policy's [fidelity] come from it

Absolute times on a shared machine are noise; the ratios, measured minutes apart on the same machine, are the
result, judged on CPU time where other jobs could inflate wall time. Writes reports/bench/latest.md (see
benchmarks/report.py). `--quick` is a smoke run (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts benchmarks/ first on sys.path, where our module names would shadow top-level ones;
# the project root goes there instead, and the modules are imported as the `benchmarks` package.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import ROOT, child_env, say  # noqa: E402
from benchmarks.report import build_report, machine_facts, summary_table  # noqa: E402

EVALSET = ROOT / "benchmarks" / "shared_evalsets" / "squad_200.toml"
FULL = {"items": 200, "repeats": 2, "profile_items": 48, "cache_items": 16, "calibration_samples": 16, "latency_requests": 8,
        "fidelity_items": 100}
QUICK = {"items": 24, "repeats": 1, "profile_items": 8, "cache_items": 2, "calibration_samples": 4, "latency_requests": 2,
         "fidelity_items": 6}
STEPS = ("eval", "profile", "cache", "quantize", "serve", "fidelity")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    parser.add_argument("--items", type=int, help=f"SQuAD items for benchmarks 1-2 (default {FULL['items']})")
    parser.add_argument("--repeats", type=int,
                        help=f"runs of each side in 1-2, best time counts (default {FULL['repeats']})")
    parser.add_argument("--profile-items", type=int,
                        help=f"items for the py-spy profile of quantgate's side (default {FULL['profile_items']})")
    parser.add_argument("--cache-items", type=int, help=f"--max-items of the demo run in 3-4 (default {FULL['cache_items']})")
    parser.add_argument("--calibration-samples", type=int,
                        help=f"calibration texts for the demo run in 3-4 (default {FULL['calibration_samples']})")
    parser.add_argument("--latency-requests", type=int,
                        help=f"--latency-requests of the demo run in 3 (default {FULL['latency_requests']})")
    parser.add_argument("--fidelity-items", type=int,
                        help=f"items per public set in 6 (default {FULL['fidelity_items']})")
    parser.add_argument("--fidelity-rungs", default="",
                        help="the ladder's rungs in 6, comma-separated, on every model (benchmarks/fidelity_bench.py "
                             "RUNGS; default: each model's share of fidelity_bench.DEFAULT_LADDER)")
    parser.add_argument("--fidelity-models", default="demo,gemma3-270m",
                        help="the models the ladder runs on in 6 (benchmarks/fidelity_bench.py MODELS; default both)")
    parser.add_argument("--fidelity-sets", default="",
                        help="the public sets of 6, comma-separated, on every model (default: each model's sets in "
                             "fidelity_bench.DEFAULT_LADDER; cnndm_summeval_100 costs several times a QA set an item)")
    parser.add_argument("--fidelity-only", default="",
                        help="run only these formats and candidates of the rungs in 6 (fidelity_bench --only)")
    parser.add_argument("--fidelity-parallel", type=int,
                        help="model ladders run at once in 6 (default: one a CPU core, at most one a model)")
    parser.add_argument("--batch-size", type=int, default=8, help="generation batch size, every side (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every side (default 1)")
    parser.add_argument("--no-lm-eval-default-batch", dest="lm_eval_default_batch", action="store_false",
                        help="skip the extra lm-eval run at its default batch size (1)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"which benchmarks (default {','.join(STEPS)})")
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench" / "latest.md"))
    parser.add_argument("--work", help="scratch directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--fidelity-results", metavar="JSON", nargs="+", type=Path,
                        help="6 from saved ladders instead of running them: the result JSON each model's "
                             "`fidelity_bench --run` wrote (WORK/fidelity.json, WORK/fidelity-gemma3-270m.json)")
    parser.add_argument("--render", metavar="JSON", help="measure nothing: rewrite --out from a saved results JSON "
                        "(the .json written next to the Markdown)")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = set(args.steps) - set(STEPS)
    if unknown:
        parser.error(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(STEPS)}")
    from benchmarks.fidelity_bench import MODELS, parse_rungs, parse_sets
    from harness.errors import UserError

    try:  # checked before anything is measured
        args.fidelity_rungs = parse_rungs(args.fidelity_rungs) if args.fidelity_rungs.strip() else ()
        args.fidelity_sets = parse_sets(args.fidelity_sets) if args.fidelity_sets.strip() else ()
    except UserError as exc:
        parser.error(str(exc).replace("--rungs", "--fidelity-rungs", 1).replace("--sets", "--fidelity-sets", 1))
    args.fidelity_models = tuple(m.strip() for m in args.fidelity_models.split(",") if m.strip())
    if not args.fidelity_models or set(args.fidelity_models) - set(MODELS):
        parser.error(f"--fidelity-models {','.join(args.fidelity_models)}: choose from {', '.join(MODELS)}")
    args.fidelity_only = tuple(sorted({n.strip() for n in args.fidelity_only.split(",") if n.strip()}))
    missing = [str(p) for p in args.fidelity_results or () if not p.is_file()]
    if missing:
        parser.error(f"--fidelity-results: no such file: {', '.join(missing)}")
    if args.fidelity_parallel is None:
        args.fidelity_parallel = max(1, min(len(args.fidelity_models), os.cpu_count() or 1))
    elif args.fidelity_parallel < 1:
        parser.error(f"--fidelity-parallel {args.fidelity_parallel}: give at least 1")
    return args


def fidelity_plans(args: argparse.Namespace) -> dict[str, tuple[tuple[str, ...], frozenset[str], tuple[str, ...]]]:
    """{model: (rungs, only, sets)}: --fidelity-rungs/--fidelity-only/--fidelity-sets for every model where given,
    else each model's share of the default ladder (fidelity_bench.DEFAULT_LADDER)."""
    from benchmarks.fidelity_bench import DEFAULT_LADDER, DEFAULT_RUNGS, SETS

    plans = {}
    for model in args.fidelity_models:
        default = DEFAULT_LADDER.get(model)
        rungs = args.fidelity_rungs or (default.rungs if default else DEFAULT_RUNGS)
        only = frozenset(args.fidelity_only) if args.fidelity_only else (
            default.only if default and not args.fidelity_rungs else frozenset())
        sets = args.fidelity_sets or (default.sets if default else SETS)
        plans[model] = (rungs, only, sets)
    return plans


def ladder_command(model: str, work: Path, rungs: tuple[str, ...], only: frozenset[str], sets: tuple[str, ...],
                   args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "benchmarks.fidelity_bench", "--run", "--model", model, "--work", str(work),
            "--items", str(args.fidelity_items), "--sets", ",".join(sets), "--rungs", ",".join(rungs),
            "--only", ",".join(sorted(only)), "--threads", str(args.threads), "--batch-size", str(args.batch_size),
            "--calibration-samples", str(args.calibration_samples)]


def last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(starting)"
    return next((line.strip()[:160] for line in reversed(lines) if line.strip()), "(starting)")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _signal_session(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def run_fidelity_models(work: Path, args: argparse.Namespace) -> dict | None:
    """Benchmark 6 on each of --fidelity-models, each model's ladder a `fidelity_bench --run` process of its own,
    up to --fidelity-parallel at once (default: one a core, the models being independent), their rows in one
    result (fidelity_bench.merge_results). A ladder that fails is reported and left out; none outlives this."""
    from benchmarks.fidelity_bench import merge_results, model_paths

    pending = list(fidelity_plans(args).items())
    running: list[tuple[str, subprocess.Popen, Path]] = []
    results, failed = [], []
    last_report = time.time()
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the finally below runs on SIGTERM too
    try:
        while pending or running:
            while pending and len(running) < args.fidelity_parallel:
                model, (rungs, only, sets) = pending.pop(0)
                log = work / f"fidelity-{model}.log"
                say(f"fidelity: ladder on {model} started ({','.join(rungs)}; {len(only) or 'all'} formats and "
                    f"candidates; {args.fidelity_items} items of {','.join(sets)}); log {log}")
                with open(log, "w", encoding="utf-8") as out:
                    # a session of its own: stopping it reaches the ladder's `quantgate run` and its workers too
                    process = subprocess.Popen(ladder_command(model, work, rungs, only, sets, args), cwd=ROOT,
                                               env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)
                running.append((model, process, log))
            time.sleep(5)
            for entry in list(running):
                model, process, log = entry
                if process.poll() is None:
                    continue
                running.remove(entry)
                result_path = model_paths(work, model)[1]
                if process.returncode == 0 and result_path.is_file():
                    results.append(json.loads(result_path.read_text(encoding="utf-8")))
                    say(f"fidelity: ladder on {model} done")
                else:
                    failed.append(model)
                    say(f"fidelity: ladder on {model} failed (exit {process.returncode}): {last_line(log)}; see {log}")
            if running and time.time() - last_report >= 300:
                last_report = time.time()
                for model, _, _ in running:
                    run_log = model_paths(work, model)[0] / "run.log"
                    say(f"fidelity: {model}: {last_line(run_log)}")
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        for _, process, _ in running:  # interrupted: no ladder outlives the bench
            _signal_session(process, signal.SIGTERM)
        for _, process, _ in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_session(process, signal.SIGKILL)
    if failed:
        say(f"fidelity: {len(failed)} ladder(s) failed ({', '.join(failed)}); the table holds the others")
    return merge_results(results) if results else None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.render:
        from benchmarks.results import load

        return write(Path(args.out), load(Path(args.render)))
    started = time.time()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="quantgate-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    say(f"settings: {vars(args)}; scratch {work}; load average {load_before[0]:.2f}")
    from harness.source import resolve_source

    say("demo model: resolving the converted checkpoint (converted once if missing), copying it to the scratch dir")
    # A private copy: nothing another process does to the user's cache can change it mid-bench.
    demo = work / "checkpoint" / "smollm2-135m-instruct-bf16"
    if not demo.is_dir():
        shutil.copytree(resolve_source("demo").path, demo)
    eval_run = cache_run = profile = serve_run = fidelity_run = None
    quantize_runs = []
    try:
        if "eval" in args.steps:
            from benchmarks.eval_bench import run_eval_bench

            eval_run = run_eval_bench(demo, EVALSET, args.items, args.batch_size, args.threads, work / "eval",
                                      repeats=args.repeats, lm_eval_default_batch=args.lm_eval_default_batch)
        if "profile" in args.steps:
            from benchmarks.eval_bench import profile_quantgate
            from benchmarks.pyspy_profile import pyspy

            if pyspy():
                profile = profile_quantgate(demo, EVALSET, args.profile_items, args.batch_size, args.threads,
                                            work / "profile")
            else:
                say("profile: py-spy is not installed (pip install py-spy); skipped")
        if "cache" in args.steps or "quantize" in args.steps:  # 4 runs in the cache 3 leaves
            from benchmarks.cache_bench import run_cache_bench

            cache_run = run_cache_bench(demo, work / "demo", args.cache_items, args.calibration_samples,
                                        args.latency_requests, args.threads, args.batch_size)
        if "quantize" in args.steps:
            from benchmarks.quantize_bench import run_quantize_bench

            quantize_runs = [run_quantize_bench(fmt, cache_run.cache, args.cache_items, args.calibration_samples,
                                                args.threads, work / "quantize") for fmt in ("gptq", "awq")]
        if "serve" in args.steps:
            from benchmarks.serve_bench import run_serve_bench

            serve_run = run_serve_bench(demo, EVALSET, args.items, args.batch_size, args.threads, work / "serve")
        if "fidelity" in args.steps and args.fidelity_results:
            from benchmarks.fidelity_bench import merge_results

            fidelity_run = merge_results([json.loads(p.read_text(encoding="utf-8")) for p in args.fidelity_results])
        elif "fidelity" in args.steps:
            fidelity_run = run_fidelity_models(work, args)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    run = {"args": args, "eval_run": eval_run, "profile": profile, "cache_run": cache_run,
           "quantize_runs": quantize_runs, "load_before": load_before, "load_after": os.getloadavg(),
           "total_s": time.time() - started, "measured_at": time.strftime("%Y-%m-%d %H:%M %Z"), "serve_run": serve_run,
           "fidelity_run": fidelity_run, "machine": machine_facts(args.threads)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from benchmarks.results import carry_over, save

    run = carry_over(run, args.steps, out.with_suffix(".json"))
    if fidelity_run is not None and args.fidelity_results:
        run["carried"] = {**run.get("carried", {}), "fidelity": "from the ladders' saved results "
                          + ", ".join(p.name for p in args.fidelity_results) + ", each with its own command and time"}
    save(out.with_suffix(".json"), run)
    return write(out, run)


def write(out: Path, run: dict) -> int:
    from benchmarks.fidelity_bench import render_fidelity_bench
    from benchmarks.results import carried_line
    from benchmarks.serve_bench import render_serve_bench

    run = dict(run)
    carried = carried_line(run.pop("carried", None) or {})
    serve_lines = render_serve_bench(run.pop("serve_run", None))
    fidelity_lines = render_fidelity_bench(run.pop("fidelity_run", None), out.parent / "fidelity_ladder.png")
    markdown, checks = build_report(**run)
    if carried:  # after the title and the "Measured ..." paragraph
        title, measured, rest = markdown.split("\n\n", 2)
        markdown = "\n\n".join((title, measured, carried, rest))
    for lines in (serve_lines, fidelity_lines):
        if lines:
            markdown = markdown.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    out.write_text(markdown, encoding="utf-8")
    print("\n".join(summary_table(checks)))
    say(f"wrote {out} (and the raw results in {out.with_suffix('.json').name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
