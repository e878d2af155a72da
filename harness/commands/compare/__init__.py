"""`quantgate compare OLD NEW [NEWER...]` or `quantgate compare RUNS_DIR`: what changed between runs.

Output, top-down: the differences in what the runs measured (model, evalsets, metric definitions: not comparable;
device, versions, policy, recipe, calibration: warnings; see comparability.py), then for three or more runs the
trend (per format its verdicts and gated scores, a column per run), then the changes between the last two runs:
verdict flips, scores, peak memory, latency, recommendation.

Exit codes: 1 when a format that was GO in the last-but-one run is not GO, missing or failed in the last; 2 for an
unreadable input, or when the last two runs are not comparable and --allow-changes is not given; 0 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.compare.changes import Comparison, compare_reports, effective_verdict
from harness.commands.compare.comparability import ARROW, Difference, find_differences
from harness.commands.compare.inputs import Run, collect_runs
from harness.commands.compare.trend import Trend, build_trend, render_trend
from harness.errors import UserError
from harness.report.schema import SCHEMA_VERSION, load_report

__all__ = ["SCHEMA_VERSION", "Comparison", "Difference", "add_parser", "compare_reports", "effective_verdict",
           "find_differences", "load_report", "run"]

ALLOW_HINT = "pass --allow-changes to compare anyway"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="what changed between runs (two report.json files, more for a trend, or a directory of runs)",
        description="Compare quantgate runs: first every difference in what they measured, then (for three or more "
                    "runs) the trend of verdicts and gated scores, then the verdict flips, score, memory and latency "
                    "changes between the last two. Exit 1 when a format that was GO is no longer GO (or missing, "
                    "or failed); 2 when the last two runs scored different things (model, evalsets, metric "
                    "definitions) unless --allow-changes is given.",
    )
    p.add_argument("reports", nargs="+", type=Path, metavar="REPORT",
                   help="report.json files or run directories, oldest first; or a directory of runs (each "
                        "subdirectory holds a report.json; ordered by the reports' created_at)")
    p.add_argument("--allow-changes", action="store_true",
                   help="compare even when the model, an evalset or a metric definition changed (listed as warnings)")
    p.add_argument("--html", type=Path, metavar="FILE",
                   help="also write the trend as a self-contained HTML page with a plot")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    runs = collect_runs(args.reports)
    old, new = runs[-2], runs[-1]
    comparison = compare_reports(old.report, new.report)
    trend = build_trend(runs) if len(runs) > 2 or args.html else None
    blocking = [] if args.allow_changes else comparison.incomparable
    print(_title(runs))
    _print_differences(comparison, trend, blocking)
    if blocking:
        raise UserError(f"{old.path} {ARROW} {new.path}: not comparable ({_names(blocking)} changed); {ALLOW_HINT}")
    if trend is not None and len(runs) > 2:
        print("", *render_trend(trend), "", f"Changes #{len(runs) - 1}{ARROW}#{len(runs)} ({old.path} {ARROW} "
              f"{new.path}):", sep="\n")
    _print_changes(comparison)
    if args.html:
        _write_html(args.html, trend, comparison.regressed)
        print(f"\ntrend page: {args.html}")
    if comparison.regressed:
        print(f"\nno longer GO: {', '.join(comparison.regressed)}")
        return 1
    return 0


def _title(runs: list[Run]) -> str:
    if len(runs) == 2:
        return f"{runs[0].path} {ARROW} {runs[1].path}"
    return f"{len(runs)} runs, oldest first: {runs[0].path} \u2026 {runs[-1].path}"


def _print_differences(comparison: Comparison, trend: Trend | None, blocking: list[Difference]) -> None:
    """Not comparable (the last two runs; only without --allow-changes), then every warning, oldest pair first."""
    last = f"{trend.pairs[-1].label} " if trend is not None and len(trend.runs) > 2 else ""
    warnings = [f"{pair.label} {_warning(d, allowed=False)}" for pair in (trend.pairs[:-1] if last else [])
                for d in pair.differences]
    warnings += [f"{last}{_warning(d, allowed=True)}" for d in comparison.differences if d not in blocking]
    if blocking:
        print(f"\nNot comparable (the scores measure different things; {ALLOW_HINT}):")
        print("\n".join(f"  {last}{d.describe()}" for d in blocking))
    if warnings:
        print("\nWarnings:")
        print("\n".join(f"  {line}" for line in warnings))


def _warning(difference: Difference, allowed: bool) -> str:
    if not difference.incomparable:
        return difference.describe()
    return difference.describe() + (" (scores not comparable; compared anyway: --allow-changes)" if allowed
                                    else " (scores not comparable)")


def _names(differences: list[Difference], limit: int = 3) -> str:
    names = [d.what for d in differences]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _print_changes(comparison: Comparison) -> None:
    sections = comparison.sections()
    if not any(lines for _, lines in sections):
        print("\nno changes" if not comparison.differences else
              "\nno changes in verdicts, scores, memory or latency")
    for title, lines in sections:
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(f"  {line}")


def _write_html(path: Path, trend: Trend | None, regressed: list[str]) -> None:
    from harness.commands.compare.trend_html import render_trend_html

    assert trend is not None  # built whenever --html is given
    page = render_trend_html(trend, regressed)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--html {path}: cannot write ({exc.strerror or exc}); check the directory exists and is "
                        "writable") from None
