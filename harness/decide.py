"""Verdicts: each candidate format against the baseline, item by item, under a policy.

GO when every gated metric's interval lies above -margin on enough evidence and every floor and budget holds;
NO-GO when a gated interval lies wholly below -margin (at any n: a true drop beyond the margin is never GO),
a floor or budget fails, or the format crashed;
INCONCLUSIVE otherwise (the data cannot tell: the reason says how large a drop the set can detect).

Evidence rules: an interval above -margin is not enough for a gated metric to pass. It also needs
- at least the policy's min_items paired items (per "evalset/metric", "metric" or the default);
- a set that could have detected a drop of the margin: MDE at the policy's power <= margin. With zero
  spread (identical scores, a uniform shift) the MDE is the resolution 100 / n, so a zero-width interval
  from a constant difference proves nothing on a small set;
- a metric that tells formats apart: not 0 for the baseline on every item, and not one constant for every
  item of both formats.
Short of these the check is INCONCLUSIVE and its reason names the rule and about how many items would do.
Items that share a context (or a spec's `group` column) are clustered: FormatOutcome.clusters maps each
item to its cluster, and the interval and MDE come from the cluster bootstrap and cluster-robust t.
A latency p95 within budget passes only on at least P95_MIN_REQUESTS requests; exceeding it fails at any count.
Capacity (the policy's [serving] target_gpu set): the vLLM plan at the policy's target must hold min_concurrency
sequences of max_model_len (FormatOutcome.serving_fit, planned in assemble.py); a format vLLM cannot serve, or one
that holds fewer, fails. The recommendation, the smallest GO format, is therefore one that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal

from harness import units
from harness.fidelity.rule import FidelityJudgment, judge_fidelity
from harness.fidelity.summary import FidelityItem
from harness.capacity.gpus import with_article
from harness.measure.latency import P95_MIN_REQUESTS
from harness.policy import Policy
from harness.report.schema import Saturation
from harness.stats import PairedComparison, compare_paired, items_needed

Verdict = Literal["GO", "NO-GO", "INCONCLUSIVE"]
CheckStatus = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class ServingFit:
    """A format's vLLM plan at the policy's serving target, as the capacity check needs it."""

    gpu: str  # the target GPU's name, e.g. "L4"
    max_model_len: int
    max_concurrency: int  # sequences of max_model_len the KV cache holds (0: not one)
    servable: bool = True  # False: vLLM cannot serve the format there at all (reason says why)
    reason: str = ""  # why it does not fit or cannot be served; "" when it fits
    weights_source: str = "measured"  # or "estimated from the config"


@dataclass(frozen=True)
class FormatOutcome:
    """What one format produced: per-item scores and measurements (None where not measured)."""

    name: str
    status: Literal["ok", "failed", "interrupted"] = "ok"  # interrupted: not run because the run was stopped
    error: str | None = None
    items: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # evalset -> id -> metric -> score
    gates: dict[str, list[str]] = field(default_factory=dict)  # evalset -> gated metrics
    peak_bytes: int | None = None
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    latency_requests: int | None = None  # requests the latency p95s rest on; None: unknown (not held against it)
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)  # evalset -> id -> cluster key (absent: own)
    cluster_by: dict[str, str] = field(default_factory=dict)  # evalset -> what the clusters are ("context", a column)
    calibration_overlap: tuple[str, ...] = ()  # "evalset/id" of evaluated items its calibration texts contained
    serving_fit: ServingFit | None = None  # the vLLM plan at the policy's serving target; None: not planned
    latency_source: str = "transformers"  # or "vLLM server": where ttft/tpot p95 were measured
    served_refusal: str | None = None  # backend vllm: why vLLM cannot serve this format (then it cannot be GO)
    saturation: Saturation | None = None  # backend vllm: the saturation check at the planned flags (load.saturation)
    fidelity: dict[str, dict[str, FidelityItem]] = field(default_factory=dict)  # evalset -> id -> against baseline
    fidelity_note: str | None = None  # why fidelity was not measured (harness.fidelity.plan)
    languages: dict[str, str] = field(default_factory=dict)  # evalset -> language ("en", "zh")


@dataclass(frozen=True)
class Check:
    name: str
    kind: Literal["metric", "floor", "memory", "latency", "run", "calibration", "capacity", "fidelity", "spot_check"]
    status: CheckStatus
    detail: str
    reason: str  # the line for `reasons` when the check does not pass
    # inconclusive only for want of items (an interval that straddles the margin, too few items, MDE above the
    # margin): the open question the fidelity rule may settle (Policy.fidelity.basis)
    wants_evidence: bool = False

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind, "status": self.status, "detail": self.detail,
                "reason": self.reason}


@dataclass(frozen=True)
class FormatDecision:
    name: str
    verdict: Verdict
    reasons: list[str]
    checks: list[dict[str, str]]
    scores: dict[str, dict[str, dict[str, Any]]]  # evalset -> metric -> report.json score entry
    # which rule carried the verdict: "tasks", "fidelity", "tasks and fidelity"; "" when none did (NO-GO or
    # INCONCLUSIVE, or a failed run)
    rule: str = ""
    fidelity: dict[str, dict[str, Any]] = field(default_factory=dict)  # evalset -> FidelityJudgment.as_dict()
    # [spot_checks] required and none folded in yet: the report's spot_checks entry (SpotCheckEntry's fields),
    # holding the verdict without them so that `quantgate report --reviews` can fold judgments in later
    spot_checks: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons, "checks": self.checks, "scores": self.scores,
                "rule": self.rule, "fidelity": self.fidelity}


def decide_format(baseline: FormatOutcome, candidate: FormatOutcome, policy: Policy) -> FormatDecision:
    if "interrupted" in (candidate.status, baseline.status):  # never judged: not a NO-GO, whose reason would be false
        which = candidate.name if candidate.status == "interrupted" else "the baseline"
        detail = f"{which} did not run: the run was interrupted"
        return _decision(candidate.name, [Check("run", "run", "inconclusive", detail,
                                                f"{detail}; `quantgate run --resume --out DIR` finishes it")], {})
    if candidate.status != "ok":
        error = candidate.error or f"{candidate.name} failed without an error message; see its log"
        return _decision(candidate.name, [Check("run", "run", "fail", error, error)], {})
    if baseline.status != "ok":
        error = f"baseline failed, so {candidate.name} cannot be compared: {baseline.error or 'no error message'}"
        return _decision(candidate.name, [Check("run", "run", "fail", error, error)], {})

    checks: list[Check] = []
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for evalset in _ordered_union(baseline.items, candidate.items):
        base_items = baseline.items.get(evalset, {})
        cand_items = candidate.items.get(evalset, {})
        pairing = _pairing_check(evalset, candidate.name, base_items, cand_items)
        if pairing is not None:
            checks.append(pairing)
        gated = set(baseline.gates.get(evalset, [])) | set(candidate.gates.get(evalset, []))
        metrics = _ordered_union(
            *(row for row in base_items.values()),
            *(row for row in cand_items.values()),
            baseline.gates.get(evalset, []),
            candidate.gates.get(evalset, []),
        )
        scores[evalset] = {}
        clustering = _clustering(evalset, baseline, candidate)
        for metric in metrics:
            entry, metric_checks = _score_metric(
                evalset, metric, base_items, cand_items, metric in gated, policy, clustering
            )
            scores[evalset][metric] = entry
            checks.extend(metric_checks)
    judgments = _fidelity_judgments(baseline, candidate, policy, decided=[e for e in scores if any(
        entry["gated"] for entry in scores[e].values())])
    # Without any fidelity figures (`quantgate decide` on scores alone, a backend that measures none) the rule has
    # nothing to say, and a line per evalset would only repeat that; "tasks_and_fidelity" needs it all the same.
    if policy.fidelity.basis == "tasks_and_fidelity" or (policy.fidelity.basis != "tasks" and candidate.fidelity):
        checks.extend(Check(f"{j.evalset}/fidelity", "fidelity", j.status, j.detail, f"{j.evalset}/fidelity: {j.detail}")
                      for j in judgments)
    checks.extend(_budget_checks(candidate, policy))
    if candidate.calibration_overlap:
        checks.append(_calibration_check(candidate.calibration_overlap))
    decision = _decision(candidate.name, checks, scores, policy.fidelity.basis,
                         {j.evalset: j.as_dict() for j in judgments})
    return _spot_checks_pending(decision, checks, policy) if policy.spot_checks.required else decision


SPOT_CHECKS_PENDING = ("spot checks are required by the policy and none of its random sample was judged: run "
                       "`quantgate review RUN_DIR`, judge the items, then `quantgate report RUN_DIR --reviews "
                       "review-*.jsonl`")


def _spot_checks_pending(decision: FormatDecision, checks: list[Check], policy: Policy) -> FormatDecision:
    """[spot_checks] required and no judgments yet (every command that decides: run, decide, report, compare): the
    check is open, so no GO; the verdict without it is kept for the fold of the judgments (harness.review.fold)."""
    pending = Check("spot_checks", "spot_check", "inconclusive", SPOT_CHECKS_PENDING,
                    f"spot_checks: {SPOT_CHECKS_PENDING}")
    folded = _decision(decision.name, [*checks, pending], decision.scores, policy.fidelity.basis, decision.fidelity)
    entry = {**empty_spot_checks(), "status": "inconclusive", "detail": SPOT_CHECKS_PENDING,
             "verdict_without": decision.verdict, "rule_without": decision.rule or None,
             "reasons_without": list(decision.reasons)}
    return replace(folded, spot_checks=entry)


def empty_spot_checks() -> dict[str, Any]:
    """A report spot_checks entry's figures before any judgment (SpotCheckEntry; no plan yet)."""
    empty = {"count": 0, "of": 0, "value": 0.0, "ci_low": 0.0, "ci_high": 100.0}
    return {"plan": "", "reviewers": [], "judged": 0, "judgments": 0, "worse": dict(empty),
            "candidate_unacceptable": dict(empty), "baseline_unacceptable": dict(empty), "increase": 0.0,
            "increase_low": -100.0, "increase_high": 100.0, "agreement": None, "multiply_judged": 0,
            "worst_judged": 0, "worst_unacceptable": 0, "unacceptable_items": []}


