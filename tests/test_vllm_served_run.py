"""The demo recipe's formats as vLLM serves them (--backend vllm), next to the transformers run of the demo_run
fixture: its own file because it needs that fixture, and every test that does runs on one xdist worker
(tests/conftest.py). The served run takes the demo recipe (E2E_ARGS) so its 4-bit artifact comes from the cache the
demo_run fixture filled."""

import json
from pathlib import Path

import pytest

from conftest import quantgate
from test_vllm_backend import SERVED_ARGS, _probe, _prompt_tokens, _servers_left, demo_cache_of


@pytest.fixture(scope="session")
def served_run(vllm_install, demo_run, demo_cache, tmp_path_factory):
    from test_pipeline_external import _checkpoint_like

    out = tmp_path_factory.mktemp("served-run")
    # The demo run's AWQ checkpoint, copied without quantgate's manifest: AWQ served, as a checkpoint made elsewhere.
    awq = Path(demo_run[1]["formats"]["awq"]["artifact"]["path"])
    hub_awq = _checkpoint_like(awq, tmp_path_factory.mktemp("served-candidate") / "hub-awq")
    result = quantgate("run", *SERVED_ARGS, "--formats", "baseline,int8,gptq,w8a8", "--candidate", f"hub-awq={hub_awq}",
                       "--out", str(out), cache=demo_cache)
    return out, json.loads((out / "report.json").read_text()), result, _probe(demo_cache)


