"""Console output for long steps: one status line per event, a redrawn bar for counted work.

Worker subprocesses cannot draw on the console: they emit `@@progress {json}` lines on stdout, which the
parent turns back into calls here (see harness.launcher).
"""

from __future__ import annotations

import json
import sys
import time

PROTOCOL_PREFIX = "@@progress "
_quiet = False
_as_protocol = False
_protocol_stream = None


def configure(*, quiet: bool = False, protocol_stream=None) -> None:
    """protocol_stream: in a worker, the pipe to the parent (stdout itself is redirected to the log)."""
    global _quiet, _as_protocol, _protocol_stream
    _quiet, _as_protocol, _protocol_stream = quiet, protocol_stream is not None, protocol_stream


def say(message: str) -> None:
    if _as_protocol:
        _emit({"say": message})
    elif not _quiet:
        _clear_bar()
        print(f"[quantgate] {message}", file=sys.stderr, flush=True)


_bar_open = False
_bar_started: dict[str, float] = {}


def step(label: str, done: int, total: int) -> None:
    """Report counted progress; the console shows `label [#####.....] done/total  eta`."""
    if _as_protocol:
        _emit({"step": label, "done": done, "total": total})
        return
    if _quiet:
        return
    global _bar_open
    started = _bar_started.setdefault(label, time.monotonic())
    elapsed = time.monotonic() - started
    eta = f" eta {elapsed / done * (total - done):4.0f}s" if 0 < done < total else f" {elapsed:5.1f}s"
    width = 24
    filled = int(width * done / total) if total else width
    line = f"\r[quantgate] {label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{eta}"
    if sys.stderr.isatty():
        print(line, end="", file=sys.stderr, flush=True)
        _bar_open = True
        if done >= total:
            print(file=sys.stderr, flush=True)
            _bar_open = False
    elif done >= total or done == 0 or done % max(1, total // 4) == 0:
        print(line.lstrip("\r"), file=sys.stderr, flush=True)
    if done >= total:
        _bar_started.pop(label, None)


def handle_protocol_line(line: str, prefix_label: str = "") -> bool:
    """Replay a worker's progress line here; False when the line is not progress."""
    if not line.startswith(PROTOCOL_PREFIX):
        return False
    try:
        event = json.loads(line[len(PROTOCOL_PREFIX):])
    except ValueError:
        return False
    if "say" in event:
        say(f"{prefix_label}{event['say']}")
    elif "step" in event:
        step(f"{prefix_label}{event['step']}", int(event["done"]), int(event["total"]))
    return True


def _emit(event: dict) -> None:
    _protocol_stream.write(PROTOCOL_PREFIX + json.dumps(event, ensure_ascii=False) + "\n")
    _protocol_stream.flush()


def _clear_bar() -> None:
    global _bar_open
    if _bar_open:
        print(file=sys.stderr, flush=True)
        _bar_open = False
