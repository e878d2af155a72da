"""Templates: the default template of a set that names none, and checking a template's fields."""

from __future__ import annotations

import string

from harness.evalsets.data import Row
from harness.evalsets.spec import Spec
from harness.metrics.tokenizers import detect_language

TEMPLATE_FIELDS = ("question", "context", "instruction")
ABSTAIN_REPLY = {"en": "cannot be answered", "zh": "无法回答"}


def default_template_for(task: str, language: str, rows: list[Row], columns: dict[str, str]) -> str:
    """The template of a set whose spec names none: in the set's language (for "auto" its first rows'), with the
    parts the data has."""
    return _default_template(task, _template_language(language, rows, columns), _present(rows, columns))


def _present(rows: list[Row], columns: dict[str, str]) -> set[str]:
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


def _template_language(language: str, rows: list[Row], columns: dict[str, str]) -> str:
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


def check_template(spec: Spec, template: str, problems: list[str]) -> set[str]:
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
