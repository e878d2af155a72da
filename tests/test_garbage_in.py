"""No verdict from garbage: `quantgate decide` score files and policies that say something other than they mean.
Each case either stops with one line naming the file, line and field (exit 2) or gives a verdict whose reason
names the fault; none is ever GO."""

import json
from pathlib import Path

import numpy as np
import pytest

from harness import cli

N = 100


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))


def _scores(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(20, 90, N).round(2)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pair(tmp_path, candidate_value=lambda i, v: float(v), evalset: str | None = None):
    """A baseline and a candidate that equals it (GO under the default policy), with candidate_value(i, v) planted."""
    extra = {"evalset": evalset} if evalset else {}
    base = _write(tmp_path / "base.jsonl", [{"id": f"q{i}", "f1": float(v), **extra} for i, v in enumerate(_scores())])
    cand = _write(tmp_path / "cand.jsonl", [{"id": f"q{i}", **({"f1": candidate_value(i, v)} if
                                                                candidate_value(i, v) is not ... else {}), **extra}
                                             for i, v in enumerate(_scores())])
    return base, cand


def _decide(capsys, base: Path, cand: Path, *flags: str) -> tuple[int, str, str]:
    code = cli.main(["decide", "--baseline", str(base), "--candidate", str(cand), *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_clean_pair_is_go(tmp_path, capsys):
    """The control: without a planted fault the same files are GO, so every refusal below is the fault's."""
    code, out, _ = _decide(capsys, *_pair(tmp_path))
    assert code == 0 and "Verdict: GO" in out


@pytest.mark.parametrize("plant, message", [
    (lambda i, v: "0.0" if i % 2 else float(v), "cand.jsonl:2: field 'f1': expected a number, got '0.0' (a string)"),
    (lambda i, v: None if i == 7 else float(v), "cand.jsonl:8: field 'f1': null, not a number"),
    (lambda i, v: ... if i == 3 else float(v), "cand.jsonl:4: field 'f1': missing (other lines have it)"),
    (lambda i, v: True if i == 0 else float(v), "cand.jsonl:1: field 'f1': expected a number, got True (a boolean)"),
    (lambda i, v: [float(v)] if i == 5 else float(v), "cand.jsonl:6: field 'f1': expected a number, got"),
    (lambda i, v: float(v) * 1000, "cand.jsonl:1: field 'f1': "),
    (lambda i, v: -float(v) if i == 9 else float(v), "cand.jsonl:10: field 'f1': -"),
    (lambda i, v: float(v) + 100 if i == 2 else float(v), "is outside the 0-100 scale"),
    (lambda i, v: float(v) / 100, "every score is between 0 and 1: this looks like a 0-1 scale; multiply by 100"),
    (lambda i, v: float("nan") if i == 4 else float(v), "cand.jsonl:5: field 'f1': nan is not a finite number"),
    (lambda i, v: float("inf") if i == 4 else float(v), "cand.jsonl:5: field 'f1': inf is not a finite number"),
], ids=["string", "null", "missing", "boolean", "list", "x1000", "negative", "above-100", "0-1-scale", "nan", "inf"])
def test_a_score_that_is_not_a_number_on_the_scale_stops_with_its_line(plant, message, tmp_path, capsys):
    code, out, err = _decide(capsys, *_pair(tmp_path, plant))
    assert code == 2 and "Verdict" not in out, out
    assert err.count("\n") == 1 and message in err, err


def test_allow_missing_drops_and_counts_and_is_never_go(tmp_path, capsys):
    base, cand = _pair(tmp_path, lambda i, v: "0.0" if i % 2 else float(v))
    code, out, _ = _decide(capsys, base, cand, "--allow-missing")
    assert code == 1 and "Verdict: INCONCLUSIVE" in out, out
    assert "50 item(s) without a numeric f1 for the candidate" in out and "--allow-missing" in out


def test_a_0_1_file_is_judged_with_scale_1_as_the_same_points(tmp_path, capsys):
    base = _write(tmp_path / "b.jsonl", [{"id": i, "f1": float(v) / 100} for i, v in enumerate(_scores())])
    cand = _write(tmp_path / "c.jsonl", [{"id": i, "f1": float(v) / 100} for i, v in enumerate(_scores())])
    code, out, _ = _decide(capsys, base, cand, "--scale", "1", "--json", str(tmp_path / "d.json"))
    assert code == 0 and "Verdict: GO" in out
    decision = json.loads((tmp_path / "d.json").read_text())
    assert abs(decision["baseline"]["scores"]["scores"]["f1"]["value"] - float(_scores().mean())) < 1e-6
    above = _write(tmp_path / "c2.jsonl", [{"id": i, "f1": float(v)} for i, v in enumerate(_scores())])
    code, _, err = _decide(capsys, base, above, "--scale", "1")
    assert code == 2 and "is outside the 0-1 scale" in err


def test_an_interval_is_ordered_and_within_the_scale(tmp_path, capsys):
    base, cand = _pair(tmp_path, lambda i, v: max(float(v) - 40, 0.0))
    code, out, _ = _decide(capsys, base, cand, "--json", str(tmp_path / "d.json"))
    assert code == 1 and "Verdict: NO-GO" in out
    f1 = json.loads((tmp_path / "d.json").read_text())["candidate"]["scores"]["scores"]["f1"]
    assert -100 <= f1["ci_low"] <= f1["delta"] <= f1["ci_high"] <= 100


@pytest.mark.parametrize("policy, message", [
    ('[margins]\n"en-faq/f1" = 2.0\n', "key 'margins.en-faq/f1': no evalset 'en-faq' in this run (did you mean 'en_faq'?)"),
    ('[floors]\n"en_fac/f1" = 20.0\n', "no evalset 'en_fac' in this run (did you mean 'en_faq'?)"),
    ('[min_items_for]\n"zh/f1" = 10\n', "no evalset 'zh' in this run"),
    ('[margins]\nf1 = "2.0"\n', "key 'margins.f1': Input should be a valid number, got '2.0'"),
    ('[margins]\nf1 = true\n', "key 'margins.f1': Input should be a valid number, got True"),
    ('min_items = "30"\n', "key 'min_items': Input should be a valid integer, got '30'"),
    ('min_items = 30.0\n', "key 'min_items': Input should be a valid integer, got 30.0"),
    ('power = "0.8"\n', "key 'power': Input should be a valid number, got '0.8'"),
    ('[margins]\nf1 = 1e9\n', "a margin of 100 points or more can never bind"),
    ('[margins]\nf1 = 100.0\n', "a margin of 100 points or more can never bind"),
    ('[floors]\nf1 = 0.0\n', "a floor must lie in (0, 100] points"),
    ('[floors]\nf1 = 150.0\n', "a floor must lie in (0, 100] points"),
    ('[serving]\ntarget_gpu = "L4"\nmin_concurrency = "8"\n', "key 'serving.min_concurrency': Input should be a valid integer"),
    ('[margins]\nf1 = -1.0\n', "must be a finite number of points >= 0"),
    ('max_memory_gib = "8"\n', "key 'max_memory_gib': Input should be a valid number, got '8'"),
    ('max_ttft_p95_ms = true\n', "key 'max_ttft_p95_ms': Input should be a valid number, got True"),
    ('confidence = "0.95"\n', "key 'confidence': Input should be a valid number, got '0.95'"),
    ('resamples = 2000.0\n', "key 'resamples': Input should be a valid integer, got 2000.0"),
    ('seed = "0"\n', "key 'seed': Input should be a valid integer, got '0'"),
    ('[floors]\nf1 = "50"\n', "key 'floors.f1': Input should be a valid number, got '50'"),
    ('[min_items_for]\nf1 = 10.5\n', "key 'min_items_for.f1': Input should be a valid integer, got 10.5"),
    ('inconclusive_is = true\n', "key 'inconclusive_is': Input should be 'fail' or 'pass', got True"),
], ids=["margin-evalset-typo", "floor-evalset-typo", "min-items-evalset", "margin-string", "margin-bool",
        "min-items-string", "min-items-float", "power-string", "margin-1e9", "margin-100", "floor-0", "floor-150",
        "serving-string", "margin-negative", "memory-string", "ttft-bool", "confidence-string", "resamples-float",
        "seed-string", "floor-string", "min-items-for-float", "inconclusive-bool"])
def test_a_policy_that_says_more_than_it_means_is_refused(policy, message, tmp_path, capsys):
    base, cand = _pair(tmp_path, evalset="en_faq")
    path = tmp_path / "policy.toml"
    path.write_text(policy, encoding="utf-8")
    code, out, err = _decide(capsys, base, cand, "--policy", str(path))
    assert code == 2 and "Verdict" not in out, out
    assert f"{path}: " in err and message in err, err


def test_the_right_evalset_key_is_used(tmp_path, capsys):
    """The typo'd key of the case above, spelled right: the margin binds (a 3-point drop fails a 2-point margin
    that the default 2.0 would judge the same way, so a 4-point margin makes it pass)."""
    base, cand = _pair(tmp_path, lambda i, v: float(v) - 3, evalset="en_faq")
    path = tmp_path / "policy.toml"
    path.write_text('[margins]\n"en_faq/f1" = 4.0\n', encoding="utf-8")
    assert _decide(capsys, base, cand)[0] == 1
    code, out, _ = _decide(capsys, base, cand, "--policy", str(path))
    assert code == 0 and "Verdict: GO" in out, out


@pytest.mark.parametrize("flag, value, message", [
    ("--gpu-memory-utilization", "1.5", "--gpu-memory-utilization 1.5: Input should be less than or equal to 1"),
    ("--gpu-memory-utilization", "0", "--gpu-memory-utilization 0.0: Input should be greater than 0"),
    ("--max-model-len", "-1", "--max-model-len -1: Input should be greater than 0"),
    ("--gpu-memory-gib", "-3", "--gpu-memory-gib -3.0: Input should be greater than 0"),
    ("--capacity-overhead-gib", "-5", "--capacity-overhead-gib -5.0: Input should be greater than or equal to 0"),
])
def test_run_refuses_a_bad_capacity_flag_before_any_work(flag, value, message, tmp_path, capsys):
    """Validated as `plan` validates them, before the model is fetched, converted or quantized, and before the
    output directory is made (these once ran every stage and then died with an internal error and no report)."""
    out = tmp_path / "out"
    code = cli.main(["run", "--model", "demo", flag, value, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"quantgate: error: {message}", err
    assert not out.exists() and not (tmp_path / "cache" / "models").exists()


def test_report_without_samples_stops_and_rewrites_nothing(tmp_path, capsys):
    """`quantgate report` on a run directory that lost samples.jsonl once rewrote scores.csv to its header line and
    dropped the regressions: now it names the file and leaves every file as it was."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "golden" / "expected", run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    code = cli.main(["report", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and f"{run_dir / 'samples.jsonl'}: missing" in err and err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


@pytest.mark.parametrize("key, named", [("data", "../elsewhere.jsonl"), ("calibration", "../traffic.jsonl"),
                                        ("data", "/etc/hostname")])
def test_a_spec_reads_no_file_outside_its_directory_unless_allowed(key, named, tmp_path, capsys):
    sets = tmp_path / "sets"
    sets.mkdir()
    rows = "".join(json.dumps({"id": f"q{i}", "question": f"q {i}?", "answers": [str(i)]}) + "\n" for i in range(3))
    for path in (tmp_path / "elsewhere.jsonl", sets / "faq.jsonl"):
        path.write_text(rows)
    (tmp_path / "traffic.jsonl").write_text(json.dumps({"text": "a real prompt from traffic"}) + "\n")
    data = named if key == "data" else "faq.jsonl"
    extra = f'calibration = "{named}"\n' if key == "calibration" else ""
    (sets / "faq.toml").write_text(f'task = "qa"\nlanguage = "en"\ndata = "{data}"\n{extra}')
    code = cli.main(["evalsets", "check", str(sets / "faq.toml")])
    err = capsys.readouterr().err
    assert code == 2 and f"{key} = '{named}' lies outside the spec's directory" in err, err
    if named != "/etc/hostname":  # a file that is not a QA set fails on its rows once allowed; the others load
        assert cli.main(["evalsets", "check", "--allow-outside-paths", str(sets / "faq.toml")]) == 0


def _model_dir(path: Path, *, tokenizer: bool, max_position_embeddings: int = 2048) -> Path:
    """A Llama-shaped model directory whose weights nothing could load: every check here refuses it first."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32,
        "max_position_embeddings": max_position_embeddings, "dtype": "bfloat16"}))
    (path / "model.safetensors").write_bytes(b"not really weights")
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1}, unk_token="<unk>"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="</s>").save_pretrained(path)
    return path


