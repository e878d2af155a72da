"""Serving plans in the report (measured_fields, renderers, schema) and capacity as a checked policy item, with real
configs: the demo model (SmolLM2-135M) and Llama-3-8B, and measured-like weights."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from harness.format_plans import max_model_len_of, report_capacity, serving_fit
from harness.report.build import measured_fields
from harness.report.schema import capacity_view
from harness.commands import run as run_command
from harness.config import CapacitySettings, RunSpec
from harness.decide import FormatOutcome, ServingFit, decide_format, recommend
from harness.errors import UserError
from harness.evalsets.prompts import Prompt
from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_vllm, weight_format
from harness.capacity.vllm import NEWEST_VERSION
from harness.measure.kv import DEMO_CONFIG, text_config
from harness.measure.probe import Measurement
from harness.records import FormatRun
from harness.policy import Policy, ServingTarget, load_policy
from harness.quantize.base import Recipe
from harness.report.html import render_html
from harness.report.markdown import render_markdown
from harness.report.schema import RunReport, parse_report
from records import run_inputs
from tests.test_model_configs import LLAMA3_8B

FIXTURE = Path(__file__).parent / "fixtures" / "run_example"
# Measured-like weights (bytes, 16-bit serving size) of the demo model's formats, as the worker reports them.
DEMO_WEIGHTS = {"baseline": 269_030_016, "int8": 163_483_776, "gptq": 112_622_976, "awq": 112_023_936}
# Llama-3-8B: what a run measures for each format (within a few MB of the planners' own estimate).
LLAMA_WEIGHTS = {"baseline": 16_060_522_496, "int8": 9_086_705_664, "gptq": 5_732_835_328, "awq": 5_727_854_592}
L4_POLICY = Policy(serving=ServingTarget(target_gpu="L4", max_model_len=4096, min_concurrency=8))


def format_entry(inputs, run, max_model_len: int) -> dict:
    """A format's measured fields as report.json holds them (the schema objects dumped as the report writes them,
    with `capacity`, the view of the vllm plan, FormatResult writes)."""
    fields = measured_fields(inputs, run, max_model_len)
    entry = json.loads(json.dumps(fields, default=lambda block: block.model_dump(mode="json", exclude_unset=True)))
    entry["capacity"] = capacity_view(fields["serving"]["vllm"]) if fields["serving"] else None
    return entry


def inputs_for(config: dict, policy: Policy = Policy(), capacity: CapacitySettings | None = None,
               prompts: dict | None = None):
    # The newest vLLM rules whatever vLLM this machine has (.venv-vllm's would decide otherwise).
    capacity = capacity or CapacitySettings(vllm_version=NEWEST_VERSION)
    return run_inputs(spec=RunSpec(capacity=capacity), model_config=config, policy=policy, prompts=prompts or {},
                      calibration=None, recipes={"gptq": Recipe("gptq", bits=4, group_size=64),
                                                 "awq": Recipe("awq", bits=4, group_size=64)})


PROFILED = "measured (profile forward of 8,192 tokens over 256 sequences)"
# vLLM on a 22 GiB L4 profiles at its own default budget, 2048 tokens (vllm_versions), so the forward measured at
# 8192 is scaled to it
PROFILED_FOR_VLLM_ON_L4 = "measured (profile forward of 8,192 tokens over 256 sequences, scaled linearly to 2,048 tokens)"


def measured(name: str, weights: int | None, *, compute_dtype: str = "bfloat16", activation: int = 50 * 2**20,
             profiled: bool = True):
    """A measured format as the worker writes it; `profiled`: with a profile forward at vLLM's default budget
    (8,192 tokens over 256 sequences) whose activation peak is `activation`, as a GPU run has."""
    scale = 2 if compute_dtype == "float32" else 1
    memory = {} if weights is None else {"weights_bytes": weights * scale, "activation_peak_bytes": activation * scale,
                                         "peak_bytes": weights * scale + activation * scale,
                                         "rss_peak_bytes": weights * scale + activation * scale}
    result = {"memory": memory, "latency": {}, "compute_dtype": compute_dtype}
    if weights is not None and profiled:
        result["profile"] = {"profile_tokens": 8192, "profile_sequences": 256,
                             "activation_profile_bytes": activation * scale}
    return FormatRun(name, measurement=Measurement(result=result))


# --- the report's serving block -------------------------------------------------------------------


def test_format_entry_plans_three_engines_from_the_measured_weights():
    inputs = inputs_for(DEMO_CONFIG, capacity=CapacitySettings(target_gpu="L4"))
    entry = format_entry(inputs, measured("gptq", DEMO_WEIGHTS["gptq"]), 600)
    assert set(entry["serving"]) == {"vllm", "sglang", "trtllm"}
    vllm = entry["serving"]["vllm"]
    assert vllm["memory"]["weights_bytes"] == DEMO_WEIGHTS["gptq"] and vllm["memory"]["weights_source"] == "measured"
    assert vllm["memory"]["activation_bytes"] == 50 * 2**20 * 2048 // 8192
    assert vllm["memory"]["activation_source"] == PROFILED_FOR_VLLM_ON_L4
    assert vllm["memory"]["gpu_memory_bytes"] == gpu_by_name("L4").memory_bytes and vllm["max_model_len"] == 600
    assert vllm["command"].startswith("vllm serve MODEL ") and "--quantization gptq" in vllm["command"]
    # the version-1 capacity block is the same vLLM plan
    cap = entry["capacity"]
    assert cap["vllm_flags"] == vllm["command"].removeprefix("vllm serve MODEL ") and cap["fits"] and cap["servable"]
    assert cap["kv_tokens"] == vllm["kv_tokens"] and cap["max_num_seqs"] == vllm["max_num_seqs"]
    assert entry["serving"]["sglang"]["command"].startswith("python -m sglang.launch_server")
    assert "trtllm-serve" in entry["serving"]["trtllm"]["command"]
    json.dumps(entry)  # JSON-ready: lists, not tuples
    assert isinstance(vllm["args"][0], list)


def test_the_prefix_all_prompts_open_with_is_counted_in_every_engine():
    """The run's rendered prompts share 40 tokens (a chat template's system prompt, say), across evalsets: vLLM
    keeps 2 whole 16-token blocks of them once, SGLang all 40, TensorRT-LLM one 32-token block."""
    system = tuple(range(100, 140))
    prompts = {"faq": [Prompt("faq", "1", "a", 45, 8, system + (1, 2, 3, 4, 5)),
                       Prompt("faq", "2", "b", 42, 8, system + (6, 7))],
               "news": [Prompt("news", "1", "c", 41, 8, system + (9,))]}
    inputs = inputs_for(DEMO_CONFIG, capacity=CapacitySettings(target_gpu="L4"),
                        prompts=prompts)
    serving = format_entry(inputs, measured("gptq", DEMO_WEIGHTS["gptq"]), 600)["serving"]
    assert {engine: plan["shared_prefix_tokens"] for engine, plan in serving.items()} == dict.fromkeys(serving, 40)
    vllm = serving["vllm"]
    per_token = vllm["memory"]["kv_bytes_per_token"]
    assert vllm["max_concurrency_shared_prefix"] == (vllm["memory"]["kv_cache_bytes"] - 32 * per_token) // \
        (vllm["memory"]["kv_bytes_per_sequence"] - 32 * per_token)
    assert any("40 tokens every request opens with (common to the run's 3 rendered prompts) once, 2 whole" in n
               for n in vllm["notes"])


def test_float32_host_plans_the_16_bit_serving_size():
    inputs = inputs_for(DEMO_CONFIG)
    entry = format_entry(inputs, measured("baseline", DEMO_WEIGHTS["baseline"], compute_dtype="float32"), 600)
    memory = entry["serving"]["vllm"]["memory"]
    assert memory["weights_bytes"] == DEMO_WEIGHTS["baseline"] and memory["activation_bytes"] == 50 * 2**20


def test_int8_is_planned_for_vllm_with_the_bitsandbytes_plugin():
    """bitsandbytes left vLLM's core for vllm-bnb-plugin (0.32 on): the plan prints its flags and names the plugin
    it needs, as SGLang's plan prints its own bitsandbytes."""
    entry = format_entry(inputs_for(DEMO_CONFIG), measured("int8", DEMO_WEIGHTS["int8"]), 600)
    cap = entry["capacity"]
    assert cap["servable"] is True and cap["fits"]
    assert cap["vllm_flags"].endswith("--quantization bitsandbytes --load-format bitsandbytes")
    assert any("vllm-bnb-plugin" in note for note in entry["serving"]["vllm"]["notes"])
    assert entry["serving"]["sglang"]["fits"]


