"""An evalset spec: the TOML file's keys as a typed model (`SpecTable`), resolved against the file into the `Spec`
a set is built from (name, data file, calibration split, settings).

Every problem names the file and the line of the key, as `file:LINE: ...`. Unknown keys come first (with the
closest known one), then the keys in the order `SpecTable` declares them. A key with a problem counts as not
given, so that loading goes on and reports the problems of the data too.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from harness.errors import did_you_mean
from harness.evalsets.data import DATA_FORMATS
from harness.evalsets.paths import display_path
from harness.metrics import METRIC_SPECS, metric_names

TASKS = ("qa", "generation")
LANGUAGES = ("en", "zh", "auto")
ROW_FIELDS = ("id", "question", "context", "instruction", "answers", "reference", "references")
SPEC_KEYS = (  # as messages list them; SpecTable declares the same keys in the order they are checked
    "name", "task", "language", "data", "description", "max_new_tokens", "metrics", "gate",
    "system_prompt", "prompt_template", "abstain_phrases", "columns", "few_shot", "group", "calibration",
)

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_CHECK = "spec_check"  # the error type of SpecTable's own checks: their message is the problem as it is shown
_UNKNOWN_TASK = "spec_unknown_task"  # a task that is not qa or generation: the set cannot be built at all


def _row_field(name: str) -> str:
    if name not in ROW_FIELDS:
        raise PydanticCustomError(_CHECK, "columns.{name}: '{name}' is not a row field; use one of {fields}",
                                  {"name": name, "fields": ", ".join(ROW_FIELDS)})
    return name


class SpecTable(BaseModel):
    """The keys of a spec file, strictly typed (true is not a count, 1.5 not a token limit). A key's `description`
    says what it must be; a key that is not one is reported as `key 'x' must be <description>, got <type>`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = Field(None, description="a string")
    task: str | None = Field(None, description='a string ("qa" or "generation")')
    language: str = Field("auto", description='a string ("en", "zh" or "auto")')
    data: str | None = Field(None, description="a path relative to the spec file")
    description: str = Field("", description="a string")
    prompt_template: str | None = Field(None, description="a string")
    system_prompt: str | None = Field(None, description="a string")
    max_new_tokens: int | None = Field(None, description="a positive integer")
    metrics: list[str] | None = Field(None, description="a list of metric names")
    gate: list[str] | None = Field(None, description="a list of metric names")
    abstain_phrases: list[str] | None = Field(None, description="a list of strings")
    group: str | None = Field(None, description="a column name (items with one value share a cluster)")
    calibration: str | None = Field(
        None, description="a path relative to the spec file (JSONL with 'text', or text lines)")
    columns: dict[Annotated[str, AfterValidator(_row_field)], str] = Field(
        default_factory=dict, description="a table: canonical field = column name")
    few_shot: list[dict[str, Any]] = Field(default_factory=list, description="an array of tables")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str | None) -> str | None:
        if task is not None and task not in TASKS:
            raise PydanticCustomError(_UNKNOWN_TASK, "task '{task}' unknown; use qa or generation", {"task": task})
        return task

    @field_validator("language")
    @classmethod
    def _known_language(cls, language: str) -> str:
        if language not in LANGUAGES:
            raise PydanticCustomError(_CHECK, "language '{language}' unknown; use en, zh or auto",
                                      {"language": language})
        return language

    @field_validator("max_new_tokens")
    @classmethod
    def _positive(cls, count: int | None) -> int | None:
        if count is not None and count < 1:
            raise PydanticCustomError(_CHECK, "key 'max_new_tokens' must be a positive integer, got {count}",
                                      {"count": count})
        return count

    @field_validator("few_shot", mode="before")
    @classmethod
    def _array_of_tables(cls, examples: Any) -> Any:
        if not isinstance(examples, list) or not all(isinstance(example, dict) for example in examples):
            raise PydanticCustomError(_CHECK, "few_shot must be an array of tables ([[few_shot]] blocks)")
        return examples


@dataclass(frozen=True)
class Spec:
    """One set's spec, resolved: what SpecTable holds plus the files it names (a bare data file has a default one)."""

    label: str  # how messages name the spec (or the bare data file)
    spec_path: Path | None
    spec_bytes: bytes
    data_path: Path
    name: str
    task: str | None  # None: inferred from the data's fields
    language: str
    description: str
    prompt_template: str | None  # None: a default that fits the task and the data
    system_prompt: str | None
    few_shot: list[dict[str, Any]]
    max_new_tokens: int | None
    metrics: list[str] | None
    gate: list[str] | None
    abstain_phrases: list[str] | None
    columns: dict[str, str]
    group: str | None
    calibration_path: Path | None
    key_lines: dict[str, int]

    def at(self, key: str) -> str:
        line = self.key_lines.get(key)
        return f"{self.label}:{line}" if line else self.label


def _settings(table: SpecTable) -> dict[str, Any]:
    """The keys Spec takes over as they are (name, data and calibration it resolves)."""
    return table.model_dump(exclude={"name", "data", "calibration"})


def bare_spec(data_path: Path) -> Spec:
    """The spec of a data file given without one: every key at its default, the set named after the file."""
    return Spec(label=display_path(data_path), spec_path=None, spec_bytes=b"", data_path=data_path,
                name=data_path.stem, calibration_path=None, key_lines={}, **_settings(SpecTable()))


