"""Evaluation sets: a TOML spec plus a data file (JSONL/JSON, CSV or Parquet) -> validated `EvalSet`.

Also the per-set jobs that need nothing but the set: rendering prompts and scoring a prediction. Calibration
text never comes from the items (harness.calibration); a spec may name a `calibration` file of its own.

Loading reports every problem it finds, across all sets, in one `UserError`: each problem names the
file, the line (or Parquet row) and the field, and says what to do. A set whose declared language does not
match its text (`en` but more than 30% CJK among the letters of its questions, contexts and references, or
`zh` and at most 30%) is refused: scored with the wrong tokenizer it would score 0 for every format and
tell none apart.

Items that share a context (SQuAD/CMRC-style sets ask several questions about one passage) are not
independent: `EvalSet.clusters()` keys each item by the spec's `group` column when it names one, else by
its context; items without either are their own clusters. decide.py resamples these clusters.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import os
import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from harness.errors import UserError
from harness.metrics import DEFAULT_GATE, METRICS_BY_TASK, ALL_METRICS, score_prediction, tokenizer_name
from harness.metrics.tokenizers import ZH_SHARE_THRESHOLD, cjk_share, detect_language

# datasets reads this once, at import; it is imported lazily below, so this always comes first.
os.environ["HF_DATASETS_OFFLINE"] = "1"

TASKS = ("qa", "generation")
LANGUAGES = ("en", "zh", "auto")
TEMPLATE_FIELDS = ("question", "context", "instruction")
ROW_FIELDS = ("id", "question", "context", "instruction", "answers", "reference", "references")
DATA_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SPEC_KEYS = (
    "name", "task", "language", "data", "description", "max_new_tokens", "metrics", "gate",
    "system_prompt", "prompt_template", "abstain_phrases", "columns", "few_shot", "group", "calibration",
)
FEW_SHOT_KEYS = ("question", "context", "instruction", "answer", "output")
DEFAULT_MAX_NEW_TOKENS = {"qa": 48, "generation": 128}
DEFAULT_ABSTAIN_PHRASES = (
    "cannot be answered", "can't be answered", "not in the context", "not mentioned in the context",
    "unanswerable", "no answer", "无法回答", "不能回答", "没有提到", "未提及",
)
ABSTAIN_REPLY = {"en": "cannot be answered", "zh": "无法回答"}
MAX_PROBLEMS_PER_SET = 50

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class FewShotExample:
    question: str = ""
    context: str = ""
    instruction: str = ""
    answer: str = ""  # the assistant turn: `answer` for QA, `output` for generation


@dataclass(frozen=True)
class EvalItem:
    id: str
    question: str
    context: str
    instruction: str
    answers: tuple[str, ...]  # QA gold answers; empty = unanswerable (correct when the model abstains)
    references: tuple[str, ...]  # the gold texts scored against: QA the answers, generation the references
    line: int  # line in the data file (Parquet: row number), 1-based
    group: str | None = None  # the spec's `group` column's value: items of one group share a cluster


@dataclass(frozen=True)
class EvalSet:
    name: str
    task: str
    language: str
    spec_path: Path | None  # None for a bare data file
    data_path: Path
    description: str
    prompt_template: str
    system_prompt: str | None
    few_shot: tuple[FewShotExample, ...]
    max_new_tokens: int
    metrics: tuple[str, ...]
    gate: tuple[str, ...]
    abstain_phrases: tuple[str, ...]
    items: tuple[EvalItem, ...] = field(repr=False)
    content_hash: str  # "sha256:<hex>" over the spec bytes and the data bytes
    group: str | None = None  # the data column whose value clusters items (spec key `group`); None: by context
    calibration_path: Path | None = None  # the set's own calibration split (spec key `calibration`), never scored

    @property
    def tokenizer(self) -> str:
        return tokenizer_name(self.language, self.task)

    @property
    def cluster_by(self) -> str:
        """What the clusters are, for the method line: the group column, or "context"."""
        return self.group or "context"

    def clusters(self) -> dict[str, str]:
        """item id -> cluster key: its group, else its context; items with neither are left out (own cluster)."""
        if self.group is not None:
            return {item.id: item.group for item in self.items if item.group is not None}
        return {item.id: item.context for item in self.items if item.context.strip()}

    def summary(self) -> dict[str, Any]:
        """The set's entry under report.json "evalsets"."""
        return {
            "task": self.task, "language": self.language, "n": len(self.items), "hash": self.content_hash,
            "spec": display_path(self.spec_path or self.data_path), "metrics": list(self.metrics),
            "gate": list(self.gate), "tokenizer": self.tokenizer, "max_new_tokens": self.max_new_tokens,
        }


