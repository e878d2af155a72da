"""`quantgate compare OLD/report.json NEW/report.json`: what changed between two runs.

Verdict flips first, then metric values, peak memory and latency. Exit 1 when a format that was GO
in OLD is anything else in NEW (a format missing from NEW is listed but does not count: the run
was configured differently, nothing regressed); 0 otherwise; 2 (UserError) for an unreadable report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.decide import format_bytes, format_ms, num, signed
from harness.errors import UserError

SCHEMA_VERSION = 1
ARROW = "\u2192"
VALUE_TOLERANCE = 0.05  # score points; smaller changes print as 0.0 and are float noise


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="what changed between two report.json files",
        description="Compare two quantgate reports: verdict flips, metric, memory and latency changes.",
    )
    p.add_argument("old", type=Path, help="the earlier report.json")
    p.add_argument("new", type=Path, help="the later report.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    old = load_report(args.old)
    new = load_report(args.new)
    changes = compare_reports(old, new)
    print(f"{args.old} {ARROW} {args.new}")
    sections = [
        ("Verdicts", changes["verdicts"]),
        ("Scores", changes["scores"]),
        ("Memory", changes["memory"]),
        ("Latency", changes["latency"]),
        ("Recommendation", changes["recommendation"]),
    ]
    if not any(lines for _, lines in sections):
        print("no changes")
    for title, lines in sections:
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(f"  {line}")
    if changes["regressed"]:
        print(f"\nno longer GO: {', '.join(changes['regressed'])}")
        return 1
    return 0


def load_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc}); pass the report.json of a quantgate run") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); pass the report.json of a quantgate run") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a quantgate report (expected a JSON object)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UserError(f"{path}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    formats = data.get("formats")
    if not isinstance(formats, dict):
        raise UserError(f"{path}: field 'formats': expected an object of formats")
    for name, entry in formats.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("verdict"), str):
            raise UserError(f"{path}: formats.{name}: expected an object with a 'verdict' string")
        for field in ("scores", "memory", "latency"):
            if entry.get(field) is not None and not isinstance(entry[field], dict):
                raise UserError(f"{path}: formats.{name}.{field}: expected an object or null")
    return data


def compare_reports(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Lines per section, and the formats that were GO in `old` and are not in `new`."""
    verdicts: list[str] = []
    scores: list[str] = []
    memory: list[str] = []
    latency: list[str] = []
    regressed: list[str] = []
    old_formats, new_formats = old["formats"], new["formats"]
    for name in [*old_formats, *(n for n in new_formats if n not in old_formats)]:
        before, after = old_formats.get(name), new_formats.get(name)
        if after is None:
            verdicts.append(f"{name}: {before['verdict']} {ARROW} (not in the new report)")
            continue
        if before is None:
            verdicts.append(f"{name}: (new) {after['verdict']}")
            continue
        if before["verdict"] != after["verdict"]:
            line = f"{name}: {before['verdict']} {ARROW} {after['verdict']}"
            reasons = after.get("reasons") or []
            if after["verdict"] != "GO" and reasons:
                line += f" ({reasons[0]}{'; …' if len(reasons) > 1 else ''})"
            verdicts.append(line)
            if before["verdict"] == "GO":
                regressed.append(name)
        scores.extend(_score_changes(name, before.get("scores") or {}, after.get("scores") or {}))
        memory.extend(_memory_changes(name, before.get("memory") or {}, after.get("memory") or {}))
        latency.extend(_latency_changes(name, before.get("latency") or {}, after.get("latency") or {}))
    rec_before = (old.get("recommendation") or {}).get("format")
    rec_after = (new.get("recommendation") or {}).get("format")
    recommendation = [] if rec_before == rec_after else [f"{rec_before or 'none'} {ARROW} {rec_after or 'none'}"]
    return {
        "verdicts": verdicts,
        "scores": scores,
        "memory": memory,
        "latency": latency,
        "recommendation": recommendation,
        "regressed": regressed,
    }


def _score_changes(name: str, before: dict, after: dict) -> list[str]:
    lines = []
    for evalset in [*before, *(e for e in after if e not in before)]:
        old_metrics, new_metrics = before.get(evalset) or {}, after.get(evalset) or {}
        for metric in [*old_metrics, *(m for m in new_metrics if m not in old_metrics)]:
            was, now = old_metrics.get(metric) or {}, new_metrics.get(metric) or {}
            label = f"{name} {evalset}/{metric}"
            if not was or not now:
                lines.append(f"{label}: {'only in the new report' if now else 'not in the new report'}")
                continue
            parts = []
            if _moved(was.get("value"), now.get("value")):
                parts.append(f"{num(was.get('value'))} {ARROW} {num(now.get('value'))}{_change(was.get('value'), now.get('value'))}")
            if _moved(was.get("delta"), now.get("delta")):
                parts.append(f"delta vs baseline {signed(was.get('delta'))} {ARROW} {signed(now.get('delta'))}")
            if was.get("status") != now.get("status"):
                parts.append(f"{was.get('status') or 'not gated'} {ARROW} {now.get('status') or 'not gated'}")
            if parts:
                lines.append(f"{label}: " + "; ".join(parts))
    return lines


def _memory_changes(name: str, before: dict, after: dict) -> list[str]:
    was, now = before.get("peak_bytes"), after.get("peak_bytes")
    if was == now:
        return []
    return [f"{name} peak memory: {format_bytes(was)} {ARROW} {format_bytes(now)}{_percent(was, now)}"]


def _latency_changes(name: str, before: dict, after: dict) -> list[str]:
    lines = []
    for key, label in (("ttft_ms", "TTFT p95"), ("tpot_ms", "TPOT p95")):
        was = (before.get(key) or {}).get("p95")
        now = (after.get(key) or {}).get("p95")
        if was != now:
            lines.append(f"{name} {label}: {format_ms(was)} {ARROW} {format_ms(now)}{_percent(was, now)}")
    return lines


def _moved(was: float | None, now: float | None) -> bool:
    if was is None or now is None:
        return was is not now
    return abs(now - was) >= VALUE_TOLERANCE


def _change(was: float | None, now: float | None) -> str:
    return "" if was is None or now is None else f" ({signed(now - was)})"


def _percent(was: float | None, now: float | None) -> str:
    if was is None or now is None or was == 0:
        return ""
    return f" ({signed(100 * (now - was) / was)}%)"
