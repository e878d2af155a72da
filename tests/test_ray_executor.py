"""`--executor ray` on a real Ray cluster on this machine: a head and two worker nodes (ray.cluster_utils.Cluster,
each worker with one CPU and a resource of its own), the tiny random Llama's baseline and int8 spread over them.
The scores and verdicts are the local executor's; a worker node killed mid-run is survived (the format reruns on the
other node) or named; SIGTERM cancels every task and stops the local Ray the run started, leaving no raylet or
worker; `--resume` on the same cache finishes on the cluster. No mock of Ray: without it installed the cluster tests
skip (QUANTGATE_REQUIRE_RAY=1 makes that a failure).

The executor seam itself (registry, flags, pipeline.py naming no executor) is checked without Ray.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, ours, quantgate
from test_faults import SIZES, comparable, write_sets

try:
    import ray
except ImportError:
    ray = None


def _need_ray():
    if ray is None:
        if os.environ.get("QUANTGATE_REQUIRE_RAY") == "1":
            pytest.fail("ray is not installed but QUANTGATE_REQUIRE_RAY=1 (pip install 'quantgate[ray]')")
        pytest.skip("ray is not installed (pip install 'quantgate[ray]')")


# ---------------------------------------------------------------- the seam, without Ray


def test_pipeline_names_no_executor_and_stays_short():
    text = (ROOT / "harness" / "pipeline.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 260
    for name in ("LocalExecutor", "RayExecutor", "executors.local", "executors.ray", "threading", "import ray"):
        assert name not in text, name
    assert "executor_for(" in text


def test_a_new_executor_is_one_registry_line():
    from harness.config import RunSpec
    from harness.executors.base import Executor
    from harness.executors.registry import EXECUTORS, executor_class

    assert set(EXECUTORS) == {"local", "ray"}
    assert issubclass(executor_class("local"), Executor)
    assert RunSpec().executor == "local" and RunSpec().ray_address is None
    with pytest.raises(ValueError, match="executor must be one of local, ray"):
        RunSpec(executor="slurm")


def test_ray_without_ray_installed_is_one_line_exit_2_before_any_work(tmp_path):
    """Ray made unimportable in the child (sys.modules['ray'] = None, as when it is not installed)."""
    code = ("import sys; sys.modules['ray'] = None; from harness.cli import main; "
            f"sys.exit(main(['run', '--executor', 'ray', '--out', {str(tmp_path / 'out')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), QUANTGATE_CACHE=str(tmp_path / "cache")))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'quantgate[ray]'" in lines[0], result.stderr
    assert not (tmp_path / "out" / "run.json").exists()  # refused before the inputs were even saved


def test_an_unreachable_ray_address_is_one_line_exit_2_before_any_work(tmp_path):
    """ray.init retries an address where nothing listens for ever (and ignores SIGTERM meanwhile): refused first."""
    _need_ray()
    out = tmp_path / "out"
    result = quantgate("run", "--executor", "ray", "--ray-address", "127.0.0.1:1", "--out", str(out),
                       cache=tmp_path / "cache", check_codes=(2,), timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--ray-address 127.0.0.1:1: no Ray cluster answers there" in lines[0], result.stderr
    assert not (out / "run.json").exists()


def test_resume_may_move_to_another_executor(tmp_path):
    from harness.commands.run import spec_from_args
    from harness.config import RunSpec

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(RunSpec(out=str(out)).model_dump()))
    args = _run_args(["--resume", "--out", str(out), "--executor", "ray", "--ray-address", "head:6379",
                      "--cache", "s3://bucket/quantgate"])
    spec = spec_from_args(args)
    assert (spec.executor, spec.ray_address, spec.cache_url) == ("ray", "head:6379", "s3://bucket/quantgate")


def _run_args(argv):
    import argparse

    from harness.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


# ---------------------------------------------------------------- a real cluster (slow)

NODE_LINE = re.compile(r"(\w+): running on node (\S+) \((\w{8})\)")


@pytest.fixture(scope="module")
def cluster():
    _need_ray()
    from ray.cluster_utils import Cluster

    small = dict(object_store_memory=80 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **small))
    for name in ("node_a", "node_b"):
        cluster.add_node(num_cpus=1, resources={name: 1}, **small)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def tiny(demo_checkpoint, tmp_path_factory):
    from conftest import tiny_llama

    model = tiny_llama(demo_checkpoint, tmp_path_factory.mktemp("tiny") / "model")
    sets = write_sets(tmp_path_factory.mktemp("sets"), summaries=2)
    return ("--model", str(model), "--formats", "baseline,int8", "--evalsets", str(sets), *SIZES)


@pytest.fixture(scope="module")
def local_reference(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    quantgate("run", *tiny, "--out", str(out), cache=tmp_path_factory.mktemp("local-cache"))
    report = json.loads((out / "report.json").read_text())
    assert {f["status"] for f in report["formats"].values()} == {"ok"}, report["formats"]
    assert not {"executor", "ray", "cluster"} & set(report["environment"])  # one machine: no cluster entries
    assert "cluster" not in report
    return report


def _no_ray_address() -> dict:
    return {"RAY_ADDRESS": None}  # removed: the run starts a Ray of its own


@pytest.mark.slow
def test_formats_spread_over_the_cluster_score_as_locally(cluster, tiny, local_reference, tmp_path):
    out = tmp_path / "ray"
    result = quantgate("run", *tiny, "--out", str(out), "--executor", "ray", "--ray-address", cluster.address,
                       cache=tmp_path / "cache")
    report = json.loads((out / "report.json").read_text())
    assert comparable(report) == comparable(local_reference)
    cluster = report["cluster"]
    assert not {"executor", "ray", "cluster"} & set(report["environment"])  # the typed block holds them
    assert cluster["executor"] == "ray" and cluster["version"] == ray.__version__
    assert sorted(n["cpus"] for n in cluster["nodes"]) == [0, 1, 1] and all(n["gpus"] == 0 for n in cluster["nodes"])
    assert all(n["memory_bytes"] > 0 for n in cluster["nodes"])
    started = {(m.group(1), m.group(3)) for m in NODE_LINE.finditer(result.stderr)}
    assert {fmt for fmt, _ in started} == {"baseline", "int8"}
    assert len({node for _, node in started}) == 2, result.stderr  # one CPU a node: the two ran side by side
    names = [n["node"] for n in cluster["nodes"]]
    for fmt, node_id in started:
        placed = cluster["formats"][fmt]
        assert placed["node"] in names and node_id in placed["node"] and placed["devices"] is None, cluster
    assert "**Cluster:** ray " in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_task_whose_memory_no_node_has_is_named_not_left_pending(cluster, tiny, tmp_path):
    """Ray keeps a request no node can meet pending for ever (an autoscaler might add a node): refused at once,
    each format failed with the reason, the run over in far less than its formats would take."""
    out = tmp_path / "run"
    started = time.monotonic()
    quantgate("run", *tiny, "--out", str(out), "--executor", "ray", "--ray-address", cluster.address,
              "--memory-limit-gib", "100000", cache=tmp_path / "cache", check_codes=(1,), timeout=300)
    report = json.loads((out / "report.json").read_text())
    for fmt in ("baseline", "int8"):
        error = report["formats"][fmt]["error"] or ""
        assert report["formats"][fmt]["status"] == "failed", report["formats"][fmt]
        assert "no node of the Ray cluster has room" in error and "100000.00 GiB of memory" in error, error
    assert report["cluster"]["formats"] == {}  # no task was submitted
    assert time.monotonic() - started < 240


@pytest.mark.slow
def test_a_task_out_of_memory_is_diagnosed_as_on_one_machine(cluster, tiny, tmp_path):
    """int8's worker held to 0.25 GiB (its Ray task asks for that much, and gets it): the worker runs out, and the
    format's reason is the one-machine diagnosis (test_faults' out-of-memory case) while the baseline finishes."""
    config = tmp_path / "run.toml"
    config.write_text('[formats.baseline]\n[formats.int8]\nmemory_limit_gib = 0.25\n')
    out = tmp_path / "run"
    quantgate("run", "--config", str(config), tiny[0], tiny[1], *tiny[4:], "--out", str(out), "--executor", "ray",
              "--ray-address", cluster.address, "--no-cache", cache=tmp_path / "cache", check_codes=(1,),
              timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert report["formats"]["baseline"]["status"] == "ok"
    reason = report["formats"]["int8"]["reasons"][0]
    assert "ran out of memory" in reason and "GiB RSS, past its memory limit" in reason, reason
    assert "--batch-size" in reason
    assert "int8" in report["cluster"]["formats"]  # it ran as a Ray task


def _start(args, cache: Path, env: dict | None = None) -> tuple[subprocess.Popen, list[str]]:
    """The CLI in the background, its stderr collected line by line as it comes."""
    env = {**os.environ, "QUANTGATE_CACHE": str(cache), "PYTHONPATH": str(ROOT), **(env or {})}
    child = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT, text=True,
                             env={k: v for k, v in env.items() if v is not None},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(child.stderr.readline, "")), daemon=True).start()
    threading.Thread(target=lambda: child.stdout.read(), daemon=True).start()
    return child, lines


def _wait_for(lines: list[str], pattern: re.Pattern, count: int, child, timeout: float = 300) -> list[re.Match]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [m for line in list(lines) if (m := pattern.search(line))]
        if len({m.group(1) for m in found}) >= count:
            return found
        assert child.poll() is None, "".join(lines)
        time.sleep(0.2)
    raise AssertionError("".join(lines))


def _workers_of(out: Path) -> list[str]:
    """Worker subprocesses still running for the run in `out` (their job files are under it)."""
    left = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if "harness.worker" in cmdline and str(out) in cmdline:
            left.append(cmdline)
    return left


def _raylets() -> set[int]:
    """This test worker's raylets (`pgrep -af raylet`, less another xdist worker's)."""
    return {p.pid for p in psutil.process_iter(["name", "cmdline"])
            if ("raylet" in (p.info["name"] or "") or "raylet/raylet" in " ".join(p.info["cmdline"] or ())) and ours(p)}


def _settled(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while (value := check()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return value


@pytest.mark.slow
def test_sigterm_cancels_every_task_stops_the_local_ray_and_resume_finishes_on_the_cluster(
        cluster, tiny, local_reference, tmp_path):
    before = _raylets()
    out, cache = tmp_path / "run", tmp_path / "shared-cache"
    child, lines = _start(["run", *tiny, "--out", str(out), "--executor", "ray"], cache, _no_ray_address())
    _wait_for(lines, NODE_LINE, 1, child)
    assert _raylets() - before, "no local Ray was started for the run"
    time.sleep(3)  # into the chain's worker subprocesses
    child.send_signal(signal.SIGTERM)
    code = child.wait(timeout=120)
    assert code != 0, "".join(lines)
    assert any("cancelling" in line for line in lines), "".join(lines)
    assert _settled(lambda: _raylets() - before) == set(), "the local Ray's raylet was left running"
    assert _settled(lambda: _workers_of(out)) == [], "a worker subprocess was left running"
    partial = json.loads((out / "report.json").read_text())
    assert "interrupted" in {f["status"] for f in partial["formats"].values()}

    # the same shared cache, resumed on the cluster: what finished is reused, the rest runs there
    quantgate("run", "--resume", "--out", str(out), "--executor", "ray", "--ray-address", cluster.address,
              cache=cache)
    report = json.loads((out / "report.json").read_text())
    assert comparable(report) == comparable(local_reference)
    assert set(report["cluster"]["formats"]) == {"baseline", "int8"}


@pytest.mark.slow
def test_a_worker_node_killed_mid_run_is_survived_or_named(cluster, tiny, local_reference, tmp_path):
    out = tmp_path / "run"
    child, lines = _start(["run", *tiny, "--out", str(out), "--executor", "ray", "--ray-address", cluster.address],
                          tmp_path / "cache")
    found = _wait_for(lines, NODE_LINE, 2, child)
    victim_id = next(m.group(3) for m in found if m.group(1) == "int8")
    victim = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim_id))
    time.sleep(2)  # into int8's chain
    cluster.remove_node(victim, allow_graceful=False)
    try:
        child.wait(timeout=600)
        report = json.loads((out / "report.json").read_text())
        int8 = report["formats"]["int8"]
        if int8["status"] == "ok":  # retried once, on the node left
            assert comparable(report) == comparable(local_reference)
            assert len({m.group(3) for m in NODE_LINE.finditer("".join(lines)) if m.group(1) == "int8"}) == 2
        else:
            assert "Ray task was lost" in (int8.get("error") or ""), int8
        assert report["formats"]["baseline"]["status"] == "ok"
        assert _settled(lambda: _workers_of(out)) == [], "a worker subprocess was left running"
    finally:
        cluster.add_node(num_cpus=1, resources={"node_b2": 1}, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()


@pytest.mark.slow
def test_a_cache_url_is_reused_by_a_run_with_an_empty_cache(cluster, tiny, local_reference, tmp_path):
    """--cache file://STORE: a second run whose own cache is empty (another machine's) finds every stage in the
    store: nothing is quantized, measured or generated again, and it scores as the local executor."""
    store = (tmp_path / "store").as_uri()
    first = quantgate("run", *tiny, "--out", str(tmp_path / "one"), "--executor", "ray", "--ray-address",
                      cluster.address, "--cache", store, cache=tmp_path / "cache-a")
    assert "pushed to " + store in first.stderr, first.stderr
    assert list((tmp_path / "store" / "artifacts").glob("int8-*/quantgate_seal.json"))
    second = quantgate("run", *tiny, "--out", str(tmp_path / "two"), "--executor", "ray", "--ray-address",
                       cluster.address, "--cache", store, cache=tmp_path / "cache-b")
    assert "quantizing" not in second.stderr and "loading the model" not in second.stderr, second.stderr
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    # from the report, not the console: Ray forwards a task's last lines after the driver may have exited
    assert {name: fmt["stages_run"] for name, fmt in report["formats"].items()} == {"baseline": [], "int8": []}
    assert comparable(report) == comparable(local_reference)