def read_spec(path: Path, problems: list[str], *, allow_outside_paths: bool = False) -> Spec | None:
    """The spec file's Spec; problems for every key that is wrong. None when the set cannot be built at all.
    `data` and `calibration` must name files inside the spec's directory unless allow_outside_paths."""
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
    keys, errors = _validate(table)
    found = [_problem(error, table) for error in errors]  # (key, message)

    name = keys.name or path.stem
    if not _NAME_RE.match(name):
        found.append(("name", f"name '{name}' may only use letters, digits, '_', '-' and '.' "
                              f"(it names checks and files)"))
    if keys.data is not None:
        data_path = (path.parent / keys.data).resolve()
    else:
        data_path = path.with_suffix(".jsonl")
        if not data_path.exists():
            data_path = next((path.with_suffix(s) for s in DATA_FORMATS if path.with_suffix(s).exists()), data_path)
    calibration_path = None
    if keys.calibration is not None:
        calibration_path = (path.parent / keys.calibration).resolve()
        if not calibration_path.is_file():
            found.append(("calibration", f"calibration = '{keys.calibration}' but {display_path(calibration_path)} "
                                         f"does not exist"))
        elif calibration_path == data_path.resolve():
            found.append(("calibration", "calibration is the evaluated data file itself; name a separate split that "
                                         "is never scored"))

    if not allow_outside_paths:
        home = path.parent.resolve()
        for key, named in (("data", keys.data), ("calibration", keys.calibration)):
            target = (path.parent / named).resolve() if named is not None else None
            if target is not None and not target.is_relative_to(home):
                found.append((key, f"{key} = '{named}' lies outside the spec's directory ({display_path(home)}); "
                                   "keep the file beside the spec, or pass --allow-outside-paths if you trust it"))
    spec = Spec(label=label, spec_path=path, spec_bytes=raw, data_path=data_path, name=name,
                calibration_path=calibration_path, key_lines=_key_lines(text), **_settings(keys))
    order = {key: rank for rank, key in enumerate(SpecTable.model_fields)}  # unknown keys (-1) first
    problems.extend(f"{spec.at(key)}: {message}" for key, message in sorted(found, key=lambda p: order.get(p[0], -1)))
    return None if any(error["type"] == _UNKNOWN_TASK for error in errors) else spec


def _validate(table: dict[str, Any]) -> tuple[SpecTable, list[ErrorDetails]]:
    """The table's valid keys, and the errors of the others: a wrong key (or one wrong entry of `columns`) is
    dropped and the rest validated again, so that it counts as not given. An entry of `columns` whose field is
    unknown gets that one problem, not another for its column too."""
    try:
        return SpecTable.model_validate(table), []
    except ValidationError as exc:
        errors = exc.errors()
    bad_fields = {error["loc"][1] for error in errors if error["loc"][0] == "columns" and len(error["loc"]) == 3}
    errors = [e for e in errors if not (e["loc"][0] == "columns" and len(e["loc"]) == 2 and e["loc"][1] in bad_fields)]
    kept = dict(table)
    for error in errors:
        key, *entry = error["loc"]
        if key == "columns" and entry and isinstance(kept.get("columns"), dict):
            kept["columns"] = {k: v for k, v in kept["columns"].items() if k != entry[0]}
        else:
            kept.pop(str(key), None)
    return SpecTable.model_validate(kept), errors


def _problem(error: ErrorDetails, table: dict[str, Any]) -> tuple[str, str]:
    """(key, message) of one validation error; the message without the file and line."""
    key, *entry = (str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return key, f"key '{key}' unknown{did_you_mean(key, SPEC_KEYS)}; known keys: {', '.join(SPEC_KEYS)}"
    if error["type"] in (_CHECK, _UNKNOWN_TASK):
        return key, error["msg"]
    if key == "columns" and entry:  # a column name that is not a string
        return key, f"columns.{entry[0]} must be a column name (a string)"
    description = SpecTable.model_fields[key].description
    return key, f"key '{key}' must be {description}, got {type(table[key]).__name__}"


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


def check_metrics(spec: Spec, problems: list[str]) -> None:
    """`metrics` and `gate` against the set's task (known once the data is read when the spec names none)."""
    task = spec.task
    assert task is not None
    valid, known = metric_names(task), metric_names()
    for key in ("metrics", "gate"):
        for metric in getattr(spec, key) or []:
            if metric not in known:
                problems.append(f"{spec.at(key)}: metric '{metric}' unknown; known metrics: {', '.join(known)}")
            elif metric not in valid:
                problems.append(f"{spec.at(key)}: metric '{metric}' is not a {task} metric; "
                                f"{task} metrics: {', '.join(valid)}")
    if spec.metrics is not None and not spec.metrics:
        problems.append(f"{spec.at('metrics')}: metrics is empty; name at least one of {', '.join(valid)}")
    metrics = spec.metrics or [m for m in valid if METRIC_SPECS[m].built_in]
    for metric in spec.gate or []:
        if metric in valid and metric not in metrics:
            problems.append(f"{spec.at('gate')}: gate metric '{metric}' is not in metrics; add it to metrics")
