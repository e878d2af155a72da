"""Which items people review, and in which order the two outputs are shown: review-plan.json and review-key.json.

A random sample per candidate format, spread over its evalsets (`--items` per format, seeded), estimates the
rates the verdict uses. Optionally the worst items by task delta and by fidelity are added as a separate stratum
("worst"): shown to the reviewer like the others, never counted in the rates. An item is shown for one format
only: the baseline's output is the one two formats' pairs would share, so showing an item twice unblinds it.

Each item's A/B order is drawn at random (not from the seed: anyone holding the plan could redraw it) and kept in
review-key.json, a file the page never loads; review-plan.json holds the page's two hashes per item in page order
and a salted digest of the key, so neither the page nor the plan says which output is the baseline's.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from harness.errors import UserError

PLAN_FILE = "review-plan.json"
KEY_FILE = "review-key.json"
PLAN_SCHEMA = "quantgate.review-plan/2"
OLD_PLAN_SCHEMA = "quantgate.review-plan/1"  # the A/B key inline; still read, never written
KEY_SCHEMA = "quantgate.review-key/1"
Stratum = Literal["random", "worst"]
Side = Literal["baseline", "candidate"]


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
    a: Side  # which output is shown as A (kept in review-key.json only)
    baseline_hash: str
    candidate_hash: str
    why: str = ""  # worst stratum: what put it there ("f1 -50.0", "KL 0.41")

    @property
    def shown(self) -> list[str]:
        """The two outputs' hashes in page order (A, B): what the page itself holds."""
        pair = [self.baseline_hash, self.candidate_hash]
        return pair if self.a == "baseline" else pair[::-1]

    def public(self) -> dict[str, Any]:
        return {"key": self.key, "format": self.format, "evalset": self.evalset, "id": self.id,
                "stratum": self.stratum, "why": self.why, "shown": self.shown}

    def sample(self) -> tuple:
        """What the sample holds, whatever the A/B order."""
        return (self.key, self.stratum, self.why, self.baseline_hash, self.candidate_hash)


@dataclass(frozen=True)
class ReviewPlan:
    plan: str  # hash of the run, the items and the key's digest: judgments name it
    run: str  # hash of the model and the evalsets' contents (run_key)
    baseline: str  # the baseline format's name
    seed: int
    items_per_format: int
    worst_per_format: int
    items: tuple[ReviewItem, ...]
    salt: str = ""  # keeps the key's digest from being redrawn by whoever holds the plan

    def item(self, key: str) -> ReviewItem | None:
        return self._by_key.get(key)

    @cached_property
    def _by_key(self) -> dict[str, ReviewItem]:
        return {item.key: item for item in self.items}

    def same_sample(self, other: "ReviewPlan") -> bool:
        return (self.run, self.baseline, self.seed, self.items_per_format, self.worst_per_format,
                [i.sample() for i in self.items]) == (other.run, other.baseline, other.seed, other.items_per_format,
                                                      other.worst_per_format, [i.sample() for i in other.items])

    def key_digest(self) -> str:
        order = {item.key: item.a for item in self.items}
        return hashlib.sha256(json.dumps([self.salt, order], sort_keys=True).encode()).hexdigest()[:32]

    def as_dict(self) -> dict[str, Any]:
        """review-plan.json: everything but the A/B key."""
        return {"schema": PLAN_SCHEMA, "plan": self.plan, "run": self.run, "baseline": self.baseline, "seed": self.seed,
                "items_per_format": self.items_per_format, "worst_per_format": self.worst_per_format,
                "key_file": KEY_FILE, "key_digest": self.key_digest(), "items": [i.public() for i in self.items]}

    def key_dict(self) -> dict[str, Any]:
        """review-key.json: the A/B order, which the page never loads."""
        return {"schema": KEY_SCHEMA, "plan": self.plan, "salt": self.salt,
                "a": {item.key: item.a for item in self.items}}


def _with_id(plan: ReviewPlan) -> ReviewPlan:
    public = [item.public() for item in plan.items]
    digest = hashlib.sha256(json.dumps([plan.run, plan.baseline, public, plan.key_digest()],
                                       sort_keys=True).encode()).hexdigest()
    return replace(plan, plan=digest[:16])


