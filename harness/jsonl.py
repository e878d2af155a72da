"""JSON lines in, one object per line, with errors that name the file and the line.

Lines are split on "\\n" only (not str.splitlines, which also splits on U+2028 and other separators a JSON string
written with ensure_ascii=False may hold raw); blank lines are skipped; a UTF-8 byte-order mark is allowed.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from harness.errors import UserError

ONE_OBJECT_PER_LINE = "expected one JSON object per line"


def read_jsonl_numbered(path: Path, *, fix: str = ONE_OBJECT_PER_LINE) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of `path`. A bad line raises a UserError
    "FILE:LINE: not valid JSON (...); FIX" or "FILE:LINE: expected a JSON object, got an array; FIX", where `fix`
    says what the user should do; an unreadable or non-UTF-8 file one naming the file (and the line)."""
    path = Path(path)
    try:
        raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc}); check the path") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(f"{path}:{line_no}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {column}); "
                        "save the file as UTF-8") from exc
    records: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); {fix}") from exc
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: expected a JSON object, got {_json_type(record)}; {fix}")
        records.append((number, record))
    return records


def read_jsonl(path: Path, *, fix: str = ONE_OBJECT_PER_LINE) -> list[dict[str, Any]]:
    """Every non-blank line of `path` as a dict; errors as read_jsonl_numbered's."""
    return [record for _, record in read_jsonl_numbered(path, fix=fix)]


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
