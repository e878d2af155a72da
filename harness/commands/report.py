"""`quantgate report RUN_DIR`: re-render a finished run's reports without running a model."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="re-render report.md, report.html, junit.xml and scores.csv from a run directory",
        description=(
            "Re-render report.md, report.html, junit.xml and scores.csv from RUN_DIR/report.json and "
            "RUN_DIR/samples.jsonl, without running a model. Exit code: the run's own (0 when every candidate "
            "format is GO, 1 otherwise), 2 when RUN_DIR holds no valid report."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="the output directory of `quantgate run` (holds report.json and samples.jsonl)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.report import load_report, write_reports
    from harness.report.view import samples_path

    run_dir = Path(args.run_dir)
    report = load_report(run_dir)
    if run_dir.name == "report.json" and run_dir.is_file():
        run_dir = run_dir.parent
    samples = samples_path(run_dir, report)
    if not samples.is_file():  # `run` always writes it: without it the renderings would lose every item
        raise UserError(f"{samples}: missing; report.json names it and scores.csv and the regressions are rendered "
                        "from it: restore it (or rerun the run); nothing was rewritten")
    try:
        paths = write_reports(run_dir, report)
    except OSError as exc:
        raise UserError(f"{exc.filename or run_dir}: cannot write ({exc.strerror}); check the directory's permissions") from exc
    for path in paths:
        print(path)
    return report.exit_code
