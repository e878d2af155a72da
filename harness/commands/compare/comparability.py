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
    latency and memory move with them; a quality change may be a kernel change.
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

ARROW = "\u2192"
INCOMPARABLE, WARNING = True, False


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


def find_differences(old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    """Every difference between the two runs' inputs and settings, incomparable ones first."""
    found = [
        *_model(old, new),
        *_evalsets(old, new),
        *_diff("device", _pick(old.get("device"), "kind", "name", "threads"),
               _pick(new.get("device"), "kind", "name", "threads"), WARNING),
        *_diff("environment", old.get("environment"), new.get("environment"), WARNING),
        *_diff("policy", old.get("policy"), new.get("policy"), WARNING),
        *_formats(old.get("formats") or {}, new.get("formats") or {}),
    ]
    return sorted(found, key=lambda d: not d.incomparable)  # stable: incomparable first, each group in order


def _model(old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    before, after = old.get("model") or {}, new.get("model") or {}
    return [*_diff("model fingerprint", before.get("fingerprint", MISSING), after.get("fingerprint", MISSING),
                   INCOMPARABLE),
            *_diff("model dtype", before.get("dtype", MISSING), after.get("dtype", MISSING), WARNING)]


def _evalsets(old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    before, after = old.get("evalsets") or {}, new.get("evalsets") or {}
    found = []
    for name in [*before, *(n for n in after if n not in before)]:
        if name not in after or name not in before:
            was, now = (_evaluated(before.get(name)), _evaluated(after.get(name)))
            found.append(Difference(f"evalset {name}", was, now, INCOMPARABLE))
            continue
        for key, label in (("hash", "contents (hash)"), ("n", "items evaluated"), ("metrics", "metrics"),
                           ("gate", "gate"), ("tokenizer", "tokenizer")):
            found += _diff(f"evalset {name} {label}", _field(before[name], key), _field(after[name], key),
                           INCOMPARABLE)
        found += _diff(f"evalset {name} max_new_tokens", _max_new_tokens(old, before[name]),
                       _max_new_tokens(new, after[name]), INCOMPARABLE)
    return found


def _evaluated(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not evaluated"
    return f"evaluated ({entry['n']} items)" if isinstance(entry.get("n"), int) else "evaluated"


def _field(entry: dict[str, Any], key: str) -> Any:
    value = entry.get(key, MISSING)
    return sorted(value) if key in ("metrics", "gate") and isinstance(value, list) else value  # order is no change


def _max_new_tokens(report: dict[str, Any], entry: dict[str, Any]) -> Any:
    """What generation was allowed: the spec's max_new_tokens, capped by the run's --max-new-tokens."""
    spec, cap = entry.get("max_new_tokens", MISSING), (report.get("settings") or {}).get("max_new_tokens")
    return min(spec, cap) if isinstance(spec, int) and isinstance(cap, int) else spec


def _formats(old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    found = []
    for name in (n for n in old if n in new):
        before, after = old[name], new[name]
        found += _artifact(name, before.get("artifact"), after.get("artifact"))
        found += _diff(f"{name} compute dtype", before.get("compute_dtype", MISSING),
                       after.get("compute_dtype", MISSING), WARNING)
        found += _diff(f"{name} calibration", before.get("calibration"), after.get("calibration"), WARNING)
    return found


def _artifact(name: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Difference]:
    """Engine, versions, recipe and calibration of two artifacts; nothing when either format made none (it failed,
    and the verdicts say so)."""
    if not before or not after:
        return []
    was, now = before.get("manifest") or {}, after.get("manifest") or {}
    found = _diff(f"{name} engine", was.get("engine", MISSING), now.get("engine", MISSING), WARNING)
    found += _diff(f"{name} versions", was.get("versions"), now.get("versions"), WARNING)
    found += _diff(f"{name} recipe", was.get("recipe"), now.get("recipe"), WARNING)
    for key, label in (("dtype", "dtype"), ("calibration_hash", "calibration hash"),
                       ("calibration_texts", "calibration texts")):
        found += _diff(f"{name} {label}", was.get(key, MISSING), now.get(key, MISSING), WARNING)
    return found


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


def _pick(block: Any, *keys: str) -> dict[str, Any] | None:
    return {k: block.get(k, MISSING) for k in keys} if isinstance(block, dict) else None


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
