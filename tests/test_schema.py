"""The report.json contract: committed reports validate, drift fails naming the field, the published JSON Schema
and docs/report.md agree with the models, and what the producer writes today validates."""

from __future__ import annotations

import copy
import inspect
import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from harness.report import schema
from harness.report.schema import REGENERATE, RunReport, schema_text

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "run_example" / "report.json"
VERSION_1 = ROOT / "tests" / "fixtures" / "report_v1.json"
SHARED_BASELINE = ROOT / "reports" / "shared-baseline" / "report.json"
EXAMPLE = ROOT / "reports" / "example"
PUBLISHED = ROOT / "docs" / "report.schema.json"
PAGE = ROOT / "docs" / "report.md"


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def models() -> dict[str, type[BaseModel]]:
    """Every model of the contract, by name."""
    return {name: cls for name, cls in vars(schema).items()
            if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == schema.__name__
            and not name.startswith("_")}


# --- committed reports ----------------------------------------------------------------------------


def test_a_version_2_report_validates_unchanged():
    data = load(FIXTURE)
    report = RunReport.model_validate(data)
    assert report.schema_version == schema.SCHEMA_VERSION == 2
    assert schema.report_dict(report) == data  # nothing dropped, coerced or reordered on the way
    assert list(report.formats["gptq"].artifact.manifest.model_dump(exclude_unset=True)) == list(data["formats"]["gptq"]["artifact"]["manifest"])


def test_the_example_report_is_what_this_version_renders(tmp_path):
    """reports/example is a real `nox -s demo` run; the README links its Markdown. After a change to the renderer or
    the schema, `quantgate report reports/example` re-renders it (seconds), and a schema change that breaks it needs
    a new demo run."""
    from harness import cli

    data = load(EXAMPLE / "report.json")
    assert data["schema_version"] == schema.SCHEMA_VERSION
    report = RunReport.model_validate(data)
    assert {name: fmt.status for name, fmt in report.formats.items()} == dict.fromkeys(
        ("baseline", "int8", "gptq", "awq"), "ok")
    for name in ("report.json", "samples.jsonl"):
        (tmp_path / name).write_bytes((EXAMPLE / name).read_bytes())
    assert cli.main(["report", str(tmp_path)]) == data["exit_code"]
    for name in ("report.md", "scores.csv"):
        assert (tmp_path / name).read_text(encoding="utf-8") == (EXAMPLE / name).read_text(encoding="utf-8"), name


@pytest.mark.parametrize("path", [VERSION_1, SHARED_BASELINE], ids=["report_v1", "shared-baseline"])
def test_committed_version_1_reports_are_read_as_version_2(path):
    data = load(path)
    assert data["schema_version"] == 1
    report = RunReport.model_validate(data)
    assert report.schema_version == 2
    assert set(report.formats) == set(data["formats"])
    assert schema.report_dict(report) == schema.upgrade_v1(data)  # nothing else dropped or coerced on the way


def test_upgrading_version_1_gives_each_check_the_reason_line_it_had():
    """What version 2 adds: the run example as version 1 upgrades to exactly the version-2 fixture."""
    assert schema.upgrade_v1(load(VERSION_1)) == load(FIXTURE)
    gptq = RunReport.model_validate(load(VERSION_1)).formats["gptq"]
    assert [c.reason for c in gptq.checks if c.status != "pass"] == gptq.reasons
    assert all(c.reason == "" for c in gptq.checks if c.status == "pass")


