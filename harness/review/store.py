"""Where judgments are kept, so that none is ever lost.

- RUN_DIR/reviews/NAME.jsonl: every judgment `report --reviews` has folded, per reviewer, the latest line per item.
  A later fold merges into it: a reviewer's new file replaces the kept judgments only when it holds every item
  judged before (a superset); otherwise the judgments it lacks are kept. Each fold counts them all.
- RUN_DIR/review-NAME.jsonl written by `review --serve`: each save appends the lines that are new or changed, so
  an earlier save is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.review.judgments import Judgment

KEPT_DIR = "reviews"
SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
Line = tuple[Judgment, dict[str, Any]]


@dataclass(frozen=True)
class Merged:
    lines: dict[str, dict[str, Line]]  # reviewer -> item -> the line that counts
    changed: tuple[str, ...]  # reviewers whose kept file is to be rewritten
    notes: tuple[str, ...]


def kept_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / KEPT_DIR).glob("*.jsonl"))


def kept_file(run_dir: Path, reviewer: str) -> Path:
    """The reviewer's kept file; a name that is not a plain file name is stored under its hash."""
    name = reviewer if SAFE_NAME.fullmatch(reviewer) else \
        "reviewer-" + hashlib.sha256(reviewer.encode()).hexdigest()[:12]
    return run_dir / KEPT_DIR / f"{name}.jsonl"


def merge(kept: list[Line], new: list[Line]) -> Merged:
    """Each reviewer's kept judgments with the new lines merged in: the latest line per item wins (a line's
    `judged_at`, when both carry one; otherwise the one read later)."""
    lines: dict[str, dict[str, Line]] = {}
    for line in kept:
        _take(lines.setdefault(line[0].reviewer, {}), line)
    before = {reviewer: dict(items) for reviewer, items in lines.items()}
    incoming: dict[str, dict[str, Line]] = {}
    for line in new:
        _take(incoming.setdefault(line[0].reviewer, {}), line)
    changed, notes = [], []
    for reviewer, items in incoming.items():
        own = lines.setdefault(reviewer, {})
        for line in items.values():
            _take(own, line)
        if _contents(own) != _contents(before.get(reviewer, {})):
            changed.append(reviewer)
        earlier = before.get(reviewer, {})
        if not earlier:
            continue
        sources = ", ".join(sorted({line[0].where.rsplit(":", 1)[0] for line in items.values()}))
        missing = sorted(set(earlier) - set(items))
        if missing:
            notes.append(f"{reviewer}: {sources} lacks {len(missing)} item(s) judged before ({_few(missing)}); "
                         "those earlier judgments are kept: a reviewer's file replaces the earlier one only when it "
                         "holds every item judged before")
        elif _contents(own) != _contents(earlier):
            notes.append(f"{reviewer}: {sources} replaces the {len(earlier)} earlier judgment(s) (it holds every "
                         f"item judged before, {len(items)} in all)")
    return Merged(lines, tuple(changed), tuple(notes))


def _take(items: dict[str, Line], line: Line) -> None:
    old = items.get(line[0].item)
    if old is None or (_content(line) != _content(old) and not _older(line[1], old[1])):
        items[line[0].item] = line


def _content(line: Line) -> str:
    """A line as judged: where it was read from aside."""
    return json.dumps({k: v for k, v in line[1].items() if k != "source"}, sort_keys=True, ensure_ascii=False)


def _contents(items: dict[str, Line]) -> dict[str, str]:
    return {item: _content(line) for item, line in items.items()}


def _older(new: dict[str, Any], old: dict[str, Any]) -> bool:
    a, b = new.get("judged_at"), old.get("judged_at")
    return isinstance(a, str) and isinstance(b, str) and a < b


def _few(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def write_kept(run_dir: Path, merged: Merged) -> list[Path]:
    from harness.cache import atomic_write_text

    written = []
    for reviewer in merged.changed:
        path = kept_file(run_dir, reviewer)
        text = "".join(json.dumps({**record, "source": record.get("source") or judgment.where},
                                  ensure_ascii=False) + "\n"
                       for judgment, record in merged.lines[reviewer].values())
        atomic_write_text(path, text)
        written.append(path)
    return written


_APPEND = threading.Lock()


def append_save(path: Path, lines: list[Line]) -> tuple[int, int]:
    """Append to a reviewer's saved file the lines whose judgment differs from the latest one it holds for that
    item (an unchanged page saved again adds nothing; an earlier save is never overwritten); (lines appended,
    items the file now holds)."""
    with _APPEND:
        latest = _latest_lines(path)
        fresh = []
        for _, record in lines:
            text = json.dumps(record, ensure_ascii=False, sort_keys=True)
            if latest.get(str(record.get("item"))) != text:
                latest[str(record.get("item"))] = text
                fresh.append(json.dumps(record, ensure_ascii=False) + "\n")
        if fresh:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("".join(fresh))
                handle.flush()
                os.fsync(handle.fileno())
        return len(fresh), len(latest)


def _latest_lines(path: Path) -> dict[str, str]:
    latest: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return latest
    except (OSError, UnicodeDecodeError):
        return latest  # unreadable: everything is appended, nothing overwritten
    for line in text.split("\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            latest[str(record.get("item"))] = json.dumps(record, ensure_ascii=False, sort_keys=True)
    return latest
