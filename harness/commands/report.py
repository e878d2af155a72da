"""`quantgate report RUN_DIR`: re-render a finished run's reports without running a model."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="re-render summary.md, report.md, report.html, junit.xml and scores.csv (and fold in people's "
             "spot checks, --reviews)",
        description=(
            "Re-render report.md, report.html, junit.xml and scores.csv from RUN_DIR/report.json and "
            "RUN_DIR/samples.jsonl, without running a model. Exit code: the run's own (0 when every candidate "
            "format is GO, 1 otherwise), 2 when RUN_DIR holds no valid report."
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="the output directory of `quantgate run` (holds report.json and samples.jsonl)")
    parser.add_argument("--reviews", nargs="+", type=Path, metavar="REVIEW_JSONL",
                        help="people's judgments saved from `quantgate review`'s page (review-NAME.jsonl): fold "
                             "them into the verdicts under the policy's [spot_checks] and rewrite report.json too")
    parser.add_argument("--policy", type=Path, metavar="FILE",
                        help="with --reviews: take [spot_checks] from this policy file (every other table must be "
                             "the run's: re-deciding those needs `quantgate run --resume`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.report import load_report, write_reports

    run_dir = Path(args.run_dir)
    if args.policy and not args.reviews:
        raise UserError("--policy: only with --reviews (report re-renders the run's own verdicts otherwise)")
    report = load_report(run_dir)
    if run_dir.name == "report.json" and run_dir.is_file():
        run_dir = run_dir.parent
    _require_every_sample(run_dir, report)  # before anything is rewritten, the fold's report.json included
    if args.reviews:
        report, run_dir = _fold(run_dir, args.reviews, args.policy)
    try:
        paths = write_reports(run_dir, report)
    except OSError as exc:
        raise UserError(f"{exc.filename or run_dir}: cannot write ({exc.strerror}); check the directory's permissions") from exc
    for path in paths:
        print(path)
    return report.exit_code


def _require_every_sample(run_dir: Path, report) -> None:
    """samples.jsonl must hold every item of every format and evalset report.json lists: scores.csv and the
    regressions are rendered from it, so a shorter file would rewrite the reports with less."""
    from harness.report.view import load_samples, missing_samples, samples_path

    samples = samples_path(run_dir, report)
    if not samples.is_file():  # `run` always writes it: without it the renderings would lose every item
        raise UserError(f"{samples}: missing; report.json names it and scores.csv and the regressions are rendered "
                        "from it: restore it (or rerun the run); nothing was rewritten")
    missing = missing_samples(report, load_samples(samples))
    if missing:
        shown = "; ".join(missing[:6]) + (f"; and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise UserError(f"{samples}: lacks items report.json lists ({shown}); the reports rendered from it would "
                        "lose them: restore the file (or rerun the run); nothing was rewritten")


def _fold(run_dir: Path, reviews: list[Path], policy_path: Path | None):
    """The run's report with the judgments folded in, written to report.json (the renderings follow)."""
    from harness.review.session import fold_and_write

    report, run_dir = fold_and_write(run_dir, reviews, policy_path, say=lambda note: print(f"note: {note}"))
    for name, fmt in report.formats.items():
        if fmt.spot_checks is not None:
            print(f"{name}: {fmt.verdict} (spot checks: {fmt.spot_checks.judged} judged, {fmt.spot_checks.detail})")
    return report, run_dir
