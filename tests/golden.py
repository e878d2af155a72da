"""The golden run: a small demo run whose stage results (each format's artifact entry, measurement and per-item
generations) are recorded once, and everything downstream of the model replayed from them.

What is downstream of the model is deterministic on any CPU: scoring, paired statistics, verdicts, capacity plans
and the rendered report. What the model generates is not: greedy decoding flips a near-tie token between CPU
vendors' float32 kernels (MKL blocks its reductions by vendor), even with QUANTGATE_FORCE_AVX2=1. So the recording
is the input of an exact check (replay) and the reference of a tolerant one (test_golden_report.py).

    QUANTGATE_FORCE_AVX2=1 python tests/golden.py record    # runs the model; rewrites tests/fixtures/golden/
    python tests/golden.py expected                         # no model: renews expected/ after a deliberate change

The expected files hold <ROOT>, <CACHE> and <OUT> where the recording machine had its checkout, cache and output
directory; created_at, the device and the library versions are the recording's (replay puts them back).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
GOLDEN = TESTS / "fixtures" / "golden"
RECORDED = GOLDEN / "recorded.json"
EXPECTED = GOLDEN / "expected"
COMPARED = ("report.json", "report.md", "scores.csv", "junit.xml")
# The golden run: both formats whose scores need no calibration, every bundled evalset, a few items. The vLLM rules
# are named so that the plans do not depend on which vLLM this machine has.
COMMAND = ("--model", "demo", "--formats", "baseline,int8", "--max-items", "3", "--batch-size", "4",
           "--max-new-tokens", "12", "--latency-requests", "3", "--vllm-version", "0.32")


def spec_for(command, out: Path):
    """The RunSpec `quantgate run COMMAND --out OUT` runs."""
    from harness.cli import build_parser
    from harness.commands.run import spec_from_args

    return spec_from_args(build_parser().parse_args(["run", *command, "--out", str(out), "--quiet"]))


def run_record(run) -> dict:
    """A pipeline FormatRun as JSON (every field: it is what the evaluation reads)."""
    from dataclasses import asdict

    return {"name": run.name, "status": run.status, "error": run.error, "artifact": _block(run.artifact),
            "measurement": {"path": run.measurement.path, "key": run.measurement.key,
                            "result": run.measurement.result},
            "generations": {name: {"result": asdict(g) if g else None} for name, g in run.generations.items()},
            "stages_run": list(run.stages_run), "served": _block(run.served),
            "devices": run.devices, "fidelity": run.fidelity, "fidelity_note": run.fidelity_note}


def _block(block):
    from harness.report.schema import AS_READ

    return block.model_dump(exclude_unset=True, context={AS_READ: True}) if block is not None else None


def format_run(record: dict):
    from harness.measure.probe import Measurement
    from harness.records import EvalsetGeneration, FormatRun
    from harness.report.schema import Artifact, Served

    generations = {name: EvalsetGeneration.from_result(g["result"]) if g["result"] else None
                   for name, g in record["generations"].items()}
    return FormatRun(**{**record, "measurement": Measurement(**record["measurement"]), "generations": generations,
                        "artifact": Artifact.model_validate(record["artifact"]) if record["artifact"] else None,
                        "served": Served.model_validate(record["served"]) if record["served"] else None})


def build_outputs(inputs, runs: dict, out: Path, *, wall_s: float, fixed: dict | None = None) -> None:
    """evaluate -> build -> write, as run_pipeline does after its formats ran; `fixed` puts back created_at, device
    and environment (what the recording machine and day wrote)."""
    from harness.evaluate import evaluate_formats
    from harness.pipeline import write_outputs
    from harness.report.build import build_report
    from harness.report.schema import RunReport

    evaluation = evaluate_formats(inputs, runs)
    report = build_report(inputs, runs, evaluation, wall_s=wall_s)
    if fixed:
        report = RunReport.model_validate({**json.loads(report.model_dump_json()), **fixed})
    write_outputs(out, report, evaluation.samples)


def replay(recorded: dict, out: Path) -> Path:
    """The recorded run's report rebuilt from its recorded stage results: no model runs (the tokenizer renders the
    prompts). The environment's QUANTGATE_CACHE must hold the demo checkpoint."""
    from harness.pipeline import prepare_inputs

    inputs = prepare_inputs(spec_for(recorded["command"], out))
    runs = {name: format_run(record) for name, record in recorded["runs"].items()}
    build_outputs(inputs, runs, out, wall_s=recorded["wall_s"],
                  fixed={key: recorded[key] for key in ("created_at", "device", "environment")})
    return out