def _fidelity_judgments(baseline: FormatOutcome, candidate: FormatOutcome, policy: Policy,
                        decided: list[str]) -> list[FidelityJudgment]:
    """The fidelity rule on every evalset the verdict gates on (harness.fidelity.rule)."""
    return [judge_fidelity(evalset, candidate.fidelity.get(evalset), policy,
                           clusters=baseline.clusters.get(evalset) or candidate.clusters.get(evalset),
                           language=candidate.languages.get(evalset) or baseline.languages.get(evalset),
                           note=candidate.fidelity_note, scored=_scored_ids(baseline, candidate, evalset))
            for evalset in decided]


def _scored_ids(baseline: FormatOutcome, candidate: FormatOutcome, evalset: str) -> list[str]:
    """The items both formats scored in `evalset`: what the fidelity rule must cover to speak for the set."""
    cand_items = candidate.items.get(evalset, {})
    return [i for i in baseline.items.get(evalset, {}) if i in cand_items]


def _calibration_check(overlapping: tuple[str, ...]) -> Check:
    """Calibration that saw evaluated items (run with --allow-calibration-overlap) biases scores toward the
    baseline's: such a format may still be NO-GO, never GO."""
    shown = ", ".join(overlapping[:5]) + (" ..." if len(overlapping) > 5 else "")
    detail = f"calibration texts contain {len(overlapping)} evaluated item(s): {shown}"
    return Check("calibration/overlap", "calibration", "inconclusive", detail,
                 f"{detail} (allowed by --allow-calibration-overlap): its scores may be biased toward GO, so it "
                 "cannot be GO; calibrate on text that is not evaluated (--calibration FILE)")


