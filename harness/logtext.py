"""Why a log says it failed: the exception it stated last that names a cause, not one that only points at another.

Shared by the worker's failure reasons (collect), the vLLM server's (runtime.vllm.server) and `diagnose`.
"""

from __future__ import annotations

import re

# "ValueError: Failed to find a kernel ...", "torch.OutOfMemoryError: CUDA out of memory ..."
STATED = re.compile(r"\b(?:\w+\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit): \S")
# an exception that only points at another (vLLM's "EngineCore encountered an issue. See stack trace (above) for the
# root cause", "Engine core initialization failed. See root cause above"), a server's access-log line for a request
# that failed because of it, or the interpreter's complaint at shutdown: the line that names why is before it
WRAPPER = re.compile(r"root cause|stack trace \(above\)|EngineDeadError|\d{3} Internal Server Error|"
                     r"Fatal Python error: _enter_buffered_busy", re.I)


def is_cause(line: str) -> bool:
    """Whether the line states an exception that names why (not a wrapper of another)."""
    return bool(STATED.search(line)) and not WRAPPER.search(line)


def last_cause(lines: list[str]) -> str | None:
    """The last line that states a cause (is_cause), stripped; None when there is none."""
    for line in reversed(lines):
        if is_cause(line):
            return line.strip()
    return None
