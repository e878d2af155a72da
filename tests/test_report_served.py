"""The `served` block (backend vllm) and settings.backend: the contract accepts them and refuses drift, and the
Markdown and HTML reports show a "Served by vLLM" section only when a format was served."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.report.html import render_html
from harness.report.markdown import md_fence, md_inline, render_markdown
from harness.report.schema import RunReport, parse_report

FIXTURE = Path(__file__).parent / "fixtures" / "run_example" / "report.json"
COMMAND = ("VLLM_WORKER_MULTIPROC_METHOD=spawn vllm serve /cache/gptq --quantization gptq_marlin "
           "--max-model-len 4096 --max-num-seqs 8 --seed 0")
UNSUPPORTED = ("vLLM 0.32.0 has no bitsandbytes quantization method, so int8 cannot be served; "
               "use --backend transformers for it, or serve int8_per_channel_weight_only")
PREEMPTED = ("vLLM preempted 3 time(s) under 8 concurrent requests of 4088 tokens: the KV cache does not hold "
             "max-num-seqs sequences of max-model-len")


def _stats(p50: float, count: int) -> dict:
    return {"p50": p50, "p95": 1.4 * p50, "p99": 1.6 * p50, "max": 1.7 * p50, "mean": 1.1 * p50,
            "stdev": 0.2 * p50, "count": count}


def _latency(concurrency: int, requests: int, ttft: float) -> dict:
    return {"concurrency": concurrency, "requests": requests, "ttft_ms": _stats(ttft, requests),
            "itl_ms": _stats(9.5, 40 * requests), "tpot_ms": _stats(9.8, requests),
            "e2e_ms": _stats(ttft + 400.0, requests), "output_tokens_per_s": 98.5 * concurrency,
            "wall_s": 12.5}


def served_ok() -> dict:
    return {
        "status": "ok", "reason": None, "engine": "vllm", "source": "project environment .venv-vllm",
        "version": "0.32.0", "endpoint": None, "command": COMMAND,
        "flags": {"--quantization": "gptq_marlin", "--max-model-len": "4096", "--max-num-seqs": "8", "--seed": "0"},
        "kernels": ["MarlinLinearKernel"], "startup_s": 41.2, "log": "/runs/x/logs/gptq.vllm.log",
        "kv_cache": {"block_size": 16, "max_model_len": 4096, "predicted_tokens": 46592, "vllm_tokens": 46080,
                     "relative_error": (46592 - 46080) / 46080, "predicted_max_concurrency": 11.38,
                     "vllm_max_concurrency": 11.25, "vllm_kv_memory_gib": 1.0},
        "latency": {"concurrency_1": _latency(1, 8, 21.0), "concurrency_8": _latency(8, 24, 65.0)},
        "saturation": {"holds": False, "concurrency": 8, "prompt_tokens": 4088, "new_tokens": 8, "preemptions": 3.0,
                       "failed_requests": 0, "server_alive": True, "reason": PREEMPTED},
        "rss_peak_bytes": None, "scored": True,
    }


def served_unsupported() -> dict:
    return {"status": "unsupported", "reason": UNSUPPORTED, "engine": "vllm",
            "source": "project environment .venv-vllm", "version": "0.32.0", "endpoint": None, "command": None,
            "flags": {}, "kernels": [], "startup_s": None, "log": None, "kv_cache": None, "latency": {},
            "saturation": None, "rss_peak_bytes": None, "scored": False}


@pytest.fixture(scope="module")
def plain() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def served(plain) -> dict:
    report = copy.deepcopy(plain)
    report["settings"]["backend"] = "vllm"
    report["formats"]["gptq"]["served"] = served_ok()
    report["formats"]["int8"]["served"] = served_unsupported()
    return report


@pytest.fixture(scope="module")
def md(served) -> str:
    return render_markdown(parse_report(served, "report.json"), [])


@pytest.fixture(scope="module")
def page(served) -> str:
    return render_html(parse_report(served, "report.json"), [], plots=[])


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


# --- the contract ----------------------------------------------------------------------------------


def test_a_served_report_validates_unchanged(served):
    parsed = RunReport.model_validate(served)
    assert parsed.model_dump(mode="json", exclude_unset=True) == served
    gptq = parsed.formats["gptq"].served
    assert parsed.settings.backend == "vllm" and gptq.latency["concurrency_8"].ttft_ms.p99 == pytest.approx(104.0)
    assert gptq.kv_cache.vllm_tokens == 46080 and gptq.saturation.holds is False
    assert parsed.formats["int8"].served.status == "unsupported" and parsed.formats["baseline"].served is None


def test_older_reports_mean_the_transformers_backend(plain):
    assert "backend" not in plain["settings"]
    assert RunReport.model_validate(plain).settings.backend == "transformers"
    nulled = copy.deepcopy(plain)
    nulled["formats"]["int8"]["served"] = None  # what the transformers backend may write
    assert RunReport.model_validate(nulled).formats["int8"].served is None


def _with(report: dict, change) -> dict:
    changed = copy.deepcopy(report)
    change(changed["formats"]["gptq"]["served"])
    return changed


@pytest.mark.parametrize("change, where", [
    (lambda s: s.update(kernel=s.pop("kernels")), "formats.gptq.served.kernel"),
    (lambda s: s["kv_cache"].update(vllm_token=s["kv_cache"].pop("vllm_tokens")), "formats.gptq.served.kv_cache"),
    (lambda s: s["latency"]["concurrency_1"]["ttft_ms"].update(p98=1.0), "concurrency_1.ttft_ms.p98"),
    (lambda s: s["latency"]["concurrency_1"].update(requests="8"), "concurrency_1.requests"),
    (lambda s: s["saturation"].update(holds="no"), "formats.gptq.served.saturation.holds"),
    (lambda s: s.update(status="maybe"), "formats.gptq.served.status"),
    (lambda s: s["latency"].update(c4=s["latency"]["concurrency_1"]), "formats.gptq.served.latency.c4"),
    (lambda s: s["latency"].update(concurrency_4=s["latency"]["concurrency_1"]), "holds concurrency 1"),
])
def test_served_drift_fails_naming_it(served, change, where):
    with pytest.raises(ValidationError) as caught:
        RunReport.model_validate(_with(served, change))
    assert where in str(caught.value)


def test_an_unknown_backend_fails(served):
    wrong = copy.deepcopy(served)
    wrong["settings"]["backend"] = "not a runtime name"  # a plugin's runtime name is a word; this is not
    with pytest.raises(ValidationError, match="settings.backend"):
        RunReport.model_validate(wrong)


# --- Markdown --------------------------------------------------------------------------------------


def test_markdown_served_section_comes_after_the_formats(md):
    order = [md.index(s) for s in ("## awq", "## Served by vLLM", "### int8: unsupported", "### gptq: ok",
                                   "## Provenance")]
    assert order == sorted(order)
    assert "### baseline" not in md  # not served: no entry


def test_markdown_served_ok_format(md):
    gptq = _between(md, "### gptq: ok", "## Provenance")
    assert ("- **vLLM:** vLLM 0.32.0 from project environment .venv-vllm; started in 41.2 s; log "
            "/runs/x/logs/gptq.vllm.log") in gptq
    assert "- **Kernels:** MarlinLinearKernel" in gptq
    assert ("- **KV cache:** predicted 46,592 tokens vs vLLM's 46,080 tokens (error +1.1%), max concurrency 11.38 "
            "predicted vs 11.25 vLLM at 4,096 tokens (16-token blocks, vLLM's KV memory 1.00 GiB)") in gptq
    assert f"- **Saturation:** does not hold under load: {PREEMPTED}" in gptq
    assert "- **Scores:** from this server" in gptq
    assert f"```sh\n{COMMAND}\n```" in gptq


def test_markdown_served_latency_table(md):
    gptq = _between(md, "### gptq: ok", "## Provenance")
    rows = [line for line in gptq.splitlines() if line.startswith("|")]
    assert rows[0] == ("| Concurrency | Requests | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p95 | TPOT p50 | "
                       "TPOT p95 | E2E p50 | E2E p95 | Output tok/s |")
    # 8 requests are too few for a p95 or p99: the cells say "max of 8"; the ITL gaps (320) are enough
    assert rows[2] == ("| 1 | 8 | 21.0 ms | max of 8: 35.7 ms | max of 8: 35.7 ms | 9.5 ms | 13.3 ms | 9.8 ms | "
                       "max of 8: 16.7 ms | 421.0 ms | max of 8: 715.7 ms | 98.5 tok/s |")
    assert rows[3].startswith("| 8 | 24 | 65.0 ms | 91.0 ms | 104.0 ms |")
    assert all(len(re.split(r"(?<!\\)\|", row)) == 14 for row in rows)


def test_markdown_unsupported_format_says_why(md):
    int8 = _between(md, "### int8: unsupported", "### gptq")
    assert f"**Reason:** {md_inline(UNSUPPORTED)}" in int8 and "int8\\_per\\_channel" in int8  # escaped
    assert "- **Scores:** from transformers" in int8
    assert "Kernels" not in int8 and "```" not in int8 and "| Concurrency |" not in int8


def test_markdown_says_where_scores_and_latency_come_from(md):
    table_end = md.index("**Recommendation:**")
    assert "_Scores come from the vLLM server (backend vllm); baseline, int8: from transformers (not served)._" \
        in md[:table_end]
    gptq = _between(md, "## gptq", "## awq")
    assert ("_Latency below is measured in transformers (eager, in-process); served figures are in 'Served by "
            "vLLM'._") in gptq
    int8 = _between(md, "## int8", "## gptq")
    assert "vLLM has no figures for this format (see 'Served by vLLM')" in int8
    baseline = _between(md, "## baseline", "## int8")
    assert "_Latency below is measured in transformers (eager, in-process); this format was not served by vLLM._" \
        in baseline


def test_a_report_without_served_has_no_served_section(plain):
    md = render_markdown(parse_report(plain, "report.json"), [])
    page = render_html(parse_report(plain, "report.json"), [], plots=[])
    for text in ("Served by vLLM", "Scores come from the vLLM server", "measured in transformers"):
        assert text not in md and text not in page


def test_the_command_fence_survives_backticks():
    assert md_fence("echo ```x``") == "````sh\necho ```x``\n````"


# --- HTML ------------------------------------------------------------------------------------------


def test_html_served_section(page):
    served = _between(page, '<section id="served">', "</section>")
    assert "<h2>Served by vLLM</h2>" in served
    assert "predicted 46,592 tokens vs vLLM&#x27;s 46,080 tokens (error +1.1%)" in served
    assert "does not hold under load: vLLM preempted 3 time(s)" in served
    assert "max of 8: 35.7 ms" in served and "<th>TTFT p99</th>" in served
    assert f"<strong>Reason:</strong> {UNSUPPORTED}" in served
    assert f"<pre><code>{COMMAND}</code></pre>" in served
    assert '<p class="note">Scores come from the vLLM server (backend vllm)' in page


def test_html_escapes_served_text_and_fetches_nothing(served):
    hostile = copy.deepcopy(served)
    hostile["formats"]["int8"]["served"]["reason"] = '<script>alert(1)</script> "quoted" & more'
    hostile["formats"]["gptq"]["served"]["command"] = "vllm serve '/m<x>' --api-key $(</etc/passwd)"
    hostile["formats"]["gptq"]["served"]["endpoint"] = "http://h:8000"
    page = render_html(parse_report(hostile, "report.json"), [], plots=[])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot; &amp; more" in page
    assert "vllm serve &#x27;/m&lt;x&gt;&#x27; --api-key $(&lt;/etc/passwd)" in page
    assert "at http://h:8000" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) and "<link" not in page


def test_a_users_endpoint_without_a_prediction_validates_and_renders(served):
    """--vllm-endpoint: no command, no log, a KV cache vLLM's log was not read for."""
    endpoint = copy.deepcopy(served)
    block = endpoint["formats"]["gptq"]["served"]
    block.update(source="--vllm-endpoint http://h:8000", endpoint="http://h:8000", command=None, log=None,
                 flags={}, startup_s=None)
    block["kv_cache"] = {key: None for key in block["kv_cache"]} | {"max_model_len": 4096}
    assert RunReport.model_validate(endpoint).formats["gptq"].served.kv_cache.block_size is None
    md = render_markdown(parse_report(endpoint, "report.json"), [])
    gptq = md[md.index("### gptq: ok"):]
    assert "- **vLLM:** vLLM 0.32.0 from --vllm-endpoint http://h:8000\n" in gptq  # the URL once
    assert "predicted — tokens vs vLLM's — tokens (error —), max concurrency — predicted vs — vLLM at 4,096" in gptq
    assert "```" not in gptq.split("## Provenance")[0]
