"""Which items people review, and in which order the two outputs are shown: review-plan.json.

A random sample per candidate format, spread over its evalsets (`--items` per format, seeded), estimates the
rates the verdict uses. Optionally the worst items by task delta and by fidelity are added as a separate stratum
("worst"): shown to the reviewer like the others, never counted in the rates. Each item's A/B order is drawn
per item and kept in the plan, never in the page's labels, so several reviewers judge the same items blind.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from harness.errors import UserError

PLAN_FILE = "review-plan.json"
PLAN_SCHEMA = "quantgate.review-plan/1"
Stratum = Literal["random", "worst"]


def text_hash(text: str) -> str:
    """The hash a judgment keeps of each output it saw: a changed output no longer matches."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ReviewItem:
    key: str  # "format/evalset/id"
    format: str
    evalset: str
    id: str
    stratum: Stratum
    a: Literal["baseline", "candidate"]  # which output is shown as A
    baseline_hash: str
    candidate_hash: str
    why: str = ""  # worst stratum: what put it there ("f1 -50.0", "KL 0.41")


@dataclass(frozen=True)
class ReviewPlan:
    plan: str  # hash of the run and the items: judgments name it
    run: str  # hash of the model and the evalsets' contents (run_key)
    baseline: str  # the baseline format's name
    seed: int
    items_per_format: int
    worst_per_format: int
    items: tuple[ReviewItem, ...]

    def item(self, key: str) -> ReviewItem | None:
        return self._by_key.get(key)

    @cached_property
    def _by_key(self) -> dict[str, ReviewItem]:
        return {item.key: item for item in self.items}

    def as_dict(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, "plan": self.plan, "run": self.run, "baseline": self.baseline, "seed": self.seed,
                "items_per_format": self.items_per_format, "worst_per_format": self.worst_per_format,
                "items": [asdict(item) for item in self.items]}