def _decision(name: str, checks: list[Check], scores: dict, basis: str = "tasks",
              fidelity: dict[str, dict[str, Any]] | None = None) -> FormatDecision:
    """The verdict from the checks. Any fail: NO-GO. Then which rule carries a GO (Policy.fidelity.basis):
    "tasks": every check passes (fidelity is reported, not judged); "tasks_and_fidelity": every check passes,
    the fidelity checks included; "tasks_or_fidelity": every check but the fidelity ones passes (the task rule),
    or every fidelity check passes and the only open checks are task metrics that want more items (the fidelity
    rule). Otherwise INCONCLUSIVE, with every open check's reason."""
    failed = [c for c in checks if c.status == "fail"]
    open_ = [c for c in checks if c.status == "inconclusive"]
    fidelity_checks = [c for c in checks if c.kind == "fidelity"]
    fidelity_holds = bool(fidelity_checks) and all(c.status == "pass" for c in fidelity_checks)
    task_open = [c for c in open_ if c.kind != "fidelity"]
    rule = ""
    if failed:
        verdict: Verdict = "NO-GO"
    elif basis == "tasks_or_fidelity" and not task_open:
        verdict, rule = "GO", "tasks and fidelity" if fidelity_holds else "tasks"
    elif basis == "tasks_or_fidelity" and fidelity_holds and all(c.wants_evidence for c in task_open):
        verdict, rule = "GO", "fidelity"
    elif not open_:
        verdict, rule = "GO", "tasks and fidelity" if fidelity_checks else "tasks"
    else:
        verdict = "INCONCLUSIVE"
    if verdict == "GO":
        reasons = [_go_reason(checks, rule, task_open)]
    else:
        reasons = [c.reason for c in failed + open_]
        blocking = [c.name for c in task_open if not c.wants_evidence]
        if verdict == "INCONCLUSIVE" and basis == "tasks_or_fidelity" and fidelity_holds and blocking:
            reasons.append(f"fidelity holds on every gated evalset, but the fidelity rule cannot carry a GO past "
                           f"{', '.join(blocking)}: a mean drop beyond its margin, a drop its interval shows to be real, "
                           "or a check fidelity does not answer")
    return FormatDecision(name, verdict, reasons, [c.as_dict() for c in checks], scores, rule, fidelity or {})