def test_a_model_without_a_tokenizer_is_one_line_and_leaves_no_output_directory(tmp_path, capsys):
    model = _model_dir(tmp_path / "model", tokenizer=False)
    out = tmp_path / "out"
    code = cli.main(["run", "--model", str(model), "--formats", "baseline", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{model}: cannot load its tokenizer" in err, err
    assert not out.exists()


def test_a_prompt_longer_than_the_context_is_refused_before_loading(tmp_path, capsys):
    model = _model_dir(tmp_path / "model", tokenizer=True, max_position_embeddings=40)
    out = tmp_path / "out"
    code = cli.main(["run", "--model", str(model), "--formats", "baseline", "--out", str(out), "--max-items", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "prompt(s) do not fit the model's context of 40 tokens (max_position_embeddings): " in err, err
    assert "en_incident_summaries/" in err and " new)" in err
    assert not out.exists()


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """Where a write fails for lack of space (ENOSPC), the command ends with one line naming the file and the room
    left, not an internal error. The disk cannot be filled here; the command's write is made to fail so."""
    import errno

    from harness.commands import report as report_command

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "report.md"))

    monkeypatch.setattr(report_command, "run", full)  # the parser is built per call: it takes the patched one
    code = cli.main(["report", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{tmp_path / 'run' / 'report.md'}: the disk is full (" in err and "MiB free on" in err


class _Shaped:
    """A loopback HTTP server that answers GET paths with fixed JSON (404 for the rest): the shapes of servers
    that are not vLLM."""

    def __init__(self, answers: dict[str, dict]):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(body if body is not None else {"detail": "Not Found"}).encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _closed_port() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("answers, message", [
    (None, "no answer ("),
    ({}, "GET /version answered HTTP 404, as no vLLM server does"),
    ({"/version": {"version": "0.32.0"}, "/v1/models": {"object": "list", "data": [{"id": "m", "object": "model"}]}},
     "GET /v1/models lists models that are not vLLM's own"),
    ({"/version": {"v": 1}, "/v1/models": {"data": []}}, "GET /version answered"),
    ({"/version": {"version": "0.32.0"}, "/v1/models": {"data": []}}, "GET /v1/models lists no model"),
], ids=["nothing-listening", "plain-404", "openai-shaped", "no-version", "no-models"])
def test_an_endpoint_that_is_not_vllm_is_refused_before_anything_runs(answers, message, tmp_path, capsys):
    server = _Shaped(answers) if answers is not None else None
    url = server.url if server else _closed_port()
    out = tmp_path / "out"
    try:
        code = cli.main(["run", "--model", "demo", "--backend", "vllm", "--formats", "baseline",
                         "--vllm-endpoint", f"baseline={url}", "--out", str(out)])
    finally:
        if server:
            server.close()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--vllm-endpoint baseline={url}: {message}" in err and "start the vLLM server there" in err, err
    assert not out.exists() and not (tmp_path / "cache" / "models").exists()


@pytest.mark.parametrize("predictions, reason", [
    (["", "", " ", ""], "the model answered nothing: every one of its 4 predictions is empty"),
    (["Paris."] * 4, "the model gave one answer to every item (4 predictions, all 'Paris.')"),
    (["Paris.", "Paris.", "Rome.", "Paris."], None),
])
def test_empty_or_constant_outputs_fail_the_format_with_the_reason(predictions, reason, tmp_path):
    """Outputs as a worker writes them, read back by the pipeline's own collect step: garbage on every item is a
    failed format (NO-GO with this reason in the report), never scored into a verdict."""
    from harness.cache import atomic_write_json
    from harness.decide import FormatOutcome, decide_format
    from harness.collect import collect_results
    from harness.records import Artifact, DeviceRun, ResultFile
    from harness.policy import Policy

    measurement = tmp_path / "measure.json"
    atomic_write_json(measurement, {"memory": {"peak_bytes": 1}, "latency": {}})
    generations = {}
    for name, chunk in (("qa", predictions[:2]), ("sum", predictions[2:])):
        path = tmp_path / f"generate-{name}.json"
        atomic_write_json(path, {"evalset": name, "outputs": [{"id": f"i{k}", "prediction": p, "new_tokens": 3}
                                                              for k, p in enumerate(chunk)]})
        generations[name] = ResultFile(str(path), name)
    run = collect_results("int8", Artifact("k", tmp_path, None), DeviceRun(ResultFile(str(measurement), "m"),
                                                                            generations), None, None)
    assert run.error == reason or (reason and run.error.startswith(reason)), run.error
    assert run.status == ("ok" if reason is None else "failed")
    if reason:
        decision = decide_format(FormatOutcome(name="baseline", items={}), FormatOutcome(
            name="int8", status="failed", error=run.error, items={}), Policy())
        assert decision.verdict == "NO-GO" and decision.reasons[0].startswith(reason)


@pytest.mark.parametrize("memory, field", [({"peak_bytes": "1.2 GiB"}, "memory.peak_bytes"),
                                           ({"largest_batch": {"batch_size": 2}}, "memory.largest_batch.prompt_tokens"),
                                           ({"peak_bytes": 1, "rss_peak_bytes": 2, "extra_figure": 3},
                                            "memory.extra_figure")])
def test_a_measurement_that_is_not_one_fails_the_format_naming_the_field(memory, field, tmp_path):
    """A measurement file in the cache that holds something else than the worker writes (edited, or from another
    tool): the format fails with the file and field named, before anything is scored or planned from it."""
    from harness.cache import atomic_write_json
    from harness.collect import collect_results
    from harness.records import Artifact, DeviceRun, ResultFile

    measurement = tmp_path / "measure.json"
    atomic_write_json(measurement, {"memory": memory, "latency": {}})
    answers = tmp_path / "generate-qa.json"
    atomic_write_json(answers, {"evalset": "qa", "outputs": [{"id": f"i{k}", "prediction": f"answer {k}",
                                                              "new_tokens": 2} for k in range(4)]})
    run = collect_results("int8", Artifact("k", tmp_path, None), DeviceRun(
        ResultFile(str(measurement), "m"), {"qa": ResultFile(str(answers), "qa")}), None, None)
    assert run.status == "failed" and str(measurement) in run.error and field in run.error, run.error
    assert "--no-cache" in run.error and run.measurement.result is None
    assert not run.measurement.measured and run.measurement.memory.peak_bytes is None  # nothing of it is read on


@pytest.mark.parametrize("value", [0.5 * 300, -1.0, float("nan"), "80", None, True])
def test_a_metric_that_scores_off_the_scale_stops_before_any_verdict(value, monkeypatch):
    """A registered metric (a plugin's) whose item score is not a number on 0-100 is an error naming the metric,
    never a score that the statistics would take."""
    from harness.errors import UserError
    from harness.metrics import METRIC_SPECS, MetricSpec, score_prediction

    monkeypatch.setitem(METRIC_SPECS, "off_scale", MetricSpec("off_scale", "generation",
                                                              item_score=lambda p, refs, lang: value))
    with pytest.raises(UserError, match=r"metric 'off_scale' scored an item .*: a metric's item_score must return"):
        score_prediction("generation", "en", "one two", ["one two three"], ["off_scale"])
    monkeypatch.setitem(METRIC_SPECS, "on_scale", MetricSpec("on_scale", "generation",
                                                             item_score=lambda p, refs, lang: 42))
    assert score_prediction("generation", "en", "one two", ["one two three"], ["on_scale"]) == {"on_scale": 42.0}


def test_a_write_that_fills_the_disk_names_the_room_it_needed_and_keeps_the_old_file(tmp_path, monkeypatch):
    """The write itself fails (fsync reports ENOSPC, as it does on a full disk): the file keeps its previous
    content, no temp file is left, and the line says how much room the write needed."""
    import errno
    import os

    from harness.cache import atomic_write_text
    from harness.cli import disk_full_line

    target = tmp_path / "report.json"
    target.write_text("previous\n")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError) as caught:
        atomic_write_text(target, "x" * 3_000_000)
    assert target.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]
    line = disk_full_line(caught.value)
    assert line.startswith(f"{target}: the disk is full (") and "writing it needs 2.86 MiB" in line
