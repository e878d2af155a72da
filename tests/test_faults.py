"""Faults mid-run on the real pipeline: kill -9, Ctrl-C, OOM, --resume, stale and corrupt cache entries.

Runs baseline + int8 (bitsandbytes, for real) on a tiny random Llama with the demo model's tokenizer over two tiny
evalsets written here, in a cache of this module's own: the faults are the pipeline's, so the demo model would add
nothing but minutes, and the tests may delete cache entries without touching another test's.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, quantgate

pytestmark = pytest.mark.slow
SIZES = ("--batch-size", "2", "--max-new-tokens", "6", "--latency-requests", "2")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults-cache")


@pytest.fixture(scope="module")
def fast(demo_checkpoint, tmp_path_factory) -> tuple[str, ...]:
    """The run's flags: --model (a tiny random Llama), --formats, the sizes."""
    from conftest import tiny_llama

    model = tiny_llama(demo_checkpoint, tmp_path_factory.mktemp("tiny") / "model")
    return ("--model", str(model), "--formats", "baseline,int8", *SIZES)


def write_sets(folder: Path, summaries: int = 3) -> Path:
    """A QA set and a summary set of `summaries` items (the summaries' ids s5, s7, s9, then on)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qa.toml").write_text('name = "qa"\ntask = "qa"\nlanguage = "en"\ndata = "qa.jsonl"\n'
                                    'max_new_tokens = 6\nprompt_template = "{context}\\nQuestion: {question}"\n')
    rows = [{"id": "q1", "context": "Refunds are possible within 30 days of purchase.",
             "question": "Within how many days are refunds possible?", "answers": ["30 days"]},
            {"id": "q2", "context": "Support is open from 9am to 5pm.", "question": "When does support open?",
             "answers": ["9am"]},
            {"id": "q3", "context": "SSO is on the Pro plan.", "question": "Which plan has SSO?", "answers": ["Pro"]}]
    (folder / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "sum.toml").write_text('name = "sum"\ntask = "generation"\nlanguage = "en"\ndata = "sum.jsonl"\n'
                                     'max_new_tokens = 6\nprompt_template = "{instruction}\\n{context}"\n')
    rows = [{"id": f"s{i}", "instruction": "Summarize in one sentence.",
             "context": f"The API gateway returned errors for {i} minutes after a bad deploy; we rolled back.",
             "reference": f"A bad deploy caused {i} minutes of gateway errors and was rolled back."}
            for i in range(5, 5 + 2 * summaries, 2)]
    (folder / "sum.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def comparable(report: dict) -> dict:
    return {name: (entry["verdict"], entry["scores"]) for name, entry in report["formats"].items()}


@pytest.fixture(scope="module")
def reference(fast, cache, tmp_path_factory):
    """An uninterrupted run: what every recovered run must reproduce."""
    sets = write_sets(tmp_path_factory.mktemp("sets"))
    out = tmp_path_factory.mktemp("reference")
    quantgate("run", *fast, "--evalsets", str(sets), "--out", str(out), cache=cache)
    report = json.loads((out / "report.json").read_text())
    assert {f["status"] for f in report["formats"].values()} == {"ok"}, report["formats"]
    return sets, report


def start(args, cache: Path) -> subprocess.Popen:
    env = dict(os.environ, QUANTGATE_CACHE=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_worker(parent: subprocess.Popen, needle: str, timeout: float = 300) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in psutil.Process(parent.pid).children(recursive=True):
            try:
                if "harness.worker" in " ".join(child.cmdline()) and needle in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no worker matching {needle} started")


def test_kill_9_of_a_format_subprocess_then_resume(fast, cache, tmp_path):
    """The kill lands between int8's measurement and the end of its evalsets: on the tiny model those take a
    tenth of a second for the module's sets, so this test's summary set has 150 items (seconds of generation)."""
    sets = write_sets(tmp_path / "sets", summaries=150)
    quantgate("run", *fast, "--evalsets", str(sets), "--out", str(tmp_path / "reference"), cache=cache)
    expected = json.loads((tmp_path / "reference" / "report.json").read_text())
    shutil.rmtree(cache / "results", ignore_errors=True)
    out = tmp_path / "run"
    run = start(("run", *fast, "--evalsets", str(sets), "--out", str(out)), cache)
    worker = wait_for_worker(run, "stages/int8/device")
    job = json.loads((out / "stages" / "int8" / "device.job.json").read_text())
    wait_for_file(Path(job["measure"]["result_path"]), run)  # int8 has finished its measurement, not its evalsets
    worker.send_signal(signal.SIGKILL)
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 1, stderr
    report = json.loads((out / "report.json").read_text())
    int8 = report["formats"]["int8"]
    assert int8["status"] == "failed" and int8["verdict"] == "NO-GO"
    assert "killed by SIGKILL" in int8["reasons"][0]
    assert report["formats"]["baseline"]["status"] == "ok"  # the other format finished
    resumed = quantgate("run", "--resume", "--out", str(out), cache=cache)
    again = json.loads((out / "report.json").read_text())
    assert again["formats"]["baseline"]["stages_run"] == []  # finished work is not redone
    assert "measure" not in again["formats"]["int8"]["stages_run"]  # int8's measurement had finished
    assert "generate:sum" in again["formats"]["int8"]["stages_run"]  # its evaluation had not
    assert comparable(again) == comparable(expected)
    assert "Traceback" not in resumed.stderr


def test_kill_9_during_quantization_then_resume(fast, reference, cache, tmp_path):
    sets, expected = reference
    for artifact in (cache / "artifacts").glob("int8-*"):
        shutil.rmtree(artifact)
    out = tmp_path / "run"
    run = start(("run", *fast, "--evalsets", str(sets), "--out", str(out)), cache)
    wait_for_worker(run, "stages/int8/quantize").send_signal(signal.SIGKILL)
    run.communicate(timeout=600)
    assert run.returncode == 1
    int8 = json.loads((out / "report.json").read_text())["formats"]["int8"]
    assert int8["verdict"] == "NO-GO" and "quantization subprocess was killed by SIGKILL" in int8["reasons"][0]
    quantgate("run", "--resume", "--out", str(out), cache=cache)
    again = json.loads((out / "report.json").read_text())
    assert again["formats"]["baseline"]["stages_run"] == []
    assert "quantize" in again["formats"]["int8"]["stages_run"]  # no half-written artifact was taken as done
    assert comparable(again) == comparable(expected)


def test_an_engine_raising_is_reported_in_one_line(tmp_path):
    from harness.jobs import QuantizeJob
    from harness.launcher import run_worker

    failure = tmp_path / "quantize.failed.json"
    job = {"kind": "quantize", "format": "int8", "source_path": str(tmp_path / "no-such-model"),
           "recipe": {"format": "int8", "bits": 8, "calibration_samples": 0}, "calibration_path": str(tmp_path / "c.json"),
           "out_dir": str(tmp_path / "artifact"), "manifest": {"engine": "bitsandbytes"}, "threads": 1,
           "failure_path": str(failure)}
    (tmp_path / "c.json").write_text("[]")
    exit_ = run_worker(QuantizeJob.from_json(job), tmp_path / "job.json", tmp_path / "worker.log", "int8")
    assert exit_.returncode == 1
    error = json.loads(failure.read_text())["error"]
    assert "no-such-model" in error and "\n" not in error  # the engine's own message, one line
    assert "Traceback" in (tmp_path / "worker.log").read_text()  # the full story stays in the log


def wait_for_file(path: Path, parent: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} did not appear"
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("cache_flags", [(), ("--no-cache",)], ids=["cache", "no-cache"])
def test_kill_9_of_the_whole_run_then_resume(fast, reference, cache, tmp_path, cache_flags):
    sets, expected = reference
    shutil.rmtree(cache / "results", ignore_errors=True)
    out = tmp_path / "run"
    run = start(("run", *fast, *cache_flags, "--evalsets", str(sets), "--out", str(out)), cache)
    wait_for_worker(run, "stages/int8/device")
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert not (out / "report.json").exists()
    quantgate("run", "--resume", "--out", str(out), cache=cache)
    report = json.loads((out / "report.json").read_text())
    assert report["formats"]["baseline"]["stages_run"] == []  # baseline had finished before the kill
    assert comparable(report) == comparable(expected)


@pytest.mark.parametrize("how, code", [("Ctrl-C", 130), ("SIGTERM", 143)])
def test_an_interrupt_writes_a_partial_report(fast, how, code, reference, cache, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) and SIGTERM to quantgate alone (what a CI runner or
    Kubernetes sends on a timeout): the finished format kept, a partial report, the worker stopped, 130 / 143."""
    sets, expected = reference
    shutil.rmtree(cache / "results", ignore_errors=True)
    out = tmp_path / "run"
    run = start(("run", *fast, "--evalsets", str(sets), "--out", str(out)), cache)
    worker = wait_for_worker(run, "stages/int8/device")
    if how == "Ctrl-C":
        os.killpg(run.pid, signal.SIGINT)
    else:
        run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == code, stderr
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, "the worker outlived quantgate"
    partial = json.loads((out / "report.json").read_text())
    assert partial["formats"]["baseline"]["status"] == "ok"
    assert partial["formats"]["int8"]["status"] == "interrupted"
    assert "--resume" in stderr and "Traceback" not in stderr
    quantgate("run", "--resume", "--out", str(out), cache=cache)
    assert comparable(json.loads((out / "report.json").read_text())) == comparable(expected)