def _go_reason(checks: list[Check], rule: str, task_open: list[Check]) -> str:
    kinds = [c.kind for c in checks]
    others = [
        *([f"{kinds.count('floor')} floor(s) met"] if "floor" in kinds else []),
        *(["memory within budget"] if "memory" in kinds else []),
        *(["latency within budget"] if "latency" in kinds else []),
        *(["fits the serving target"] if "capacity" in kinds else []),
    ]
    metrics = f"{kinds.count('metric')} gated metric(s) above their margins"
    fidelity = f"fidelity within the policy's limits on {kinds.count('fidelity')} evalset(s)"
    if rule == "fidelity":
        wanting = ", ".join(c.name for c in task_open)
        return ("GO by the fidelity rule: " + ", ".join([fidelity, *others]) + f"; the task metrics show no drop "
                f"beyond their margins, but their sets are too small to show it alone ({wanting})")
    if rule == "tasks and fidelity":
        return "GO by the task and fidelity rules: every check passes: " + ", ".join([metrics, fidelity, *others])
    return "GO by the task rule: every check passes: " + ", ".join([metrics, *others])


# --- metrics --------------------------------------------------------------------------------------


def _pairing_check(evalset: str, name: str, base_items: dict, cand_items: dict) -> Check | None:
    only_base = [i for i in base_items if i not in cand_items]
    only_cand = [i for i in cand_items if i not in base_items]
    if not only_base and not only_cand:
        return None
    paired = len(base_items) - len(only_base)
    sides = []
    if only_base:
        sides.append(f"{len(only_base)} item(s) have no {name} score ({_preview(only_base)})")
    if only_cand:
        sides.append(f"{len(only_cand)} item(s) have no baseline score ({_preview(only_cand)})")
    detail = "; ".join(sides) + f"; compared on the {paired} paired item(s)"
    name = f"{evalset}/items"
    return Check(name, "run", "inconclusive", detail, f"{name}: {detail}")


