"""`quantgate decide`: a verdict from two per-item score files, without running any model.

Each JSONL line is one item: {"id": ..., "<metric>": <number>, ...}, optionally with "evalset" to
group items (default group "scores") and "group" (a string or integer): items of one evalset with one
group share a context and are resampled as one cluster (items without a group are their own cluster).
Numeric fields are metrics, except the bookkeeping fields in NOT_METRICS; other fields (prompt,
prediction, references, ...) are ignored. A run's samples.jsonl works as either file: its lines carry "format",
and each file is read for one format (--baseline-format, default "baseline"; --candidate-format, needed when the
file holds several candidates). An optional "language" per line ("en", "zh") lets the policy's per-language
fidelity limits apply, as in a run.

The policy is checked as `run` checks it: a [margins]/[floors]/[min_items_for] key naming a metric that
is neither a quantgate metric nor in the score files is an error (exit 2), not a silently ignored typo.
The verdict follows the same evidence rules as a run (harness/decide.py): min_items, MDE <= margin.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from harness import __version__
from harness.decide import FormatOutcome, baseline_scores, decide_format, exit_code, num, signed
from harness.errors import UserError
from harness.fidelity.summary import FidelityItem
from harness.jsonl import ONE_OBJECT_PER_LINE, read_jsonl_numbered
from harness.metrics import metric_names
from harness.policy import load_policy

DEFAULT_GROUP = "scores"
NOT_METRICS = {"id", "evalset", "group", "format", "new_tokens", "prompt_tokens", "index", "fidelity", "language"}
MAX_LISTED = 10


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "decide",
        help="verdict from two per-item score files (JSONL)",
        description="Compare a candidate's per-item scores with the baseline's, item by item, under a policy.",
    )
    p.add_argument("--baseline", required=True, type=Path, help="baseline scores, one JSON object per line")
    p.add_argument("--candidate", required=True, type=Path, help="candidate scores, same ids")
    p.add_argument("--baseline-format", default=None, metavar="NAME",
                   help='the format to read from a --baseline file whose lines carry "format" (a run\'s '
                        'samples.jsonl); default: baseline')
    p.add_argument("--candidate-format", default=None, metavar="NAME",
                   help='the format to read from a --candidate file whose lines carry "format"; needed when it '
                        'holds more than one candidate')
    p.add_argument("--policy", type=Path, default=None, help="policy TOML (default: built-in margins)")
    p.add_argument("--json", type=Path, default=None, dest="json_out", help="write the decision as JSON here")
    p.add_argument("--scale", type=float, choices=(1.0, 100.0), default=100.0,
                   help="the scale the files' scores are on: 100 (points, quantgate's own; default) or 1 "
                        "(fractions, multiplied by 100 on reading)")
    p.add_argument("--allow-missing", action="store_true",
                   help="drop an item's metric whose value is missing or not a number (each dropped one is counted "
                        "in the verdict, which cannot be GO then) instead of stopping with an error")
    p.add_argument(
        "--gate",
        nargs="+",
        action="extend",
        metavar="METRIC",
        default=None,
        help="metrics the verdict gates on (METRIC or EVALSET/METRIC); default: every metric with a policy margin",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base_records = read_records(args.baseline, args.baseline_format, "baseline")
    cand_records = read_records(args.candidate, args.candidate_format, "candidate")
    base_rows, base_order, base_groups = read_scores(args.baseline, scale=args.scale,
                                                     allow_missing=args.allow_missing, records=base_records)
    cand_rows, cand_order, cand_groups = read_scores(args.candidate, scale=args.scale,
                                                     allow_missing=args.allow_missing, records=cand_records)
    languages = read_languages(args.baseline, base_records, args.candidate, cand_records)
    known = list(metric_names()) + sorted({m for rows in (base_rows, cand_rows) for items in rows.values()
                                           for m in _metrics_in(items)} - set(metric_names()))
    policy = load_policy(args.policy, known_metrics=known, known_evalsets=sorted({*base_rows, *cand_rows}),
                         known_languages=sorted(set(languages.values())))
    _require_same_ids(args.baseline, base_rows, args.candidate, cand_rows)
    clusters = _merge_groups(args.baseline, base_groups, args.candidate, cand_groups)

    metric_sets = {
        group: (_metrics_in(base_rows[group]), _metrics_in(cand_rows[group])) for group in base_rows
    }
    gates = _gates(metric_sets, args.gate, policy)
    if not any(gates.values()):
        shared_names = sorted({m for base_m, cand_m in metric_sets.values() for m in base_m & cand_m})
        raise UserError(
            f"nothing to gate on: no metric in both files ({', '.join(shared_names) or 'none'}) has a policy margin; "
            "add one under [margins] in --policy, or name metrics with --gate"
        )
    notes = []
    for group, (base_metrics, cand_metrics) in metric_sets.items():
        for metric in base_metrics - cand_metrics:
            notes.append(f"{_label(group, metric)} is only in {args.baseline}: not compared")
        for metric in cand_metrics - base_metrics:
            notes.append(f"{_label(group, metric)} is only in {args.candidate}: not compared")
    if policy.has_budgets():
        notes.append("memory, latency and capacity budgets are not checked: score files carry no measurements")
        policy = policy.without_budgets()

    shared = {g: base_m & cand_m for g, (base_m, cand_m) in metric_sets.items()}
    cluster_by = {group: "group" for group in clusters}
    baseline = FormatOutcome(
        name="baseline", items=_only(base_rows, shared, base_order), gates=gates, clusters=clusters,
        cluster_by=cluster_by, languages=languages,
    )
    candidate = FormatOutcome(
        name="candidate", items=_only(cand_rows, shared, base_order), gates=gates, clusters=clusters,
        cluster_by=cluster_by, fidelity=read_fidelity(args.candidate, cand_records), languages=languages,
        fidelity_note="not in the candidate file (add a `fidelity` object per line: kl, top1_agreement, tokens)",
    )
    decision = decide_format(baseline, candidate, policy)
    code = exit_code({"candidate": decision.verdict}, policy)

    _print_table(decision, baseline_scores(baseline), policy.confidence)
    for note in notes:
        print(f"note: {note}")
    for evalset, judged in decision.fidelity.items():
        print(f"fidelity {evalset}: {judged['status']}: {judged['detail']}")
    print(f"\nVerdict: {decision.verdict}" + (f" (by the {decision.rule} rule{'s' if ' and ' in decision.rule else ''})"
                                             if decision.rule else ""))
    for reason in decision.reasons:
        print(f"  - {reason}")

    if args.json_out is not None:
        _write_json(
            args.json_out,
            {
                "schema_version": 1,
                "tool": {"name": "quantgate", "version": __version__},
                "baseline": {"path": str(args.baseline), "scores": baseline_scores(baseline)},
                "candidate": {"path": str(args.candidate), **decision.as_dict()},
                "notes": notes,
                "policy": policy.as_dict(),
                "exit_code": code,
            },
        )
    return code


# --- input ----------------------------------------------------------------------------------------


SCORE_LINE = f'{ONE_OBJECT_PER_LINE}, like {{"id": "q1", "f1": 80.0}}'


def read_records(path: Path, wanted: str | None, role: str) -> list[tuple[int, dict]]:
    """The numbered lines of a score file; lines that carry "format" (a run's samples.jsonl) are kept for one
    format: `wanted`, else "baseline" for the baseline file, else the file's only candidate."""
    records = list(read_jsonl_numbered(path, fix=SCORE_LINE))
    formats = list(dict.fromkeys(str(r["format"]) for _, r in records if "format" in r))
    if not formats:
        if wanted is not None:
            raise UserError(f"{path}: --{role}-format {wanted}: its lines carry no \"format\" field; leave the "
                            "flag out for a file of one format")
        return records
    if wanted is None:
        others = [f for f in formats if f != "baseline"]
        if role == "baseline" and "baseline" in formats:
            wanted = "baseline"
        elif role == "candidate" and len(others) == 1:
            wanted = others[0]
        else:
            raise UserError(f"{path}: holds the formats {', '.join(formats)}; name the one to read with "
                            f"--{role}-format NAME")
    if wanted not in formats:
        raise UserError(f"{path}: no lines of format {wanted!r} (formats: {', '.join(formats)}); check "
                        f"--{role}-format")
    return [(number, r) for number, r in records if str(r.get("format")) == wanted]


def read_languages(base_path: Path, base: list[tuple[int, dict]], cand_path: Path,
                   cand: list[tuple[int, dict]]) -> dict[str, str]:
    """evalset -> language from the lines' optional "language" field: one language per evalset, in both files."""
    languages: dict[str, tuple[str, str]] = {}
    for path, records in ((base_path, base), (cand_path, cand)):
        for number, record in records:
            language = record.get("language")
            if language is None:
                continue
            where = f"{path}:{number}: field 'language'"
            if not isinstance(language, str) or not language:
                raise UserError(f"{where}: expected a language code like \"en\" or \"zh\", got {language!r}")
            group = record.get("evalset", DEFAULT_GROUP)
            first = languages.setdefault(str(group), (language, where))
            if first[0] != language:
                raise UserError(f"{where}: {language!r}, but {first[1]} gives {first[0]!r} for evalset {group!r}; "
                                "give each evalset one language")
    return {group: language for group, (language, _) in languages.items()}


def read_scores(path: Path, *, scale: float = 100.0, allow_missing: bool = False,
                records: list[tuple[int, dict]] | None = None,
                ) -> tuple[dict[str, dict[str, dict[str, float]]], list[tuple[str, str]], dict]:
    """group -> id -> metric -> score (points, 0-100), the (group, id) order of the file, and group -> id -> cluster
    ("group"). A metric is a field that holds a number on some line, or is named like a quantgate metric; on every
    line it must be a finite number on the file's scale (`scale`: 100, or 1 for fractions). A value that is missing,
    null, a string or a boolean is an error naming the line, unless allow_missing drops it from that item."""
    if records is None:
        records = list(read_jsonl_numbered(path, fix=SCORE_LINE))
    metric_fields = _metric_fields(record for _, record in records)
    rows: dict[str, dict[str, dict[str, float]]] = {}
    clusters: dict[str, dict[str, str]] = {}
    first_line: dict[tuple[str, str], int] = {}
    order: list[tuple[str, str]] = []
    values: dict[str, list[tuple[float, str]]] = {}
    for number, record in records:
        where = f"{path}:{number}"
        item_id = record.get("id")
        if isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or item_id == "":
            raise UserError(f"{where}: field 'id': missing or not a string/integer; every line needs an id")
        group = record.get("evalset", DEFAULT_GROUP)
        if not isinstance(group, str) or not group:
            raise UserError(f"{where}: field 'evalset': expected a non-empty string, got {group!r}")
        key = (group, str(item_id))
        if key in first_line:
            raise UserError(
                f"{where}: duplicate id {item_id!r}{_in_group(group)} (first on line {first_line[key]}); "
                "give each item one line (one format per file)"
            )
        first_line[key] = number
        order.append(key)
        cluster = record.get("group")
        if cluster is not None:
            if isinstance(cluster, bool) or not isinstance(cluster, (str, int)) or cluster == "":
                raise UserError(f"{where}: field 'group': expected a non-empty string or integer naming the item's "
                                f"cluster (e.g. its passage), got {cluster!r}")
            clusters.setdefault(group, {})[str(item_id)] = str(cluster)
        metrics: dict[str, float] = {}
        for field in metric_fields:
            value = record.get(field)
            if _is_number(value) and math.isfinite(value):
                metrics[field] = float(value)
                values.setdefault(field, []).append((float(value), where))
            elif _is_number(value):
                raise UserError(f"{where}: field '{field}': {value!r} is not a finite number; score every item "
                                f"on the 0-{scale:g} scale")
            elif not allow_missing:
                raise UserError(f"{where}: field '{field}': {_not_a_number(field in record, value)}; write the "
                                f"score as a number on the 0-{scale:g} scale, or pass --allow-missing to drop it "
                                "(the verdict then cannot be GO)")
        rows.setdefault(group, {})[str(item_id)] = metrics
    if not rows:
        raise UserError(f"{path}: no items; expected one JSON object per line with an 'id' and metric fields")
    _check_scale(path, values, scale)
    if scale != 100.0:
        factor = 100.0 / scale
        rows = {g: {i: {m: v * factor for m, v in row.items()} for i, row in items.items()}
                for g, items in rows.items()}
    return rows, order, clusters


FIDELITY_LINE = ('"fidelity": {"kl": 0.012, "top1_agreement": 97.5, "tokens": 48}: KL(baseline || candidate) in '
                 'nats per token, top-1 agreement in %, output tokens compared (quantgate run writes it in '
                 'samples.jsonl)')


def read_fidelity(path: Path, records: list[tuple[int, dict]] | None = None) -> dict[str, dict[str, FidelityItem]]:
    """group -> id -> the item's fidelity, from the lines that carry a `fidelity` object (samples.jsonl's shape).
    Every figure is checked: KL a finite number >= 0, agreement a percentage, tokens a positive integer (required:
    the figures are token-weighted)."""
    found: dict[str, dict[str, FidelityItem]] = {}
    for number, record in (records if records is not None else read_jsonl_numbered(path, fix=SCORE_LINE)):
        value = record.get("fidelity")
        if value is None:
            continue
        where = f"{path}:{number}: field 'fidelity"
        if not isinstance(value, dict):
            raise UserError(f"{where}': expected an object, got {value!r}; write {FIDELITY_LINE}")
        kl, agreement, tokens = value.get("kl"), value.get("top1_agreement"), value.get("tokens")
        if not (_is_number(kl) and math.isfinite(kl) and kl >= 0):
            raise UserError(f"{where}.kl': {kl!r} is not a KL (a finite number of nats per token, >= 0); "
                            f"write {FIDELITY_LINE}")
        if not (_is_number(agreement) and 0 <= agreement <= 100):
            raise UserError(f"{where}.top1_agreement': {agreement!r} is not a percentage from 0 to 100; "
                            f"write {FIDELITY_LINE}")
        if tokens is None:
            raise UserError(f"{where}.tokens': missing: the output tokens compared weigh each item's KL and "
                            f"agreement; write {FIDELITY_LINE}")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise UserError(f"{where}.tokens': {tokens!r} is not a positive whole number of tokens; "
                            f"write {FIDELITY_LINE}")
        flip = value.get("first_flip")
        group = record.get("evalset", DEFAULT_GROUP)
        found.setdefault(group, {})[str(record.get("id"))] = FidelityItem(
            tokens, float(kl) * tokens, float(agreement) * tokens / 100, first_flip=flip if isinstance(flip, int) else None)
    return found


def _metric_fields(records) -> list[str]:
    """Fields that hold a number on some line or are named like a quantgate metric, in first-seen order."""
    known = set(metric_names())
    fields: dict[str, None] = {}
    for record in records:
        for field, value in record.items():
            if field not in NOT_METRICS and (field in known or _is_number(value)):
                fields.setdefault(field)
    return list(fields)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _not_a_number(present: bool, value: Any) -> str:
    if not present:
        return "missing (other lines have it)"
    if value is None:
        return "null, not a number"
    kinds = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
    kind = kinds.get(type(value), type(value).__name__)
    return f"expected a number, got {value!r} ({kind})"


def _check_scale(path: Path, values: dict[str, list[tuple[float, str]]], scale: float) -> None:
    """Every score within 0..scale; a file of points whose every score is at most 1 is on 0-1, not 0-100."""
    for field, found in values.items():
        for value, where in found:
            if not 0.0 <= value <= scale:
                raise UserError(f"{where}: field '{field}': {value:g} is outside the 0-{scale:g} scale; give "
                                "points, 0-100 (or fractions, 0-1, with --scale 1)")
    every = [value for found in values.values() for value, _ in found]
    if scale == 100.0 and every and max(every) <= 1.0 and any(0.0 < v < 1.0 for v in every):
        raise UserError(f"{path}: every score is between 0 and 1: this looks like a 0-1 scale; multiply by 100 "
                        "(quantgate scores in points, 0-100) or pass --scale 1")


def _merge_groups(base_path: Path, base: dict, cand_path: Path, cand: dict) -> dict[str, dict[str, str]]:
    """One cluster key per item from either file; the two files must not disagree."""
    merged = {group: dict(items) for group, items in base.items()}
    for group, items in cand.items():
        for item_id, cluster in items.items():
            known = merged.setdefault(group, {}).setdefault(item_id, cluster)
            if known != cluster:
                raise UserError(
                    f"{_item_label(group, item_id)}: field 'group' is {known!r} in {base_path} but {cluster!r} in "
                    f"{cand_path}; give each item one group (or leave it out of one file)"
                )
    return merged


def _require_same_ids(base_path: Path, base_rows: dict, cand_path: Path, cand_rows: dict) -> None:
    def keys(rows: dict) -> list[tuple[str, str]]:
        return [(group, item_id) for group, items in rows.items() for item_id in items]

    cand_keys = set(keys(cand_rows))
    base_keys = set(keys(base_rows))
    only_base = [k for k in keys(base_rows) if k not in cand_keys]
    only_cand = [k for k in keys(cand_rows) if k not in base_keys]
    if not only_base and not only_cand:
        return
    missing = [(k, base_path) for k in only_base] + [(k, cand_path) for k in only_cand]
    listed = ", ".join(f"{_item_label(*k)} (only in {p.name})" for k, p in missing[:MAX_LISTED])
    more = f", and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
    raise UserError(
        f"{len(missing)} id(s) are in one file only: {listed}{more}; "
        f"score the same items in {base_path} and {cand_path}"
    )


def _metrics_in(items: dict[str, dict[str, float]]) -> set[str]:
    return {metric for row in items.values() for metric in row}


def _gates(metric_sets: dict, requested: list[str] | None, policy) -> dict[str, list[str]]:
    gates: dict[str, list[str]] = {}
    for group, (base_metrics, cand_metrics) in metric_sets.items():
        shared = base_metrics & cand_metrics
        if requested is None:
            chosen = [m for m in sorted(shared) if policy.margin_for(group, m) is not None]
        else:
            chosen = [m for m in sorted(shared) if m in requested or f"{group}/{m}" in requested]
        gates[group] = chosen
    if requested is not None:
        known = {m for metrics in metric_sets.values() for m in metrics[0] & metrics[1]}
        known |= {f"{g}/{m}" for g, metrics in metric_sets.items() for m in metrics[0] & metrics[1]}
        unknown = [g for g in requested if g not in known]
        if unknown:
            raise UserError(
                f"--gate {' '.join(unknown)}: not a metric in both files "
                f"(available: {', '.join(sorted({m for ms in metric_sets.values() for m in ms[0] & ms[1]}))})"
            )
    return gates


def _only(rows: dict, shared: dict[str, set[str]], order: list[tuple[str, str]]) -> dict:
    """The rows restricted to shared metrics, in the baseline file's item order."""
    items: dict[str, dict[str, dict[str, float]]] = {}
    for group, item_id in order:
        row = rows[group][item_id]
        items.setdefault(group, {})[item_id] = {m: v for m, v in row.items() if m in shared[group]}
    return items


# --- output ---------------------------------------------------------------------------------------


def _print_table(decision, base_scores: dict, confidence: float) -> None:
    header = ["metric", "n", "baseline", "candidate", "delta", f"{confidence:.0%} CI", "margin", "status"]
    rows = []
    for group, metrics in decision.scores.items():
        for metric, s in metrics.items():
            base_value = base_scores.get(group, {}).get(metric, {}).get("value")
            ci = "n/a" if s["ci_low"] is None else f"[{num(s['ci_low'])}, {num(s['ci_high'])}]"
            rows.append(
                [
                    _label(group, metric),
                    str(s["n"]),
                    num(base_value),
                    num(s["value"]),
                    signed(s["delta"]),
                    ci,
                    "n/a" if s["margin"] is None else num(-s["margin"]),
                    s["status"] or "(not gated)",
                ]
            )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write the decision ({exc.strerror or exc}); check --json") from exc
    print(f"wrote {path}", file=sys.stderr)


def _label(group: str, metric: str) -> str:
    return metric if group == DEFAULT_GROUP else f"{group}/{metric}"


def _item_label(group: str, item_id: str) -> str:
    return item_id if group == DEFAULT_GROUP else f"{group}/{item_id}"


def _in_group(group: str) -> str:
    return "" if group == DEFAULT_GROUP else f" in evalset {group!r}"
