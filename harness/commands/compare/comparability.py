"""Whether two reports measured the same thing: every difference in what was scored and how it was run.

A difference is either *incomparable* or a *warning*:

- Incomparable: the scores measure different things, so a change in them says nothing about the model or the
  format. The model's weights (model fingerprint); which evalsets ran; each evalset's contents (its hash over
  spec and data bytes, and the number of items evaluated: --max-items); its metric definitions (metrics, gate,
  tokenizer, and the effective max_new_tokens: the spec's value capped by the run's --max-new-tokens).
  `compare` exits 2 on these unless --allow-changes is given; then they are listed as warnings.
- Warning: the scores still measure the same items the same way, but something around them changed, and a
  reviewer must see it next to any score change it may explain:
  - device (kind, name, threads) and engine versions (report environment, each artifact's engine and versions):
    latency and memory move with them; a quality change may be a kernel change. Where the formats ran (the
    `cluster` block: executor, nodes, each format's node) is no difference at all.
  - policy (margins, floors, budgets, confidence): it changes how verdicts follow from the same scores, not the
    scores; the verdict flips it causes are still real for whoever ships under the new policy.
  - quantization recipe (artifact manifest recipe and dtype, the format's compute dtype) and calibration (the
    format's `calibration` block, the manifest's calibration hash and text count): changing them is exactly
    what a regression check exists to judge; the scores stay comparable, and their changes are reported as usual.
A field missing from both reports is no difference; missing from one only, it is (shown as "(not recorded)").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from harness.report.schema import Artifact, Device, EvalsetInfo, FormatResult, Model, RunReport

ARROW = "\u2192"
INCOMPARABLE, WARNING = True, False
CLUSTER_ENTRIES = frozenset({"executor", "ray", "cluster"})


class _Missing:
    def __repr__(self) -> str:
        return "(not recorded)"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Difference:
    what: str  # the field, e.g. "model fingerprint", "evalset squad_200 hash", "gptq recipe group_size"
    old: Any  # MISSING when the old report does not record it
    new: Any
    incomparable: bool

    def describe(self) -> str:
        return f"{self.what}: {show(self.old)} {ARROW} {show(self.new)}"


def find_differences(old: RunReport, new: RunReport) -> list[Difference]:
    """Every difference between the two runs' inputs and settings, incomparable ones first."""
    found = [
        *_model(old.model, new.model),
        *_evalsets(old, new),
        *_diff("device", _device(old.device), _device(new.device), WARNING),
        *_diff("environment", _software(old.environment), _software(new.environment), WARNING),
        *_diff("policy", _recorded_block(old.policy), _recorded_block(new.policy), WARNING),
        *_formats(old.formats, new.formats),
    ]
    return sorted(found, key=lambda d: not d.incomparable)  # stable: incomparable first, each group in order


def _software(environment: dict[str, str]) -> dict[str, str]:
    """The environment less where the formats ran: the report's `cluster` block (not compared) and the entries
    reports written before it carried instead ("executor", "ray", "cluster", "node FORMAT"). The same inputs
    score the same on any executor and node; the device they were measured on is compared on its own."""
    return {key: value for key, value in environment.items()
            if key not in CLUSTER_ENTRIES and not key.startswith("node ")}


def _model(before: Model, after: Model) -> list[Difference]:
    return [*_diff("model fingerprint", before.fingerprint, after.fingerprint, INCOMPARABLE),
            *_diff("model dtype", before.dtype, after.dtype, WARNING)]


def _device(device: Device) -> dict[str, Any]:
    return {"kind": device.kind, "name": device.name, "threads": device.threads}


def _evalsets(old: RunReport, new: RunReport) -> list[Difference]:
    before, after = old.evalsets, new.evalsets
    found = []
    for name in [*before, *(n for n in after if n not in before)]:
        if name not in after or name not in before:
            was, now = (_evaluated(before.get(name)), _evaluated(after.get(name)))
            found.append(Difference(f"evalset {name}", was, now, INCOMPARABLE))
            continue
        was_set, now_set = before[name], after[name]
        found += _diff(f"evalset {name} contents (hash)", was_set.hash, now_set.hash, INCOMPARABLE)
        found += _diff(f"evalset {name} items evaluated", was_set.n, now_set.n, INCOMPARABLE)
        found += _diff(f"evalset {name} metrics", sorted(was_set.metrics), sorted(now_set.metrics),
                       INCOMPARABLE)  # sorted: their order is no change
        found += _diff(f"evalset {name} gate", sorted(was_set.gate), sorted(now_set.gate), INCOMPARABLE)
        found += _diff(f"evalset {name} tokenizer", was_set.tokenizer, now_set.tokenizer, INCOMPARABLE)
        found += _diff(f"evalset {name} max_new_tokens", _max_new_tokens(old, was_set),
                       _max_new_tokens(new, now_set), INCOMPARABLE)
    return found


