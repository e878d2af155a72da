"""The real path end to end: demo model, real bitsandbytes and GPTQModel, real metrics. Slow (minutes)."""

import json

import pytest

from conftest import E2E_ARGS, NOISE, ROOT, SIZE_FLAGS, quantgate
from test_layer_progress import bars
from harness.quantize import AWQ_NO_BF16_CALIBRATION_SAMPLES
from harness.runtime.device import cpu_has_bf16_matmul

pytestmark = pytest.mark.slow
FORMATS = ("baseline", "int8", "gptq", "awq")


def test_the_e2e_runs_take_the_demo_recipe():
    """Only item counts and lengths differ from `nox -s demo`: same formats, calibration count, group size."""
    flags = [a for a in E2E_ARGS if a.startswith("--")]
    assert set(flags) <= {"--model", *SIZE_FLAGS}, flags
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '"--model", "demo"' in noxfile and '"--formats", "baseline,int8,gptq,awq"' in noxfile
    assert "--calibration" not in noxfile and "--group-size" not in noxfile


def test_every_format_of_the_demo_recipe_runs(demo_run):
    """The demo's recipe on this CPU as it is: every format `ok`, the quantized ones calibrated on the bundled
    corpus (tests/test_pipeline_e2e_no_bf16.py: the same with the no-bf16 path forced)."""
    check_every_format_ran(demo_run[1])


def check_every_format_ran(report: dict) -> None:
    failed = {name: entry["error"] for name, entry in report["formats"].items() if entry["status"] != "ok"}
    assert not failed, failed
    assert set(report["formats"]) == set(FORMATS)
    # AWQ calibrates in emulated bf16 without bf16 units, on fewer texts by default there (harness.quantize).
    texts = {"gptq": 32, "awq": 32 if report["device"]["bf16_matmul"] else AWQ_NO_BF16_CALIBRATION_SAMPLES}
    for name in ("gptq", "awq"):
        calibration = report["formats"][name]["calibration"]
        assert calibration["source"].startswith("bundled corpus") and calibration["texts"] == texts[name]
        assert calibration["tokens_min"] >= 200 and calibration["overlap"]["items_overlapping"] == 0
        manifest = report["formats"][name]["artifact"]["manifest"]
        assert manifest["calibration_texts"] == texts[name] and len(manifest["smoke_replies"]) == 2


def test_report_has_every_key_filled_with_measured_numbers(demo_run):
    out, report, result = demo_run
    assert report["schema_version"] == 2
    assert report["model"]["source"] == "demo" and report["model"]["fingerprint"].startswith("sha256:")
    assert "dequantized Q4_1" in report["model"]["note"]
    assert set(report["formats"]) == set(FORMATS)
    for name in FORMATS:
        entry = report["formats"][name]
        assert entry["status"] == "ok", (name, entry["error"])
        assert entry["verdict"] in ("BASELINE", "GO", "NO-GO", "INCONCLUSIVE")
        assert isinstance(entry["reasons"], list)
        memory = entry["memory"]
        assert memory["device"] == "cpu" and memory["peak_bytes"] > memory["weights_bytes"] > 0
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            at_one = entry["latency"]["batch_1"][key]
            assert at_one["p50"] > 0 and at_one["p95"] >= at_one["p50"]
        batched = entry["latency"]["batched"]  # every evaluation request, at the evaluation batch size
        assert batched["batch_size"] == 4 and batched["requests"] == 4 * len(report["evalsets"])
        assert batched["e2e_ms"]["p95"] >= batched["e2e_ms"]["p50"] > 0
        assert set(entry["scores"]) == set(report["evalsets"])
        for evalset, metrics in entry["scores"].items():
            for metric, score in metrics.items():
                assert 0 <= score["value"] <= 100 and score["n"] == 4
                if name != "baseline":
                    assert score["delta"] is not None
    assert report["formats"]["baseline"]["verdict"] == "BASELINE"
    # fidelity, teacher-forced on the baseline's output: every candidate, every gated set, 4 items each
    for name in FORMATS[1:]:
        entry = report["formats"][name]
        assert set(entry["fidelity"]) == set(report["evalsets"]), name
        assert any(stage.startswith("fidelity:") for stage in entry["stages_run"]) or not entry["stages_run"]
        for evalset, fidelity in entry["fidelity"].items():
            assert fidelity["items"] == 4 and fidelity["positions"] >= 4, (name, evalset)
            assert 0 <= fidelity["kl"]["ci_low"] <= fidelity["kl"]["value"] <= fidelity["kl"]["ci_high"] < 5
            assert 0 <= fidelity["top1_agreement"]["value"] <= 100
            assert fidelity["status"] in ("fail", "inconclusive")  # never a pass on 4 items (min_items 30)
    samples = [json.loads(line) for line in (out / report["samples"]).read_text().splitlines()]
    with_fidelity = [s for s in samples if "fidelity" in s]
    assert {s["format"] for s in with_fidelity} == set(FORMATS[1:])
    assert len(with_fidelity) == 4 * len(report["evalsets"]) * (len(FORMATS) - 1)
    assert len(samples) == 4 * 4 * len(report["evalsets"])
    assert {"format", "evalset", "id", "prediction"} <= set(samples[0])
    for name in ("report.md", "report.html", "junit.xml", "scores.csv"):
        assert (out / name).stat().st_size > 0
    assert result.returncode == report["exit_code"]