def run_key(report) -> str:
    """What a run's judgments belong to: its model's fingerprint and every evalset's content hash. A rerun of the
    same model on the same sets (a cached one) has the same key; output hashes pin the outputs themselves."""
    parts = [report.model.fingerprint, *sorted(f"{name}={info.hash}" for name, info in report.evalsets.items())]
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def outputs_by_item(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """samples.jsonl rows keyed (format, evalset, id)."""
    return {(str(r.get("format")), str(r.get("evalset")), str(r.get("id"))): r for r in rows}


def build_plan(report, rows: list[dict[str, Any]], *, items: int, worst: int, seed: int,
               formats: list[str] | None = None, previous: ReviewPlan | None = None) -> ReviewPlan:
    """The plan for these options; `previous` (the plan already written) is returned as it is when it holds the
    same sample, so its A/B order, and the judgments and the browser progress made on it, stay valid."""
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
    pairs = {name: {e: sorted(i for (f, s, i) in outputs if f == name and s == e and (baseline, e, i) in outputs)
                    for e in evalsets} for name in candidates}
    chosen = _disjoint_sample(pairs, evalsets, items, seed)
    taken = {pair for picked in chosen.values() for pair in picked}
    plan_items: list[ReviewItem] = []
    order = secrets.SystemRandom()
    for name in candidates:
        for evalset, item_id in chosen[name]:
            plan_items.append(_item(name, baseline, evalset, item_id, "random", order, outputs))
        for evalset, item_id, why in _worst(report, name, baseline, pairs[name], outputs, worst, taken):
            taken.add((evalset, item_id))
            plan_items.append(_item(name, baseline, evalset, item_id, "worst", order, outputs, why))
    plan = ReviewPlan("", run_key(report), baseline, seed, items, worst, tuple(plan_items), secrets.token_hex(16))
    if previous is not None and previous.same_sample(plan):
        return previous
    return _with_id(plan)


def _disjoint_sample(pairs: dict[str, dict[str, list[str]]], evalsets: list[str], total: int, seed: int
                     ) -> dict[str, list[tuple[str, str]]]:
    """Up to `total` items per format, drawn at random, as evenly over the evalsets as their sizes allow, no item
    for two formats: the formats take turns, one item each, so a pool too small for all is shared evenly."""
    rngs = {name: random.Random(f"{seed}:{name}") for name in pairs}
    chosen: dict[str, list[tuple[str, str]]] = {name: [] for name in pairs}
    taken: set[tuple[str, str]] = set()
    active = [name for name in pairs]
    while active:
        for name in list(active):
            free = {e: [i for i in pairs[name][e] if (e, i) not in taken] for e in evalsets}
            open_sets = [e for e in evalsets if free[e]]
            if len(chosen[name]) >= total or not open_sets:
                active.remove(name)
                continue
            counts = {e: sum(1 for s, _ in chosen[name] if s == e) for e in open_sets}
            evalset = min(open_sets, key=lambda e: (counts[e], evalsets.index(e)))
            pick = (evalset, rngs[name].choice(free[evalset]))
            chosen[name].append(pick)
            taken.add(pick)
    return {name: sorted(picked, key=lambda p: (evalsets.index(p[0]), p[1])) for name, picked in chosen.items()}


def _worst(report, name: str, baseline: str, pairs: dict[str, list[str]], outputs, count: int,
           taken: set[tuple[str, str]]):
    """The `count` items with the largest drop on each evalset's first gated metric, then the `count` with the
    largest fidelity KL, over all its evalsets; items another stratum or format holds are passed over."""
    if count <= 0:
        return []
    drops, kls = [], []
    for evalset, ids in pairs.items():
        gate = report.evalsets[evalset].gate
        metric = gate[0] if gate else None
        for item_id in ids:
            if (evalset, item_id) in taken:
                continue
            base, cand = outputs[(baseline, evalset, item_id)], outputs[(name, evalset, item_id)]
            if metric and _number(base.get(metric)) is not None and _number(cand.get(metric)) is not None:
                delta = _number(cand[metric]) - _number(base[metric])
                if delta < 0:
                    drops.append((delta, evalset, item_id, f"{metric} {delta:+.1f}"))
            fidelity = cand.get("fidelity")
            if isinstance(fidelity, dict) and _number(fidelity.get("kl")) is not None:
                kls.append((-_number(fidelity["kl"]), evalset, item_id, f"KL {_number(fidelity['kl']):.3f}"))
    picked, seen = [], set()
    for ranked in (sorted(drops), sorted(kls)):
        for _, evalset, item_id, why in [r for r in ranked if (r[1], r[2]) not in seen][:count]:
            seen.add((evalset, item_id))
            picked.append((evalset, item_id, why))
    return picked


def _item(name, baseline, evalset, item_id, stratum, order: random.Random, outputs, why: str = "") -> ReviewItem:
    return ReviewItem(f"{name}/{evalset}/{item_id}", name, evalset, item_id, stratum,
                      "baseline" if order.random() < 0.5 else "candidate",
                      text_hash(str(outputs[(baseline, evalset, item_id)].get("prediction", ""))),
                      text_hash(str(outputs[(name, evalset, item_id)].get("prediction", ""))), why)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None


def write_plan(run_dir: Path, plan: ReviewPlan) -> Path:
    """The key first: a plan is never on disk without the key its judgments are read with."""
    from harness.cache import atomic_write_text

    atomic_write_text(run_dir / KEY_FILE, json.dumps(plan.key_dict(), indent=2, ensure_ascii=False) + "\n")
    path = run_dir / PLAN_FILE
    atomic_write_text(path, json.dumps(plan.as_dict(), indent=2, ensure_ascii=False) + "\n")
    return path


def archived_plan_path(run_dir: Path, plan_id: str) -> Path:
    return run_dir / f"review-plan-{plan_id}.json"


def archived_plans(run_dir: Path) -> list[str]:
    return sorted(p.name[len("review-plan-"):-len(".json")] for p in run_dir.glob("review-plan-*.json"))


def archive_plan(run_dir: Path) -> str | None:
    """Move the current plan and its key aside as review-plan-ID.json and review-key-ID.json (replacing it must
    not lose the key its judgments are read with); the old plan's id, or None when there was none."""
    try:
        plan_id = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))["plan"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(plan_id, str) or not plan_id.isalnum():
        return None
    if (run_dir / KEY_FILE).is_file():
        (run_dir / KEY_FILE).replace(run_dir / f"review-key-{plan_id}.json")
    (run_dir / PLAN_FILE).replace(archived_plan_path(run_dir, plan_id))
    return plan_id


def read_plan(run_dir: Path, archived: str | None = None) -> ReviewPlan:
    """The directory's plan with its key; with `archived`, the plan of that id a later one replaced."""
    path = archived_plan_path(run_dir, archived) if archived else run_dir / PLAN_FILE
    key_path = run_dir / (f"review-key-{archived}.json" if archived else KEY_FILE)
    again = f"run `quantgate review {run_dir}` again to rewrite it"
    data = _read_json(path, f"run `quantgate review {run_dir}` first (it writes the plan the judgments refer to)",
                      again)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in (PLAN_SCHEMA, OLD_PLAN_SCHEMA):
        raise UserError(f"{path}: not a quantgate review plan (schema {schema!r}, expected {PLAN_SCHEMA!r}); {again}")
    try:
        if schema == OLD_PLAN_SCHEMA:
            items = tuple(ReviewItem(**item) for item in data["items"])
            return ReviewPlan(data["plan"], data["run"], data["baseline"], data["seed"], data["items_per_format"],
                              data["worst_per_format"], items)
        key = _read_key(key_path, data["plan"])
        items = tuple(_keyed_item(item, key["a"][item["key"]]) for item in data["items"])
        plan = ReviewPlan(data["plan"], data["run"], data["baseline"], data["seed"], data["items_per_format"],
                          data["worst_per_format"], items, key["salt"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: a field is missing or wrong ({exc}); {again}") from None
    if plan.key_digest() != data["key_digest"]:
        raise UserError(f"{key_path}: not the key of {path.name} (its digest differs): restore the key "
                        f"written with plan {plan.plan}; without it the judgments cannot be read back")
    return plan


def _keyed_item(public: dict[str, Any], a: str) -> ReviewItem:
    if a not in ("baseline", "candidate"):
        raise ValueError(f"key of {public['key']}: {a!r}")
    hash_a, hash_b = public["shown"]
    baseline_hash, candidate_hash = (hash_a, hash_b) if a == "baseline" else (hash_b, hash_a)
    return ReviewItem(public["key"], public["format"], public["evalset"], public["id"], public["stratum"], a,
                      baseline_hash, candidate_hash, public.get("why", ""))


def _read_key(path: Path, plan_id: str) -> dict[str, Any]:
    data = _read_json(path, f"it holds the A/B order of plan {plan_id}: restore it beside {PLAN_FILE}",
                      f"restore the key written with plan {plan_id}")
    if not isinstance(data, dict) or data.get("schema") != KEY_SCHEMA or data.get("plan") != plan_id:
        raise UserError(f"{path}: not the key of plan {plan_id}; restore the key written with it")
    if not isinstance(data.get("a"), dict) or not isinstance(data.get("salt"), str):
        raise UserError(f"{path}: a field is missing or wrong; restore the key written with plan {plan_id}")
    return data


def _read_json(path: Path, if_missing: str, if_broken: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {if_missing}") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); {if_broken}") from None
