"""Which reports `quantgate compare` reads, in which order, and the checks that make each one a quantgate report.

Each argument is a report.json, a run directory holding one, or a directory of runs (its subdirectories each hold
a report.json; they are ordered by the report's `created_at`). Every problem is one UserError naming the path.

A report is read through the schema (harness/report/schema.py: a version-1 report is upgraded), after a few
checks of its own that say what the file is when it is not a quantgate report at all (not JSON, another tool's
JSON, a schema version this quantgate does not read, formats without verdicts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.report.schema import READABLE_SCHEMA_VERSIONS, RunReport, parse_report

# Report schemas this comparison reads: those the schema reads (the producer writes SCHEMA_VERSION; version 1
# differs only in the checks' `reason`, which the comparison does not read). A later one is refused, not guessed at.
SUPPORTED_SCHEMA_VERSIONS = READABLE_SCHEMA_VERSIONS
REPORT_NAME = "report.json"
PASS_A_REPORT = "pass the report.json of a quantgate run (or its output directory)"


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


def load_report(path: Path) -> RunReport:
    """A quantgate report (schema_version 1 or 2) as the schema reads it, or a UserError naming the file and what
    is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except IsADirectoryError:
        raise UserError(f"{path}: no {REPORT_NAME} in this directory; {PASS_A_REPORT}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc}); {PASS_A_REPORT}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}), so not a quantgate report; {PASS_A_REPORT}") from None
    _check_is_a_report(path, data)
    return parse_report(data, str(path))


def _check_is_a_report(path: Path, data: Any) -> None:
    """What the schema would word as a missing field, said as what the file is: not a quantgate report, one from
    a quantgate version this one does not read, or formats that are not results."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a quantgate report (expected a JSON object); {PASS_A_REPORT}")
    tool = data.get("tool")
    if "schema_version" not in data or (isinstance(tool, dict) and tool.get("name") not in (None, "quantgate")):
        raise UserError(f"{path}: not a quantgate report (no 'schema_version' field); {PASS_A_REPORT}")
    version = data["schema_version"]
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:
        expected = " or ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
        raise UserError(f"{path}: schema_version {version!r} is not supported (expected {expected}); "
                        "compare it with the quantgate version that wrote it")
    formats = data.get("formats")
    if not isinstance(formats, dict):
        raise UserError(f"{path}: field 'formats': expected an object of formats")
    for name, entry in formats.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("verdict"), str):
            raise UserError(f"{path}: formats.{name}: expected an object with a 'verdict' string")
        for field in ("scores", "memory", "latency", "artifact", "calibration"):
            if entry.get(field) is not None and not isinstance(entry[field], dict):
                raise UserError(f"{path}: formats.{name}.{field}: expected an object or null")