def test_out_of_memory_format_is_no_go_and_others_finish(fast, reference, cache, tmp_path):
    sets, _ = reference
    config = tmp_path / "run.toml"
    config.write_text('[formats.baseline]\n[formats.int8]\nmemory_limit_gib = 0.25\n')
    out = tmp_path / "run"
    result = quantgate("run", "--config", str(config), *fast[:2], *fast[4:], "--evalsets", str(sets),
                       "--out", str(out), "--no-cache", cache=cache)
    assert result.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert report["formats"]["baseline"]["status"] == "ok"
    reason = report["formats"]["int8"]["reasons"][0]
    assert "ran out of memory" in reason and "GiB RSS, past its memory limit" in reason
    assert "--batch-size" in reason


def test_changed_evalset_line_reruns_only_that_evaluation(fast, reference, cache, tmp_path):
    sets, _ = reference
    quantgate("run", *fast, "--evalsets", str(sets), "--out", str(tmp_path / "warm"), cache=cache)
    edited = tmp_path / "edited"
    shutil.copytree(sets, edited)
    lines = (edited / "qa.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["answers"] = ["the Pro plan"]  # same prompt, new gold answer: scores change, generation need not
    row["question"] = "Which plan?"  # shorter prompt: stays outside the memory probe (the longest prompts)
    lines[2] = json.dumps(row)
    (edited / "qa.jsonl").write_text("\n".join(lines) + "\n")
    quantgate("run", *fast, "--evalsets", str(edited), "--out", str(tmp_path / "run"), cache=cache)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for name in ("baseline", "int8"):  # and that set's fidelity: the baseline's reference, int8's comparison
        assert report["formats"][name]["stages_run"] == ["generate:qa", "fidelity:qa"], name


def test_truncated_cache_artifact_is_rebuilt(fast, reference, cache, tmp_path):
    sets, expected = reference
    artifacts = sorted((cache / "artifacts").glob("int8-*"))
    assert artifacts
    weights = artifacts[0] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = quantgate("run", *fast, "--evalsets", str(sets), "--out", str(tmp_path), cache=cache)
    report = json.loads((tmp_path / "report.json").read_text())
    assert "quantize" in report["formats"]["int8"]["stages_run"]
    assert "missing or corrupt; rebuilding" in result.stderr
    assert comparable(report) == comparable(expected)
