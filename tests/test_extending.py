"""docs/extending.md's worked example: a toy format and a toy metric (tests/plugins/quantgate_toy.py) added
through the seams alone (harness.formats.register, harness.metrics.register_metric, QUANTGATE_PLUGINS), then
planned for the serving engines and run through the real pipeline on the demo model."""

import argparse
import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, quantgate

PLUGIN_DIR = Path(__file__).parent / "plugins"


def _plugin_env() -> dict:
    return {"QUANTGATE_PLUGINS": "quantgate_toy",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGIN_DIR)])}


def test_the_toy_plugin_registers_a_format_and_a_metric(monkeypatch):
    from harness.formats import FORMAT_SPECS, check_format_names, default_formats
    from harness.capacity import weight_format
    from harness.metrics import METRIC_SPECS, metric_names, score_prediction
    from harness.plugins import load_plugins

    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    try:
        assert load_plugins({"QUANTGATE_PLUGINS": "quantgate_toy"}) == ["quantgate_toy"]
        assert check_format_names(["toy8"], "--formats") == ["baseline", "toy8"]
        assert "toy8" not in default_formats()  # default=False: only when asked for
        assert weight_format("toy8").bits == 8
        assert "length_ratio" in metric_names("generation")
        scores = score_prediction("generation", "en", "one two three", ["one two three four"], ["rougeL",
                                                                                             "length_ratio"])
        assert scores["length_ratio"] == 75.0 and 0 < scores["rougeL"] <= 100
    finally:
        FORMAT_SPECS.pop("toy8", None)
        METRIC_SPECS.pop("length_ratio", None)


TOY8_REFUSAL = "toy8 is fake-quantized 16-bit weights: serve the baseline instead"  # the toy spec's vllm_refusal


def test_plan_takes_a_plugin_format_and_follows_its_serving_fields(tmp_path):
    """`quantgate plan --format toy8` through the seam alone: the registry knows toy8 once the plugin has loaded,
    and every engine's plan follows the toy spec (its vllm_refusal, no serving entry of its own): nothing serves it,
    so no command and no --quantization made up from its name."""
    result = quantgate("plan", "--format", "baseline,toy8", "--target-gpu", "L4", "--json", cache=tmp_path,
                       check_codes=(0,), env=_plugin_env())
    plan = json.loads(result.stdout)
    toy = plan["formats"]["toy8"]
    assert (toy["bits"], toy["group_size"]) == (8, None)
    for engine in ("vllm", "sglang", "trtllm"):
        assert plan["formats"]["baseline"]["engines"][engine]["servable"]
        entry = toy["engines"][engine]
        assert (entry["servable"], entry["command"], entry["reason"]) == (False, "", TOY8_REFUSAL), engine
    assert "--quantization toy8" not in result.stdout  # nor toy8_marlin
    unknown = quantgate("plan", "--format", "toy8", cache=tmp_path, check_codes=(2,))  # without the plugin
    assert "unknown format 'toy8'" in unknown.stderr