def test_console_is_clean_and_shows_progress(demo_run):
    _, _, result = demo_run
    console = result.stdout + result.stderr
    for noise in NOISE:
        assert noise not in console
    # Everything on stderr is ours: a library's line (a C extension's load error, a glog warning) is not.
    foreign = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("[quantgate] ")]
    assert not foreign, foreign[:5]
    assert "quantizing" in console and "generating" in console
    for done, total in bars(console):
        assert done <= total == 30, console  # a read cut inside "of 29" once drew 4/3
    for fmt in ("gptq", "awq"):  # GPTQModel's 0-based layer counter becomes a bar that ends full: 30 layers
        assert f"{fmt}: quantizing layers [{'#' * 24}] 30/30" in console
    assert "recommendation:" in result.stdout


def test_memory_breakdown_matches_the_formats(demo_run):
    _, report, _ = demo_run
    formats = report["formats"]
    base = formats["baseline"]["memory"]["weights_bytes"]
    params = report["model"]["num_parameters"]
    # bf16 as stored; float32 where the CPU has no bf16 units and the baseline is computed upcast
    element = {"bfloat16": 2, "float32": 4}[formats["baseline"]["compute_dtype"]]
    if cpu_has_bf16_matmul():
        assert element == 2
    assert abs(base - element * params) / (element * params) < 0.05
    bf16_base = 2 * params
    assert formats["int8"]["memory"]["weights_bytes"] < 0.65 * bf16_base
    assert formats["gptq"]["memory"]["weights_bytes"] < 0.5 * bf16_base
    assert formats["awq"]["memory"]["weights_bytes"] < 0.5 * bf16_base
    # 2 x 30 layers x 3 KV heads x 64 head dim x element bytes, predicted and measured from a real prefill
    assert formats["baseline"]["memory"]["kv_bytes_per_token"] == 11520 * element
    assert formats["baseline"]["memory"]["kv_bytes_per_token_measured"] == 11520 * element
    for name in FORMATS:
        assert formats[name]["capacity"]["max_num_seqs"] >= 1
        assert "--max-model-len" in formats[name]["capacity"]["vllm_flags"]
    # bitsandbytes int8 through vLLM's bitsandbytes plugin (vllm-bnb-plugin)
    assert formats["int8"]["capacity"]["servable"] is True
    assert "--quantization bitsandbytes --load-format bitsandbytes" in formats["int8"]["capacity"]["vllm_flags"]


def test_artifacts_carry_a_manifest(demo_run):
    _, report, _ = demo_run
    for name, engine in (("int8", "bitsandbytes"), ("gptq", "gptqmodel"), ("awq", "gptqmodel")):
        manifest = report["formats"][name]["artifact"]["manifest"]
        assert manifest["engine"] == engine and manifest["versions"][engine]
        assert manifest["calibration_hash"].startswith("sha256:") and manifest["recipe"]["format"] == name
    assert report["formats"]["gptq"]["artifact"]["manifest"]["recipe"]["group_size"] == 64


def test_second_identical_run_reuses_every_stage(demo_run, demo_cache, tmp_path):
    _, first, _ = demo_run
    result = quantgate("run", *E2E_ARGS, "--formats", "baseline,int8,gptq,awq", "--out", str(tmp_path),
                       cache=demo_cache)
    second = json.loads((tmp_path / "report.json").read_text())
    for name in FORMATS:
        assert second["formats"][name]["stages_run"] == [], name
        assert second["formats"][name]["verdict"] == first["formats"][name]["verdict"]
        assert second["formats"][name]["scores"] == first["formats"][name]["scores"]
    assert "reusing cached artifact" in result.stderr
    for name in FORMATS:
        assert f"{name}: reusing cached results (measurement, generations on 4 evalset(s))" in result.stderr


def test_the_report_validates_against_the_published_schema(demo_run):
    check_the_report_validates(demo_run[1])


def check_the_report_validates(report: dict) -> None:
    from harness.report.schema import RunReport

    RunReport.model_validate(report)
    for name in FORMATS:
        timeline = report["formats"][name]["memory"]["timeline"]
        assert timeline["peaks"]["rss_bytes"]["bytes"] > 0 and timeline["stages"][0]["stage"] == "load"
    assert set(report["formats"]["gptq"]["serving"]) == {"vllm", "sglang", "trtllm"}
    assert "--quantization bitsandbytes" in report["formats"]["int8"]["capacity"]["vllm_flags"]  # its plugin
