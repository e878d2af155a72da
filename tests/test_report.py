"""Report renderers: report.md, report.html, junit.xml, scores.csv and `quantgate report`."""

from __future__ import annotations

import argparse
import base64
import copy
import csv
import io
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.report import OUTPUT_NAMES, load_report, write_reports
from harness.report.html import render_html
from harness.report.junit import render_junit
from harness.report.markdown import MAX_CHARS, render_markdown
from harness.report.regressions import worst_regressions
from harness.report.view import LEGEND
from harness.report.scores_csv import render_scores_csv
from harness.report.schema import RunReport, parse_report
from harness.units import format_bytes, format_interval, prompt_excerpt
from harness.report.view import load_samples

FIXTURE = Path(__file__).parent / "fixtures" / "run_example"
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((FIXTURE / "report.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return load_samples(FIXTURE / "samples.jsonl")


@pytest.fixture(scope="module")
def page(report, samples) -> str:
    return render_html(parse_report(report, "report.json"), samples)


def _tables(markdown: str) -> list[list[list[str]]]:
    """Markdown tables as rows of cells, splitting only on unescaped pipes."""
    tables, current = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            current.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def _assert_tables_well_formed(markdown: str) -> None:
    for table in _tables(markdown):
        widths = {len(row) for row in table}
        assert len(widths) == 1, f"a table row has a different number of cells: {table[0]}"


def _sections(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("## ")]


# --- units ---------------------------------------------------------------------------------


def test_bytes_are_human_units():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(57344) == "56.0 KiB"
    assert format_bytes(234881024) == "224.0 MiB"
    assert format_bytes(15231233024) == "14.19 GiB"
    assert format_bytes(None) == "—"


def test_delta_interval_uses_real_minus_and_signs():
    assert format_interval(-1.23, -3.0, 0.5) == "−1.2 [−3.0, +0.5]"
    assert format_interval(0.0, None, None) == "0.0"


def test_prompt_excerpt_drops_chat_tokens_and_keeps_the_question():
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + "context " * 100 + "Question: why?<|im_end|>"
    text = prompt_excerpt(prompt, 80)
    assert "<|im_start|>" not in text and "\n" not in text
    assert text.endswith("Question: why?") and len(text) <= 80


# --- report.md -----------------------------------------------------------------------------


def test_markdown_starts_with_the_verdict_table(report, samples):
    md = render_markdown(parse_report(report, "report.json"), samples)
    lines = [line for line in md.splitlines() if line.strip()]
    assert lines[0].startswith("# quantgate")
    assert lines[1].startswith("| Format | Verdict | Peak memory | Weights | TPOT p50 |")
    table = _tables(md)[0]
    assert [row[0] for row in table[2:]] == ["baseline", "int8", "gptq", "awq"]
    assert [row[1] for row in table[2:]] == ["BASELINE", "**GO**", "**INCONCLUSIVE**", "**NO-GO**"]
    gptq = table[4]
    assert gptq[2] == "6.49 GiB (cuda)" and gptq[3] == "5.17 GiB" and gptq[4] == "17.9 ms"
    assert "en\\_support\\_qa/f1 −16.7 [−50.0, +3.3] ?" in gptq[5]
    assert gptq[6] == "not measured"  # a report from before fidelity: the column says so
    assert "--quantization gptq_marlin" in gptq[7]
    assert "CUDA out of memory" in table[5][5]


def test_markdown_order_recommendation_legend_sections_provenance(report, samples):
    md = render_markdown(parse_report(report, "report.json"), samples)
    order = [md.index(s) for s in ("| Format |", "**Recommendation:** ship **int8**", "**How to read a verdict**",
                                   "## baseline", "## int8", "## gptq", "## awq", "## Provenance")]
    assert order == sorted(order)
    legend = md[md.index("**How to read a verdict**"):md.index("## baseline")]
    assert len([line for line in legend.splitlines() if line.startswith("- ")]) == len(LEGEND)


def test_markdown_per_format_details(report, samples):
    md = render_markdown(parse_report(report, "report.json"), samples)
    gptq = md[md.index("## gptq"):md.index("## awq")]
    assert "straddles -2.0" in gptq  # reasons
    assert "Memory on cuda; peak is torch.cuda.max\\_memory\\_allocated" in gptq
    assert "| KV cache per token | 56.0 KiB |" in gptq and "| **Peak** | **6.49 GiB** |" in gptq
    assert "| KV cache at largest batch (4,096 tokens) | 224.0 MiB |" in gptq  # the worker's largest_batch field
    # 18 requests are too few for a p95: the cell says so (a report with "max" shows "max of 18: ...")
    assert ("| batch 1 | 18 | 27.1 ms | p95 of only 18: 35.3 ms | 17.9 ms | p95 of only 18: 19.4 ms | 590.0 ms | "
            "p95 of only 18: 1.23 s | 55.3 tok/s |") in gptq
    assert "| batch 8 |" in gptq
    assert "max concurrent sequences 300" in gptq and "vllm serve MODEL --quantization gptq_marlin" in gptq
    # worst regressions: worst first, on the gated metric
    en = gptq[gptq.index("Worst regressions: en\\_support\\_qa"):]
    assert "(f1; 2 of 6 items dropped)" in en
    assert en.index("| q004 |") < en.index("| q002 |")
    assert "100.0 → 0.0 (−100.0)" in en
    awq = md[md.index("## awq"):md.index("## Provenance")]
    assert "**Failed:** awq quantize: CUDA out of memory" in awq


def test_markdown_provenance(report, samples):
    prov = render_markdown(parse_report(report, "report.json"), samples).split("## Provenance", 1)[1]
    for text in ("sha256:5f1c0a9e", "local Hugging Face checkpoint", "NVIDIA H200", "threads 8", "seed 0",
                 "torch 2.13.0+cu128", "gptqmodel 7.6.0", "sha256:3c4d5e6f", "char-cjk+word-latin",
                 "engine: gptqmodel", '"group\\_size": 128'):
        assert text in prov, text


def test_markdown_escapes_pipes_newlines_and_markup(report, samples):
    md = render_markdown(parse_report(report, "report.json"), samples)
    _assert_tables_well_formed(md)
    assert "Settings \\| Billing \\| Plan" in md
    assert "Okta SSO fails for EU users.<br>US is fine." in md
    assert "<script>" not in md and "\\<script\\>alert(1)\\</script\\>" in md
    assert "<b>" not in md


def _huge_report(report: dict, samples: list[dict]) -> tuple[dict, list[dict]]:
    """Many evalsets, long outputs full of pipes and newlines, long reason lists, big environment."""
    big = copy.deepcopy(report)
    long_text = ("row | with | pipes\nand newlines " * 200)[:4000]
    evalsets = {f"set_{i:02d}": {**report["evalsets"]["en_support_qa"], "n": 200} for i in range(30)}
    big["evalsets"] = evalsets
    big["environment"] = {f"package_{i}": "1.0." + "9" * 50 for i in range(500)}
    for name, fmt in big["formats"].items():
        if fmt["status"] != "ok":
            continue
        template = report["formats"][name]["scores"]["en_support_qa"]
        fmt["scores"] = {e: copy.deepcopy(template) for e in evalsets}
        fmt["reasons"] = [f"reason {i}: " + long_text[:300] for i in range(400)]
        fmt["checks"] = [{"name": f"{e}/f1", "kind": "metric", "status": "inconclusive", "detail": long_text[:200],
                          "reason": long_text[:200]} for e in evalsets]
    big_samples = []
    for name in ("baseline", "int8", "gptq"):
        for e in evalsets:
            for i in range(200):
                score = 100.0 if name == "baseline" else float(i % 100)
                big_samples.append({"format": name, "evalset": e, "id": f"item{i}", "prompt": long_text,
                                    "prediction": long_text, "references": [long_text], "new_tokens": 48,
                                    "em": score, "f1": score, "contains": score})
    return big, big_samples


def test_markdown_stays_under_60000_characters_with_a_huge_input(report, samples):
    big, big_samples = _huge_report(report, samples)
    md = render_markdown(parse_report(big, "report.json"), big_samples)
    assert len(md) < MAX_CHARS
    lines = [line for line in md.splitlines() if line.strip()]
    assert lines[1].startswith("| Format | Verdict")
    verdicts = _tables(md)[0]
    assert [row[0] for row in verdicts[2:]] == ["baseline", "int8", "gptq", "awq"]  # never dropped
    _assert_tables_well_formed(md)
    assert "## Provenance" in md


def test_summary_and_report_fit_a_review_comment_with_6_formats_and_12_evalsets(report, samples):
    """summary.md at most 8 KB, report.md under 60,000 characters, on 6 formats x 12 evalsets with long reasons;
    every format keeps its row and its verdict, and report.md folds each format's tables."""
    from harness.report.summary import MAX_BYTES as SUMMARY_BYTES, render_summary

    big, big_samples = _huge_report(report, samples)
    big["evalsets"] = dict(list(big["evalsets"].items())[:12])
    for name in ("int8", "gptq"):
        big["formats"][name]["scores"] = {e: big["formats"][name]["scores"][e] for e in big["evalsets"]}
        for copy_name in (f"{name}_b", f"{name}_c"):
            big["formats"][copy_name] = copy.deepcopy(big["formats"][name])
    big["formats"]["baseline"]["scores"] = {e: copy.deepcopy(report["formats"]["baseline"]["scores"]["en_support_qa"])
                                            for e in big["evalsets"]}
    big_samples = [s for s in big_samples if s["evalset"] in big["evalsets"]]
    parsed = parse_report(big, "report.json")
    assert len(parsed.formats) == 8 and len(parsed.evalsets) == 12  # the baseline and 7 candidates (awq failed)
    summary = render_summary(parsed)
    assert len(summary.encode("utf-8")) <= SUMMARY_BYTES
    for name, fmt in parsed.formats.items():
        assert f"| {name.replace('_', chr(92) + '_')} | " in summary and fmt.verdict in summary
    assert "more in report.md" in summary and summary.rstrip().endswith("[junit.xml](junit.xml)")
    _assert_tables_well_formed(summary)
    md = render_markdown(parsed, big_samples)
    assert len(md) < MAX_CHARS
    assert md.count("<details><summary>") == md.count("</details>") >= 6
    _assert_tables_well_formed(md)


def test_markdown_drops_regression_rows_before_anything_else(report, samples):
    """Too many regressions to list: rows go (worst kept), every section stays."""
    mid = copy.deepcopy(report)
    mid_samples = list(samples)
    template = [s for s in samples if s["evalset"] == "en_support_qa"]
    for i in range(20):  # both candidates drop on every item of 20 more evalsets
        name = f"extra_{i:02d}"
        mid["evalsets"][name] = report["evalsets"]["en_support_qa"]
        for s in template:
            f1 = 100.0 if s["format"] == "baseline" else 40.0 + int(s["id"][-1])
            mid_samples.append(dict(s, evalset=name, f1=f1, prompt=s["prompt"] * 5, prediction=s["prediction"] * 30))
    md = render_markdown(parse_report(mid, "report.json"), mid_samples)
    assert len(md) < MAX_CHARS
    assert [s.split(":")[0] for s in _sections(md)] == ["## baseline", "## int8", "## gptq", "## awq", "## Provenance"]
    assert "rows left out to keep this report under 60,000 characters" in md
    assert "Rows left out" not in md  # every group still shows its worst item
    for candidate in ("int8", "gptq"):
        section = md[md.index(f"## {candidate}"):]
        assert "| q001 |" in section[section.index("Worst regressions: extra\\_19"):]  # f1 41: the worst


def test_markdown_hard_cut_keeps_the_verdict_table(report, samples):
    """Absurd input (300 failed formats): the file is cut after the verdict table, never inside it."""
    many = copy.deepcopy(report)
    failed = copy.deepcopy(report["formats"]["awq"])
    failed["error"] = "CUDA out of memory | " * 200
    failed["reasons"] = [failed["error"]] * 50
    for i in range(300):
        many["formats"][f"fmt_{i:03d}"] = failed
    md = render_markdown(parse_report(many, "report.json"), samples)
    assert len(md) < MAX_CHARS
    assert md.rstrip().endswith("report.json and report.html hold everything._")
    verdicts = _tables(md)[0]
    assert len(verdicts) == 2 + 4 + 300 and verdicts[-1][0] == "fmt\\_299"
    _assert_tables_well_formed(md.split("## ")[0])


# --- report.html ---------------------------------------------------------------------------


def _sparse_report(report: dict) -> dict:
    """Shapes the pipeline writes when little could be measured: every format failed, placeholders everywhere."""
    sparse = copy.deepcopy(report)
    for fmt in sparse["formats"].values():
        fmt.update(status="failed", verdict="NO-GO", error="worker died: signal 9 (out of host memory?)",
                   artifact=None, capacity=None, scores={}, checks=[], reasons=[], generation=None,
                   memory={"device": None, "peak_bytes": None, "weights_bytes": None, "kv_bytes_per_token": 23040},
                   latency={k: {"p50": None, "p95": None} for k in ("ttft_ms", "tpot_ms", "e2e_ms")})
    for spec in sparse["evalsets"].values():
        spec["tokenizer"] = None
    sparse["recommendation"] = {"format": None, "why": "no candidate format is GO", "runner_up": None}
    for key in ("environment", "device", "model", "settings"):
        sparse.pop(key)
    return sparse


def _valid_sparse_report(report: dict) -> dict:
    """The sparse shapes with the blocks the schema requires (junit reads a parsed report)."""
    sparse = _sparse_report(report)
    for name, spec in sparse["evalsets"].items():
        spec["tokenizer"] = report["evalsets"][name]["tokenizer"]
    return {**sparse, **{key: report[key] for key in ("environment", "device", "model", "settings")}}


def test_sparse_report_renders_everywhere(report):
    sparse = parse_report(_valid_sparse_report(report), "report.json")
    md = render_markdown(sparse, [])
    assert "**Recommendation:** no candidate format is GO" in md and "Latency" not in md and "Memory on" not in md
    _assert_tables_well_formed(md)
    page = render_html(sparse, [])
    assert "<img" not in page and page.count('<div class="error">') == 4
    suite = ET.fromstring(render_junit(RunReport.model_validate(_valid_sparse_report(report))))
    assert suite.get("failures") == "4" and {c.get("name") for c in suite.iter("testcase")} == {"run"}
    assert render_scores_csv(RunReport.model_validate(_valid_sparse_report(report)), []).strip() == "format,evalset,id,new_tokens,em,f1,contains,rouge1,rouge2,rougeL"


def test_html_escapes_model_output_and_dataset_markup(page):
    assert not re.search(r"<\s*script", page, re.IGNORECASE)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;14 days&lt;/b&gt;" in page and "&lt;b&gt;URGENT&lt;/b&gt;" in page
    assert "<b>" not in page


def test_html_fetches_nothing(page):
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "@import" not in page and not re.search(r"url\(\s*['\"]?\s*(https?:)?//", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for src in re.findall(r"""src="([^"]*)\"""", page):
        assert src.startswith("data:image/png;base64,")


def test_html_embeds_the_four_plots(page):
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [alt for alt, _ in images] == ["Accuracy vs peak memory", "Latency per format (batch 1)",
                                          "Memory breakdown", "Gated deltas against the margin"]
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert len(page.encode("utf-8")) < 2 * 1024 * 1024


def test_html_content_verdicts_and_failed_format(page):
    for badge in ('class="badge v-go">GO<', 'class="badge v-nogo">NO-GO<', 'class="badge v-inconclusive">INCONCLUSIVE<',
                  'class="badge v-baseline">BASELINE<'):
        assert badge in page
    assert '<div class="error"><strong>Failed:</strong> awq quantize: CUDA out of memory' in page
    for text in ("Recommendation:", "How to read a verdict", "−16.7 [−50.0, +3.3]", "vllm serve MODEL --quantization",
                 "Worst regressions: en_support_qa", "Provenance", "sha256:5f1c0a9e", "八五折优惠"):
        assert text in page, text


def test_html_escapes_hostile_names(report, samples):
    hostile = copy.deepcopy(report)
    name = 'int8"><img src=x onerror=alert(1)>'
    hostile["formats"] = {(name if k == "int8" else k): v for k, v in hostile["formats"].items()}
    hostile["settings"]["formats"] = [name if f == "int8" else f for f in hostile["settings"]["formats"]]
    hostile_samples = [dict(s, format=name) if s["format"] == "int8" else s for s in samples]
    page = render_html(parse_report(hostile, "report.json"), hostile_samples, plots=[])
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    md = render_markdown(parse_report(hostile, "report.json"), hostile_samples)
    assert not re.search(r"(?<!\\)<img", md) and "\\<img src=x" in md
    _assert_tables_well_formed(md)


def test_html_stays_under_2_mb_with_a_huge_input(report, samples):
    big, big_samples = _huge_report(report, samples)
    page = render_html(parse_report(big, "report.json"), big_samples)
    assert len(page.encode("utf-8")) < 2 * 1024 * 1024
    assert 'class="verdicts"' in page and page.count("data:image/png;base64,") == 4


def test_matplotlib_is_not_imported_until_plots_are_drawn():
    code = ("import sys, harness.report, harness.report.html, harness.commands.report; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- junit.xml -----------------------------------------------------------------------------


def test_junit_one_case_per_format_and_check(report):
    suite = ET.fromstring(render_junit(RunReport.model_validate(report)))
    assert suite.tag == "testsuite" and suite.get("name") == "quantgate"
    cases = suite.findall("testcase")
    assert len(cases) == 17 == int(suite.get("tests"))
    assert suite.get("failures") == "1" and suite.get("skipped") == "3" and suite.get("errors") == "0"
    assert {c.get("classname") for c in cases} == {"quantgate.int8", "quantgate.gptq", "quantgate.awq"}
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [("quantgate.awq", "run")]
    assert "CUDA out of memory" in failed[0].find("failure").get("message")
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert {c.get("name") for c in skipped} == {"en_support_qa/f1", "zh_billing_qa/f1", "en_ticket_summaries/rougeL"}
    for case in skipped:  # the message is decide's reason line for that check
        assert case.find("skipped").get("message").startswith(f"INCONCLUSIVE: {case.get('name')}: delta ")
    # a metric check and its floor share a name in report.json; CI would merge equal testcases
    int8 = [c.get("name") for c in cases if c.get("classname") == "quantgate.int8"]
    assert len(set(int8)) == len(int8) == 8
    assert "en_support_qa/f1" in int8 and "en_support_qa/f1 (floor)" in int8


def test_junit_failure_message_is_the_reason_and_xml_stays_valid(report):
    broken = copy.deepcopy(report)
    gptq = broken["formats"]["gptq"]
    gptq["checks"][0]["status"] = "fail"
    gptq["checks"][0]["reason"] = "en_support_qa/f1: delta \x1b[31m-16.7\x1b[0m below -2.0 <&>"
    broken["formats"]["awq"]["checks"] = []  # a failed format still shows up, as a 'run' case
    suite = ET.fromstring(render_junit(RunReport.model_validate(broken)))
    assert suite.get("failures") == "2"
    failure = suite.find("testcase[@classname='quantgate.gptq'][@name='en_support_qa/f1']/failure")
    assert failure.get("message") == "en_support_qa/f1: delta [31m-16.7[0m below -2.0 <&>"
    assert suite.find("testcase[@classname='quantgate.awq'][@name='run']/failure") is not None


# --- scores.csv ----------------------------------------------------------------------------


def test_scores_csv_round_trips(report, samples):
    text = render_scores_csv(RunReport.model_validate(report), samples)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["format", "evalset", "id", "new_tokens", "em", "f1", "contains", "rouge1", "rouge2", "rougeL"]
    assert len(rows) == len(samples) == 54
    for row, sample in zip(rows, samples):
        assert (row["format"], row["evalset"], row["id"], int(row["new_tokens"])) == (
            sample["format"], sample["evalset"], sample["id"], sample["new_tokens"])
        for metric in ("em", "f1", "contains", "rouge1", "rouge2", "rougeL"):
            assert row[metric] == ("" if metric not in sample else repr(sample[metric]))


def test_scores_csv_reads_in_pandas(report, samples):
    pd = pytest.importorskip("pandas")
    frame = pd.read_csv(io.StringIO(render_scores_csv(RunReport.model_validate(report), samples)))
    assert frame.shape == (54, 10)
    assert frame["f1"].dtype.kind == "f" and frame["rougeL"].isna().sum() == 36
    means = frame.groupby(["format", "evalset"])["f1"].mean()
    assert means[("gptq", "en_support_qa")] == pytest.approx(report["formats"]["gptq"]["scores"]["en_support_qa"]["f1"]["value"], abs=0.01)


# --- regressions ---------------------------------------------------------------------------


def test_worst_regressions_pair_items_and_sort_worst_first(report, samples):
    parsed = parse_report(report, "report.json")
    groups = {(g.candidate, g.evalset): g for g in worst_regressions(parsed, samples, limit=5)}
    assert set(groups) == {(c, e) for c in ("int8", "gptq") for e in report["evalsets"]}  # awq has no samples
    en = groups[("gptq", "en_support_qa")]
    assert (en.metric, en.compared, en.regressed) == ("f1", 6, 2)
    assert [(r.item_id, r.change) for r in en.rows] == [("q004", -100.0), ("q002", -20.0)]
    assert en.rows[0].candidate_output == "<script>alert(1)</script>" and en.rows[0].baseline_output == "Within 14 days."
    assert [r.item_id for r in worst_regressions(parsed, samples, limit=1)[5].rows] == ["s003"]


# --- write_reports and `quantgate report` --------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(FIXTURE, target)
    return target


def _command(argv: list[str]) -> argparse.Namespace:
    from harness.commands import report as report_command

    parser = argparse.ArgumentParser(prog="quantgate")
    report_command.add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def test_report_command_rerenders_the_run(run_dir: Path, report, samples, capsys):
    args = _command(["report", str(run_dir)])
    assert args.func(args) == 1  # gptq and awq are not GO
    printed = capsys.readouterr().out.split()
    assert printed == [str(run_dir / name) for name in OUTPUT_NAMES]
    parsed = parse_report(report, "report.json")
    assert (run_dir / "report.md").read_text(encoding="utf-8") == render_markdown(parsed, samples)
    assert ET.parse(run_dir / "junit.xml").getroot().get("tests") == "17"
    assert not list(run_dir.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("exit_code", "formats", "expected"),
    [
        (0, ["baseline", "int8", "gptq"], 0),  # recorded by decide (e.g. inconclusive_is = "pass"): kept
        (1, ["baseline", "int8"], 1),
    ],
)
def test_report_command_exit_code(run_dir: Path, exit_code, formats, expected):
    data = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    data["formats"] = {k: v for k, v in data["formats"].items() if k in formats}
    data["exit_code"] = exit_code
    (run_dir / "report.json").write_text(json.dumps(data), encoding="utf-8")
    args = _command(["report", str(run_dir)])
    assert args.func(args) == expected


def test_write_reports_without_samples(run_dir: Path, report):
    (run_dir / "samples.jsonl").unlink()
    paths = write_reports(run_dir, report)
    assert [p.name for p in paths] == list(OUTPUT_NAMES)
    assert (run_dir / "scores.csv").read_text().splitlines() == ["format,evalset,id,new_tokens,em,f1,contains,rouge1,rouge2,rougeL"]


def test_missing_report_json_is_a_user_error(tmp_path: Path):
    args = _command(["report", str(tmp_path)])
    with pytest.raises(UserError) as caught:
        args.func(args)
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "report.json") in message and "not found" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"schema_version": 1,\n "formats": {', "report.json:2: not valid JSON"),
        ('{"schema_version": 7, "formats": {"a": {}}}', "field 'schema_version': is 7"),
        ('{"schema_version": 1, "formats": {}}', "field 'tool': Field required (and "),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_invalid_report_json_is_a_user_error(tmp_path: Path, content: str, expected: str):
    (tmp_path / "report.json").write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(expected)) as caught:
        load_report(tmp_path)
    assert "\n" not in str(caught.value)


def test_bad_samples_line_is_a_user_error(run_dir: Path, report):
    with (run_dir / "samples.jsonl").open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    with pytest.raises(UserError, match=r"samples\.jsonl:55: not valid JSON"):
        write_reports(run_dir, report)


def test_missing_run_dir_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="no such directory"):
        load_report(tmp_path / "nope")


def test_cli_registers_report_command(run_dir: Path):
    from harness import cli, commands

    assert "report" in commands.COMMANDS
    assert cli.main(["report", str(run_dir)]) == 1
    assert (run_dir / "report.html").is_file()


# --- memory over time ---------------------------------------------------------------------------


def _with_timelines(report: dict) -> dict:
    """The fixture with a CPU timeline on int8 (as the sampler writes it) and a GPU one on the baseline."""
    from harness.measure.timeline import MemoryTimeline

    timed = copy.deepcopy(report)
    values = iter(range(10_000))
    cpu = MemoryTimeline(reader=lambda: (int(1.2 * 2**30) + next(values) * 2**20,), fields=("rss_bytes",),
                         interval_s=3600, stage="load")
    with cpu:
        for stage in ("warm-up", "latency", "measure batch", "generate:en_support_qa"):
            cpu.mark(stage)
    timed["formats"]["int8"]["memory"]["timeline"] = cpu.as_dict()
    gpu = MemoryTimeline(reader=lambda: (9 * 2**30, 7 * 2**30, 8 * 2**30),
                         fields=("nvml_used_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"), interval_s=3600,
                         stage="load")
    with gpu:
        gpu.mark("latency")
    timed["formats"]["baseline"]["memory"]["timeline"] = gpu.as_dict()
    return timed


def test_memory_timeline_renders_a_plot_per_format_and_a_peak_line(report, samples):
    from harness.report.schema import RunReport

    timed = _with_timelines(report)
    RunReport.model_validate(json.loads(json.dumps(timed)))
    peak = timed["formats"]["int8"]["memory"]["timeline"]["peaks"]["rss_bytes"]
    assert peak["stage"] == "generate:en_support_qa"
    md = render_markdown(parse_report(timed, "report.json"), samples)
    line = f"**Memory over time:** peak RSS {format_bytes(peak['bytes'])} at {peak['t_s']:.1f} s (generate:en\\_support\\_qa)"
    assert line in md and md.count("**Memory over time:**") == 2
    assert "peak NVML used 9.00 GiB at " in md and "; peak allocated 7.00 GiB" in md
    _assert_tables_well_formed(md)
    page = render_html(parse_report(timed, "report.json"), samples)
    images = dict(re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page))
    for name in ("baseline", "int8"):
        assert base64.b64decode(images[f"Memory over time: {name}"]).startswith(b"\x89PNG")
    assert len(images) == 6 and "peak RSS" in page and "(generate:en_support_qa)" in page


def _cpu_timeline(rss_by_stage: dict[str, list[int]]) -> dict:
    """A CPU timeline as the sampler writes it, reading these RSS figures (MiB) stage by stage."""
    from harness.measure.timeline import MemoryTimeline

    timeline = MemoryTimeline(reader=lambda: (2**30,), fields=("rss_bytes",), interval_s=3600, stage="load")
    with timeline:
        for stage in list(rss_by_stage)[1:]:
            timeline.mark(stage)
    series = timeline.as_dict()
    readings = [(stage, mib) for stage, values in rss_by_stage.items() for mib in values]
    series["points"] = [{"t_s": float(i), "stage": stage, "rss_bytes": mib * 2**20}
                        for i, (stage, mib) in enumerate(readings)]
    return series


def test_memory_that_keeps_rising_through_the_evaluation_is_named(report, samples):
    """int8 in bf16 on an AVX512 CPU (demo run of 2026-12-05): RSS rose from 2.4 to 4.4 GiB over the generate stages,
    one new input shape at a time. A transient batch peak or a flat run is not named."""
    rising = {"load": [400], "latency": [700, 1200], "generate:a": [2450, 2600, 2900], "generate:b": [3000, 3500],
              "generate:c": [4500, 4800]}
    flat = {"load": [400], "latency": [700], "generate:a": [940, 990], "generate:b": [945, 1900, 950],
            "generate:c": [980, 1020]}
    timed = copy.deepcopy(report)
    timed["formats"]["int8"]["memory"]["timeline"] = _cpu_timeline(rising)
    timed["formats"]["baseline"]["memory"]["timeline"] = _cpu_timeline(flat)
    md = render_markdown(parse_report(timed, "report.json"), samples)
    assert md.count("kept rising through the evaluation") == 1
    assert ("RSS kept rising through the evaluation, its lowest 2.39 GiB in generate:a and 4.39 GiB in generate:c: "
            "memory that grows with each new input shape") in md
    timed["formats"]["int8"]["memory"]["timeline"] = _cpu_timeline({**rising, "generate:c": [2900, 3000]})
    assert "kept rising" not in render_markdown(parse_report(timed, "report.json"), samples)  # +550 MiB: < 50%


def test_reports_without_a_timeline_have_no_timeline_line_or_plot(report, samples, page):
    md = render_markdown(parse_report(report, "report.json"), samples)
    assert "Memory over time" not in md and "Memory over time" not in page
