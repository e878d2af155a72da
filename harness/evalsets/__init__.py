"""Evaluation sets: a TOML spec plus a data file (JSONL/JSON, CSV or Parquet) -> validated `EvalSet`.

The package, one job a module: spec.py reads and checks the spec file, data.py the data file's rows,
items.py builds the items and the set, prompts.py picks the default template and renders prompts. Scoring a
prediction is harness.metrics' (`score_item`). Calibration text never comes from the items (harness.calibration);
a spec may name a `calibration` file of its own.

Loading reports every problem it finds, across all sets, in one `UserError`: each problem names the
file, the line (or Parquet row) and the field, and says what to do. A set whose declared language does not
match its text (`en` but more than 30% CJK among the letters of its questions, contexts and references, or
`zh` and at most 30%) is refused: scored with the wrong tokenizer it would score 0 for every format and
tell none apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from harness.errors import UserError
from harness.evalsets.data import DATA_FORMATS
from harness.evalsets.items import (DEFAULT_ABSTAIN_PHRASES, DEFAULT_MAX_NEW_TOKENS, FEW_SHOT_KEYS, EvalItem,
                                    EvalSet, FewShotExample, build_set)
from harness.evalsets.paths import display_path
from harness.evalsets.prompts import Prompt, render_messages, render_plain
from harness.evalsets.template import ABSTAIN_REPLY, TEMPLATE_FIELDS
from harness.evalsets.spec import LANGUAGES, ROW_FIELDS, SPEC_KEYS, TASKS, bare_spec, read_spec

MAX_PROBLEMS_PER_SET = 50


def load_evalsets(paths: Sequence[Path | str], *, allow_outside_paths: bool = False) -> list[EvalSet]:
    """Load spec files, directories of specs (*.toml, sorted) and bare data files; raise on any problem. A spec's
    `data` and `calibration` must lie inside the spec's directory unless allow_outside_paths (a spec from another
    team should not read arbitrary files)."""
    problems: list[str] = []
    sets: list[EvalSet] = []
    for kind, path in _expand_paths(paths, problems):
        set_problems: list[str] = []
        spec = (read_spec(path, set_problems, allow_outside_paths=allow_outside_paths) if kind == "spec"
                else bare_spec(path))
        evalset = build_set(spec, set_problems) if spec is not None else None
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


__all__ = [
    "ABSTAIN_REPLY", "DATA_FORMATS", "DEFAULT_ABSTAIN_PHRASES", "DEFAULT_MAX_NEW_TOKENS", "FEW_SHOT_KEYS",
    "LANGUAGES", "MAX_PROBLEMS_PER_SET", "ROW_FIELDS", "SPEC_KEYS", "TASKS", "TEMPLATE_FIELDS",
    "EvalItem", "EvalSet", "FewShotExample", "Prompt", "display_path", "load_evalsets", "render_messages",
    "render_plain",
]
