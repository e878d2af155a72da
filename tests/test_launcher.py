"""A Ctrl-C at any moment of a worker's start leaves no worker running and no relay writing to a closed log (CI once
printed `ValueError: I/O operation on closed file.` from the relay thread when the interrupt landed just after the
worker had started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness import launcher
from harness.jobs import QuantizeJob

# Stands in for harness.worker: one line on stderr at once, then it sleeps far longer than the test waits.
SLOW_WORKER = "import sys, time; sys.stderr.write('started\\n'); sys.stderr.flush(); time.sleep(30)"


def job(tmp_path) -> QuantizeJob:
    return QuantizeJob.from_json({
        "kind": "quantize", "format": "int8", "source_path": str(tmp_path / "model"),
        "recipe": {"format": "int8", "bits": 8, "calibration_samples": 0},
        "calibration_path": str(tmp_path / "c.json"), "out_dir": str(tmp_path / "artifact"),
        "manifest": {"engine": "bitsandbytes"}, "threads": 1, "failure_path": str(tmp_path / "failed.json")})


def test_ctrl_c_right_after_the_worker_starts_kills_it_and_keeps_its_log(tmp_path, monkeypatch):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # what a quantgate run has
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(args, **kwargs):
        child = real_popen([sys.executable, "-c", SLOW_WORKER], **kwargs)
        started.append(child)
        time.sleep(2)  # time for its first line to reach the pipe
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, before run_worker has a hold on the child
        return child

    monkeypatch.setattr(launcher.subprocess, "Popen", popen_then_ctrl_c)
    thread_errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: thread_errors.append(hook.exc_value))
    log_path = tmp_path / "worker.log"
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launcher.run_worker(job(tmp_path), tmp_path / "job.json", log_path, "int8")
    [child] = started
    assert child.poll() is not None and time.monotonic() - began < 20  # killed, not left to sleep out its 30 s
    for thread in threading.enumerate():
        if "_relay" in thread.name:  # "Thread-N (_relay_then_release)": its target's name
            thread.join(timeout=10)
    assert thread_errors == []
    assert log_path.read_text() == "started\n"


def test_the_log_closes_when_the_last_writer_releases_it(tmp_path):
    log = launcher._WorkerLog(tmp_path / "w.log")
    log.write("stdout line\n")
    log.release()
    log.write("a late stderr chunk\n")  # the relay, after its join timed out
    log.release()
    assert (tmp_path / "w.log").read_text() == "stdout line\na late stderr chunk\n"
    with pytest.raises(ValueError):
        log.write("after both released")