def display_path(path: Path | str) -> str:
    """Relative to the working directory when under it, else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)


# ---------------------------------------------------------------- loading


def load_evalsets(paths: Sequence[Path | str]) -> list[EvalSet]:
    """Load spec files, directories of specs (*.toml, sorted) and bare data files; raise on any problem."""
    problems: list[str] = []
    sets: list[EvalSet] = []
    for kind, path in _expand_paths(paths, problems):
        set_problems: list[str] = []
        spec = _read_spec(path, set_problems) if kind == "spec" else _bare_spec(path)
        evalset = _build_set(spec, set_problems) if spec is not None else None
        problems.extend(_capped(set_problems, display_path(path)))
        if evalset is not None and not set_problems:
            sets.append(evalset)
    seen: dict[str, EvalSet] = {}
    for evalset in sets:
        if evalset.name in seen:
            first = seen[evalset.name]
            problems.append(
                f"{display_path(evalset.spec_path or evalset.data_path)}: set name '{evalset.name}' is already "
                f"used by {display_path(first.spec_path or first.data_path)}; set names must be unique"
            )
        seen.setdefault(evalset.name, evalset)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise UserError(f"evalsets: {len(problems)} {noun}; fix them and rerun `quantgate evalsets check`",
                        problems=problems)
    return sets


def _expand_paths(paths: Sequence[Path | str], problems: list[str]) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            specs = sorted(path.glob("*.toml"))
            if not specs:
                problems.append(f"{display_path(path)}: no *.toml evalset specs in this directory")
            found.extend(("spec", spec) for spec in specs)
        elif not path.exists():
            problems.append(f"{given}: not found; pass a spec (.toml), a directory of specs, or a data file "
                            f"({', '.join(DATA_FORMATS)})")
        elif path.suffix == ".toml":
            found.append(("spec", path))
        elif path.suffix in DATA_FORMATS:
            found.append(("data", path))
        else:
            problems.append(f"{display_path(path)}: unknown file type '{path.suffix}'; pass a spec (.toml) "
                            f"or a data file ({', '.join(DATA_FORMATS)})")
    unique: dict[Path, tuple[str, Path]] = {}
    for kind, path in found:
        unique.setdefault(path.resolve(), (kind, path.resolve()))
    return list(unique.values())


def _capped(problems: list[str], where: str) -> list[str]:
    if len(problems) <= MAX_PROBLEMS_PER_SET:
        return problems
    extra = len(problems) - MAX_PROBLEMS_PER_SET
    return problems[:MAX_PROBLEMS_PER_SET] + [f"{where}: ... and {extra} more problems"]


# ---------------------------------------------------------------- the spec


@dataclass
class _Spec:
    label: str  # how messages name the spec (or the bare data file)
    spec_path: Path | None
    spec_bytes: bytes
    data_path: Path
    name: str
    task: str | None = None  # None: inferred from the data's fields
    language: str = "auto"
    description: str = ""
    prompt_template: str | None = None  # None: a default that fits the task and the data
    system_prompt: str | None = None
    few_shot: list[dict[str, Any]] = field(default_factory=list)
    max_new_tokens: int | None = None
    metrics: list[str] | None = None
    gate: list[str] | None = None
    abstain_phrases: list[str] | None = None
    columns: dict[str, str] = field(default_factory=dict)
    group: str | None = None
    calibration_path: Path | None = None
    key_lines: dict[str, int] = field(default_factory=dict)

    def at(self, key: str) -> str:
        line = self.key_lines.get(key)
        return f"{self.label}:{line}" if line else self.label


def _bare_spec(data_path: Path) -> _Spec:
    return _Spec(label=display_path(data_path), spec_path=None, spec_bytes=b"", data_path=data_path,
                 name=data_path.stem)


def _read_spec(path: Path, problems: list[str]) -> _Spec | None:
    label = display_path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
        table = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        problems.append(f"{label}: not valid UTF-8 ({exc.reason} at byte {exc.start}); save the spec as UTF-8")
        return None
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{label}: invalid TOML ({exc})")
        return None
    spec = _Spec(label=label, spec_path=path, spec_bytes=raw, data_path=path.with_suffix(".jsonl"),
                 name=path.stem, key_lines=_key_lines(text))

    for key in table:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(key, SPEC_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(f"{spec.at(key)}: key '{key}' unknown{hint}; known keys: {', '.join(SPEC_KEYS)}")

    def get(key: str, kind: type, what: str) -> Any:
        value = table.get(key)
        if value is None:
            return None
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and kind is list:
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            problems.append(f"{spec.at(key)}: key '{key}' must be {what}, got {type(value).__name__}")
            return None
        return value

    spec.name = get("name", str, "a string") or spec.name
    if not _NAME_RE.match(spec.name):
        problems.append(f"{spec.at('name')}: name '{spec.name}' may only use letters, digits, '_', '-' and '.' "
                        f"(it names checks and files)")
    task = get("task", str, 'a string ("qa" or "generation")')
    task_unknown = task is not None and task not in TASKS
    if task_unknown:
        problems.append(f"{spec.at('task')}: task '{task}' unknown; use qa or generation")
    else:
        spec.task = task
    language = get("language", str, 'a string ("en", "zh" or "auto")')
    if language is not None and language not in LANGUAGES:
        problems.append(f"{spec.at('language')}: language '{language}' unknown; use en, zh or auto")
    elif language is not None:
        spec.language = language
    data = get("data", str, "a path relative to the spec file")
    if data is not None:
        spec.data_path = (path.parent / data).resolve()
    elif not spec.data_path.exists():
        spec.data_path = next((path.with_suffix(s) for s in DATA_FORMATS if path.with_suffix(s).exists()),
                              spec.data_path)
    spec.description = get("description", str, "a string") or ""
    spec.prompt_template = get("prompt_template", str, "a string")
    spec.system_prompt = get("system_prompt", str, "a string")
    max_new_tokens = get("max_new_tokens", int, "a positive integer")
    if max_new_tokens is not None and max_new_tokens < 1:
        problems.append(f"{spec.at('max_new_tokens')}: key 'max_new_tokens' must be a positive integer, "
                        f"got {max_new_tokens}")
    spec.max_new_tokens = max_new_tokens
    spec.metrics = get("metrics", list, "a list of metric names")
    spec.gate = get("gate", list, "a list of metric names")
    spec.abstain_phrases = get("abstain_phrases", list, "a list of strings")
    spec.group = get("group", str, "a column name (items with one value share a cluster)")
    calibration = get("calibration", str, "a path relative to the spec file (JSONL with 'text', or text lines)")
    if calibration is not None:
        spec.calibration_path = (path.parent / calibration).resolve()
        if not spec.calibration_path.is_file():
            problems.append(f"{spec.at('calibration')}: calibration = '{calibration}' but "
                            f"{display_path(spec.calibration_path)} does not exist")
        elif spec.calibration_path == spec.data_path.resolve():
            problems.append(f"{spec.at('calibration')}: calibration is the evaluated data file itself; name a "
                            "separate split that is never scored")
    columns = get("columns", dict, "a table: canonical field = column name") or {}
    for canonical, column in columns.items():
        if canonical not in ROW_FIELDS:
            problems.append(f"{spec.at('columns')}: columns.{canonical}: '{canonical}' is not a row field; "
                            f"use one of {', '.join(ROW_FIELDS)}")
        elif not isinstance(column, str):
            problems.append(f"{spec.at('columns')}: columns.{canonical} must be a column name (a string)")
        else:
            spec.columns[canonical] = column
    few_shot = table.get("few_shot", [])
    if not isinstance(few_shot, list) or not all(isinstance(ex, dict) for ex in few_shot):
        problems.append(f"{spec.at('few_shot')}: few_shot must be an array of tables ([[few_shot]] blocks)")
    else:
        spec.few_shot = few_shot
    return None if task_unknown else spec


def _key_lines(text: str) -> dict[str, int]:
    """Line of each top-level key or table header (first occurrence), for messages."""
    lines: dict[str, int] = {}
    in_table = False  # TOML puts top-level keys before the first table header
    for number, line in enumerate(text.splitlines(), 1):
        if header := re.match(r"\s*\[\[?\s*([A-Za-z0-9_-]+)\s*\]", line):
            lines.setdefault(header.group(1), number)
            in_table = True
        elif not in_table and (key := re.match(r"\s*([A-Za-z0-9_-]+)\s*=", line)):
            lines.setdefault(key.group(1), number)
    return lines


def _check_task_keys(spec: _Spec, problems: list[str]) -> None:
    task = spec.task
    assert task is not None
    valid = METRICS_BY_TASK[task]
    for key in ("metrics", "gate"):
        for metric in getattr(spec, key) or []:
            if metric not in ALL_METRICS:
                problems.append(f"{spec.at(key)}: metric '{metric}' unknown; known metrics: {', '.join(ALL_METRICS)}")
            elif metric not in valid:
                problems.append(f"{spec.at(key)}: metric '{metric}' is not a {task} metric; "
                                f"{task} metrics: {', '.join(valid)}")
    if spec.metrics is not None and not spec.metrics:
        problems.append(f"{spec.at('metrics')}: metrics is empty; name at least one of {', '.join(valid)}")
    metrics = spec.metrics or list(valid)
    for metric in spec.gate or []:
        if metric in valid and metric not in metrics:
            problems.append(f"{spec.at('gate')}: gate metric '{metric}' is not in metrics; add it to metrics")


def _check_template(spec: _Spec, template: str, problems: list[str]) -> set[str]:
    """The template's fields; problems for unknown ones."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        problems.append(f"{spec.at('prompt_template')}: prompt_template is not a valid template ({exc}); "
                        f"write literal braces as {{{{ and }}}}")
        return set()
    for name in sorted(names - set(TEMPLATE_FIELDS)):
        shown = "{" + name + "}"
        problems.append(f"{spec.at('prompt_template')}: prompt_template field {shown} unknown; "
                        f"use {{question}}, {{context}} or {{instruction}}")
    if spec.task == "qa" and "question" not in names:
        problems.append(f"{spec.at('prompt_template')}: prompt_template must contain {{question}} for a qa set")
    if spec.task == "generation" and not names & {"context", "instruction"}:
        problems.append(f"{spec.at('prompt_template')}: prompt_template must contain {{context}} or "
                        f"{{instruction}} for a generation set")
    return names & set(TEMPLATE_FIELDS)


