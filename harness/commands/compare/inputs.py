"""Which reports `quantgate compare` reads, and in which order.

Each argument is a report.json, a run directory holding one, or a directory of runs (its subdirectories each hold
a report.json; they are ordered by the report's `created_at`). Every problem is one UserError naming the path.
Each report is read by the one reader, harness.report.schema.load_report: it says what a file is when it is not a
quantgate report at all (not JSON, another tool's JSON, a schema version this quantgate does not read, formats
without verdicts) and upgrades a version-1 report (its checks' `reason`, which the comparison does not read).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness.errors import UserError
from harness.report.schema import PASS_A_REPORT, RunReport, load_report

REPORT_NAME = "report.json"


@dataclass(frozen=True)
class Run:
    path: Path  # the report.json
    report: RunReport

    @property
    def created_at(self) -> str:
        return self.report.created_at


def collect_runs(paths: list[Path]) -> list[Run]:
    """The reports to compare, oldest first: files in the order given, each directory of runs by created_at."""
    runs: list[Run] = []
    for path in paths:
        runs.extend(_runs_at(Path(path)))
    if len(runs) < 2:
        raise UserError(f"{paths[0]}: only one report to compare; pass two or more (OLD NEW, oldest first) "
                        "or a directory holding several runs")
    return runs


def _runs_at(path: Path) -> list[Run]:
    if not path.is_dir():
        return [Run(path, load_report(path))]
    if (path / REPORT_NAME).is_file():
        return [Run(path / REPORT_NAME, load_report(path / REPORT_NAME))]
    try:
        subdirectories = sorted(p for p in path.iterdir() if p.is_dir())
    except OSError as exc:
        raise UserError(f"{path}: cannot list this directory ({exc.strerror or exc}); {PASS_A_REPORT}") from None
    found: dict[Path, Path] = {}  # a `latest` link to a run is that run once
    for sub in subdirectories:
        if (sub / REPORT_NAME).is_file():
            found.setdefault(sub.resolve(), sub)
    if not found:
        raise UserError(f"{path}: no {REPORT_NAME} in this directory or its subdirectories; {PASS_A_REPORT}, "
                        "or a directory of such runs")
    runs = [Run(p / REPORT_NAME, load_report(p / REPORT_NAME)) for p in found.values()]
    return sorted(runs, key=lambda run: (_created_at(run), str(run.path)))


def _created_at(run: Run) -> datetime:
    try:
        when = datetime.fromisoformat(run.created_at.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{run.path}: field 'created_at': {run.created_at!r} is not an ISO time, so the runs in "
                        f"{run.path.parent.parent} cannot be ordered; pass the reports oldest first instead") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