def _unscored_check(name: str, metric: str, base_items: dict, cand_items: dict, paired: int) -> Check | None:
    """Items of the set without this metric on one side or both (`quantgate decide --allow-missing` dropped a
    value that was not a number): the comparison rests on the others, a subset the data chose, so not a pass.
    Every dropped item is counted, those dropped on both sides included."""
    items = [i for i in base_items if i in cand_items]
    if not any(metric in base_items[i] or metric in cand_items[i] for i in items):
        return None  # a metric this set never scored: the metric check says so
    sides = [(label, [i for i in items if metric not in mine[i]])
             for label, mine in (("baseline", base_items), ("candidate", cand_items))]
    found = [f"{len(ids)} item(s) without a numeric {metric} for the {label} ({_preview(ids)})"
             for label, ids in sides if ids]
    if not found:
        return None
    dropped = len(items) - paired
    detail = (f"{dropped} of {len(items)} item(s) dropped: " + "; ".join(found)
              + f" (--allow-missing); compared on the {paired} scored on both sides, so it cannot be GO")
    return Check(f"{name}/missing", "run", "inconclusive", detail, f"{name}: {detail}")


@dataclass(frozen=True)
class _Clustering:
    keys: dict[str, str]  # id -> cluster key; an id without one is its own cluster
    by: str  # what the clusters are, for the method line

    def of(self, ids: list[str]) -> list[tuple[str, str]] | None:
        if not self.keys:
            return None
        return [("cluster", self.keys[i]) if i in self.keys else ("item", i) for i in ids]


def _clustering(evalset: str, baseline: FormatOutcome, candidate: FormatOutcome) -> _Clustering:
    keys = baseline.clusters.get(evalset) or candidate.clusters.get(evalset) or {}
    by = baseline.cluster_by.get(evalset) or candidate.cluster_by.get(evalset) or "cluster"
    return _Clustering(keys, by)


def _score_metric(
    evalset: str, metric: str, base_items: dict, cand_items: dict, gated: bool, policy: Policy,
    clustering: _Clustering,
) -> tuple[dict[str, Any], list[Check]]:
    ids = [i for i, row in base_items.items() if metric in row and metric in cand_items.get(i, {})]
    base = [float(base_items[i][metric]) for i in ids]
    cand = [float(cand_items[i][metric]) for i in ids]
    comparison = compare_paired(
        base, cand, confidence=policy.confidence, resamples=policy.resamples, seed=policy.seed,
        power=policy.power, clusters=clustering.of(ids),
    )
    method = comparison.method
    if comparison.clusters is not None:
        method += f", clustered by {clustering.by} ({comparison.clusters} clusters)"
    value = sum(cand) / len(cand) if cand else None
    margin = policy.margin_for(evalset, metric)
    name = f"{evalset}/{metric}"
    checks: list[Check] = []
    if gated:
        evidence = _Evidence(policy.min_items_at(evalset, metric), policy.power, policy.confidence, clustering.by)
        checks.append(_metric_check(name, metric, comparison, margin, evidence, base, cand))
    floor = policy.floor_for(evalset, metric)
    if floor is not None:
        checks.append(_floor_check(name, value, floor))
    unscored = _unscored_check(name, metric, base_items, cand_items, len(ids))
    if unscored is not None:
        checks.append(unscored)
    entry = {
        "value": value,
        "delta": comparison.delta,
        "ci_low": comparison.ci_low,
        "ci_high": comparison.ci_high,
        "n": comparison.n,
        "margin": margin,
        "mde": comparison.mde,
        "p_value": comparison.p_value,
        "method": method,
        "gated": gated,
        "status": checks[0].status if gated else None,
    }
    return entry, checks


@dataclass(frozen=True)
class _Evidence:
    """What a pass needs beyond an interval above -margin."""

    min_items: int
    power: float
    confidence: float
    cluster_by: str


