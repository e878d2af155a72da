"""The executor seam: how the formats' chains run (one after another, in device lanes, or as tasks on a cluster).

A format's chain is pipeline.run_format (quantize -> the one model load that measures, generates and compares ->
the served run when asked), called as chain(inputs, fmt, devices) and returning the format's FormatRun. An
executor is given every chain to run with submit(), hands each one's FormatRun back from wait() as it finishes,
and stops them all on cancel(); close() gives back what it started (a local Ray instance, say).
harness.executors.registry names them; run_chains is the order every executor follows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.records import FormatRun, RunInputs

Chain = Callable[[RunInputs, str, "str | None"], FormatRun]

NO_REFERENCE = "no baseline reference"  # the fidelity note of a format that ran beside the baseline


@dataclass(frozen=True)
class ClusterNode:
    """One live node of the cluster when the run started, as its scheduler counts it."""

    node: str  # "ADDRESS (NODE-ID)", its first 8 hex digits
    cpus: float
    gpus: float
    memory_bytes: int  # what the scheduler may give tasks (Ray's `memory` resource), not the node's whole RAM


@dataclass(frozen=True)
class ClusterInfo:
    executor: str  # "ray"
    version: str  # the driver's Ray version
    nodes: tuple[ClusterNode, ...]

    def gpus_per_node(self) -> int:
        """The GPUs of the largest node: more than that for one format spans nodes."""
        return int(max((n.gpus for n in self.nodes), default=0))


@dataclass(frozen=True)
class Placement:
    """Where the chains ran, for the report: the cluster (None on this machine alone) and each format's node."""

    cluster: ClusterInfo | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # format -> the node its chain ran on


class Executor(ABC):
    name: str = ""

    def __init__(self, inputs: RunInputs, chain: Chain) -> None:
        self.inputs = inputs
        self.chain = chain

    @abstractmethod
    def submit(self, fmt: str, devices: str | None = None) -> None:
        """Queue one format's chain; `devices` pins it to that device group (a rerun where it ran before)."""

    @abstractmethod
    def wait(self) -> Iterator[tuple[str, FormatRun]]:
        """Every chain submitted since the last wait, as (format, FormatRun), each as it finishes; a Ctrl-C or
        SIGTERM reaches the caller while it waits."""

    def cancel(self) -> None:
        """Stop every chain still running (the run was interrupted)."""

    def close(self) -> None:
        """Give back what the executor started."""

    def placement(self) -> Placement:
        return Placement()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is not None:
                self.cancel()
        finally:
            self.close()


def run_chains(executor: Executor, formats: list[str], runs: dict[str, FormatRun]) -> None:
    """Every format's chain, the baseline's submitted first (its fidelity reference is what the others compare
    with). A format that ran beside the baseline found no reference yet: its chain runs again once the baseline
    is done, on the devices it had, and only its comparison is left to do (all else of it is cached)."""
    for fmt in formats:
        executor.submit(fmt)
    for fmt, run in executor.wait():
        runs[fmt] = run
    baseline = runs.get("baseline")
    again = [fmt for fmt in formats if fmt != "baseline" and (run := runs.get(fmt)) is not None
             and run.status == "ok" and (run.fidelity_note or "").startswith(NO_REFERENCE)
             and baseline is not None and baseline.status == "ok"]
    for fmt in again:
        executor.submit(fmt, runs[fmt].devices)
    for fmt, run in executor.wait():
        runs[fmt] = run
