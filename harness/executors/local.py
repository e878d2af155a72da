"""The local executor (the default): every chain on this machine, as subprocesses of this process. One format
after another; with --devices split into several device groups, one lane per group runs the next format not yet
started (its workers and server see only that group's GPUs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from harness import progress
from harness.errors import UserError
from harness.executors.base import Executor
from harness.records import FormatRun


def check(spec) -> None:
    """--cache URL is for a cluster's nodes; on this machine the cache is the directory QUANTGATE_CACHE names."""
    if spec.cache_url:
        raise UserError(f"--cache {spec.cache_url}: a cache URL is for --executor ray; on one machine set "
                        "QUANTGATE_CACHE to a directory instead")


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, inputs, chain) -> None:
        super().__init__(inputs, chain)
        self._queued: list[tuple[str, str | None]] = []

    def submit(self, fmt: str, devices: str | None = None) -> None:
        self._queued.append((fmt, devices))

    def wait(self) -> Iterator[tuple[str, FormatRun]]:
        queued, self._queued = self._queued, []
        groups = self.inputs.spec.device_groups()
        pinned = [(fmt, devices) for fmt, devices in queued if devices is not None]
        free = [fmt for fmt, devices in queued if devices is None]
        if len(groups) > 1 and free:
            yield from self._lanes(free, groups)
        else:
            pinned = [(fmt, groups[0] if groups else None) for fmt in free] + pinned
        for fmt, devices in pinned:
            yield fmt, self.chain(self.inputs, fmt, devices)

    def _lanes(self, formats: list[str], groups: list[str]) -> Iterator[tuple[str, FormatRun]]:
        waiting = list(formats)
        runs: dict[str, FormatRun] = {}
        lock = threading.Lock()

        def lane(devices: str) -> None:
            while True:
                with lock:
                    if not waiting:
                        return
                    fmt = waiting.pop(0)
                try:
                    runs[fmt] = self.chain(self.inputs, fmt, devices)
                except Exception as exc:  # noqa: BLE001 - one lane's failure must not lose the other formats
                    runs[fmt] = FormatRun(fmt, status="failed", error=f"internal error on devices {devices}: {exc}")

        progress.say(f"running formats in parallel on device groups {' | '.join(groups)}")
        lanes = [threading.Thread(target=lane, args=(group,), daemon=True) for group in groups]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            while thread.is_alive():
                thread.join(0.5)  # a short join keeps Ctrl-C deliverable to this thread
        yield from ((fmt, runs[fmt]) for fmt in formats if fmt in runs)