def run_key(report) -> str:
    """What a run's judgments belong to: its model's fingerprint and every evalset's content hash. A rerun of the
    same model on the same sets (a cached one) has the same key; output hashes pin the outputs themselves."""
    parts = [report.model.fingerprint, *sorted(f"{name}={info.hash}" for name, info in report.evalsets.items())]
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def outputs_by_item(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """samples.jsonl rows keyed (format, evalset, id)."""
    return {(str(r.get("format")), str(r.get("evalset")), str(r.get("id"))): r for r in rows}


def build_plan(report, rows: list[dict[str, Any]], *, items: int, worst: int, seed: int,
               formats: list[str] | None = None) -> ReviewPlan:
    baseline = next((name for name, f in report.formats.items() if f.role == "baseline"), None)
    outputs = outputs_by_item(rows)
    candidates = [name for name, f in report.formats.items() if f.role == "candidate" and f.status == "ok"]
    if formats:
        unknown = [f for f in formats if f not in candidates]
        if unknown:
            raise UserError(f"--formats {','.join(unknown)}: not a candidate that finished in this run (candidates: "
                            f"{', '.join(candidates) or 'none'})")
        candidates = [c for c in candidates if c in formats]
    if baseline is None or not candidates:
        raise UserError("nothing to review: the run has no baseline and finished candidate with outputs; review a "
                        "run where at least one candidate format finished")
    evalsets = list(report.evalsets)
    plan_items: list[ReviewItem] = []
    for name in candidates:
        pairs = {e: [i for (f, s, i) in outputs if f == name and s == e and (baseline, e, i) in outputs]
                 for e in evalsets}
        rng = random.Random(f"{seed}:{name}")
        chosen = _spread(pairs, items, rng)
        for evalset, item_id in chosen:
            plan_items.append(_item(name, baseline, evalset, item_id, "random", rng, outputs))
        taken = set(chosen)
        for evalset, item_id, why in _worst(report, name, baseline, pairs, outputs, worst):
            if (evalset, item_id) not in taken:
                taken.add((evalset, item_id))
                plan_items.append(_item(name, baseline, evalset, item_id, "worst", rng, outputs, why))
    key = run_key(report)
    digest = hashlib.sha256(json.dumps([key, [asdict(i) for i in plan_items]], sort_keys=True).encode()).hexdigest()
    return ReviewPlan(digest[:16], key, baseline, seed, items, worst, tuple(plan_items))


def _spread(pairs: dict[str, list[str]], total: int, rng: random.Random) -> list[tuple[str, str]]:
    """`total` items drawn at random, as evenly over the evalsets as their sizes allow."""
    left = {e: sorted(ids) for e, ids in pairs.items() if ids}
    quota = {e: 0 for e in left}
    remaining = total
    while remaining > 0 and any(quota[e] < len(left[e]) for e in left):
        for e in left:
            if remaining > 0 and quota[e] < len(left[e]):
                quota[e] += 1
                remaining -= 1
    return [(e, i) for e in left for i in sorted(rng.sample(left[e], quota[e]))]


def _worst(report, name: str, baseline: str, pairs: dict[str, list[str]], outputs, count: int):
    """The `count` items with the largest drop on each evalset's first gated metric, then the `count` with the
    largest fidelity KL, over all its evalsets."""
    if count <= 0:
        return []
    drops, kls = [], []
    for evalset, ids in pairs.items():
        gate = report.evalsets[evalset].gate
        metric = gate[0] if gate else None
        for item_id in ids:
            base, cand = outputs[(baseline, evalset, item_id)], outputs[(name, evalset, item_id)]
            if metric and _number(base.get(metric)) is not None and _number(cand.get(metric)) is not None:
                delta = _number(cand[metric]) - _number(base[metric])
                if delta < 0:
                    drops.append((delta, evalset, item_id, f"{metric} {delta:+.1f}"))
            fidelity = cand.get("fidelity")
            if isinstance(fidelity, dict) and _number(fidelity.get("kl")) is not None:
                kls.append((-_number(fidelity["kl"]), evalset, item_id, f"KL {_number(fidelity['kl']):.3f}"))
    picked = sorted(drops)[:count] + sorted(kls)[:count]
    return [(evalset, item_id, why) for _, evalset, item_id, why in picked]


def _item(name, baseline, evalset, item_id, stratum, rng, outputs, why: str = "") -> ReviewItem:
    return ReviewItem(f"{name}/{evalset}/{item_id}", name, evalset, item_id, stratum,
                      "baseline" if rng.random() < 0.5 else "candidate",
                      text_hash(str(outputs[(baseline, evalset, item_id)].get("prediction", ""))),
                      text_hash(str(outputs[(name, evalset, item_id)].get("prediction", ""))), why)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None


def write_plan(run_dir: Path, plan: ReviewPlan) -> Path:
    from harness.cache import atomic_write_text

    path = run_dir / PLAN_FILE
    atomic_write_text(path, json.dumps(plan.as_dict(), indent=2, ensure_ascii=False) + "\n")
    return path


def read_plan(run_dir: Path) -> ReviewPlan:
    path = run_dir / PLAN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: missing; run `quantgate review {run_dir}` first (it writes the plan the "
                        "judgments refer to)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); run `quantgate review {run_dir}` again to rewrite it") from None
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise UserError(f"{path}: not a quantgate review plan (schema {data.get('schema') if isinstance(data, dict) else None!r}, "
                        f"expected {PLAN_SCHEMA!r}); run `quantgate review {run_dir}` again")
    try:
        items = tuple(ReviewItem(**item) for item in data["items"])
        return ReviewPlan(data["plan"], data["run"], data["baseline"], data["seed"], data["items_per_format"],
                          data["worst_per_format"], items)
    except (KeyError, TypeError) as exc:
        raise UserError(f"{path}: a field is missing or wrong ({exc}); run `quantgate review {run_dir}` again") from None