def _few_shot_examples(spec: _Spec, needs: set[str], problems: list[str]) -> tuple[FewShotExample, ...]:
    examples = []
    reply_key = "answer" if spec.task == "qa" else "output"
    for number, raw in enumerate(spec.few_shot, 1):
        where = f"{spec.at('few_shot')}: few_shot #{number}"
        for key in raw:
            if key not in FEW_SHOT_KEYS:
                problems.append(f"{where}: key '{key}' unknown; use {', '.join(FEW_SHOT_KEYS)}")
        values = {k: raw.get(k) for k in FEW_SHOT_KEYS}
        if any(v is not None and not isinstance(v, str) for v in values.values()):
            problems.append(f"{where}: values must be strings")
            continue
        reply = values[reply_key] or values["answer"] or values["output"]
        if not reply:
            problems.append(f"{where}: '{reply_key}' missing (the assistant turn of the example)")
        for name in sorted(needs):
            if not values[name]:
                problems.append(f"{where}: '{name}' missing (the prompt template uses {{{name}}})")
        examples.append(FewShotExample(question=values["question"] or "", context=values["context"] or "",
                                       instruction=values["instruction"] or "", answer=reply or ""))
    return tuple(examples)


# ---------------------------------------------------------------- the data


@dataclass(frozen=True)
class _Row:
    where: str  # "path:LINE" or "path:row N" (Parquet)
    unit: str  # "line" or "row", for "first at line 3"
    number: int
    values: dict[str, Any]  # file columns as read
    from_csv: bool = False  # CSV cells are strings: lists arrive as JSON text