def _metric_check(
    name: str, metric: str, c: PairedComparison, margin: float | None, evidence: _Evidence,
    base: list[float], cand: list[float],
) -> Check:
    def check(status: CheckStatus, detail: str, wants_evidence: bool = False) -> Check:
        return Check(name, "metric", status, detail, f"{name}: {detail}", wants_evidence)

    if margin is None:
        return check("inconclusive", f"gated, but the policy sets no margin; add `{metric} = <points>` under [margins]")
    if c.n == 0:
        return check("inconclusive", "no paired items to compare; score this evalset for both formats")
    if c.ci_low is None or c.ci_high is None:
        if c.clusters == 1:
            return check("inconclusive", f"{signed(c.delta)} points on {c.n} paired items that all share one "
                                         f"{evidence.cluster_by}: no interval; add items from other clusters")
        return check("inconclusive", f"{signed(c.delta)} points on only {c.n} paired item: no interval; add items")
    measured = f"{signed(c.delta)} points [{num(c.ci_low)}, {num(c.ci_high)}]"
    if c.method.endswith("exact McNemar"):
        measured += f" ({c.worsened} items worse, {c.improved} better, McNemar p={c.p_value:.3g})"
    if c.clusters is not None:
        measured += f" over {c.clusters} clusters by {evidence.cluster_by}"
    bound = f"the {num(-margin)} margin"
    if c.ci_high < -margin:
        return check("fail", f"{measured} is worse than {bound}")
    flat = _flat(metric, base, cand)
    if flat is not None:
        return check("inconclusive", flat)
    real = _real_drop(c)
    if c.ci_low > -margin:
        gaps = _evidence_gaps(c, margin, evidence)
        if not gaps:
            return check("pass", f"{measured} lies above {bound}")
        return check("inconclusive", f"{measured} lies above {bound}, but that is not evidence yet: {'; '.join(gaps)}; "
                                     f"{_items_to_add(c, margin, evidence)}{real}", wants_evidence=not real)
    # A mean drop beyond the margin is a task signal the fidelity rule must not talk over, however wide the interval;
    # so is a drop the interval shows to be real (_real_drop).
    return check(
        "inconclusive",
        f"{measured} straddles {bound}; add items: this set can detect drops of {num(c.mde)} points or more{real}",
        wants_evidence=c.delta is not None and c.delta >= -margin and not real,
    )


def _real_drop(c: PairedComparison) -> str:
    """Why the fidelity rule may not carry a GO past this metric although its mean drop is within the margin, or "".
    Fidelity is teacher-forced: it shows the format's next-token distributions stay close along the baseline's own
    output, and vouches for the free-running output only up to the first position where the format's top token
    differs (or sooner: a tie in a bf16 baseline's own top-1 can break either way in generation). On long
    generations nearly every item departs somewhere (97-98% top-1 agreement over 100-token summaries), and whether a departure costs score is what the task metric measures. Where its interval lies
    wholly below 0 the departures do cost score, measurably, whatever the KL (Gemma 3 270M on CNN/DM: fp8 at KL
    0.0074 loses 2.0 [-3.9, -0.1] ROUGE-L, docs/fidelity.md), so the drop may pass the margin and only more items
    can say."""
    if c.ci_high is None or c.ci_high >= 0:
        return ""
    return "; the drop is real: its interval lies wholly below 0"


def _flat(metric: str, base: list[float], cand: list[float]) -> str | None:
    """Why this metric cannot tell formats apart on these items, or None when it can."""
    if all(b == 0 for b in base):
        return (f"the baseline scores 0 on all {len(base)} items, so {metric} cannot tell formats apart; "
                "check the set's language, prompt template and references")
    if all(v == base[0] for v in (*base, *cand)):
        return (f"both formats score {num(base[0])} on all {len(base)} items, so {metric} cannot tell formats apart; "
                "use items that some format gets wrong, or gate on another metric")
    return None


def _evidence_gaps(c: PairedComparison, margin: float, evidence: _Evidence) -> list[str]:
    gaps = []
    if c.n < evidence.min_items:
        gaps.append(f"only {c.n} paired items, and GO needs at least {evidence.min_items} (min_items)")
    if c.mde is None or c.mde > margin:
        spread = f", the resolution 100/{c.n} of a zero-spread set" if c.se == 0 else ""
        gaps.append(f"the smallest drop it can detect at {evidence.power:.0%} power is {num(c.mde)} points "
                    f"(MDE{spread}), above the {num(margin)} margin")
    return gaps


def _items_to_add(c: PairedComparison, margin: float, evidence: _Evidence) -> str:
    needed = items_needed(c, margin, evidence.confidence, evidence.power)
    if needed is None:
        return f"no number of items shows a drop of at most {num(margin)}: set a margin above 0"
    if c.mde is None or c.mde > margin:
        needed = max(needed, c.n + 1)
    return f"add items: about {max(needed, evidence.min_items)} paired items in all would do"


