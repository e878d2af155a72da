"""From a resolved spec and its rows to an `EvalSet`: the task (inferred when the spec names none), the template,
the few-shot examples, one `EvalItem` per row, and the check that the declared language fits the text.

Items that share a context (SQuAD/CMRC-style sets ask several questions about one passage) are not
independent: `EvalSet.clusters()` keys each item by the spec's `group` column when it names one, else by
its context; items without either are their own clusters. decide.py resamples these clusters.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.evalsets.data import Row, read_rows
from harness.evalsets.paths import display_path
from harness.evalsets.template import TEMPLATE_FIELDS, check_template, default_template_for
from harness.evalsets.spec import ROW_FIELDS, Spec, check_metrics
from harness.metrics import METRIC_SPECS, default_gate, metric_names, tokenizer_name
from harness.metrics.tokenizers import ZH_SHARE_THRESHOLD, cjk_share, detect_language

FEW_SHOT_KEYS = ("question", "context", "instruction", "answer", "output")
DEFAULT_MAX_NEW_TOKENS = {"qa": 48, "generation": 128}
DEFAULT_ABSTAIN_PHRASES = (
    "cannot be answered", "can't be answered", "not in the context", "not mentioned in the context",
    "unanswerable", "no answer", "无法回答", "不能回答", "没有提到", "未提及",
)


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

    def item_language(self, item: EvalItem) -> str:
        """The set's language, or for "auto" the item's: zh when CJK characters exceed 30% of its text."""
        if self.language != "auto":
            return self.language
        return detect_language(" ".join([item.question, item.context, item.instruction, *item.references]))



# ---------------------------------------------------------------- the set


def build_set(spec: Spec, problems: list[str]) -> EvalSet | None:
    """The set of a spec; None, with problems, when anything is wrong."""
    loaded = read_rows(spec.data_path, spec.label, problems)
    if spec.task is None and loaded is not None:
        spec = replace(spec, task=_infer_task(spec, loaded[1], problems))
    if spec.task is None:
        return None
    check_metrics(spec, problems)
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
        spec = replace(spec, group=None)  # one problem, not one per row
    template = spec.prompt_template
    if template is None:
        template = default_template_for(spec.task, spec.language, rows, spec.columns)
    needs = check_template(spec, template, problems)
    few_shot = _few_shot_examples(spec, needs, problems)
    items = _items(spec, rows, needs, problems)
    _check_language(spec, items, problems)
    if problems:
        return None
    metrics = tuple(spec.metrics or [m for m in metric_names(spec.task) if METRIC_SPECS[m].built_in])
    digest = hashlib.sha256()
    digest.update(spec.spec_bytes)
    digest.update(b"\0")
    digest.update(data_bytes)
    return EvalSet(
        name=spec.name, task=spec.task, language=spec.language, spec_path=spec.spec_path,
        data_path=spec.data_path, description=spec.description, prompt_template=template,
        system_prompt=spec.system_prompt, few_shot=few_shot,
        max_new_tokens=spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS[spec.task], metrics=metrics,
        gate=tuple(spec.gate or [m for m in default_gate(spec.task) if m in metrics] or metrics[:1]),
        abstain_phrases=tuple(spec.abstain_phrases if spec.abstain_phrases is not None else DEFAULT_ABSTAIN_PHRASES),
        items=tuple(items), content_hash="sha256:" + digest.hexdigest(), group=spec.group,
        calibration_path=spec.calibration_path,
    )


def _infer_task(spec: Spec, columns: list[str], problems: list[str]) -> str | None:
    column_of = {f: spec.columns.get(f, f) for f in ROW_FIELDS}
    if column_of["answers"] in columns:
        return "qa"
    if column_of["reference"] in columns or column_of["references"] in columns:
        return "generation"
    problems.append(f"{spec.label}: cannot tell the task: rows have neither 'answers' (qa) nor "
                    f"'reference'/'references' (generation); add those fields or a spec with task = ...")
    return None


def _few_shot_examples(spec: Spec, needs: set[str], problems: list[str]) -> tuple[FewShotExample, ...]:
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


def _items(spec: Spec, rows: list[Row], needs: set[str], problems: list[str]) -> list[EvalItem]:
    """One item per valid row; ids unique within the set."""
    items: list[EvalItem] = []
    first_seen: dict[str, Row] = {}
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
    return items


def _check_language(spec: Spec, items: list[EvalItem], problems: list[str]) -> None:
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


# ---------------------------------------------------------------- one row -> one item


def _make_item(spec: Spec, row: Row, needs: set[str], problems: list[str]) -> EvalItem | None:
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


def _text_field(row: Row, values: dict[str, Any], name: str, label: str, problems: list[str]) -> str:
    value = values.get(name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        problems.append(f"{row.where}: field {label} must be a string, got {type(value).__name__}")
        return ""
    return str(value)


def _string_list(row: Row, value: Any, label: str, problems: list[str]) -> list[str] | None:
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
