"""review-NAME.jsonl: one judgment per line, as the review page saves it, checked against the plan and the run.

A line: {"schema": "quantgate.review/1", "run": RUN, "plan": PLAN, "item": "format/evalset/id", "reviewer": NAME,
"preference": "A" | "same" | "B", "acceptable_a": bool, "acceptable_b": bool, "comment": str, "hash_a": H,
"hash_b": H}. A and B are the plan's blind labels; here they are turned back into baseline and candidate. A line
from another run or plan, an item the plan does not hold, or an output whose hash no longer matches the run's is
refused, with its file and line: judgments of other text must not count. A comment longer than MAX_COMMENT
characters is cut there, with a marker, before it is kept or copied into a report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import UserError
from harness.jsonl import read_jsonl_numbered
from harness.review.plan import ReviewPlan, outputs_by_item, text_hash

JUDGMENT_SCHEMA = "quantgate.review/1"
PREFERENCES = ("A", "same", "B")
SAVED_BY_THE_PAGE = "pass the review-NAME.jsonl files the review page saved (one judgment per line)"
MAX_COMMENT = 4000  # characters of a reviewer's comment kept (a report quotes it whole)


@dataclass(frozen=True)
class Judgment:
    reviewer: str
    item: str  # the plan item's key
    format: str
    evalset: str
    id: str
    stratum: str
    preferred: Literal["baseline", "same", "candidate"]
    baseline_acceptable: bool
    candidate_acceptable: bool
    comment: str
    where: str  # "file:line"


def read_judgments(paths: list[Path], plan: ReviewPlan, rows: list[dict[str, Any]]) -> list[Judgment]:
    """Every judgment in the files, the last one per reviewer and item winning; UserError on the first bad line."""
    chosen: dict[tuple[str, str], Judgment] = {}
    for judgment, _ in read_judgment_lines(paths, plan, rows):
        chosen[(judgment.reviewer, judgment.item)] = judgment
    return list(chosen.values())


def read_judgment_lines(paths: list[Path], plan: ReviewPlan, rows: list[dict[str, Any]]
                        ) -> list[tuple[Judgment, dict[str, Any]]]:
    """Every line of the files in order, checked, with the line as it is to be kept (its comment cut to
    MAX_COMMENT); UserError on the first bad line or an empty file."""
    outputs = outputs_by_item(rows)
    lines = []
    for path in paths:
        records = read_jsonl_numbered(Path(path), fix=SAVED_BY_THE_PAGE)
        if not records:
            raise UserError(f"{path}: no judgments in it; save the review page after judging some items")
        for number, data in records:
            judgment = _judgment(data, f"{path}:{number}", plan, outputs)
            lines.append((judgment, {**data, "reviewer": judgment.reviewer, "comment": judgment.comment}))
    return lines


def cut_comment(comment: str) -> str:
    if len(comment) <= MAX_COMMENT:
        return comment
    return (f"{comment[:MAX_COMMENT]} [... cut: the comment had {len(comment):,} characters, the first "
            f"{MAX_COMMENT:,} kept]")


def _judgment(data: dict[str, Any], where: str, plan: ReviewPlan, outputs) -> Judgment:
    def refuse(field: str, problem: str) -> UserError:
        return UserError(f"{where}: field '{field}': {problem}")

    if data.get("schema") != JUDGMENT_SCHEMA:
        raise refuse("schema", f"{data.get('schema')!r}, expected {JUDGMENT_SCHEMA!r}: not a quantgate judgment")
    if data.get("run") != plan.run:
        raise refuse("run", "judged on another run (another model or other evalsets); its judgments cannot count "
                     "here: review this run with `quantgate review RUN_DIR`")
    if data.get("plan") != plan.plan:
        raise refuse("plan", f"judged against another review plan ({data.get('plan')!r}; this run's plan is "
                     f"{plan.plan!r}): fold it into the run it was planned for, or judge this plan's page")
    item = plan.item(str(data.get("item")))
    if item is None:
        raise refuse("item", f"{data.get('item')!r} is not in this run's review plan")
    reviewer = data.get("reviewer")
    if not isinstance(reviewer, str) or not reviewer.strip():
        raise refuse("reviewer", "missing; every judgment names its reviewer")
    if data.get("preference") not in PREFERENCES:
        raise refuse("preference", f"{data.get('preference')!r}, expected one of {', '.join(PREFERENCES)}")
    for field in ("acceptable_a", "acceptable_b"):
        if not isinstance(data.get(field), bool):
            raise refuse(field, f"{data.get(field)!r}, expected true or false")
    comment = data.get("comment", "")
    if not isinstance(comment, str):
        raise refuse("comment", "expected text")
    shown = {"baseline": item.baseline_hash, "candidate": item.candidate_hash}
    b_side = "candidate" if item.a == "baseline" else "baseline"
    for field, side in (("hash_a", item.a), ("hash_b", b_side)):
        if data.get(field) != shown[side]:
            raise refuse(field, f"the {side}'s output it judged is not the one the plan showed (edited by hand, or "
                         "another run): refused")
    current = {"baseline": outputs.get((plan.baseline, item.evalset, item.id)),
               "candidate": outputs.get((item.format, item.evalset, item.id))}
    for side, row in current.items():
        if row is None or text_hash(str(row.get("prediction", ""))) != shown[side]:
            raise refuse("hash_a" if side == item.a else "hash_b",
                         f"the {side}'s output of {item.key} changed since it was judged: the judgment is of other "
                         "text; judge the new output")
    acceptable = {item.a: data["acceptable_a"], b_side: data["acceptable_b"]}
    preferred = "same" if data["preference"] == "same" else (item.a if data["preference"] == "A" else b_side)
    return Judgment(reviewer.strip(), item.key, item.format, item.evalset, item.id, item.stratum, preferred,
                    acceptable["baseline"], acceptable["candidate"], cut_comment(comment), where)