@pytest.fixture
def unservable_format(monkeypatch):
    """A format no vLLM serves (its FormatSpec refuses), registered for one test: what a verdict on capacity does
    with a format vLLM cannot serve at all."""
    from harness.formats import FORMAT_SPECS, FormatSpec

    spec = FormatSpec("legacy8", engine="test", bits=8, vllm_refusal="legacy8 is no vLLM quantization method")
    monkeypatch.setitem(FORMAT_SPECS, "legacy8", spec)
    return "legacy8"


def test_run_target_defaults_to_an_80_gib_gpu():
    entry = format_entry(inputs_for(DEMO_CONFIG), measured("awq", DEMO_WEIGHTS["awq"]), 600)
    assert entry["capacity"]["gpu_memory_gib"] == 80.0
    # vLLM 0.34's default: no utilization, the KV cache set outright
    assert entry["serving"]["vllm"]["gpu_memory_utilization"] is None and entry["capacity"]["gpu_memory_utilization"] is None
    assert "--kv-cache-memory-bytes" in entry["capacity"]["vllm_flags"]
    older = format_entry(inputs_for(DEMO_CONFIG, capacity=CapacitySettings(vllm_version="0.32")),
                         measured("awq", DEMO_WEIGHTS["awq"]), 600)
    assert older["serving"]["vllm"]["gpu_memory_utilization"] == 0.92  # vLLM 0.32's default
    given = format_entry(inputs_for(DEMO_CONFIG, capacity=CapacitySettings(gpu_memory_utilization=0.85)),
                         measured("awq", DEMO_WEIGHTS["awq"]), 600)
    assert given["serving"]["vllm"]["gpu_memory_utilization"] == 0.85  # the run's --gpu-memory-utilization
    md = render_markdown(parse_report(json.loads(json.dumps(_report_with(entry))), "report.json"), [])
    assert "**Capacity.** On an 80 GiB GPU, max-model-len 600: " in md


