"""The Ray executor (`--executor ray`): each format's chain is one Ray task, placed by Ray on any node with room.

A task asks for GPUs = tensor x pipeline parallel size when the cluster has GPUs (else one CPU), and for memory:
the format's --memory-limit-gib, else its planned weights (harness.executors.resources); a request no live node can
meet fails the format at once with the reason, rather than waiting for ever. The run's inputs go to the cluster
once (ray.put); each task's FormatRun comes back through the object store (a few KB). Stage results, artifacts and
the baseline's fidelity references are written to the cache directory this process uses (QUANTGATE_CACHE): on more
than one machine that must be storage every node mounts at the same path (docs/scale.md), and its content-hash keys
hold on any node.

Faults: a task whose node or worker dies is retried once (max_retries=1), its finished stages reused from the
shared cache, then the format fails with Ray's reason. A Ctrl-C or SIGTERM cancels every task (the task kills its
worker subprocesses first) and a local Ray started for the run is stopped, leaving no raylet or worker behind.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from harness import progress
from harness.cache import CACHE_ENV, cache_root
from harness.errors import UserError
from harness.executors.base import ClusterInfo, ClusterNode, Executor, Placement
from harness.executors.remote_cache import RemoteCache, check_url
from harness.executors.resources import task_request, unmet_reason
from harness.records import FormatRun

INSTALL = "pip install 'quantgate[ray]'"
# A task's results are small (FormatRun records): a local Ray needs no more object store than this.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
RAY_TEMP_DIR_MAX = 40
CONNECT_TIMEOUT_S = 5.0
CANCEL_GRACE_S = 15.0  # for a cancelled task to kill its worker subprocesses before Ray kills the task
# Set once this process has been a Ray driver: harness.__main__ then ends it with exit_after_ray().
DRIVER_RAN = threading.Event()


def check(spec) -> None:
    """Before any work: Ray installed, and something answering at a HOST:PORT address (ray.init would retry an
    unreachable one for ever, deaf to SIGTERM)."""
    check_installed()
    if spec.cache_url:
        check_url(spec.cache_url)
    address = spec.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address and "://" not in address and address not in ("auto", "local"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not HOST:PORT"
            raise UserError(f"--ray-address {address}: no Ray cluster answers there ({reason}); give the head's "
                            "HOST:PORT (its GCS port, 6379 by default), ray://HOST:10001, or auto on a node of it")


def check_installed() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError(f"--executor ray: Ray is not installed here; install it with {INSTALL}") from None


class RayExecutor(Executor):
    name = "ray"

    def __init__(self, inputs, chain) -> None:
        super().__init__(inputs, chain)
        check_installed()
        import ray

        self._ray = ray
        address = inputs.spec.ray_address or os.environ.get("RAY_ADDRESS") or None
        sigterm = signal.getsignal(signal.SIGTERM)
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every format's progress lines, not "[repeated 2x]"
        if address is None:  # "local": a new instance, never one that happens to run on this machine already
            progress.say("starting a local Ray instance for this run (--ray-address or RAY_ADDRESS: a cluster)")
            ray.init(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                     configure_logging=False, log_to_driver=True, _temp_dir=local_ray_temp_dir())
        else:
            ray.init(address=address, configure_logging=False, log_to_driver=True)
        DRIVER_RAN.set()
        if threading.current_thread() is threading.main_thread() and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)  # ray.init's own handler exits; ours writes the partial report
        self._pending: dict[object, str] = {}
        self._refused: list[tuple[str, FormatRun]] = []
        self._nodes: dict[str, str] = {}
        self._cluster = describe_cluster(ray)
        self._address = ray.get_runtime_context().gcs_address
        self._remote = RemoteCache(inputs.spec.cache_url) if inputs.spec.cache_url else None
        if self._remote is not None:  # the converted demo model, which tasks on other nodes load
            progress.say(f"cache: {self._remote.url} (pushed {self._remote.push(cache_root(), ('models',))} file(s))")
        self._inputs = ray.put(inputs)
        self._task = ray.remote(run_chain_task)
        progress.say(f"Ray {ray.__version__} cluster of {len(self._cluster.nodes)} node(s): " + ", ".join(
            f"{n.node} ({n.cpus:g} CPU, {n.gpus:g} GPU, {n.memory_bytes / 2**30:.1f} GiB)"
            for n in self._cluster.nodes))

    def submit(self, fmt: str, devices: str | None = None) -> None:
        request = task_request(self.inputs, fmt, self._cluster)
        unmet = unmet_reason(request, self._cluster)
        if unmet:
            progress.say(f"{fmt}: {unmet}")
            self._refused.append((fmt, FormatRun(fmt, status="failed", error=unmet)))
            return
        if request.spans_nodes:
            from harness.runtime.vllm.multinode import spanning_note

            spec = self.inputs.spec
            progress.say(f"{fmt}: " + spanning_note((spec.tensor_parallel_size, spec.pipeline_parallel_size),
                                                    self._cluster.gpus_per_node()))
        cluster = (self._cluster.gpus_per_node(), self._address)
        ref = self._task.options(**request.ray_options(), max_retries=1, retry_exceptions=False,
                                 name=f"quantgate {fmt}").remote(
            self.chain, self._inputs, fmt, str(cache_root()), bool(getattr(progress, "_quiet", False)), cluster,
            self._remote)
        self._pending[ref] = fmt

    def wait(self) -> Iterator[tuple[str, FormatRun]]:
        refused, self._refused = self._refused, []
        yield from refused
        while self._pending:
            done, _ = self._ray.wait(list(self._pending), num_returns=1, timeout=0.5)
            for ref in done:
                fmt = self._pending.pop(ref)
                yield fmt, self._result(fmt, ref)

    def _result(self, fmt: str, ref) -> FormatRun:
        exceptions = self._ray.exceptions
        try:
            run, node = self._ray.get(ref)
        except exceptions.TaskCancelledError:
            return FormatRun(fmt, status="interrupted", error="not run: the run was interrupted")
        except exceptions.RayTaskError as exc:  # the chain itself raised: as a lane's internal error
            return FormatRun(fmt, status="failed", error=f"internal error in its Ray task: {_first_line(exc.cause)}")
        except exceptions.RayError as exc:  # its node or worker died, twice (retried once)
            return FormatRun(fmt, status="failed", error=f"its Ray task was lost, and again when retried once: "
                                                         f"{type(exc).__name__}: {_first_line(exc)}")
        self._nodes[fmt] = node
        if self._remote is not None:
            self._remote.pull(cache_root())  # its stage results, which the report reads here
        return run

    def cancel(self) -> None:
        refs = list(self._pending)
        if not refs:
            return
        progress.say(f"cancelling {len(refs)} Ray task(s)")
        for ref in refs:
            self._ray.cancel(ref)  # a KeyboardInterrupt in the task: it kills its worker subprocesses, then ends
        _, left = self._ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
        for ref in left:
            self._ray.cancel(ref, force=True)
        self._pending.clear()

    def close(self) -> None:
        self._ray.shutdown()  # a local Ray started here stops with it; a cluster is only disconnected from

    def placement(self) -> Placement:
        return Placement(self._cluster, dict(self._nodes))


def exit_after_ray(code: int) -> None:
    """End a process that was a Ray driver, after ray.shutdown(), without C++ static destructors. Ray 2.x's
    _raylet.so joins its IO thread pool in a static destructor at exit(), and that thread can be blocked on the
    pool's own mutex, so the process hangs for ever after its report is written (seen in CI: a resumed
    `quantgate run --executor ray` alive 30 minutes after "Driver shutdown complete"; gdb: exit() ->
    ~thread_pool -> join, worker.io in scheduler::stopped()). Ray ends its own workers with os._exit for the same
    reason (ray-project/ray#18899). Python's atexit handlers run first, and stdout/stderr are flushed, so nothing
    the run printed or registered is lost."""
    import atexit
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, or a closed stream: nothing left to write to
            pass
    os._exit(code)


def local_ray_temp_dir() -> str:
    """Where a local Ray keeps its session (sockets, logs): TMPDIR's ray/ (which the sandbox puts in the cache), unless
    that path is too long for the Unix sockets under it (107 bytes, with ~62 of Ray's own after it): then /tmp/ray."""
    temp = os.path.join(tempfile.gettempdir(), "ray")
    return temp if len(temp) <= RAY_TEMP_DIR_MAX else os.path.join("/tmp", "ray")


def describe_cluster(ray) -> ClusterInfo:
    nodes = tuple(ClusterNode(node_name(n["NodeManagerAddress"], n["NodeID"]), float(n["Resources"].get("CPU", 0)),
                              float(n["Resources"].get("GPU", 0)), int(n["Resources"].get("memory", 0)))
                  for n in ray.nodes() if n.get("Alive"))
    return ClusterInfo("ray", ray.__version__, nodes)


def node_name(address: str, node_id: str) -> str:
    return f"{address} ({node_id[:8]})"


def run_chain_task(chain, inputs, fmt: str, cache: str, quiet: bool, cluster: tuple[int, str | None] = (0, None),
                   remote: RemoteCache | None = None) -> tuple[FormatRun, str]:
    """The body of one format's Ray task, on whichever node Ray chose: the chain, with this run's cache, the GPUs
    Ray gave the task, and the cluster (the GPUs of its largest node, its address) for a vLLM server that must span
    nodes (harness.runtime.vllm.multinode). With --cache URL, what the chain may reuse is pulled from that store
    first, and what it wrote is pushed there after it, finished or not (harness.executors.remote_cache). The chain
    runs in a thread so that a cancel (a KeyboardInterrupt in this, the task's main thread) is seen at once, and
    the worker subprocesses it started are killed before the task ends."""
    import ray

    from harness.runtime.vllm.multinode import CLUSTER_ADDRESS_ENV, NODE_GPUS_ENV

    os.environ[CACHE_ENV] = cache
    node_gpus, address = cluster
    os.environ[NODE_GPUS_ENV] = str(node_gpus)
    if address:
        os.environ[CLUSTER_ADDRESS_ENV] = address
    progress.configure(quiet=quiet)
    context = ray.get_runtime_context()
    node = node_name(ray.util.get_node_ip_address(), context.get_node_id())
    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) or None
    progress.say(f"{fmt}: running on node {node}" + (f", GPUs {gpus}" if gpus else ""))
    if remote is not None:
        progress.say(f"{fmt}: {remote.pull(Path(cache), (fmt,))} file(s) pulled from {remote.url}")
    box: dict = {}

    def run() -> None:
        try:
            box["run"] = chain(inputs, fmt, gpus)
        except BaseException as exc:  # noqa: BLE001 - raised again in the task's main thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"quantgate {fmt}", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except BaseException:
        deadline = time.monotonic() + CANCEL_GRACE_S
        while thread.is_alive() and time.monotonic() < deadline:
            _kill_children()  # the chain may be between two workers: keep killing until it has returned
            thread.join(0.2)
        raise
    if remote is not None:  # the stages it finished, for a retry elsewhere and for later runs on any node
        progress.say(f"{fmt}: {remote.push(Path(cache), formats=(fmt,))} file(s) pushed to {remote.url}")
    if "error" in box:
        raise box["error"]
    progress.say(f"{fmt}: finished on node {node}")
    return box["run"], node


def _kill_children() -> None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