def _floor_check(name: str, value: float | None, floor: float) -> Check:
    if value is None:
        detail = f"no scored items to check against the {num(floor)} floor"
        return Check(name, "floor", "inconclusive", detail, f"{name}: {detail}")
    if value >= floor:
        return Check(name, "floor", "pass", f"{num(value)} meets the {num(floor)} floor", "")
    detail = f"{num(value)} is below the {num(floor)} floor"
    return Check(name, "floor", "fail", detail, f"{name}: {detail}")


# --- budgets --------------------------------------------------------------------------------------


def _budget_checks(candidate: FormatOutcome, policy: Policy) -> list[Check]:
    checks = []
    budget = policy.memory_budget_bytes
    if budget is not None:
        checks.append(
            _budget_check("memory", "memory", "peak memory", candidate.peak_bytes, budget, format_bytes)
        )
    where = "" if candidate.latency_source == "transformers" else f" ({candidate.latency_source})"
    for name, label, measured, limit in (
        ("latency/ttft_p95", f"TTFT p95{where}", candidate.ttft_p95_ms, policy.max_ttft_p95_ms),
        ("latency/tpot_p95", f"TPOT p95{where}", candidate.tpot_p95_ms, policy.max_tpot_p95_ms),
    ):
        if limit is not None:
            checks.append(
                _budget_check(name, "latency", label, measured, limit, format_ms, candidate.latency_requests)
            )
    if policy.serving.checked:
        checks.append(_capacity_check(candidate.serving_fit, policy))
    checks += _served_checks(candidate)
    return checks


def _served_checks(candidate: FormatOutcome) -> list[Check]:
    """Backend vllm: a format the user's vLLM cannot serve cannot be GO; nor one whose planned flags do not hold
    under load (max-num-seqs requests of max-model-len: the server died, failed a request or preempted)."""
    checks = []
    if candidate.served_refusal:
        detail = f"vLLM cannot serve it: {candidate.served_refusal}"
        checks.append(Check("served", "run", "fail", detail, detail))
    if candidate.saturation is not None:
        held = candidate.saturation
        if held.holds:
            checks.append(Check("capacity/saturation", "capacity", "pass", "holds under load: " + held.reason, ""))
        else:
            detail = "does not hold under load: " + held.reason
            checks.append(Check("capacity/saturation", "capacity", "fail", detail, f"capacity: {detail}"))
    return checks


def _capacity_check(fit: ServingFit | None, policy: Policy) -> Check:
    """Whether the vLLM plan at the policy's serving target holds min_concurrency sequences of max_model_len."""
    serving = policy.serving
    need, length, gpu = serving.concurrency, serving.length, serving.target_gpu
    where = f"{length:,} tokens on {with_article(gpu)}"
    if fit is None:
        detail = (f"the capacity at the serving target ({where}) was not planned: the model's config is not one the "
                  "planners read")
        return Check("capacity", "capacity", "inconclusive", detail, f"capacity: {detail}")
    if not fit.servable:
        detail = (f"vLLM cannot serve it on {with_article(gpu)}, policy needs {need} {_sequences(need)} of {length:,} "
                  f"tokens: {fit.reason}")
        return Check("capacity", "capacity", "fail", detail, f"capacity: {detail}")
    held = f"holds {fit.max_concurrency:,} {_sequences(fit.max_concurrency)} of {where}, policy needs {need}"
    if fit.max_concurrency < need:
        detail = held + (f" ({fit.reason})" if fit.reason else "")
        return Check("capacity", "capacity", "fail", detail, f"capacity: {detail}")
    return Check("capacity", "capacity", "pass", held, "")


def _sequences(count: int) -> str:
    return "sequence" if count == 1 else "sequences"


def _budget_check(name, kind, label, measured, limit, fmt, requests: int | None = None) -> Check:
    if measured is None:
        detail = f"{label} was not measured, so the {fmt(limit)} budget cannot be checked"
        return Check(name, kind, "inconclusive", detail, f"{name}: {detail}")
    if measured > limit:
        detail = f"{label} {fmt(measured)} exceeds the {fmt(limit)} budget"
        return Check(name, kind, "fail", detail, f"{name}: {detail}")
    within = f"{label} {fmt(measured)} within the {fmt(limit)} budget"
    if requests is not None and requests < P95_MIN_REQUESTS:
        detail = (f"{within}, but the p95 of {requests} requests is about the max of {requests}; it needs >= "
                  f"{P95_MIN_REQUESTS} requests (quantgate run --latency-requests {P95_MIN_REQUESTS})")
        return Check(name, kind, "inconclusive", detail, f"{name}: {detail}")
    return Check(name, kind, "pass", within, "")


