"""Reading an evalset's data file (JSONL, JSON array, CSV or Parquet) into rows that know their line.

The datasets library reads the rows; before it does, the text formats are checked here (UTF-8, JSON per line,
CSV cell counts), since datasets' own errors name no line. Parquet rows are numbered instead.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.evalsets.paths import display_path

DATA_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Row:
    where: str  # "path:LINE" or "path:row N" (Parquet)
    unit: str  # "line" or "row", for "first at line 3"
    number: int
    values: dict[str, Any]  # file columns as read
    from_csv: bool = False  # CSV cells are strings: lists arrive as JSON text


def read_rows(path: Path, label: str, problems: list[str]) -> tuple[list[Row], list[str], bytes] | None:
    """Rows, the file's column names and its bytes; None when the file cannot be read at all."""
    if not path.exists():
        problems.append(f"{label}: data file {display_path(path)} not found (key 'data' is relative to the spec file)")
        return None
    shown = display_path(path)
    raw = path.read_bytes()
    fmt = DATA_FORMATS.get(path.suffix)
    if fmt is None:
        problems.append(f"{label}: data file {shown}: unknown type '{path.suffix}'; use {', '.join(DATA_FORMATS)}")
        return None
    if fmt == "parquet":
        numbers = None
    else:
        numbers = _scan_text(raw, shown, fmt, problems)
        if numbers is None:
            return None
    if not raw.strip() or numbers == []:
        problems.append(f"{shown}: empty evalset (no rows); add at least one item")
        return None
    records = _load_with_datasets(path, fmt, hashlib.sha256(raw).hexdigest(), shown, problems)
    if records is None:
        return None
    if not records:
        problems.append(f"{shown}: empty evalset (no rows); add at least one item")
        return None
    if numbers is not None and len(numbers) != len(records):
        problems.append(f"{shown}: datasets read {len(records)} rows but the file has {len(numbers)}; "
                        f"check for stray line breaks")
        return None
    columns = sorted({key for record in records for key in record})
    if fmt == "parquet":
        rows = [Row(f"{shown}:row {i}", "row", i, rec) for i, rec in enumerate(records, 1)]
    else:
        rows = [Row(f"{shown}:{n}", "line", n, rec, fmt == "csv") for n, rec in zip(numbers, records)]
    return rows, columns, raw


def _scan_text(raw: bytes, shown: str, fmt: str, problems: list[str]) -> list[int] | None:
    """Check UTF-8 and syntax ourselves (datasets' errors name no line); the line each row starts on."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    ok = True
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{shown}:{number}: not valid UTF-8 (byte 0x{line[exc.start]:02x} at column "
                            f"{exc.start + 1}); save the file as UTF-8")
            ok = False
    if not ok:
        return None
    text = raw.decode("utf-8")
    if fmt == "csv":
        return _scan_csv(text, shown, problems)
    if text.lstrip().startswith("["):  # a .json file holding one array
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"{shown}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})")
            return None
        return list(range(1, len(rows) + 1))
    numbers = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{shown}:{number}: invalid JSON ({exc.msg} at column {exc.colno})")
            ok = False
            continue
        if not isinstance(value, dict):
            problems.append(f"{shown}:{number}: a row must be a JSON object, got {type(value).__name__}")
            ok = False
        numbers.append(number)
    return numbers if ok else None


def _scan_csv(text: str, shown: str, problems: list[str]) -> list[int] | None:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        numbers, start, ok = [], reader.line_num + 1, True
        for record in reader:
            if record:
                if len(record) != len(header):
                    problems.append(f"{shown}:{start}: {len(record)} cells but the header has {len(header)} "
                                    f"(check quoting: a cell with a comma or a line break needs double quotes)")
                    ok = False
                numbers.append(start)
            start = reader.line_num + 1
    except csv.Error as exc:
        problems.append(f"{shown}:{reader.line_num}: invalid CSV ({exc})")
        return None
    return numbers if ok else None


def _load_with_datasets(path: Path, fmt: str, digest: str, shown: str, problems: list[str]) -> list[dict] | None:
    from harness.cache import cache_dir

    # datasets reads this once, at its import: set it first, here rather than when harness.evalsets is imported.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its failures come back to us as exceptions
    # datasets' own cache is keyed by path and mtime and can serve stale rows; key ours by content.
    options: dict[str, Any] = {"cache_dir": str(cache_dir("datasets") / digest[:20])}
    if fmt == "csv":  # every cell a string: "007" stays "007", "NA" stays "NA", empty stays ""
        header = next(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
        options["features"] = datasets.Features({name: datasets.Value("string") for name in header})
        options["keep_default_na"] = False
    try:
        dataset = datasets.load_dataset(fmt, data_files=str(path), split="train", **options)
        records = dataset.to_list()
    except Exception as exc:  # datasets raises many types; the message is what the user needs
        while exc.__cause__ is not None:  # DatasetGenerationError wraps the reader's own error
            exc = exc.__cause__
        first_line = (str(exc).strip().splitlines() or [""])[0]
        problems.append(f"{shown}: datasets could not read it ({type(exc).__name__}: {first_line})")
        return None
    if fmt == "csv":  # an empty cell means "not given"
        records = [{k: (None if v == "" else v) for k, v in rec.items()} for rec in records]
    return records
