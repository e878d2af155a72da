"""Keep library noise off the user's console.

torchao prints "Failed to load ..._C_mxfp8..." at import from C++ (so Python's logging cannot catch it), GPTQModel
prints a banner, bitsandbytes warns on every matmul. Workers send all of it to their log file; in the parent
process the few imports we need are wrapped in quiet_imports(), which redirects the OS-level stdout/stderr, and
library work done there (the demo's GGUF conversion) in output_to(), which keeps it in a log file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path


@contextlib.contextmanager
def quiet_imports():
    with tempfile.TemporaryFile(mode="w+") as sink, _redirected(sink):
        yield


@contextlib.contextmanager
def output_to(log_path: Path):
    """Library work in this process (the demo's GGUF conversion) with its stdout/stderr appended to `log_path`:
    torchao's load errors, torch's pytree warnings and transformers' bars stay off the console but are kept."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as sink, _redirected(sink):
        yield


@contextlib.contextmanager
def _redirected(sink):
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class OncePerMessage(logging.Filter):
    """Lets each distinct message of a logger through once: bitsandbytes logs "MatMul8bitLt: inputs will be cast
    from torch.bfloat16 to float16" on every 8-bit matmul (16 MB of an int8 worker's log on 16 items)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.msg, record.args if isinstance(record.args, tuple) else ())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def quiet_repeated_library_logs() -> None:
    """In a worker: each repeated library log line once (the vLLM servers get the same from server_site)."""
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(OncePerMessage())
