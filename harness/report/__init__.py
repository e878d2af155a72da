"""Render a run's report.json (+ samples.jsonl) as summary.md, report.md, report.html, junit.xml, scores.csv.

report.json itself is written by the pipeline; everything here only reads it, so
`quantgate report RUN_DIR` can re-render a run without a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.report.schema import RunReport, parse_report
from harness.report.schema import load_report

__all__ = ["OUTPUT_NAMES", "load_report", "write_reports"]

OUTPUT_NAMES = ("summary.md", "report.md", "report.html", "junit.xml", "scores.csv")


def write_reports(run_dir: Path, report: RunReport | dict[str, Any]) -> list[Path]:
    """Write the five renderings into run_dir and return their paths (in OUTPUT_NAMES order). A dict (what the
    pipeline writes) is parsed through the schema first; every renderer reads the parsed report."""
    from harness.report.html import render_html
    from harness.report.junit import render_junit
    from harness.report.markdown import render_markdown
    from harness.report.scores_csv import render_scores_csv
    from harness.report.summary import render_summary
    from harness.report.view import load_samples, samples_path

    run_dir = Path(run_dir)
    parsed = report if isinstance(report, RunReport) else parse_report(report, str(run_dir / "report.json"))
    samples = load_samples(samples_path(run_dir, parsed))
    rendered = {
        "summary.md": render_summary(parsed),
        "report.md": render_markdown(parsed, samples),
        "report.html": render_html(parsed, samples),
        "junit.xml": render_junit(parsed),
        "scores.csv": render_scores_csv(parsed, samples),
    }
    paths = []
    for name in OUTPUT_NAMES:
        path = run_dir / name
        _write_atomic(path, rendered[name])
        paths.append(path)
    return paths


def _write_atomic(path: Path, text: str) -> None:
    """A reader (CI uploading junit.xml, a browser) never sees a half-written file; the file keeps its mode."""
    from harness.cache import atomic_write_text  # here: importing the schema (this package) loads nothing else

    atomic_write_text(path, text)