def test_the_report_plans_for_the_policy_target_when_the_run_names_none():
    """A policy with [serving] target_gpu = "L4", max_model_len = 4096 and a run with no --target-gpu,
    --gpu-memory-gib or --max-model-len: the printed commands are for the L4 at 4,096 tokens, the deployment the
    capacity check judges, and report.json says where the target came from."""
    inputs = inputs_for(DEMO_CONFIG, policy=L4_POLICY)
    planned = report_capacity(inputs)
    assert (planned.target_source, planned.settings.target_gpu, planned.settings.max_model_len) == ("policy", "L4",
                                                                                                    4096)
    assert planned.settings.gpu_memory_gib == gpu_by_name("L4").memory_bytes / 2**30
    assert max_model_len_of(inputs) == 4096
    entry = format_entry(inputs, measured("awq", DEMO_WEIGHTS["awq"]), max_model_len_of(inputs))
    vllm = entry["serving"]["vllm"]
    assert vllm["memory"]["gpu_memory_bytes"] == gpu_by_name("L4").memory_bytes and vllm["max_model_len"] == 4096
    assert "--max-model-len 4096 " in entry["capacity"]["vllm_flags"]
    # the run's own settings win, each where given: a GPU of 40 GiB, still the policy's length; then 1,024 tokens
    own_gpu = report_capacity(inputs_for(DEMO_CONFIG, policy=L4_POLICY, capacity=CapacitySettings(gpu_memory_gib=40)))
    assert (own_gpu.target_source, own_gpu.settings.target_gpu, own_gpu.settings.gpu_memory_gib,
            own_gpu.settings.max_model_len) == ("run", None, 40, 4096)
    own_len = inputs_for(DEMO_CONFIG, policy=L4_POLICY, capacity=CapacitySettings(max_model_len=1024))
    assert report_capacity(own_len).settings.target_gpu == "L4" and max_model_len_of(own_len) == 1024
    # no policy target and no flags: an 80 GiB GPU and the run's longest request, as before
    plain = report_capacity(inputs_for(DEMO_CONFIG))
    assert (plain.target_source, plain.settings.target_gpu, plain.settings.gpu_memory_gib,
            plain.settings.max_model_len) == ("default", None, 80.0, None)