def _read_rows(path: Path, label: str, problems: list[str]) -> tuple[list[_Row], list[str], bytes] | None:
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
        rows = [_Row(f"{shown}:row {i}", "row", i, rec) for i, rec in enumerate(records, 1)]
    else:
        rows = [_Row(f"{shown}:{n}", "line", n, rec, fmt == "csv") for n, rec in zip(numbers, records)]
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


def _infer_task(spec: _Spec, columns: list[str], problems: list[str]) -> str | None:
    column_of = {f: spec.columns.get(f, f) for f in ROW_FIELDS}
    if column_of["answers"] in columns:
        return "qa"
    if column_of["reference"] in columns or column_of["references"] in columns:
        return "generation"
    problems.append(f"{spec.label}: cannot tell the task: rows have neither 'answers' (qa) nor "
                    f"'reference'/'references' (generation); add those fields or a spec with task = ...")
    return None


# ---------------------------------------------------------------- rows -> items


def _text_field(row: _Row, values: dict[str, Any], name: str, label: str, problems: list[str]) -> str:
    value = values.get(name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        problems.append(f"{row.where}: field {label} must be a string, got {type(value).__name__}")
        return ""
    return str(value)


def _string_list(row: _Row, value: Any, label: str, problems: list[str]) -> list[str] | None:
    if isinstance(value, str) and value.lstrip().startswith("["):  # CSV cells hold lists as JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            problems.append(f"{row.where}: field {label} is not a valid JSON list ({exc.msg})")
            return None
    elif isinstance(value, str) and row.from_csv:
        value = [value]  # a CSV cell with one plain string is one answer
    if not isinstance(value, list):
        problems.append(f"{row.where}: field {label} must be a list of strings, got {type(value).__name__} "
                        f"({json.dumps(value, ensure_ascii=False)[:40]}); write [{json.dumps(value, ensure_ascii=False)[:40]}]")
        return None
    for index, element in enumerate(value, 1):
        if not isinstance(element, str):
            problems.append(f"{row.where}: field {label} item {index} is {type(element).__name__}, not a string")
            return None
        if not element.strip():
            problems.append(f"{row.where}: field {label} item {index} is empty")
            return None
    return value


def _make_item(spec: _Spec, row: _Row, needs: set[str], problems: list[str]) -> EvalItem | None:
    before = len(problems)
    values = {f: row.values.get(spec.columns.get(f, f)) for f in ROW_FIELDS}

    def label(name: str) -> str:
        return f"'{name}' (column '{spec.columns[name]}')" if name in spec.columns else f"'{name}'"

    raw_id = values["id"]
    if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
        problems.append(f"{row.where}: field {label('id')} missing (every row needs a unique id)")
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        problems.append(f"{row.where}: field {label('id')} must be a string or an integer, "
                        f"got {type(raw_id).__name__}")
    text = {name: _text_field(row, values, name, label(name), problems) for name in TEMPLATE_FIELDS}
    for name in sorted(needs):
        if not text[name].strip() and not (name == "question" and spec.task == "qa"):
            problems.append(f"{row.where}: field {label(name)} missing (the prompt template uses {{{name}}})")

    answers: list[str] = []
    references: list[str] = []
    if spec.task == "qa":
        if not text["question"].strip():
            problems.append(f"{row.where}: field {label('question')} missing (QA rows need a question)")
        if values["answers"] is None:
            problems.append(f"{row.where}: field {label('answers')} missing "
                            f"(QA rows need answers: a list of strings)")
        else:
            answers = _string_list(row, values["answers"], label("answers"), problems) or []
        references = answers
    else:
        reference, listed = values["reference"], values["references"]
        if reference is None and listed is None:
            problems.append(f"{row.where}: field {label('references')} missing (generation rows need reference: "
                            f"a string, or references: a list of strings)")
        if reference is not None:
            if not isinstance(reference, str) or not reference.strip():
                problems.append(f"{row.where}: field {label('reference')} must be a non-empty string")
            else:
                references.append(reference)
        if listed is not None:
            more = _string_list(row, listed, label("references"), problems)
            if more is not None and not more:
                problems.append(f"{row.where}: field {label('references')} is empty; give at least one reference")
            references.extend(r for r in more or [] if r not in references)
    group = None
    if spec.group is not None:
        value = row.values.get(spec.group)
        if value is None or (isinstance(value, str) and not value.strip()):
            problems.append(f"{row.where}: field '{spec.group}' missing (the spec's group names it; every row needs "
                            f"one)")
        elif isinstance(value, bool) or not isinstance(value, (str, int)):
            problems.append(f"{row.where}: field '{spec.group}' (the group) must be a string or an integer, "
                            f"got {type(value).__name__}")
        else:
            group = str(value)
    if len(problems) > before:
        return None
    return EvalItem(id=str(raw_id), question=text["question"], context=text["context"],
                    instruction=text["instruction"], answers=tuple(answers), references=tuple(references),
                    line=row.number, group=group)


# ---------------------------------------------------------------- building a set


def _build_set(spec: _Spec, problems: list[str]) -> EvalSet | None:
    loaded = _read_rows(spec.data_path, spec.label, problems)
    if spec.task is None and loaded is not None:
        spec.task = _infer_task(spec, loaded[1], problems)
    if spec.task is None:
        return None
    _check_task_keys(spec, problems)
    if loaded is None:
        return None
    rows, columns, data_bytes = loaded
    for canonical, column in spec.columns.items():
        if column not in columns:
            problems.append(f"{spec.at('columns')}: columns.{canonical} = '{column}' but "
                            f"{display_path(spec.data_path)} has no column '{column}' (it has: {', '.join(columns)})")
    if spec.group is not None and spec.group not in columns:
        problems.append(f"{spec.at('group')}: group = '{spec.group}' but {display_path(spec.data_path)} has no "
                        f"column '{spec.group}' (it has: {', '.join(columns)})")
        spec.group = None  # one problem, not one per row
    language = spec.language
    template = spec.prompt_template
    if template is None:
        template = _default_template(spec.task, _template_language(language, rows, spec.columns),
                                     _present(rows, spec.columns))
    needs = _check_template(spec, template, problems)
    few_shot = _few_shot_examples(spec, needs, problems)

    items: list[EvalItem] = []
    first_seen: dict[str, _Row] = {}
    for row in rows:
        item = _make_item(spec, row, needs, problems)
        if item is None:
            continue
        if item.id in first_seen:
            first = first_seen[item.id]
            problems.append(f"{row.where}: duplicate id '{item.id}' (first at {first.unit} {first.number}); "
                            f"ids must be unique within a set")
            continue
        first_seen[item.id] = row
        items.append(item)
    _check_language(spec, items, problems)
    if problems:
        return None
    metrics = tuple(spec.metrics or METRICS_BY_TASK[spec.task])
    digest = hashlib.sha256()
    digest.update(spec.spec_bytes)
    digest.update(b"\0")
    digest.update(data_bytes)
    return EvalSet(
        name=spec.name, task=spec.task, language=language, spec_path=spec.spec_path,
        data_path=spec.data_path, description=spec.description, prompt_template=template,
        system_prompt=spec.system_prompt, few_shot=few_shot,
        max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS[spec.task], metrics=metrics,
        gate=tuple(spec.gate or [m for m in DEFAULT_GATE[spec.task] if m in metrics] or metrics[:1]),
        abstain_phrases=tuple(spec.abstain_phrases if spec.abstain_phrases is not None else DEFAULT_ABSTAIN_PHRASES),
        items=tuple(items), content_hash="sha256:" + digest.hexdigest(), group=spec.group,
        calibration_path=spec.calibration_path,
    )


def _check_language(spec: _Spec, items: list[EvalItem], problems: list[str]) -> None:
    """A declared en/zh that its text contradicts: the wrong tokenizer would score every format 0."""
    if spec.language == "auto" or not items:
        return
    contexts = dict.fromkeys(item.context for item in items)  # a passage asked about 5 times counts once
    text = " ".join([*contexts, *(t for i in items for t in (i.question, i.instruction, *i.references))])
    if detect_language(text) == spec.language:
        return
    share = f"{cjk_share(text):.0%} of the letters in {display_path(spec.data_path)} (questions, contexts, references)"
    if spec.language == "en":
        found, fix = f"{share} are CJK: English tokenization cannot score Chinese text", "zh"
    else:
        found, fix = f"only {share} are CJK (a Chinese set has more than {ZH_SHARE_THRESHOLD:.0%})", "en"
    problems.append(f"{spec.at('language')}: language = \"{spec.language}\" but {found}; set language = \"{fix}\" "
                    f"(or \"auto\" for a mixed set)")


def _present(rows: list[_Row], columns: dict[str, str]) -> set[str]:
    """Which optional parts the data has: 'context', 'instruction', 'unanswerable'."""
    found = set()
    for row in rows:
        for name in ("context", "instruction"):
            value = row.values.get(columns.get(name, name))
            if isinstance(value, str) and value.strip():
                found.add(name)
        if row.values.get(columns.get("answers", "answers")) in ([], "[]"):
            found.add("unanswerable")
    return found


def _template_language(language: str, rows: list[_Row], columns: dict[str, str]) -> str:
    if language != "auto":
        return language
    sample = " ".join(str(row.values.get(columns.get(f, f)) or "") for row in rows[:20] for f in TEMPLATE_FIELDS)
    return detect_language(sample)


def _default_template(task: str, language: str, present: set[str]) -> str:
    zh = language == "zh"
    if task == "qa":
        lead = ("请根据上下文回答问题，只回答答案。" if zh else
                "Answer the question using only the context. Reply with the answer only.")
        if "context" not in present:
            lead = "请回答问题，只回答答案。" if zh else "Answer the question. Reply with the answer only."
        if "unanswerable" in present:
            lead += (f"如果上下文中没有答案，请回答“{ABSTAIN_REPLY['zh']}”。" if zh else
                     f" If the context does not contain the answer, reply: {ABSTAIN_REPLY['en']}.")
        parts = [lead]
        if "context" in present:
            parts.append("上下文：{context}" if zh else "Context: {context}")
        parts.append("问题：{question}" if zh else "Question: {question}")
        return "\n\n".join(parts)
    parts = ["{instruction}"] if "instruction" in present else [("请总结下面的文字。" if zh else
                                                               "Summarize the following text.")]
    if "context" in present or "instruction" not in present:
        parts.append("{context}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------- prompts, scores, calibration


def _fill(template: str, question: str, context: str, instruction: str) -> str:
    return template.format(question=question, context=context, instruction=instruction)


def _user_text(evalset: EvalSet, example: EvalItem | FewShotExample) -> str:
    return _fill(evalset.prompt_template, example.question, example.context, example.instruction)


def render_messages(evalset: EvalSet, item: EvalItem) -> list[dict[str, str]]:
    """Chat messages: optional system prompt, few-shot user/assistant turns, then the item."""
    messages = []
    if evalset.system_prompt:
        messages.append({"role": "system", "content": evalset.system_prompt})
    for example in evalset.few_shot:
        messages.append({"role": "user", "content": _user_text(evalset, example)})
        messages.append({"role": "assistant", "content": example.answer})
    messages.append({"role": "user", "content": _user_text(evalset, item)})
    return messages


def _answer_cue(evalset: EvalSet, item: EvalItem) -> str:
    zh = item_language(evalset, item) == "zh"
    if evalset.task == "qa":
        return "答案：" if zh else "Answer:"
    return "回答：" if zh else "Response:"


def render_plain(evalset: EvalSet, item: EvalItem) -> str:
    """One prompt string for models without a chat template; ends with the answer cue."""
    cue = _answer_cue(evalset, item)
    gap = "" if cue.endswith("：") else " "
    blocks = [evalset.system_prompt] if evalset.system_prompt else []
    blocks += [f"{_user_text(evalset, ex)}\n{cue}{gap}{ex.answer}" for ex in evalset.few_shot]
    blocks.append(f"{_user_text(evalset, item)}\n{cue}")
    return "\n\n".join(blocks)


def item_language(evalset: EvalSet, item: EvalItem) -> str:
    """The set's language, or for "auto" the item's: zh when CJK characters exceed 30% of its text."""
    if evalset.language != "auto":
        return evalset.language
    return detect_language(" ".join([item.question, item.context, item.instruction, *item.references]))


def score_item(evalset: EvalSet, item: EvalItem, prediction: str) -> dict[str, float]:
    """Per-metric scores (0-100) of one prediction, in the set's metric order."""
    if evalset.task == "qa":
        return score_prediction("qa", item_language(evalset, item), prediction, item.answers,
                                evalset.metrics, evalset.abstain_phrases)
    # generation keeps "auto": the mixed tokenizer equals rouge-score's default on text without CJK
    return score_prediction("generation", evalset.language, prediction, item.references, evalset.metrics)