def _evaluated(entry: EvalsetInfo | None) -> str:
    return "not evaluated" if entry is None else f"evaluated ({entry.n} items)"


def _max_new_tokens(report: RunReport, entry: EvalsetInfo) -> int:
    """What generation was allowed: the spec's max_new_tokens, capped by the run's --max-new-tokens."""
    cap = report.settings.max_new_tokens
    return entry.max_new_tokens if cap is None else min(entry.max_new_tokens, cap)


def _formats(old: dict[str, FormatResult], new: dict[str, FormatResult]) -> list[Difference]:
    found = []
    for name in (n for n in old if n in new):
        before, after = old[name], new[name]
        found += _artifact(name, before.artifact, after.artifact)
        found += _diff(f"{name} compute dtype", _recorded(before, "compute_dtype"),
                       _recorded(after, "compute_dtype"), WARNING)
        found += _diff(f"{name} calibration", _recorded_block(before.calibration),
                       _recorded_block(after.calibration), WARNING)
    return found


def _artifact(name: str, before: Artifact | None, after: Artifact | None) -> list[Difference]:
    """Engine, versions, recipe and calibration of two artifacts; nothing when either format made none (it failed,
    and the verdicts say so)."""
    if before is None or after is None:
        return []
    was, now = before.manifest, after.manifest
    found = []
    for key, label in (("engine", "engine"), ("versions", "versions"), ("recipe", "recipe"), ("dtype", "dtype"),
                       ("calibration_hash", "calibration hash"), ("calibration_texts", "calibration texts")):
        found += _diff(f"{name} {label}", _recorded(was, key), _recorded(now, key), WARNING)
    return found


def _recorded(model: BaseModel | None, key: str) -> Any:
    """The field as the report has it, MISSING when the report does not carry it (a field with a default that an
    older report lacks, or a key an open block such as the artifact manifest does not have)."""
    if model is None:
        return MISSING
    if key in model.model_fields_set:
        return getattr(model, key)
    return (model.model_extra or {}).get(key, MISSING)


def _recorded_block(block: BaseModel | None) -> dict[str, Any] | None:
    """A block as the JSON the report carries (only the fields it wrote), compared key by key."""
    return None if block is None else block.model_dump(mode="json", exclude_unset=True)


def _diff(label: str, old: Any, new: Any, incomparable: bool) -> list[Difference]:
    """One Difference per differing leaf of two values (objects compared key by key). A block that one report
    has and the other lacks is one Difference; lacking from both is none."""
    absent = (MISSING, None)
    if old in absent and new in absent:
        return []
    if not isinstance(old, dict) or not isinstance(new, dict):
        if _same(old, new):
            return []
        if old is None and isinstance(new, dict):  # a block one report lacks: "(not recorded)", not "none"
            old = MISSING
        if new is None and isinstance(old, dict):
            new = MISSING
        return [Difference(label, old, new, incomparable)]
    found = []
    for key in [*old, *(k for k in new if k not in old)]:
        was, now = old.get(key, MISSING), new.get(key, MISSING)
        if isinstance(was, dict) and isinstance(now, dict):
            found += _diff(f"{label} {key}", was, now, incomparable)
        elif not _same(was, now):
            found.append(Difference(f"{label} {key}", was, now, incomparable))
    return found


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (1 and "1" differ, so do 1 and true), except that 6 and 6.0 are the same number."""
    if type(a) is type(b):
        return a == b
    numbers = (int, float)
    return (isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool)
            and not isinstance(b, bool) and a == b)


def show(value: Any) -> str:
    if value is MISSING:
        return "(not recorded)"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value[:19] + "\u2026" if value.startswith("sha256:") and len(value) > 20 else value
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return f"{value:g}" if isinstance(value, float) else str(value)
