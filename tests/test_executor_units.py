"""The Ray executor's decisions, without a cluster: what a format's task asks for (GPUs, memory from the plan), a
request no node can meet refused with its reason, vLLM's Ray executor for a format larger than one node, and the
report's typed `cluster` block (schema, rendering, `compare` ignoring it). The cluster itself: test_ray_executor.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.capacity import model_shape, weight_format, weights_bytes
from harness.config import RunSpec
from harness.executors.base import ClusterInfo, ClusterNode, Placement
from harness.executors.resources import task_request, unmet_reason
from harness.formats import FORMAT_SPECS
from harness.measure.kv import text_config
from harness.records import FormatRun, RunInputs
from harness.runtime.serving_engine import LaunchPlan, ServedFormat
from harness.runtime.vllm.client import Sampling
from harness.runtime.vllm.locate import VllmInstall
from harness.runtime.vllm.multinode import CLUSTER_ADDRESS_ENV, NODE_GPUS_ENV, across_nodes, spans_nodes

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "run_example" / "report.json"
GIB = 2**30
# SmolLM2-135M-Instruct's config.json (the demo model): 134,515,008 parameters
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "tie_word_embeddings": True, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
           "torch_dtype": "bfloat16"}


def _inputs(**spec) -> RunInputs:
    return RunInputs(spec=RunSpec(**spec), out_dir=Path("/nonexistent"), source=None, model_config=SMOLLM2,
                     evalsets=[], policy=None, recipes={}, prompts={}, calibration=None)


def _cluster(*nodes: tuple[float, float, float]) -> ClusterInfo:
    """Nodes as (CPUs, GPUs, GiB of Ray memory)."""
    return ClusterInfo("ray", "2.60.0", tuple(ClusterNode(f"10.0.0.{i} (abcdef0{i})", cpus, gpus, int(gib * GIB))
                                              for i, (cpus, gpus, gib) in enumerate(nodes)))


# ---------------------------------------------------------------- what a task asks for


def test_memory_is_the_planned_16_bit_weights_the_chain_loads():
    request = task_request(_inputs(), "gptq", _cluster((1, 0, 8)))
    assert request.memory_bytes == 134_515_008 * 2  # every parameter of the demo model at 2 bytes
    assert request.memory_bytes == weights_bytes(model_shape(text_config(SMOLLM2)), weight_format("baseline"))
    assert "16-bit source" in request.memory_source
    assert request.ray_options() == {"num_cpus": 1, "memory": 134_515_008 * 2}


def test_a_memory_limit_is_what_the_task_asks_for():
    request = task_request(_inputs(memory_limit_gib=3), "int8", _cluster((1, 0, 8)))
    assert (request.memory_bytes, request.memory_source) == (3 * GIB, "--memory-limit-gib")


def test_gpus_are_tensor_times_pipeline_parallel_size_on_a_gpu_cluster():
    request = task_request(_inputs(tensor_parallel_size=2, pipeline_parallel_size=2), "awq", _cluster((16, 8, 500)))
    assert request.ray_options()["num_gpus"] == 4 and not request.spans_nodes


def test_a_request_no_node_can_meet_is_named_not_left_pending():
    cluster = _cluster((0, 0, 4), (1, 0, 2), (1, 0, 1.5))
    request = task_request(_inputs(memory_limit_gib=3), "int8", cluster)
    reason = unmet_reason(request, cluster)
    assert reason is not None
    assert "no node of the Ray cluster has room" in reason and "1 CPU and 3.00 GiB of memory" in reason
    assert "10.0.0.1 (abcdef01): 0 GPU, 1 CPU, 2.00 GiB" in reason  # the largest node that has a CPU
    assert unmet_reason(task_request(_inputs(memory_limit_gib=2), "int8", cluster), cluster) is None
    gpus = task_request(_inputs(tensor_parallel_size=4), "int8", _cluster((8, 2, 64), (8, 2, 64)))
    assert "4 GPU(s)" in unmet_reason(gpus, _cluster((8, 2, 64), (8, 2, 64)))


# ---------------------------------------------------------------- vLLM beyond one node


def test_a_vllm_format_larger_than_a_node_spans_nodes_and_leaves_one_gpu_for_vllm():
    cluster = _cluster((16, 4, 500), (16, 4, 500), (16, 4, 500))
    request = task_request(_inputs(backend="vllm", tensor_parallel_size=4, pipeline_parallel_size=2), "gptq", cluster)
    assert request.spans_nodes and request.gpus == 3  # vLLM's Ray executor needs one GPU free where it starts
    assert unmet_reason(request, cluster) is None
    in_process = task_request(_inputs(tensor_parallel_size=8), "gptq", cluster)  # transformers cannot span nodes
    assert not in_process.spans_nodes and "8 GPU(s)" in unmet_reason(in_process, cluster)


def test_spanning_is_more_gpus_than_the_largest_node():
    assert spans_nodes(4, 2, 4) and spans_nodes(16, 1, 8)
    assert not spans_nodes(4, 2, 8) and not spans_nodes(8, 1, None) and not spans_nodes(8, 1, 0)


def test_the_launch_gets_vllms_ray_executor_and_the_cluster_only_where_it_spans():
    plan = LaunchPlan(("--dtype", "bfloat16", "--tensor-parallel-size", "8"), {"X": "1"}, 4096, 8)
    spanning = across_nodes(plan, (8, 1), 4, "10.0.0.1:6379")
    assert spanning.args[-2:] == ("--distributed-executor-backend", "ray")
    assert spanning.env == {"X": "1", "RAY_ADDRESS": "10.0.0.1:6379"}
    assert (spanning.max_model_len, spanning.max_num_seqs) == (4096, 8)
    assert across_nodes(plan, (8, 1), 8, "10.0.0.1:6379") == plan
    assert across_nodes(plan, (8, 1), None, None) == plan


def test_the_flag_is_the_installed_vllms():
    arg_utils = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm/engine/arg_utils.py"), None)
    if arg_utils is None:
        pytest.skip("no .venv-vllm here (nox -s vllm_env)")
    text = arg_utils.read_text(encoding="utf-8")
    assert '"--distributed-executor-backend"' in text
    parallel = (arg_utils.parents[1] / "config" / "parallel.py").read_text(encoding="utf-8")
    assert re.search(r'DistributedExecutorBackend = Literal\[[^\]]*"ray"', parallel)


def test_vllm_engine_launch_spans_nodes_inside_a_ray_task(monkeypatch, tmp_path):
    from harness.runtime.vllm.engine import VllmEngine

    install = VllmInstall("test", ("vllm", "serve"), False, "0.32.0", "cuda", frozenset())
    served = ServedFormat("gptq", "key", tmp_path, "bfloat16", 1024, Sampling(), FORMAT_SPECS["gptq"])
    spec = RunSpec(backend="vllm", tensor_parallel_size=8)
    monkeypatch.delenv(NODE_GPUS_ENV, raising=False)
    monkeypatch.delenv(CLUSTER_ADDRESS_ENV, raising=False)
    alone = VllmEngine().launch_plan(spec, served, install, 2048, lambda: None)
    assert "--distributed-executor-backend" not in alone.args and "RAY_ADDRESS" not in alone.env
    monkeypatch.setenv(NODE_GPUS_ENV, "4")
    monkeypatch.setenv(CLUSTER_ADDRESS_ENV, "10.0.0.1:6379")
    spanning = VllmEngine().launch_plan(spec, served, install, 2048, lambda: None)
    assert "--distributed-executor-backend ray" in " ".join(spanning.args)
    assert spanning.env["RAY_ADDRESS"] == "10.0.0.1:6379"
    shown = VllmEngine().shown_command(install, served, spanning)
    assert "RAY_ADDRESS=10.0.0.1:6379" in shown and "--distributed-executor-backend ray" in shown


# ---------------------------------------------------------------- the report's cluster block


def _report_with_cluster():
    from harness.report.build import cluster_block
    from harness.report.schema import RunReport

    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    names = list(data["formats"])
    cluster = _cluster((0, 0, 4), (1, 2, 8))
    runs = {name: FormatRun(name, devices="0,1" if name == names[0] else None) for name in names}
    block = cluster_block(Placement(cluster, {names[0]: cluster.nodes[1].node}), runs)
    return RunReport.model_validate({**data, "cluster": block.model_dump(mode="json")}), names


def test_the_cluster_block_validates_and_is_written_back_as_built():
    from harness.report.schema import RunReport, report_json

    report, names = _report_with_cluster()
    assert report.cluster.version == "2.60.0" and len(report.cluster.nodes) == 2
    assert report.cluster.nodes[1].memory_bytes == 8 * GIB
    assert set(report.cluster.formats) == {names[0]}  # a format that never started is absent
    assert report.cluster.formats[names[0]].devices == "0,1"
    text = report_json(report)
    assert report_json(RunReport.model_validate_json(text)) == text
    with pytest.raises(Exception, match="nodes"):
        RunReport.model_validate({**json.loads(text), "cluster": {**json.loads(text)["cluster"], "nodes": "x"}})


def test_a_run_on_one_machine_has_no_cluster_block():
    from harness.report.build import cluster_block

    assert cluster_block(Placement(), {}) is None and cluster_block(None, {}) is None


def test_markdown_and_html_name_the_cluster_and_each_formats_node(tmp_path):
    from harness.report.html import render_html
    from harness.report.markdown import render_markdown

    report, names = _report_with_cluster()
    for text in (render_markdown(report, []), render_html(report, [])):
        assert "ray 2.60.0, 2 node(s)" in text
        assert f"{names[0]} on 10.0.0.1 (abcdef01) GPUs 0,1" in text


def test_compare_does_not_call_runs_different_for_where_they_ran():
    from harness.commands.compare.comparability import find_differences
    from harness.report.schema import RunReport

    plain = RunReport.model_validate(json.loads(FIXTURE.read_text(encoding="utf-8")))
    clustered, names = _report_with_cluster()
    assert find_differences(plain, clustered) == []
    legacy = plain.model_copy(update={"environment": {**plain.environment, "executor": "ray", "ray": "2.60.0",
                                                      "cluster": "10.0.0.1 (abcdef01) 1 CPU 0 GPU",
                                                      f"node {names[0]}": "10.0.0.1 (abcdef01)"}})
    assert find_differences(plain, legacy) == []
    upgraded = plain.model_copy(update={"environment": {**plain.environment, "torch": "9.9.9"}})
    assert [d.what for d in find_differences(plain, upgraded)] == ["environment torch"]  # software still counts


def test_the_reports_vllm_plan_says_it_serves_across_nodes_where_the_format_spans_them():
    from harness.report.build import across_nodes as plan_across_nodes
    from harness.report.schema import RunReport, report_json

    report = RunReport.model_validate(json.loads((ROOT / "reports" / "example" / "report.json").read_text()))
    gptq = report.formats["gptq"]
    wide = RunSpec(tensor_parallel_size=8)
    four_gpu_nodes = Placement(_cluster((16, 4, 500), (16, 4, 500)), {})
    spanning = plan_across_nodes(gptq, wide, four_gpu_nodes).serving["vllm"]
    assert spanning.command == gptq.serving["vllm"].command + " --distributed-executor-backend ray"
    assert spanning.args[-1] == ["--distributed-executor-backend", "ray"]
    assert "8 GPUs exceeds the 4 of one node" in spanning.notes[-1]
    assert plan_across_nodes(gptq, wide, Placement(_cluster((16, 8, 500)), {})) is gptq  # one node holds it
    assert plan_across_nodes(gptq, wide, None) is gptq and plan_across_nodes(gptq, RunSpec(), four_gpu_nodes) is gptq
    spanned = report.model_copy(update={"formats": {**report.formats, "gptq": plan_across_nodes(gptq, wide,
                                                                                              four_gpu_nodes)}})
    assert "--distributed-executor-backend ray" in report_json(spanned)


# ---------------------------------------------------------------- --cache URL (fsspec)


def _cache_with_entries(root: Path) -> None:
    from harness.cache import seal_dir

    (root / "results").mkdir(parents=True)
    (root / "results" / "measure-abc.json").write_text('{"memory": {}}')
    (root / "results" / ".measure-abc.json.123.tmp").write_text("half")  # an atomic write under way
    (root / "models" / "demo").mkdir(parents=True)
    (root / "models" / "demo" / "config.json").write_text("{}")
    for name, sealed in (("int8-0123", True), ("gptq-4567", False)):
        artifact = root / "artifacts" / name
        artifact.mkdir(parents=True)
        (artifact / "quantgate_manifest.json").write_text(json.dumps({"format": name}))
        (artifact / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        if sealed:
            seal_dir(artifact)


def test_a_cache_url_carries_results_and_sealed_artifacts_to_another_node(tmp_path):
    from harness.cache import SEAL, is_sealed
    from harness.executors.remote_cache import RemoteCache, check_url

    url = (tmp_path / "store").as_uri()  # file:///...
    check_url(url)
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    _cache_with_entries(node_a)
    remote = RemoteCache(url)
    assert remote.push(node_a, formats=("int8", "gptq")) == 5  # result, model, int8's manifest, weights and seal
    store = tmp_path / "store"
    assert (store / "artifacts" / "int8-0123" / SEAL).is_file()
    assert not (store / "artifacts" / "gptq-4567").exists()  # not sealed: a quantization that did not finish
    assert not list(store.rglob(".*.tmp"))
    assert remote.push(node_a, formats=("int8",)) == 0  # nothing new

    assert remote.pull(node_b, ("gptq",)) == 2  # the shared kinds only: no int8 artifact for a gptq task
    assert not (node_b / "artifacts").exists()
    assert remote.pull(node_b, ("int8",)) == 3
    assert is_sealed(node_b / "artifacts" / "int8-0123", required=("quantgate_manifest.json",))
    assert (node_b / "results" / "measure-abc.json").read_text() == '{"memory": {}}'
    assert remote.pull(node_b, ("int8",)) == 0


def test_tasks_pulling_and_pushing_the_same_files_at_once_never_half_copy_them(tmp_path):
    """Two formats' tasks on one node pull the store into the same working copy as they start, and push to it as
    they end: no copy raises on another's half-written file, and every file is whole afterwards (CI once lost both
    formats of a run to a FileNotFoundError here)."""
    import os
    import threading

    from harness.executors.remote_cache import RemoteCache

    files = {f"stage-{i}.json": os.urandom(100_000 + i) for i in range(120)}
    nodes = [tmp_path / f"node-{i}" for i in range(4)]
    for node in nodes:
        for name, data in files.items():
            (node / "results").mkdir(parents=True, exist_ok=True)
            (node / "results" / name).write_bytes(data)
    store, working = tmp_path / "store", tmp_path / "working"
    remote = RemoteCache(store.as_uri())
    errors: list[BaseException] = []

    def at_once(calls):
        def call(fn):
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(fn,)) for fn in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    at_once([lambda node=node: remote.push(node) for node in nodes])
    at_once([lambda: remote.pull(working) for _ in range(4)])
    assert errors == []
    for where in (store, working):
        assert sorted(p.name for p in (where / "results").iterdir()) == sorted(files)  # no partial left behind
        assert all((where / "results" / name).read_bytes() == data for name, data in files.items())


def test_a_cache_url_is_checked_before_any_work(tmp_path):
    from harness.errors import UserError
    from harness.executors.registry import check_executor
    from harness.executors.remote_cache import check_url

    with pytest.raises(UserError, match="not a URL .*set QUANTGATE_CACHE"):
        check_url(str(tmp_path))
    with pytest.raises(UserError, match="fsspec cannot open it"):
        check_url("nosuchprotocol://bucket/quantgate")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot write there"):
        check_url((tmp_path / "file" / "cache").as_uri())
    with pytest.raises(UserError, match="a cache URL is for --executor ray"):
        check_executor(RunSpec(cache_url=(tmp_path / "store").as_uri()))


def test_a_process_that_was_a_ray_driver_ends_with_its_code_its_output_and_its_atexit_handlers(tmp_path):
    """exit_after_ray skips the C++ static destructors that can hang a finished Ray driver (harness.__main__), but
    not what Python promises at exit: atexit handlers run, buffered output reaches the reader, the code is kept."""
    import subprocess
    import sys

    marker = tmp_path / "atexit-ran"
    script = ("import atexit, sys\n"
              "from harness.executors import ray as r\n"
              f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
              "sys.stdout.write('report written')\n"  # no newline: still in the buffer
              "r.exit_after_ray(3)\n"
              "raise SystemExit('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "report written" and marker.read_text() == "ran"
    assert "not reached" not in done.stderr

