"""The serving-engine seam: what quantgate asks of an engine that serves a format over an OpenAI-compatible HTTP API
(`--backend NAME`). vLLM is one (harness/runtime/vllm/engine.py); a plugin registers its own with
register_serving_engine. The served stage (harness.served) names no engine: it asks the engine whether it can serve
a format (refusal), how it would launch it (launch_plan), starts it (start: a running server with its endpoint,
stopped on leaving the `with`), reads what the engine logged at start-up (startup_facts), then scores and times
the format through the endpoint.

An entry is "module:Class", imported only when a run names the engine (as a runtime or a quantizer is)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

from harness.errors import UserError
from harness.formats import FormatSpec
from harness.runtime.vllm.client import Sampling


@dataclass(frozen=True)
class ServedFormat:
    """What an engine needs about one format to serve it."""

    name: str
    artifact_key: str
    artifact_path: Path
    dtype: str  # the engine's --dtype
    kv_bytes_per_token: int  # at that dtype
    sampling: Sampling
    spec: FormatSpec  # its quantization method and what an engine cannot serve
    devices: str | None = None  # --devices: CUDA_VISIBLE_DEVICES of its server


@dataclass(frozen=True)
class KvPrediction:
    """What the engine's KV cache should hold with the launch plan's settings."""

    block_size: int
    max_model_len: int
    tokens: int
    max_concurrency: float
    bytes_per_token: int


@dataclass(frozen=True)
class LaunchPlan:
    """How the engine is started for one format: its arguments and environment, the longest request it takes, how
    many requests it runs at once, and its predicted KV cache (None where nothing is predicted)."""

    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    max_model_len: int = 0
    max_num_seqs: int = 1
    kv: KvPrediction | None = None


class PlanDoesNotFit(Exception):
    """On a GPU: the format's capacity plan for this device does not fit, so its server is not started."""


class ServerFailed(RuntimeError):
    """The server did not come up, died, or serves something else than planned; the message says why."""


class RunningServer(Protocol):
    base_url: str  # http://127.0.0.1:PORT
    startup_s: float | None

    @property
    def pid(self) -> int | None: ...  # the process whose tree holds the server (its peak RSS is measured)

    def alive(self) -> bool: ...

    def failure_reason(self) -> str: ...


class ServingEngine(Protocol):
    name: str  # the --backend value and the served block's `engine`
    title: str  # as the engine writes its name: "vLLM"
    prompt_logprobs: bool  # answers `prompt_logprobs` (fidelity through the server)
    preemptions_metric: str | None  # the /metrics counter of preempted requests (the saturation check)

    def check_endpoints(self, endpoints: dict[str, str]) -> None:
        """Each user-run server (format -> URL) answers as this engine; UserError otherwise, before any work."""

    def locate(self, spec) -> Any | None:
        """The install the run starts servers from (None: endpoints only); UserError when there is none."""

    def source(self, install: Any | None) -> str | None: ...

    def version(self, install: Any | None) -> str | None: ...

    def cache_identity(self, install: Any | None) -> list | None:
        """What of the install a served figure depends on (part of its cache key)."""

    def refusal(self, install: Any | None, spec: FormatSpec, endpoint: str | None) -> str | None:
        """Why the engine cannot serve this format, found before anything loads (the engine's own reason where it
        can be asked); None when it can."""

    def served_dtype(self, requested: str, config: dict, install: Any | None) -> str: ...

    def launch_plan(self, spec, served: ServedFormat, install: Any | None, max_model_len: int,
                    capacity_plan: Callable[[], Any]) -> LaunchPlan:
        """The launch settings; capacity_plan() gives the report's capacity plan for this GPU (None without one).
        Raises PlanDoesNotFit when the plan says the format does not fit."""

    def start(self, install: Any, served: ServedFormat, plan: LaunchPlan, log_path: Path, env: dict[str, str],
              startup_timeout_s: float) -> ContextManager[RunningServer]:
        """Start the server, wait until it answers, and stop it (its whole process tree) when the `with` ends;
        ServerFailed when it does not come up."""

    def shown_command(self, install: Any, served: ServedFormat, plan: LaunchPlan) -> str:
        """The command as a user would type it."""

    def startup_facts(self, install: Any, plan: LaunchPlan, server: RunningServer, log_path: Path,
                      offset: int) -> dict:
        """The served block's entries the engine's start-up log and process give (kernels, kv_cache, ...); raises
        ServerFailed when the server took another path than planned."""

    def identify(self, url: str) -> tuple[str | None, list[dict]]:
        """(version, models) of a server the user runs; UserError-free: raises ServerFailed when it is not this
        engine."""

    def answers(self, url: str) -> bool: ...


SERVING_ENGINES: dict[str, str] = {"vllm": "harness.runtime.vllm.engine:VllmEngine"}


def register_serving_engine(name: str, implementation: str) -> None:
    """Declare a serving engine: `implementation` is the "module:Class" of a ServingEngine."""
    SERVING_ENGINES[name] = implementation


def is_serving_engine(backend: str) -> bool:
    return backend in SERVING_ENGINES


def serving_engine_title(name: str) -> str:
    """As the engine writes its name ("vLLM"); the name itself for an engine this process has not registered."""
    return serving_engine(name).title if name in SERVING_ENGINES else name


def serving_engine(name: str) -> ServingEngine:
    try:
        implementation = SERVING_ENGINES[name]
    except KeyError:
        raise UserError(f"unknown serving engine '{name}' (known: {', '.join(SERVING_ENGINES)})") from None
    module, _, attribute = implementation.partition(":")
    return getattr(importlib.import_module(module), attribute)()
