"""A toy serving engine added through quantgate's serving-engine seam alone (harness.runtime.serving_engine):
`--backend toyserve` serves each 16-bit format with toy_openai_server.py, a tiny local HTTP server speaking the
OpenAI completions API (streamed, token-id prompts, usage) over transformers' greedy decoding. It shows what an
engine provides: its refusal, its launch plan, start -> endpoint, the facts of its start-up log, and stop."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from harness.runtime.serving_engine import LaunchPlan, ServerFailed, register_serving_engine

SERVER = Path(__file__).with_name("toy_openai_server.py")
VERSION = "0.1"
_KERNEL = re.compile(r"toyserve: decoding with (\w+)")


@dataclass(frozen=True)
class ToyInstall:
    source: str = f"toy server {SERVER.name}"
    version: str = VERSION


class ToyServer:
    def __init__(self, process: subprocess.Popen, base_url: str, log_path: Path) -> None:
        self.process, self.base_url, self.log_path = process, base_url, log_path
        self.startup_s: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def failure_reason(self) -> str:
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no log"


class ToyServeEngine:
    name = "toyserve"
    title = "ToyServe"
    prompt_logprobs = False
    preemptions_metric = None

    def check_endpoints(self, endpoints: dict[str, str]) -> None:
        pass

    def locate(self, spec) -> ToyInstall:
        return ToyInstall()

    def source(self, install):
        return install.source if install else None

    def version(self, install):
        return install.version if install else None

    def cache_identity(self, install):
        return [install.source, install.version] if install else None

    def refusal(self, install, spec, endpoint):
        return None if spec.bits >= 16 else f"ToyServe serves 16-bit checkpoints only ({spec.name} has {spec.bits})"

    def served_dtype(self, requested, config, install):
        return "float32"

    def launch_plan(self, spec, served, install, max_model_len, capacity_plan) -> LaunchPlan:
        return LaunchPlan(("--max-model-len", str(max_model_len)), {}, max_model_len, spec.batch_size, None)

    def shown_command(self, install, served, plan) -> str:
        return f"python {SERVER.name} {served.artifact_path} " + " ".join(plan.args)

    @contextmanager
    def start(self, install, served, plan, log_path: Path, env: dict, startup_timeout_s: float) -> Iterator[ToyServer]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, str(SERVER), str(served.artifact_path), served.name,
                                        str(port), *plan.args], stdout=log, stderr=subprocess.STDOUT, env=env)
        server = ToyServer(process, f"http://127.0.0.1:{port}", log_path)
        began = time.monotonic()
        try:
            while not self.answers(server.base_url):
                if not server.alive():
                    raise ServerFailed(f"the toy server exited: {server.failure_reason()} (log: {log_path})")
                if time.monotonic() - began > startup_timeout_s:
                    raise ServerFailed(f"the toy server was not ready after {startup_timeout_s:.0f}s")
                time.sleep(0.2)
            server.startup_s = round(time.monotonic() - began, 1)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def startup_facts(self, install, plan, server: ToyServer, log_path: Path, offset: int) -> dict:
        with open(log_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", errors="replace")
        return {"kernels": _KERNEL.findall(text)}

    def identify(self, url: str):
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as response:
            return VERSION, json.load(response)["data"]

    def answers(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


register_serving_engine("toyserve", "quantgate_toy_serve:ToyServeEngine")