def test_the_planners_ask_the_spec_not_the_name(tmp_path, capsys):
    """A plugin's 4-bit format that vLLM and SGLang serve as plain awq (no Marlin variant) and TensorRT-LLM does not
    take at all: each engine's plan says what the spec says, and its group size follows `grouped`."""
    from harness.commands import plan as plan_command
    from harness.formats import FORMAT_SPECS, EngineServing, FormatSpec, register

    register(FormatSpec("toy4", engine="toy-rounding", bits=4, grouped=True, vllm_quantization="awq", default=False,
                        serving={"trtllm": EngineServing(refusal="TensorRT-LLM: no toy4 layout")}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
              "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    parser = argparse.ArgumentParser(prog="quantgate")
    plan_command.add_parser(parser.add_subparsers())
    try:
        args = parser.parse_args(["plan", "--model", str(tmp_path), "--format", "toy4", "--target-gpu", "L4",
                                  "--json"])
        assert args.func(args) == 0
    finally:
        FORMAT_SPECS.pop("toy4", None)
    toy = json.loads(capsys.readouterr().out)["formats"]["toy4"]
    assert toy["group_size"] == 128  # chosen because the spec is grouped
    engines = toy["engines"]
    for engine in ("vllm", "sglang"):
        assert ["--quantization", "awq"] in engines[engine]["args"], engine  # plain: no Marlin variant declared
    assert (engines["trtllm"]["servable"], engines["trtllm"]["reason"]) == (False, "TensorRT-LLM: no toy4 layout")


class EchoRuntime:
    """A runtime that answers each prompt with its last token: the Runtime protocol and nothing else."""

    dtype = "float32"
    preload = ()

    @classmethod
    def load(cls, artifact_path, *, dtype="auto", trust_remote_code=False):
        return cls()

    def encode(self, prompt):
        return [len(word) for word in prompt.split()]

    def generate(self, prompts, max_new_tokens):
        from harness.runtime.base import BatchTiming, Generation

        return ([Generation(str(p[-1]), len(p), 1) for p in prompts],
                BatchTiming(len(prompts), max(map(len, prompts)), 1, 0.001, 0.002))

    def generate_with_cache_bytes(self, prompts, max_new_tokens):
        return (*self.generate(prompts, max_new_tokens), 0)

    def weights_bytes(self):
        return 0

    def parameter_count(self):
        return 0


def test_a_runtime_is_one_registry_entry(tmp_path):
    """The worker loads the runtime its job names through harness.runtime.registry, then drives it through the
    Runtime protocol alone."""
    from harness import worker
    from harness.errors import UserError
    from harness.jobs import DeviceJob, GenerateItem, GenerateTask
    from harness.runtime.registry import RUNTIMES, register_runtime, runtime_class
    from harness.runtime.transformers_backend import LoadedModel

    assert runtime_class("transformers") is LoadedModel
    with pytest.raises(UserError, match="unknown runtime 'echo' \\(known: transformers"):
        runtime_class("echo")
    register_runtime("echo", f"{__name__}:EchoRuntime")
    task = GenerateTask("faq", "k", 4, (GenerateItem("a", "one three"), GenerateItem("b", "seven")),
                        str(tmp_path / "faq.json"))
    try:
        worker.run_device_job(DeviceJob(str(tmp_path), batch_size=2, generate=(task,), runtime="echo"))
    finally:
        RUNTIMES.pop("echo")
    outputs = json.loads((tmp_path / "faq.json").read_text(encoding="utf-8"))["outputs"]
    assert [(o["id"], o["prediction"]) for o in outputs] == [("a", "5"), ("b", "5")]


def test_backend_names_a_registered_runtime():
    from pydantic import ValidationError

    from harness.config import RunSpec
    from harness.cachekeys import device_runtime
    from harness.runtime.registry import RUNTIMES, register_runtime

    with pytest.raises(ValidationError, match="a registered serving engine \\(vllm\\) or runtime \\(transformers"):
        RunSpec(backend="echo")
    register_runtime("echo", f"{__name__}:EchoRuntime")
    try:
        assert device_runtime(RunSpec(backend="echo")) == "echo"
    finally:
        RUNTIMES.pop("echo")
    assert device_runtime(RunSpec(backend="vllm")) == device_runtime(RunSpec()) == "transformers"


def test_a_missing_plugin_is_one_line(demo_cache, tmp_path):
    result = quantgate("run", "--out", str(tmp_path), cache=demo_cache, check_codes=(2,),
                       env={"QUANTGATE_PLUGINS": "no_such_plugin"})
    assert "cannot import plugin module 'no_such_plugin'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_toy_format_and_metric_run_through_the_pipeline(demo_cache, tmp_path):
    spec = (ROOT / "evalsets" / "en_incident_summaries.toml").read_text()
    spec = spec.replace('metrics = ["rouge1", "rouge2", "rougeL"]', 'metrics = ["rougeL", "length_ratio"]')
    spec = spec.replace('gate = ["rougeL"]', 'gate = ["rougeL", "length_ratio"]')
    (tmp_path / "summaries.toml").write_text(spec)  # its data file beside it: specs read no file outside their folder
    (tmp_path / "en_incident_summaries.jsonl").write_bytes((ROOT / "evalsets" / "en_incident_summaries.jsonl").read_bytes())
    (tmp_path / "policy.toml").write_text("[margins]\nlength_ratio = 5.0\n")
    out = tmp_path / "out"
    quantgate("run", "--model", "demo", "--formats", "baseline,toy8", "--evalsets", str(tmp_path / "summaries.toml"),
              "--policy", str(tmp_path / "policy.toml"), "--max-items", "4", "--max-new-tokens", "16",
              "--latency-requests", "2", "--backend", "toy-eager", "--out", str(out), cache=demo_cache,
              env=_plugin_env())
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["backend"] == "toy-eager"  # the plugin's runtime measured and generated
    toy = report["formats"]["toy8"]
    assert toy["status"] == "ok", toy["error"]
    assert toy["artifact"]["manifest"]["engine"] == "toy-rounding" and "quantize" in toy["stages_run"]
    assert {"en_incident_summaries/rougeL", "en_incident_summaries/length_ratio"} <= {
        f"{s}/{m}" for s, metrics in toy["scores"].items() for m in metrics}
    assert toy["verdict"] in ("GO", "NO-GO", "INCONCLUSIVE")


def test_a_toy_serving_engine_serves_through_the_seam_alone(demo_checkpoint, demo_cache, tmp_path):
    """--backend toyserve: an engine registered by a plugin (tests/plugins/quantgate_toy_serve.py, its server a
    tiny OpenAI completions server) serves the baseline, is scored and timed through it, refuses toy8 with its own
    reason, and leaves no server behind; nothing in quantgate names it."""
    import psutil

    from conftest import ours, tiny_llama

    model = tiny_llama(demo_checkpoint, tmp_path / "tiny")
    out = tmp_path / "out"
    env = {"QUANTGATE_PLUGINS": "quantgate_toy,quantgate_toy_serve",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGIN_DIR)])}
    result = quantgate("run", "--model", str(model), "--formats", "baseline,toy8", "--backend", "toyserve",
                       "--max-items", "2", "--max-new-tokens", "8", "--latency-requests", "2", "--out", str(out),
                       cache=demo_cache, env=env)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["backend"] == "toyserve"
    served = report["formats"]["baseline"]["served"]
    assert served["status"] == "ok" and served["scored"], served["reason"]
    assert served["engine"] == "toyserve" and served["version"] == "0.1"
    assert served["kernels"] == ["ToyGreedyLoop"]  # read from its start-up log
    assert served["baseline_probe"].startswith("reproduced")  # it answers as transformers does
    assert served["latency"]["concurrency_1"]["requests"] == 2 and served["startup_s"] > 0
    assert served["saturation"]["holds"] is False and "preemption counter" in served["saturation"]["reason"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert any(s["format"] == "baseline" and s["prediction"] for s in samples)
    toy8 = report["formats"]["toy8"]
    assert toy8["served"]["status"] == "unsupported" and "16-bit checkpoints only" in toy8["served"]["reason"]
    assert "toy8: ToyServe will not serve it" in result.stderr
    markdown = (out / "report.md").read_text()
    assert "## Served by ToyServe" in markdown and "Scores come from the ToyServe server (backend toyserve)" in markdown
    assert (out / "logs" / "baseline.toyserve.log").is_file()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if "toy_openai_server.py" in " ".join(p.info["cmdline"] or []) and ours(p)]
    assert not left, "the toy server outlived the run"