def test_unmeasured_or_unreadable_config_has_no_plan():
    assert format_entry(inputs_for(DEMO_CONFIG), measured("gptq", None), 600)["serving"] is None
    unreadable = {"architectures": ["X"], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    entry = format_entry(inputs_for(unreadable), measured("gptq", 10**6), 600)
    assert entry["capacity"] is None and entry["serving"] is None


def _report_with(entry: dict) -> dict:
    """The committed version-1 example with every planned format's capacity and serving replaced by `entry`'s."""
    report = json.loads((FIXTURE / "report.json").read_text(encoding="utf-8"))
    for fmt in report["formats"].values():
        if fmt.get("capacity"):
            fmt["capacity"], fmt["serving"] = entry["capacity"], entry["serving"]
    return report


def _report_with_serving() -> dict:
    """The committed version-1 example with the demo's serving plans on an L4 put in."""
    report = json.loads((FIXTURE / "report.json").read_text(encoding="utf-8"))
    report["settings"]["capacity"] = {"target_gpu": "L4", "gpu_memory_gib": 80.0, "gpu_memory_utilization": 0.9,
                                      "max_model_len": None, "overhead_gib": 0.0}
    inputs = inputs_for(DEMO_CONFIG, capacity=CapacitySettings(target_gpu="L4", vllm_version="0.32"))
    for name, fmt in report["formats"].items():
        if fmt.get("capacity"):
            entry = format_entry(inputs, measured(name, DEMO_WEIGHTS[name]), 600)
            fmt["capacity"], fmt["serving"] = entry["capacity"], entry["serving"]
    return report


def test_markdown_and_html_print_the_three_engines_beside_each_format():
    report = _report_with_serving()
    RunReport.model_validate(json.loads(json.dumps(report)))  # the contract holds the serving block
    md = render_markdown(parse_report(json.loads(json.dumps(report)), "report.json"), [])
    gptq = md[md.index("## gptq"):md.index("## awq")]
    assert f"**Serving on L4 (22.03 GiB) (weights measured, activations {PROFILED_FOR_VLLM_ON_L4})**" in gptq
    for title in ("- **vLLM ", "- **SGLang**: ", "- **TensorRT-LLM**: "):
        assert title in gptq
    assert "      vllm serve MODEL --max-model-len 600" in gptq and "      python -m sglang.launch_server" in gptq
    assert gptq.count("vllm serve MODEL") == 1  # the capacity paragraph leaves the command to the vLLM row
    int8 = md[md.index("## int8"):md.index("## gptq")]
    assert "- **vLLM 0.3" in int8 and "--quantization bitsandbytes --load-format bitsandbytes" in int8
    assert "vllm-bnb-plugin" in int8
    assert "**Capacity.** On an L4 (22.03 GiB) at 0.92 utilization, max-model-len 600: " in gptq
    report["settings"]["capacity"]["target_source"] = "policy"
    md = render_markdown(parse_report(json.loads(json.dumps(report)), "report.json"), [])
    assert "**Serving on L4 (22.03 GiB), the policy's serving target (weights measured" in md
    page = render_html(parse_report(json.loads(json.dumps(report)), "report.json"), [])
    assert "<h3>Serving on L4 (22.03 GiB), the policy&#x27;s serving target" in page
    assert "<td>TensorRT-LLM</td>" in page
    assert "<pre><code>python -m sglang.launch_server" in page


def test_reports_without_serving_render_as_before():
    report = json.loads((FIXTURE / "report.json").read_text(encoding="utf-8"))
    md = render_markdown(parse_report(json.loads(json.dumps(report)), "report.json"), [])
    assert "Serving on" not in md and "vllm serve MODEL --quantization gptq_marlin" in md
    assert "Serving on" not in render_html(parse_report(json.loads(json.dumps(report)), "report.json"), [])
    assert all("serving" not in fmt for fmt in report["formats"].values())
    RunReport.model_validate(report)


# --- flags and policy keys ------------------------------------------------------------------------


def run_args(*argv: str):
    parser = argparse.ArgumentParser()
    run_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_target_gpu_flag():
    _, capacity = run_command.flag_values(run_args("--target-gpu", "l4"))
    assert capacity == {"target_gpu": "L4"}
    spec = RunSpec().model_copy(update={"capacity": CapacitySettings().model_copy(update=capacity)})
    assert spec.capacity.target().gpu.name == "L4"
    assert RunSpec().capacity.target().gpu.memory_bytes == 80 * 2**30  # default unchanged
    with pytest.raises(UserError, match="unknown GPU 'Z9'"):
        run_command.flag_values(run_args("--target-gpu", "Z9"))
    # both: the named GPU at that size (a shared card), its compute capability kept
    _, both = run_command.flag_values(run_args("--target-gpu", "L4", "--gpu-memory-gib", "20"))
    gpu = CapacitySettings(**both).target().gpu
    assert gpu.memory_gib == 20 and gpu.compute_capability == 8.9


def test_policy_serving_keys(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[serving]\ntarget_gpu = "l4"\nmax_model_len = 4096\nmin_concurrency = 8\n', encoding="utf-8")
    serving = load_policy(path).serving
    assert (serving.target_gpu, serving.length, serving.concurrency) == ("L4", 4096, 8)
    assert load_policy(path).as_dict()["serving"] == {"target_gpu": "L4", "max_model_len": 4096, "min_concurrency": 8}
    assert not Policy().serving.checked and Policy().serving.length == 4096 and Policy().serving.concurrency == 1
    for text, message in (('[serving]\nmin_concurrency = 8\n', "no target_gpu"),
                          ('[serving]\ntarget_gpu = "Z9"\n', "unknown GPU"),
                          ('[serving]\ntarget_gpus = "L4"\n', "unknown key 'serving.target_gpus' (allowed: target_gpu")):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(UserError, match=message.replace("(", r"\(")):
            load_policy(path)


# --- the capacity check ---------------------------------------------------------------------------


def quality_items(n: int = 60) -> dict:
    """Scores that vary item to item and are identical for both formats: the metric check passes (GO)."""
    return {"qa": {f"q{i}": {"f1": float(i % 5 * 25)} for i in range(n)}}


def outcome(name: str, fit: ServingFit | None = None, peak: int | None = None) -> FormatOutcome:
    return FormatOutcome(name, items=quality_items(), gates={"qa": ["f1"]}, serving_fit=fit, peak_bytes=peak)


def capacity_check(decision) -> dict:
    return next(c for c in decision.checks if c["kind"] == "capacity")


def test_capacity_check_fails_with_the_numbers():
    decision = decide_format(outcome("baseline"), outcome("awq", ServingFit("L4", 4096, 5)), L4_POLICY)
    assert decision.verdict == "NO-GO"
    check = capacity_check(decision)
    assert check == {"name": "capacity", "kind": "capacity", "status": "fail",
                     "detail": "holds 5 sequences of 4,096 tokens on an L4, policy needs 8",
                     "reason": "capacity: holds 5 sequences of 4,096 tokens on an L4, policy needs 8"}
    assert decision.reasons == ["capacity: holds 5 sequences of 4,096 tokens on an L4, policy needs 8"]
    go = decide_format(outcome("baseline"), outcome("awq", ServingFit("L4", 4096, 8)), L4_POLICY)
    assert go.verdict == "GO" and capacity_check(go)["status"] == "pass" and "fits the serving target" in go.reasons[0]


def test_no_serving_target_no_check_and_unplanned_is_inconclusive():
    plain = decide_format(outcome("baseline"), outcome("awq", ServingFit("L4", 4096, 1)), Policy())
    assert plain.verdict == "GO" and all(c["kind"] != "capacity" for c in plain.checks)
    unplanned = decide_format(outcome("baseline"), outcome("awq"), L4_POLICY)
    assert unplanned.verdict == "INCONCLUSIVE" and capacity_check(unplanned)["status"] == "inconclusive"
    assert not Policy().without_budgets().serving.checked and L4_POLICY.has_budgets()
    assert not L4_POLICY.without_budgets().serving.checked


def test_llama3_8b_on_an_l4_with_real_numbers(unservable_format):
    """Llama-3-8B at 4,096 tokens on an L4 (22.03 GiB as torch reports it), vLLM, a measured 50 MiB activation peak: the 16-bit weights
    leave room for 9 sequences (512 MiB each), int8 for 22, the 4-bit ones for 29; a format vLLM cannot serve, for
    none. The check plans at the policy's L4 whatever the run targets."""
    shape = model_shape(text_config(LLAMA3_8B))
    inputs = inputs_for(LLAMA3_8B, policy=L4_POLICY)
    weights = {**LLAMA_WEIGHTS, unservable_format: LLAMA_WEIGHTS["int8"]}
    fits = {name: serving_fit(inputs, measured(name, size)) for name, size in weights.items()}
    assert {name: fit.max_concurrency for name, fit in fits.items()} == {"baseline": 9, "int8": 22, "gptq": 29,
                                                                         "awq": 29, unservable_format: 0}
    direct = plan_vllm(shape, weight_format("awq", 64), Target(gpu_by_name("L4")),
                       Workload(max_model_len=4096, weights_bytes=LLAMA_WEIGHTS["awq"], activation_bytes=50 * 2**20))
    assert fits["awq"].max_concurrency == direct.max_concurrency and fits["awq"].weights_source == "measured"
    assert fits["int8"].servable
    assert not fits[unservable_format].servable and "no vLLM quantization method" in fits[unservable_format].reason
    # the report's plan is the check's when the run names no target of its own; a run that names 80 GiB gets that
    report_plan = format_entry(inputs, measured("awq", LLAMA_WEIGHTS["awq"]), 4096)["serving"]["vllm"]
    assert report_plan["max_concurrency"] == fits["awq"].max_concurrency == 29
    own = inputs_for(LLAMA3_8B, policy=L4_POLICY, capacity=CapacitySettings(gpu_memory_gib=80.0,
                                                                            vllm_version=NEWEST_VERSION))
    assert format_entry(own, measured("awq", LLAMA_WEIGHTS["awq"]), 4096)["serving"]["vllm"]["max_concurrency"] > 100
    assert serving_fit(own, measured("awq", LLAMA_WEIGHTS["awq"])).max_concurrency == 29  # the check: still the L4

    baseline = outcome("baseline")
    decisions = {name: decide_format(baseline, outcome(name, fits[name]), L4_POLICY)
                 for name in ("int8", "gptq", "awq", unservable_format)}
    assert {n: d.verdict for n, d in decisions.items()} == {"int8": "GO", "gptq": "GO", "awq": "GO",
                                                            unservable_format: "NO-GO"}
    assert capacity_check(decisions[unservable_format])["detail"].startswith(
        "vLLM cannot serve it on an L4, policy needs 8 sequences of 4,096 tokens: legacy8 is no vLLM")
    assert capacity_check(decisions["gptq"])["detail"] == "holds 29 sequences of 4,096 tokens on an L4, policy needs 8"

    # more than the L4 holds: every 4-bit format is NO-GO with its numbers
    strict = Policy(serving=ServingTarget(target_gpu="L4", max_model_len=4096, min_concurrency=30))
    fit = serving_fit(inputs_for(LLAMA3_8B, policy=strict), measured("awq", LLAMA_WEIGHTS["awq"]))
    decision = decide_format(baseline, outcome("awq", fit), strict)
    assert decision.verdict == "NO-GO"
    assert capacity_check(decision)["detail"] == "holds 29 sequences of 4,096 tokens on an L4, policy needs 30"


def test_recommendation_is_the_smallest_format_that_is_go_and_fits(unservable_format):
    """On a CPU host a format's measured peak can be the smallest while vLLM cannot serve it: the capacity check makes
    it NO-GO and the recommendation the smallest format that is GO and fits."""
    inputs = inputs_for(LLAMA3_8B, policy=L4_POLICY)
    peaks = {unservable_format: 9_500_000_000, "awq": 9_700_000_000, "gptq": 9_900_000_000}
    weights = {**LLAMA_WEIGHTS, unservable_format: LLAMA_WEIGHTS["int8"]}
    baseline = outcome("baseline")
    decisions = {name: decide_format(baseline, outcome(name, serving_fit(inputs, measured(name, weights[name])),
                                                       peaks[name]), L4_POLICY) for name in peaks}
    rec = recommend({n: d.verdict for n, d in decisions.items()}, peaks)
    assert rec["format"] == "awq" and rec["runner_up"] == "gptq"
    without = {name: decide_format(baseline, outcome(name, None, peaks[name]), Policy()) for name in peaks}
    assert recommend({n: d.verdict for n, d in without.items()}, peaks)["format"] == unservable_format  # when the policy names no serving target


def test_demo_model_fits_an_l4_many_times_over():
    inputs = inputs_for(DEMO_CONFIG, policy=Policy(serving=ServingTarget(target_gpu="T4", min_concurrency=64)))
    fit = serving_fit(inputs, measured("gptq", DEMO_WEIGHTS["gptq"]))
    assert fit.gpu == "T4" and fit.max_model_len == 4096 and fit.max_concurrency >= 64
    decision = decide_format(outcome("baseline"), outcome("gptq", fit), inputs.policy)
    assert decision.verdict == "GO"
    assert capacity_check(decision)["detail"].endswith("tokens on a T4, policy needs 64")


def test_unmeasured_weights_are_estimated_for_the_check():
    fit = serving_fit(inputs_for(LLAMA3_8B, policy=L4_POLICY), FormatRun("awq", status="failed"))
    assert fit.weights_source == "estimated from the config" and fit.max_concurrency > 8


def test_copy_of_policy_is_unchanged():
    assert copy.deepcopy(L4_POLICY) == L4_POLICY


def test_measured_overhead_replaces_the_non_torch_estimate():
    """--capacity-overhead-gib is the user's measured CUDA context + non-torch memory: every engine plans with it."""
    from harness.capacity.memory import NON_TORCH_BYTES, NON_TORCH_SINCE_START_BYTES

    default = format_entry(inputs_for(DEMO_CONFIG, capacity=CapacitySettings(target_gpu="L4")),
                           measured("gptq", DEMO_WEIGHTS["gptq"]), 600)
    measured_overhead = format_entry(
        inputs_for(DEMO_CONFIG, capacity=CapacitySettings(target_gpu="L4", overhead_gib=2.0)),
        measured("gptq", DEMO_WEIGHTS["gptq"]), 600)
    for engine in ("vllm", "sglang", "trtllm"):
        # vLLM (0.20 on) counts only what the instance allocated after its CUDA context existed
        expected = NON_TORCH_SINCE_START_BYTES if engine == "vllm" else NON_TORCH_BYTES
        assert default["serving"][engine]["memory"]["non_torch_bytes"] == expected
        assert measured_overhead["serving"][engine]["memory"]["non_torch_bytes"] == 2 * 2**30
        assert measured_overhead["serving"][engine]["kv_tokens"] < default["serving"][engine]["kv_tokens"]