@pytest.mark.slow
def test_served_run_scores_through_vllm(served_run, demo_run):
    out, report, result, probed = served_run
    assert report["settings"]["backend"] == "vllm"
    base = report["formats"]["baseline"]
    served = base["served"]
    assert base["status"] == "ok" and served["status"] == "ok" and served["scored"], served.get("reason")
    assert served["version"] == "0.32.0" and "--max-num-seqs" in served["flags"]
    assert (out / "logs" / "baseline.vllm.log").is_file()
    # Same token ids in both backends: vLLM's own prompt token count equals the transformers run's, item by item.
    _, transformers_report, _ = demo_run
    assert base["generation"]["items"] == transformers_report["formats"]["baseline"]["generation"]["items"]
    served_tokens, local_tokens = _prompt_tokens(demo_cache_of(out, report))
    shared = set(served_tokens) & set(local_tokens)
    assert len(shared) >= base["generation"]["items"]
    assert all(served_tokens[k] == local_tokens[k] for k in shared), "the backends saw different prompts"
    served_samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["format"] for s in served_samples} >= {"baseline", "int8"}
    baseline_predictions = [s["prediction"] for s in served_samples if s["format"] == "baseline"]
    assert sum(bool(p) for p in baseline_predictions) >= 0.8 * len(baseline_predictions)  # the server answered
    # vLLM's KV figure equals the prediction exactly on CPU.
    kv = served["kv_cache"]
    assert kv["vllm_tokens"] == kv["predicted_tokens"] and kv["relative_error"] == 0.0
    assert kv["vllm_max_concurrency"] == kv["predicted_max_concurrency"]
    seqs = int(served["flags"]["--max-num-seqs"])
    assert set(served["latency"]) == {"concurrency_1", f"concurrency_{seqs}"}
    at_one = served["latency"]["concurrency_1"]
    assert at_one["requests"] == 4 and at_one["ttft_ms"]["p50"] > 0 and at_one["e2e_ms"]["p95"] >= at_one["ttft_ms"]["p95"]
    assert served["saturation"]["holds"] is True and served["saturation"]["preemptions"] == 0
    assert served["saturation"]["concurrency"] == seqs
    # bitsandbytes int8 through vLLM's bitsandbytes plugin (vllm-bnb-plugin, in .venv-vllm): served and scored by
    # the server, with its own loader, its KV cache as predicted; no capacity reason says vLLM cannot serve it.
    int8 = report["formats"]["int8"]
    served_int8 = int8["served"]
    assert served_int8["status"] == "ok" and served_int8["scored"], served_int8.get("reason")
    assert served_int8["flags"]["--quantization"] == served_int8["flags"]["--load-format"] == "bitsandbytes"
    assert served_int8["kv_cache"]["vllm_tokens"] == served_int8["kv_cache"]["predicted_tokens"]
    int8_log = (out / "logs" / "int8.vllm.log").read_text(errors="replace")
    assert "BitsAndBytesModelLoader" in int8_log
    # bitsandbytes logs its cast on every 8-bit matmul (22 MB on 16 items): server_site keeps it to one line
    assert int8_log.count("MatMul8bitLt") <= 1, int8_log.count("MatMul8bitLt")
    int8_predictions = [s["prediction"] for s in served_samples if s["format"] == "int8"]
    assert int8_predictions and sum(bool(p) for p in int8_predictions) >= 0.8 * len(int8_predictions)
    assert not any("vLLM cannot serve it" in r for r in int8["reasons"]), int8["reasons"]
    # Fidelity through the servers' prompt_logprobs: int8 against the served baseline on every set, every item.
    samples_int8 = [s for s in served_samples if s["format"] == "int8" and "fidelity" in s]
    assert len(samples_int8) == len(int8_predictions)
    for evalset, entry in int8["fidelity"].items():
        assert entry["items"] >= 1 and 0 <= entry["kl"]["value"] < 2 and 0 <= entry["top1_agreement"]["value"] <= 100
    assert any(entry["kl"]["value"] > 0 for entry in int8["fidelity"].values())  # int8 is not the baseline
    gptq = report["formats"]["gptq"]["served"]
    if probed["w4a16"]:
        assert gptq["status"] == "ok" and "CPUWNA16LinearKernel" in gptq["kernels"]
        assert gptq["kv_cache"]["vllm_tokens"] == gptq["kv_cache"]["predicted_tokens"]
    else:
        assert gptq["status"] == "unsupported" and "cpu_gemm_wna16" in gptq["reason"]
        announced = result.stderr.find("gptq: vLLM will not serve it")  # said before any model loads
        loaded = result.stderr.find("model loaded")
        assert announced >= 0 and (loaded < 0 or announced < loaded), result.stderr[:2000]
    # INT8 W8A8 on this CPU as it is: the library the probe names is the one the server mapped, and the dtype
    # follows it (16-bit with _C, whose AMX int8 kernel refuses float32; float32 with the builds for CPUs
    # without bf16 units).
    w8a8 = report["formats"]["w8a8"]["served"]
    assert w8a8["status"] == "ok" and w8a8["scored"], w8a8.get("reason")
    assert w8a8["cpu_kernel_library"] == probed["library"] == served["cpu_kernel_library"]
    assert (w8a8["flags"]["--dtype"] == "float32") == (probed["library"] != "_C"), w8a8["flags"]
    assert any("Int8ScaledMM" in kernel for kernel in w8a8["kernels"]), w8a8["kernels"]
    # AWQ, from a checkpoint made elsewhere (AutoAWQ's GEMM layout): refused or served as the 4-bit GPTQ is, through
    # the same CPU kernel (vLLM's CPUWNA16LinearKernel takes both) and scored by the server.
    candidate = report["formats"]["hub-awq"]["served"]
    assert candidate["status"] == gptq["status"]
    if probed["w4a16"]:
        assert candidate["scored"] and candidate["flags"]["--quantization"] == "awq", candidate["flags"]
        assert candidate["kernels"] == gptq["kernels"] == ["CPUWNA16LinearKernel"], candidate["kernels"]
        predictions = [s["prediction"] for s in served_samples if s["format"] == "hub-awq"]
        assert predictions and sum(bool(p) for p in predictions) >= 0.8 * len(predictions)
    else:
        assert "cpu_gemm_wna16" in candidate["reason"]
    assert "Traceback" not in result.stderr
    assert not _servers_left(), "a vLLM server outlived the run"