def placeholders(text: str, out: Path) -> str:
    from harness.cache import cache_root

    for path, name in ((out, "<OUT>"), (cache_root(), "<CACHE>"), (ROOT, "<ROOT>")):
        text = text.replace(str(path.resolve()), name).replace(str(path), name)
    return text


def differences(produced: Path, expected: Path = EXPECTED) -> list[str]:
    """The compared files that differ from the expected ones, each with its first differing line."""
    found = []
    for name in COMPARED:
        want = (expected / name).read_text(encoding="utf-8").splitlines()
        got = placeholders((produced / name).read_text(encoding="utf-8"), produced).splitlines()
        if got != want:
            line = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            found.append(f"{name} line {line + 1}: expected {want[line] if line < len(want) else '(end)'!r}, "
                         f"got {got[line] if line < len(got) else '(end)'!r}")
    return found


def record(out: Path) -> dict:
    """Run the golden command for real and write the recording and the expected files from it."""
    import time

    from harness.pipeline import prepare_inputs, run_all_formats

    started = time.time()
    inputs = prepare_inputs(spec_for(COMMAND, out))
    runs: dict = {}
    run_all_formats(inputs, runs)
    build_outputs(inputs, runs, out, wall_s=time.time() - started)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    recorded = {"command": list(COMMAND), "created_at": report["created_at"], "wall_s": report["wall_s"],
                "device": report["device"], "environment": report["environment"],
                "runs": {name: run_record(run) for name, run in runs.items()}}
    GOLDEN.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(placeholders(json.dumps(recorded, indent=1, ensure_ascii=False), out) + "\n",
                        encoding="utf-8")
    write_expected(out / "replayed")
    return recorded


def write_expected(scratch: Path) -> None:
    """The expected files: the replay's, from the recording as saved (the path every later replay takes). After a
    deliberate change downstream of the model (a new plan rule, a new report line), this alone renews them; read
    `git diff tests/fixtures/golden/expected` before committing."""
    replayed = replay(json.loads(RECORDED.read_text(encoding="utf-8")), scratch)
    EXPECTED.mkdir(exist_ok=True)
    for name in COMPARED:
        (EXPECTED / name).write_text(placeholders((replayed / name).read_text(encoding="utf-8"), replayed),
                                     encoding="utf-8")


def score_differences(formats: dict, expected: dict | None = None) -> dict[str, float]:
    """'format evalset metric' -> score minus the recording's, for a report's `formats` block."""
    if expected is None:
        expected = json.loads((EXPECTED / "report.json").read_text(encoding="utf-8"))["formats"]
    return {f"{name} {evalset} {metric}": formats[name]["scores"][evalset][metric]["value"] - score["value"]
            for name, entry in expected.items() for evalset, metrics in entry["scores"].items()
            for metric, score in metrics.items()}


def spread(reports: list[Path]) -> None:
    """The golden command run here with and without QUANTGATE_FORCE_AVX2, and any reports given (another
    machine's report.json of the same command): each score's difference from the recording."""
    import os
    import subprocess
    import tempfile

    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for label, env in (("forced AVX2", {"QUANTGATE_FORCE_AVX2": "1"}), ("this CPU as it is", {})):
            out = Path(scratch) / label.replace(" ", "-")
            subprocess.run([sys.executable, "-m", "harness", "run", *COMMAND, "--out", str(out), "--quiet"],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False)
            runs[label] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    runs.update({str(path): json.loads(path.read_text(encoding="utf-8")) for path in reports})
    for label, report in runs.items():
        moved = {k: round(v, 2) for k, v in score_differences(report["formats"]).items() if abs(v) > 1e-9}
        verdicts = {name: entry["verdict"] for name, entry in report["formats"].items()}
        largest = max(map(abs, moved.values()), default=0.0)
        print(f"{label}: verdicts {verdicts}; largest difference {largest:.2f} points; {moved or 'none moved'}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import tempfile

    if sys.argv[1:2] == ["spread"]:
        spread([Path(p) for p in sys.argv[2:]])
        sys.exit(0)
    if sys.argv[1:] == ["expected"]:
        with tempfile.TemporaryDirectory() as scratch:
            write_expected(Path(scratch) / "replayed")
        sys.exit(f"rewrote {EXPECTED} from {RECORDED}; review the diff")
    if sys.argv[1:] != ["record"]:
        sys.exit("usage: QUANTGATE_FORCE_AVX2=1 python tests/golden.py record | python tests/golden.py expected | "
                 "python tests/golden.py spread [OTHER/report.json ...]")

    with tempfile.TemporaryDirectory() as scratch:
        recording = record(Path(scratch) / "run")
    print(f"recorded {', '.join(recording['runs'])} into {GOLDEN}")
