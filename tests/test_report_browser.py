"""report.html in a real headless Chromium, driven over the DevTools protocol (tests/devtools.py)."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

import pytest

from devtools import DevToolsBrowser, browser, load_page  # noqa: F401 (browser: the fixture)
from harness.report import load_report, write_reports

FIXTURE = Path(__file__).parent / "fixtures" / "run_example"


@pytest.fixture
def rendered_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    write_reports(run_dir, load_report(run_dir))
    return run_dir


PAGE_FACTS = """(() => {
  const table = document.querySelector('table.verdicts');
  const box = table ? table.getBoundingClientRect() : null;
  const text = document.body.innerText;
  return {
    hasTable: !!table,
    tableVisible: !!box && box.width > 0 && box.height > 0 && getComputedStyle(table).visibility === 'visible',
    tableTop: box ? box.top : null,
    tableText: table ? table.innerText : '',
    badges: table ? [...table.querySelectorAll('.badge')].map(b => [b.textContent, getComputedStyle(b).backgroundColor]) : [],
    scripts: document.scripts.length,
    scriptShownAsText: text.includes('<script>alert(1)</script>'),  // model output
    datasetScriptShownAsText: text.includes('<script>alert(2)</script>'),  // a dataset line
    markupShownAsText: text.includes('<b>14 days</b>') && text.includes('<b>URGENT</b>'),
    boldElements: document.querySelectorAll('b').length,
    chineseShown: text.includes('八五折优惠') && text.includes('通常需要3到5个工作日'),
    images: [...document.images].map(i => ({loaded: i.complete && i.naturalWidth > 0, scheme: i.src.split(':')[0]})),
    awqError: [...document.querySelectorAll('.error')].map(d => d.innerText).join(' '),
  };
})()"""


def test_report_html_in_chromium(browser: DevToolsBrowser, rendered_run: Path, tmp_path: Path) -> None:
    load_page(browser, rendered_run / "report.html")
    facts = browser.evaluate(PAGE_FACTS)

    assert facts["hasTable"] and facts["tableVisible"]
    assert 0 <= facts["tableTop"] < 900, "the verdict table should be on the first screen"
    for text in ("baseline", "int8", "gptq", "awq", "BASELINE", "GO", "INCONCLUSIVE", "NO-GO", "−16.7 [−50.0, +3.3]"):
        assert text in facts["tableText"]
    colours = dict(facts["badges"])
    assert colours["GO"] == "rgb(26, 127, 55)" and colours["NO-GO"] == "rgb(207, 34, 46)"
    assert "CUDA out of memory" in facts["awqError"]

    # model output and dataset markup are text, not elements, and nothing ran
    assert facts["scripts"] == 0
    assert facts["scriptShownAsText"] and facts["datasetScriptShownAsText"] and facts["markupShownAsText"]
    assert facts["boldElements"] == 0
    assert facts["chineseShown"]
    assert browser.dialogs() == []
    assert browser.console_problems() == []

    # self-contained: the four plots are data: URIs that decoded, and nothing else was fetched
    assert len(facts["images"]) == 4
    assert all(i["loaded"] and i["scheme"] == "data" for i in facts["images"])
    assert all(url.startswith(("file:", "data:")) for url in browser.requested_urls())

    shot = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"})["data"])
    (tmp_path / "report.png").write_bytes(shot)
    _assert_nontrivial_png(shot, (1280, 900))


def test_probe_sees_dialogs_and_console_errors(browser: DevToolsBrowser, tmp_path: Path) -> None:
    """The checks above would pass vacuously if the probe could not see these."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom'); alert(1); undefinedCall();</script>")
    load_page(browser, page)
    assert [d.get("message") for d in browser.dialogs()] == ["1"]
    problems = browser.console_problems()
    assert any("boom" in p for p in problems) and any(p.startswith("uncaught") for p in problems)


def _assert_nontrivial_png(data: bytes, size: tuple[int, int]) -> None:
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    image_module = pytest.importorskip("PIL.Image")
    image = image_module.open(io.BytesIO(data)).convert("RGB")
    assert image.size == size
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50, "screenshot looks blank"
    white = max((count for count, colour in colours if colour == (255, 255, 255)), default=0) if colours else 0
    assert white < 0.95 * size[0] * size[1]
