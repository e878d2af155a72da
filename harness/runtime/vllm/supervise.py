"""Keep a server from outliving quantgate: `python -m harness.runtime.vllm.supervise GRACE_S -- COMMAND...`.

The command runs in its own process group. Its group (vLLM's API server and its engine workers) is stopped with
SIGTERM, then SIGKILL after GRACE_S seconds, when any of these happens: quantgate closes this process's stdin
(a normal stop), quantgate dies (even by `kill -9`: the pipe closes with it), or this process gets SIGTERM/SIGINT.
Exits with the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def stop_group(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child's process group, SIGKILL whatever is left after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if child.poll() is not None and not _group_alive(child.pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _term_when_parent_dies() -> None:
    """Linux: the server gets SIGTERM should this supervisor itself be killed (e.g. `kill -9 -PGID`)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    grace_s = float(argv[0])
    command = argv[argv.index("--") + 1:]
    child = subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL,
                             preexec_fn=_term_when_parent_dies)
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())

    def watch_parent() -> None:
        sys.stdin.buffer.read()  # returns at EOF: quantgate closed the pipe or died
        stop_requested.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    while child.poll() is None and not stop_requested.wait(0.2):
        pass
    stop_group(child, grace_s)  # also when the API server exited by itself: its engine workers may be left
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
