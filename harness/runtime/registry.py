"""The in-process runtimes by name: which `Runtime` (harness.runtime.base) loads an artifact in a worker.

An entry is "module:Class", imported only when a worker loads with it (as a FormatSpec's quantizer is). A plugin
(QUANTGATE_PLUGINS) may register its own; workers import the plugins before they load (harness.worker).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from harness.errors import UserError
from harness.runtime.base import Runtime

RUNTIMES: dict[str, str] = {"transformers": "harness.runtime.transformers_backend:LoadedModel"}


def register_runtime(name: str, implementation: str) -> None:
    """Declare a runtime: `implementation` is the "module:Class" of a Runtime."""
    RUNTIMES[name] = implementation


def runtime_class(name: str) -> type[Runtime]:
    try:
        implementation = RUNTIMES[name]
    except KeyError:
        raise UserError(f"unknown runtime '{name}' (known: {', '.join(RUNTIMES)})") from None
    module, _, attribute = implementation.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_runtime(name: str, artifact_path: Path, *, dtype: str = "auto", trust_remote_code: bool = False) -> Runtime:
    """The artifact loaded by runtime `name`, ready to encode and generate."""
    return runtime_class(name).load(artifact_path, dtype=dtype, trust_remote_code=trust_remote_code)