def test_latency_copies_at_the_top_are_folded_into_batch_1():
    """Reports before the copies were dropped: alongside batch_1 they are dropped; alone (the earliest version-1
    reports) they become batch_1; the nulls of a format that never ran leave no batch_1."""
    data = load(FIXTURE)
    at_one = data["formats"]["gptq"]["latency"]["batch_1"]
    with_copies = copy.deepcopy(data)
    with_copies["formats"]["gptq"]["latency"].update({k: at_one[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms")})
    assert schema.report_dict(RunReport.model_validate(with_copies)) == data
    only_copies = schema.Latency.model_validate({"ttft_ms": {"p50": None, "p95": 80.0}, "tpot_ms": {"p95": 20.0}})
    assert (only_copies.batch_1.ttft_ms.p95, only_copies.batch_1.tpot_ms.p95, only_copies.batch_1.e2e_ms.p95) == \
        (80.0, 20.0, None)
    never_ran = schema.Latency.model_validate({k: {"p50": None, "p95": None} for k in ("ttft_ms", "tpot_ms", "e2e_ms")})
    assert never_ran.batch_1 is None and "ttft_ms" not in never_ran.model_dump()


def test_early_version_1_reports_lack_the_newer_fields():
    """Why calibration, latency max & co. are optional: the committed reports predate them."""
    for path in (FIXTURE, SHARED_BASELINE):
        for fmt in load(path)["formats"].values():
            assert "calibration" not in fmt
            batch_1 = (fmt.get("latency") or {}).get("batch_1") or {"ttft_ms": {}}
            assert "max" not in batch_1["ttft_ms"]
    int8 = RunReport.model_validate(load(FIXTURE)).formats["int8"]
    assert int8.calibration is None and int8.latency.batch_1.ttft_ms.max is None


# --- drift is caught ------------------------------------------------------------------------------


def _set(report: dict, path: str, rename: str | None = None, value=None) -> dict:
    """A copy of report with the key at dotted `path` renamed to `rename`, or set to `value`."""
    changed = copy.deepcopy(report)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if rename is not None:
        node[rename] = node.pop(last)
    else:
        node[last] = value
    return changed


@pytest.mark.parametrize("path, misspelled", [
    ("recommendation", "recomendation"),
    ("settings.batch_size", "batchsize"),
    ("model.fingerprint", "fingerprnt"),
    ("evalsets.en_support_qa.gate", "gates"),
    ("formats.int8.verdict", "verdikt"),
    ("formats.int8.memory.peak_bytes", "peak_byte"),
    ("formats.int8.memory.largest_batch.tokens", "token"),
    ("formats.int8.latency.batch_1.ttft_ms.p95", "p59"),
    ("formats.int8.latency.batched.throughput_tok_s", "throughput"),
    ("formats.int8.capacity.kv_room_bytes", "kv_room"),
    ("formats.int8.checks.0.detail", "detial"),
    ("formats.gptq.scores.en_support_qa.f1.ci_low", "ci_lo"),
    ("formats.gptq.artifact.size_bytes", "size"),
])
def test_a_misspelled_field_fails_naming_it(path, misspelled):
    with pytest.raises(ValidationError) as caught:
        RunReport.model_validate(_set(load(FIXTURE), path, rename=misspelled))
    where = ".".join(path.split(".")[:-1] + [misspelled])
    errors = caught.value.errors()
    assert any(e["type"] == "extra_forbidden" and ".".join(map(str, e["loc"])) == where for e in errors), errors
    assert where in str(caught.value)


@pytest.mark.parametrize("path, value, what", [
    ("schema_version", 3, "schema_version"),
    ("schema_version", True, "schema_version"),
    ("exit_code", False, "exit_code"),
    ("formats.int8.latency.batch_1.ttft_ms.count", "18", "formats.int8.latency.batch_1.ttft_ms.count"),
    ("formats.int8.scores.en_support_qa.f1.n", 6.0, "formats.int8.scores.en_support_qa.f1.n"),
    ("formats.int8.capacity.fits", "yes", "formats.int8.capacity.fits"),
    ("formats.int8.verdict", "MAYBE", "formats.int8.verdict"),
    ("formats.int8.checks.0.kind", "vibes", "formats.int8.checks.0.kind"),
])
def test_a_wrong_type_or_value_fails_naming_the_field(path, value, what):
    with pytest.raises(ValidationError) as caught:
        RunReport.model_validate(_set(load(FIXTURE), path, value=value))
    assert what in str(caught.value)


def test_open_blocks_pass_keys_through():
    """The policy and an artifact's manifest come from other sources (policy files, cached artifacts)."""
    data = _set(load(FIXTURE), "policy.new_knob", value=3)
    data = _set(data, "formats.gptq.artifact.manifest.written_by_a_later_version", value={"x": 1})
    report = RunReport.model_validate(data)
    assert report.policy.model_extra == {"new_knob": 3, "budgets": data["policy"]["budgets"],
                                         "target": data["policy"]["target"]}
    assert report.formats["gptq"].artifact.manifest.model_extra["written_by_a_later_version"] == {"x": 1}


def test_a_version_2_check_needs_its_reason():
    data = load(FIXTURE)
    del data["formats"]["gptq"]["checks"][0]["reason"]
    with pytest.raises(ValidationError, match=re.escape("formats.gptq.checks.0.reason")):
        RunReport.model_validate(data)


def test_a_version_1_check_keeps_a_reason_it_carries():
    data = _set(load(VERSION_1), "formats.gptq.checks.0.reason", value="en_support_qa/f1: straddles")
    report = RunReport.model_validate(data)
    assert report.formats["gptq"].checks[0].reason == "en_support_qa/f1: straddles"
    assert report.formats["gptq"].checks[1].reason.startswith("zh_billing_qa/f1: delta")


# --- the published schema and the page -------------------------------------------------------------


def test_schema_command_prints_the_published_schema(capsys):
    from harness.cli import build_parser

    args = build_parser().parse_args(["schema"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert printed == schema_text()
    assert json.loads(printed) == RunReport.model_json_schema()
    published = PUBLISHED.read_text(encoding="utf-8") if PUBLISHED.is_file() else None
    assert published == printed, f"docs/report.schema.json is out of date with harness/report/schema.py; " \
                                 f"regenerate it: {REGENERATE}"


def test_the_published_schema_names_every_model_and_its_dialect():
    published = json.loads(schema_text())
    assert published["$schema"] == schema.JSON_SCHEMA_DIALECT
    assert set(published["$defs"]) | {"RunReport"} == set(models())
    assert published["properties"]["schema_version"]["const"] == schema.SCHEMA_VERSION == 2
    for name, definition in published["$defs"].items():  # every field says what it is (and its unit)
        for field, spec in definition["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"


def _page_sections() -> dict[str, set[str]]:
    """'### `Model`' heading -> the fields its table rows name ('| `field` | ...')."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#{2,4} `(\w+)`", line)
        if heading:
            current = sections.setdefault(heading.group(1), set())
        elif line.startswith("#"):
            current = None
        elif current is not None and (row := re.match(r"\| `(\w+)` \|", line)):
            current.add(row.group(1))
    return sections


def test_the_page_documents_every_field_of_every_model():
    sections = _page_sections()
    assert set(sections) == set(models()), "docs/report.md needs one '### `Model`' section per model"
    for name, cls in models().items():
        inherited = {f for base in cls.__mro__[1:] if base in models().values() for f in base.model_fields}
        own = set(cls.model_fields) - inherited
        assert sections[name] == own, (f"docs/report.md, section `{name}`: missing {sorted(own - sections[name])}, "
                                       f"not in the model {sorted(sections[name] - own)}")


# --- what the producer writes today ------------------------------------------------------------------


class _FakeModel:
    """What worker.measure_format and generate_evalset call on a loaded model, without a model."""

    dtype = "float32"
    preload = ()

    @classmethod
    def load(cls, *args, **kwargs) -> "_FakeModel":
        return cls(*args, **kwargs)

    def __init__(self, *_args, **_kwargs) -> None:
        pass

    def encode(self, prompt: str) -> list[int]:
        return list(range(len(prompt.split())))

    def weights_bytes(self) -> int:
        return 3000

    def parameter_count(self) -> int:
        return 3000

    def generate(self, prompts, max_new):
        from harness.runtime.base import BatchTiming, Generation

        steps = min(max_new, 3)
        return ([Generation(text="x", prompt_tokens=len(p), new_tokens=steps) for p in prompts],
                BatchTiming(batch_size=len(prompts), prompt_tokens=max(len(p) for p in prompts), steps=steps,
                            ttft_s=0.01 * len(prompts), e2e_s=0.03 * len(prompts)))

    def generate_with_cache_bytes(self, prompts, max_new):
        outputs, timing = self.generate(prompts, max_new)
        return outputs, timing, 4096


def test_the_producer_writes_a_report_that_validates(tmp_path, monkeypatch):
    """worker.run_device_job (a fake model: measure_format, generate_evalset, the memory timeline) ->
    evaluate_formats and build_report, for an ok baseline, an ok int8, a gptq whose quantization failed (it calibrates, so it carries
    the calibration block) and an interrupted awq."""
    from harness import worker
    from harness.evaluate import evaluate_formats
    from harness.calibration import CalibrationSet, check_overlap
    from harness.config import RunSpec
    from harness.evalsets import load_evalsets
    from harness.jobs import DeviceJob
    from harness.measure import memory
    from harness.measure.probe import Measurement
    from harness.evalsets import Prompt
    from harness.records import EvalsetGeneration, FormatRun
    from harness.report.schema import Artifact
    from harness.policy import Policy
    from harness.quantize.base import Recipe
    from harness.report.build import build_report
    from harness.runtime import device, transformers_backend
    from harness.source import ModelSource
    from records import run_inputs

    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(memory, "is_cuda", lambda: False)  # no torch import: the trackers read /proc on a CPU
    monkeypatch.setattr(device, "is_cuda", lambda: False)  # the timeline samples RSS
    monkeypatch.setattr(transformers_backend, "LoadedModel", _FakeModel)
    monkeypatch.setattr(device, "device_info", lambda threads: {
        "kind": "cpu", "name": "test CPU", "threads": threads, "cores": 2, "total_memory_bytes": 2**33,
        "bf16_matmul": False})
    rows = [{"id": f"q{i}", "question": f"What is item {i}?", "context": f"Passage {i // 3}.", "answers": ["x"]}
            for i in range(4)]
    (tmp_path / "faq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "faq.toml").write_text('name = "faq"\ntask = "qa"\nlanguage = "en"\n', encoding="utf-8")
    [evalset] = load_evalsets([tmp_path / "faq.toml"])
    spec = RunSpec(formats=["baseline", "int8", "gptq", "awq"], batch_size=2, latency_requests=3, warmup_requests=1)
    prompts = {"faq": [Prompt("faq", r["id"], f"Answer: {r['question']}", 6, 8) for r in rows]}
    calibration = CalibrationSet("calibration.txt", ("Unrelated text about billing cycles and renewals.",) * 4,
                                 token_counts=(8, 8, 8, 8))
    inputs = run_inputs(
        spec=spec, evalsets=[evalset], prompts=prompts, policy=Policy(max_memory_gib=100, max_tpot_p95_ms=1000),
        source=ModelSource("demo", "demo", tmp_path, "sha256:abc", "a test model"),
        model_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                      "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64},
        recipes={"int8": Recipe("int8", bits=8, calibration_samples=0, extra={"llm_int8_threshold": 6.0}),
                 "gptq": Recipe("gptq", bits=4, group_size=32, calibration_samples=4)},
        calibration=check_overlap(calibration, [evalset], allowed=False))

    def measured_run(name: str, artifact: dict) -> FormatRun:
        measure = {"batch1": [[p.text, p.max_new_tokens] for p in prompts["faq"][:3]],
                   "batched": [p.text for p in prompts["faq"][:2]], "batched_max_new_tokens": 8, "warmup": 1,
                   "result_path": str(tmp_path / f"{name}.measure.json")}
        task = {"evalset": "faq", "key": "k", "max_new_tokens": 8, "result_path": str(tmp_path / f"{name}.faq.json"),
                "items": [{"id": p.item_id, "prompt": p.text} for p in prompts["faq"]]}
        worker.run_device_job(DeviceJob.from_json({"kind": "device", "artifact_path": str(tmp_path),
                                                   "batch_size": 2, "measure": measure, "generate": [task]}))
        measurement = json.loads(Path(measure["result_path"]).read_text(encoding="utf-8"))
        generation = json.loads(Path(task["result_path"]).read_text(encoding="utf-8"))
        return FormatRun(name, artifact=Artifact.model_validate(artifact), stages_run=["measure", "generate:faq"],
                         measurement=Measurement("m.json", "m", measurement),
                         generations={"faq": EvalsetGeneration.from_result(generation)})
    manifest = {"engine": "bitsandbytes", "versions": {"bitsandbytes": "0.50.2"}, "format": "int8",
                "recipe": inputs.recipes["int8"].as_dict(), "source": "sha256:abc", "calibration_hash": "sha256:0",
                "calibration_texts": 0, "calibration_source": None, "device": {"kind": "cpu", "bf16_matmul": False},
                "quantgate": "0.1.0", "quantize_seconds": 1.5, "smoke_replies": ["Paris", "我是"],
                "smoke_perplexity": {"artifact": 12.5, "source": 11.0}, "created_at": "2026-12-01T00:00:00Z"}
    runs = {
        "baseline": measured_run("baseline", {"path": str(tmp_path), "size_bytes": 3000, "cached": True, "manifest": {
            "engine": "none", "format": "baseline", "source": "sha256:abc"}}),
        "int8": measured_run("int8", {"path": str(tmp_path / "int8"), "size_bytes": 2000, "cached": False,
                                      "manifest": manifest}),
        "gptq": FormatRun("gptq", status="failed", error="quantization failed: boom", stages_run=["quantize"]),
        "awq": FormatRun("awq", status="interrupted", error="not run: the run was interrupted"),
    }
    evaluation = evaluate_formats(inputs, runs)
    report, samples = build_report(inputs, runs, evaluation, wall_s=12.34), evaluation.samples
    text = schema.report_json(report)  # report.json as written
    data = json.loads(text)
    # The typed report read back writes the file byte for byte: keys in the producer's order, integers as integers.
    assert schema.report_json(RunReport.model_validate(data)) == text == json.dumps(data, indent=2,
                                                                                   ensure_ascii=False) + "\n"

    parsed = RunReport.model_validate(data)
    assert schema.report_dict(parsed) == (schema.upgrade_v1(data) if data["schema_version"] == 1 else data)
    # Each plan once: the report as built holds the vllm plan in `serving` only, and writes `capacity` from it.
    built = report.formats["int8"]
    assert built.capacity is None and built.serving["vllm"].fits
    assert data["formats"]["int8"]["capacity"] == schema.capacity_view(built.serving["vllm"])
    assert list(data["formats"]["int8"]).index("capacity") + 1 == list(data["formats"]["int8"]).index("serving")
    assert built.vllm_capacity() == parsed.formats["int8"].capacity
    assert samples and parsed.formats["gptq"].verdict == "NO-GO"  # failed to quantize
    assert parsed.formats["awq"].verdict == "INCONCLUSIVE" and "--resume" in parsed.formats["awq"].reasons[0]
    assert parsed.formats["awq"].status == "interrupted" and parsed.formats["awq"].memory.peak_bytes is None
    assert parsed.formats["gptq"].calibration.overlap.items_total == 4
    assert parsed.formats["baseline"].latency.batch_1.ttft_ms.max is not None
    timeline = parsed.formats["int8"].memory.timeline  # the whole measured job, load included, stage by stage
    assert [s.stage for s in timeline.stages] == ["load", "warm-up", "latency", "measure batch", "generate:faq"]
    assert timeline.fields == ["rss_bytes"] and timeline.error is None and 2 <= len(timeline.points) <= 300
    assert timeline.peaks.rss_bytes.bytes == max(p.rss_bytes for p in timeline.points) > 0
    assert timeline.peaks.rss_bytes.stage in {s.stage for s in timeline.stages}
    assert parsed.formats["awq"].memory.timeline is None

    # a job of generate tasks only (measurement cached) samples nothing and writes no measurement
    task = {"evalset": "faq", "key": "k", "max_new_tokens": 8, "result_path": str(tmp_path / "only.faq.json"),
            "items": [{"id": "q0", "prompt": "Answer: x"}]}
    worker.run_device_job(DeviceJob.from_json({"kind": "device", "artifact_path": str(tmp_path), "batch_size": 2,
                                               "generate": [task]}))
    assert Path(task["result_path"]).is_file() and not list(tmp_path.glob("only*.measure.json"))

    # The contract is not merely permissive: the producer writes every field the models name (but the
    # Manifest fields only a real quantization writes, which the manifest above mirrors).
    def keys(model: type[BaseModel]) -> set[str]:
        return set(model.model_fields)

    # The transformers backend writes no `served` block; settings.backend comes with the vLLM backend work (a
    # report without it means transformers); `spot_checks` comes with people's judgments (`report --reviews`).
    # `cluster` comes with --executor ray (test_executor_units). Every other field the models name must be written.
    may_lack = {schema.FormatResult: {"served", "spot_checks"}, schema.Settings: {"backend"}}
    base, int8, gptq = data["formats"]["baseline"], data["formats"]["int8"], data["formats"]["gptq"]
    assert set(data) == keys(RunReport) - {"cluster"}
    for block, model in [(data["model"], schema.Model), (data["settings"], schema.Settings),
                         (data["settings"]["capacity"], schema.CapacityTarget), (data["policy"], schema.Policy),
                         (data["evalsets"]["faq"], schema.EvalsetInfo), (data["recommendation"], schema.Recommendation),
                         (base, schema.FormatResult), (int8, schema.FormatResult), (gptq, schema.FormatResult),
                         (int8["memory"], schema.Memory), (int8["memory"]["largest_batch"], schema.LargestBatch),
                         (int8["memory"]["timeline"], schema.MemoryTimeline),
                         (int8["memory"]["timeline"]["stages"][0], schema.TimelineStage),
                         (int8["memory"]["timeline"]["peaks"]["rss_bytes"], schema.TimelinePeak),
                         (int8["latency"], schema.Latency), (int8["latency"]["batched"], schema.LatencyRun),
                         (int8["latency"]["batch_1"]["ttft_ms"], schema.LatencyStats),
                         (int8["generation"], schema.Generation),
                         (int8["serving"]["vllm"], schema.ServingPlan),
                         (int8["serving"]["sglang"]["memory"], schema.ServingMemory),
                         (int8["scores"]["faq"]["f1"], schema.ScoreEntry), (gptq["calibration"], schema.Calibration),
                         (gptq["calibration"]["overlap"], schema.Overlap), (int8["artifact"], schema.Artifact),
                         (int8["artifact"]["manifest"], schema.Manifest)]:
        missing, unknown = keys(model) - set(block), set(block) - keys(model)
        assert not unknown and missing <= may_lack.get(model, set()), f"{model.__name__}: {missing | unknown}"
    # the capacity block is the vLLM plan in the version-1 shape: the legacy plan's budget and margin are gone
    assert set(int8["capacity"]) == keys(schema.Capacity) - {"budget_bytes", "safety_margin"}
    assert set(data["policy"]["serving"]) == keys(schema.PolicyServing)
    # on a CPU only RSS is sampled: the GPU fields of points and peaks are absent
    assert set(int8["memory"]["timeline"]["points"][0]) == {"t_s", "stage", "rss_bytes"}
    assert set(int8["memory"]["timeline"]["peaks"]) == {"rss_bytes"}
    assert set(int8["generation"]["batched_latency"][0]) == keys(schema.EvalsetLatency) - {"workload"}
    assert int8["checks"] and all(set(check) == keys(schema.Check) for check in int8["checks"])
