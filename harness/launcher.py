"""Run a worker job in a fresh subprocess, relaying its progress and keeping its noise in a log file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness import progress
from harness.cache import atomic_write_json
from harness.errors import Terminated, raise_terminated
from harness.jobs import DeviceJob, QuantizeJob
from harness.measure.rss import RssSampler
from harness.runtime.device import cpu_kernel_environment
from harness.sandbox import apply_offline, cache_locations

# GPTQModel draws its own bars; we read its layer counter from the log to draw ours.
# The lookahead wants the count's end (a non-digit): a read can stop inside "of 29", and "of 2" would draw 4/3.
_LAYER_PROGRESS = re.compile(r"Quantizing [^\n\r]*?layer \[?(\d+) of (\d+)(?=\D)")


@dataclass(frozen=True)
class WorkerExit:
    returncode: int
    log_path: Path
    over_memory_limit: int | None = None  # the RSS (bytes) at which the memory guard killed the worker
    rss_peak_bytes: int | None = None  # the worker's peak RSS as sampled every 50 ms

    @property
    def killed_by(self) -> str | None:
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


def worker_environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` (the caller passes os.environ, or the environment of the process it stands in for) made a worker's:
    offline and with every library cache and temp dir inside our cache (sandbox). `base` is not changed.

    The cache itself is this process's (harness.cache.cache_root reads os.environ's QUANTGATE_CACHE), whatever
    QUANTGATE_CACHE `base` holds."""
    env = dict(base)
    env.update(cache_locations(env))
    apply_offline(env)
    env.update(TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore",
               TQDM_DISABLE="1")
    set_gptqmodel_cpu_workers(env)
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


def set_gptqmodel_cpu_workers(env: MutableMapping[str, str]) -> None:
    """GPTQModel asks for more CPU workers than small machines have unless told: one per core, unless `env` says.
    The one place that sets GPTQMODEL_CPU_WORKERS (quantgate's workers; scripts/gpu_check's, in-process)."""
    env.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, os.cpu_count() or 1)))


def run_worker(job: QuantizeJob | DeviceJob, job_path: Path, log_path: Path, label: str,
               memory_limit_bytes: int | None = None) -> WorkerExit:
    atomic_write_json(job_path, job.to_json())
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**worker_environment(os.environ), **cpu_kernel_environment()}
    log = _WorkerLog(log_path)
    child = relay = watch = None
    try:
        with _ctrl_c_deferred():  # `child` is set, and the threads started, before a Ctrl-C can land
            child = subprocess.Popen([sys.executable, "-m", "harness.worker", str(job_path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                                     encoding="utf-8", errors="replace", bufsize=1,
                                     cwd=job_path.parent)  # GPTQModel writes ./logs/: keep it in the stage directory
            relay = threading.Thread(target=_relay_then_release, args=(child.stderr, log, label), daemon=True)
            relay.start()
            # The worker's RSS (its peak goes into an OOM reason) and, with a limit, a smaller host emulated: the
            # worker SIGKILLed once its RSS passes the limit, as the kernel's OOM killer would.
            watch = RssSampler(child.pid, interval_s=0.05, limit_bytes=memory_limit_bytes,
                               on_limit=lambda rss: child.kill())
            watch.start()
        for line in child.stdout:
            if not progress.handle_protocol_line(line.rstrip("\n"), f"{label}: "):
                log.write(line)
        child.wait()
    except BaseException:
        if child is not None:
            child.kill()
            child.wait()
        raise
    finally:
        if relay is None:
            log.release()  # the relay's share: it never started
        else:
            relay.join(timeout=5)
        if watch is not None:
            watch.stop()
        log.release()
    return WorkerExit(child.returncode, log_path, watch.tripped_at, watch.peak or None)


class _WorkerLog:
    """The worker's log file, written by two threads (stdout lines here, stderr by the relay) and closed when both
    have released it: a relay still reading after its join timed out never writes to a closed file."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()
        self._holders = 2

    def write(self, text: str) -> None:
        with self._lock:
            self._file.write(text)

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._file.close()


@contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (or the CLI's SIGTERM) that arrives inside the block and raise it at the block's end. Between
    Popen and the guard that kills the worker on an interrupt, a Ctrl-C would leave the worker unkilled and its log
    closed under the relay, which then printed a thread's traceback. Only Python's own SIGINT handler and the CLI's
    SIGTERM handler are swapped, and only on the main thread (the only one that receives them)."""
    ours = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: raise_terminated}
    held = {sig: handler for sig, handler in ours.items() if signal.getsignal(sig) is handler} \
        if threading.current_thread() is threading.main_thread() else {}
    if not held:
        yield
        return
    caught: list[int] = []
    for sig in held:
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    if caught:
        raise Terminated() if signal.SIGTERM in caught else KeyboardInterrupt


def _relay_then_release(stream, log: _WorkerLog, label: str) -> None:
    try:
        _relay_stderr(stream, log, label)
    finally:
        log.release()


def _relay_stderr(stream, log, label: str) -> None:
    """Copy the worker's stderr to the log, turning GPTQModel's "Quantizing layer i of N" (0-based: N + 1
    layers) into our bar; the bar is completed when the stream ends after the last layer started."""
    last = (-1, -1)
    buffer = ""
    while chunk := stream.read(4096):
        log.write(chunk)
        buffer = (buffer + chunk)[-8192:]
        matches = _LAYER_PROGRESS.findall(buffer)
        if matches:
            index, last_index = (int(x) for x in matches[-1])
            if (index, last_index) != last:
                last = (index, last_index)
                progress.step(f"{label}: quantizing layers", index, last_index + 1)
            buffer = buffer[-200:]
    if last[0] >= 0 and last[0] == last[1]:
        progress.step(f"{label}: quantizing layers", last[1] + 1, last[1] + 1)
