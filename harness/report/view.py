"""What every renderer reads out of report.json and samples.jsonl, in one place.

report.json is produced by the pipeline (schema_version 1, see the contract); the
renderers only read it. Fields a failed format could not measure are null, so every
accessor here tolerates missing data instead of raising.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.errors import UserError

SCHEMA_VERSION = 1
VERDICTS = ("GO", "NO-GO", "INCONCLUSIVE", "BASELINE")


@dataclass(frozen=True)
class GatedScore:
    evalset: str
    metric: str
    score: dict[str, Any]  # the scores.<evalset>.<metric> entry as written by decide


def validate_report(report: Any, where: str) -> None:
    """Check the shape the renderers rely on; one UserError naming every problem."""
    if not isinstance(report, dict):
        raise UserError(f"{where}: expected a JSON object at the top level; re-run `quantgate run` to rewrite it")
    problems: list[str] = []
    version = report.get("schema_version")
    if version != SCHEMA_VERSION:
        problems.append(f"field 'schema_version': is {version!r}, this quantgate reads {SCHEMA_VERSION}")
    formats = report.get("formats")
    if not isinstance(formats, dict) or not formats:
        problems.append("field 'formats': missing or empty; a run report holds one entry per format")
    else:
        for name, fmt in formats.items():
            if not isinstance(fmt, dict):
                problems.append(f"field 'formats.{name}': expected an object")
            elif not isinstance(fmt.get("scores") or {}, dict):
                problems.append(f"field 'formats.{name}.scores': expected an object")
            elif not isinstance(fmt.get("checks") or [], list):
                problems.append(f"field 'formats.{name}.checks': expected a list")
    if not isinstance(report.get("evalsets") or {}, dict):
        problems.append("field 'evalsets': expected an object")
    if problems:
        raise UserError(f"{where}: {problems[0]}; re-run `quantgate run` to rewrite it", problems=problems[1:])


def load_samples(path: Path) -> list[dict[str, Any]]:
    """Per-item records; a missing file means no items (e.g. every format failed)."""
    if not path.is_file():
        return []
    samples: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{line_no}: not valid JSON ({exc.msg}); re-run `quantgate run` to rewrite it") from exc
            if not isinstance(record, dict):
                raise UserError(f"{path}:{line_no}: expected one JSON object per line")
            samples.append(record)
    return samples


def samples_path(run_dir: Path, report: dict[str, Any]) -> Path:
    name = report.get("samples") or "samples.jsonl"
    return run_dir / str(name)


def formats_in_order(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Baseline first, then the order the run was asked for, then anything else."""
    formats: dict[str, Any] = report.get("formats") or {}
    requested = [f for f in (report.get("settings") or {}).get("formats") or [] if f in formats]
    order = requested + [f for f in formats if f not in requested]
    order.sort(key=lambda name: 0 if (formats[name] or {}).get("role") == "baseline" else 1)  # stable
    return [(name, formats[name]) for name in order]


def baseline_name(report: dict[str, Any]) -> str | None:
    for name, fmt in formats_in_order(report):
        if fmt.get("role") == "baseline":
            return name
    return None


def candidates(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, fmt) for name, fmt in formats_in_order(report) if fmt.get("role") != "baseline"]


def gate_metrics(report: dict[str, Any], evalset: str) -> list[str]:
    """The metrics the verdict gates on for this evalset (spec `gate`), else its first metric."""
    spec = (report.get("evalsets") or {}).get(evalset) or {}
    gate = [m for m in spec.get("gate") or [] if isinstance(m, str)]
    if gate:
        return gate
    metrics = [m for m in spec.get("metrics") or [] if isinstance(m, str)]
    return metrics[:1]


def iter_scores(fmt: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for evalset, metrics in (fmt.get("scores") or {}).items():
        if not isinstance(metrics, dict):
            continue
        for metric, score in metrics.items():
            if isinstance(score, dict):
                yield evalset, metric, score


def gated_scores(report: dict[str, Any], fmt: dict[str, Any]) -> list[GatedScore]:
    """Scores marked gated by decide; for the baseline (never marked) the spec's gate metrics."""
    marked = [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if s.get("gated")]
    if marked:
        return marked
    return [GatedScore(e, m, s) for e, m, s in iter_scores(fmt) if m in gate_metrics(report, e)]


def verdict_of(fmt: dict[str, Any]) -> str:
    verdict = fmt.get("verdict")
    return verdict if verdict in VERDICTS else "NO-GO" if fmt.get("status") == "failed" else str(verdict or "?")


def exit_code_of(report: dict[str, Any]) -> int:
    """0 when every candidate is GO, else 1 (the CLI convention)."""
    cands = candidates(report)
    return 0 if cands and all(verdict_of(fmt) == "GO" for _, fmt in cands) else 1