# --- baseline, recommendation, exit code ----------------------------------------------------------


def baseline_scores(baseline: FormatOutcome) -> dict[str, dict[str, dict[str, Any]]]:
    """The baseline's report.json scores: mean values and n; the comparison fields are null."""
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for evalset, items in baseline.items.items():
        gated = set(baseline.gates.get(evalset, []))
        scores[evalset] = {}
        for metric in _ordered_union(*items.values()):
            values = [float(row[metric]) for row in items.values() if metric in row]
            scores[evalset][metric] = {
                "value": sum(values) / len(values) if values else None,
                "delta": None,
                "ci_low": None,
                "ci_high": None,
                "n": len(values),
                "margin": None,
                "mde": None,
                "p_value": None,
                "method": None,
                "gated": metric in gated,
                "status": None,
            }
    return scores


def recommend(verdicts: dict[str, str], peak_bytes: dict[str, int | None]) -> dict[str, Any]:
    """The GO format with the smallest peak memory, and the next smallest as runner-up (verdicts: candidate ->
    its verdict)."""
    go = sorted(
        (name for name, verdict in verdicts.items() if verdict == "GO"),
        key=lambda name: (peak_bytes.get(name) is None, peak_bytes.get(name) or 0, name),
    )
    if not go:
        if not verdicts:
            why = "no candidate formats were evaluated; keep serving the baseline"
        else:
            listed = ", ".join(f"{name}: {verdict}" for name, verdict in verdicts.items())
            why = f"no candidate format is GO ({listed}); keep serving the baseline"
        return {"format": None, "why": why, "runner_up": None}
    best = go[0]
    runner_up = go[1] if len(go) > 1 else None
    why = f"{best} is GO with the smallest peak memory ({_peak(peak_bytes, best)})"
    if runner_up is None:
        why += "; it is the only GO format"
    else:
        why += f"; runner-up {runner_up} ({_peak(peak_bytes, runner_up)})"
    return {"format": best, "why": why, "runner_up": runner_up}


def exit_code(verdicts: dict[str, str], policy: Policy) -> int:
    """0 when every candidate is GO (or INCONCLUSIVE under inconclusive_is = "pass"), else 1 (verdicts: candidate
    -> its verdict)."""
    acceptable = {"GO", "INCONCLUSIVE"} if policy.inconclusive_is == "pass" else {"GO"}
    return 0 if all(verdict in acceptable for verdict in verdicts.values()) else 1


# --- formatting -----------------------------------------------------------------------------------


def num(x: float | None, digits: int = 1) -> str:
    """A number for a reason line, with a real minus sign; `n/a` for None."""
    return units.format_number(x, digits, missing="n/a")


def signed(x: float | None, digits: int = 1) -> str:
    """+1.2 / −1.2 / +0.0 for a reason line; `n/a` for None."""
    return units.format_signed(x, digits, missing="n/a", plus_zero=True)


def format_bytes(n: float | None) -> str:
    """'1.50 GiB' from a GiB up, else '512.0 MiB'; `n/a` for None."""
    return units.format_bytes(n, missing="n/a", smallest="MiB")


def format_ms(ms: float | None) -> str:
    """'12.3 ms' (never seconds: budgets are in ms); `n/a` for None."""
    return units.format_ms(ms, missing="n/a", seconds=False)


def _peak(peak_bytes: dict[str, int | None], name: str) -> str:
    peak = peak_bytes.get(name)
    return "peak not measured" if peak is None else format_bytes(peak)


def _preview(ids: list[str], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f", … {len(ids) - limit} more" if len(ids) > limit else "")


def _ordered_union(*groups: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for group in groups:
        for key in group:
            seen.setdefault(key, None)
    return list(seen)
