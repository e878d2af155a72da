"""The one RSS sampler: a thread that reads a process's resident memory (with its descendants when asked) every
interval and keeps the peak; with a limit, it calls `on_limit` once the RSS passes it and stops. Used where the
kernel keeps no peak for us: this process where VmHWM cannot be reset (harness.measure.memory), a worker with its
memory limit (harness.launcher), a server's process tree (harness.served)."""

from __future__ import annotations

import threading
from typing import Callable


def status_kib(field: str) -> int:
    """A kB field of /proc/self/status (VmRSS, VmHWM): cheaper than psutil, read every 10 ms."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def own_rss_bytes() -> int:
    return status_kib("VmRSS") * 1024


class RssSampler(threading.Thread):
    """`start()`, then `stop()` returns the peak (also in `peak`). pid None: this process; `tree`: the process and
    all its descendants, summed. A process that cannot be read (gone) ends the sampling, or is skipped for a tree
    whose members come and go."""

    def __init__(self, pid: int | None = None, *, interval_s: float = 0.01, tree: bool = False,
                 limit_bytes: int | None = None, on_limit: Callable[[int], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.interval_s, self.tree, self.limit_bytes, self.on_limit = interval_s, tree, limit_bytes, on_limit
        self._process = None
        if pid is not None:
            import psutil

            self._process = psutil.Process(pid)
        self.peak = own_rss_bytes() if pid is None else 0
        self.tripped_at: int | None = None  # the RSS that passed limit_bytes
        self._done = threading.Event()

    def read(self) -> int:
        if self._process is None:
            return own_rss_bytes()
        if not self.tree:
            return self._process.memory_info().rss
        return sum(p.memory_info().rss for p in [self._process, *self._process.children(recursive=True)])

    def run(self) -> None:
        import psutil

        while not self._done.wait(self.interval_s):
            try:
                rss = self.read()
            except psutil.Error:
                if self.tree:
                    continue
                return
            self.peak = max(self.peak, rss)
            if self.limit_bytes and rss > self.limit_bytes:
                self.tripped_at = rss
                if self.on_limit:
                    self.on_limit(rss)
                return

    def stop(self) -> int:
        self._done.set()
        if self.is_alive():
            self.join()
        if self._process is None:
            self.peak = max(self.peak, own_rss_bytes())
        return self.peak

    def __enter__(self) -> "RssSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
