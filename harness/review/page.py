"""review.html: one self-contained page (no network; it works from a file and from a CI artifact) on which a
reviewer judges the plan's items blind: A better / same / B better, each output acceptable or not, a comment.
Outputs are untrusted text: the data travels as JSON inside the page and is only ever set as text, never as HTML.
Progress stays in the browser (localStorage, per plan); Save writes review-NAME.jsonl (a download, or with
`quantgate review --serve` a POST the local server writes into the run directory)."""

from __future__ import annotations

import json
from typing import Any

from harness.review.judgments import JUDGMENT_SCHEMA
from harness.review.page_template import TEMPLATE
from harness.review.plan import ReviewPlan, outputs_by_item


def page_items(plan: ReviewPlan, rows: list[dict[str, Any]], inputs: dict[tuple[str, str], dict[str, str]]
               ) -> list[dict[str, Any]]:
    """What the page shows per item: the input, the reference, and the two outputs in the plan's order."""
    outputs = outputs_by_item(rows)
    shown = []
    for item in plan.items:
        base = outputs[(plan.baseline, item.evalset, item.id)]
        cand = outputs[(item.format, item.evalset, item.id)]
        a, b = (base, cand) if item.a == "baseline" else (cand, base)
        refs = cand.get("references")
        shown.append({
            "key": item.key, "format": item.format, "evalset": item.evalset, "id": item.id, "stratum": item.stratum,
            "input": inputs.get((item.evalset, item.id)) or {"prompt": str(cand.get("prompt", ""))},
            "reference": " | ".join(map(str, refs)) if isinstance(refs, list) else str(refs or ""),
            "a": str(a.get("prediction", "")), "b": str(b.get("prediction", "")),
            "hash_a": item.baseline_hash if item.a == "baseline" else item.candidate_hash,
            "hash_b": item.candidate_hash if item.a == "baseline" else item.baseline_hash,
        })
    return shown


def render_page(plan: ReviewPlan, items: list[dict[str, Any]], languages: dict[str, str], title: str,
                serve: bool = False) -> str:
    data = {"schema": JUDGMENT_SCHEMA, "plan": plan.plan, "run": plan.run, "serve": serve, "title": title,
            "languages": languages, "items": items}
    payload = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e") \
        .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return TEMPLATE.replace("/*DATA*/null", payload).replace("<!--TITLE-->", _escape(title))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
