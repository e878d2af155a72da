"""The fidelity rule of the verdict, per evalset: does the format reproduce the baseline closely enough?

pass  the KL interval's upper end is at most max_kl and the top-1 agreement interval's lower end at least
      min_top1_agreement, on at least min_items items, and no tail hides behind the mean (confident_flip_tail);
fail  the KL interval lies wholly above max_kl, or the agreement interval wholly below its minimum;
inconclusive otherwise (too few items, an interval that straddles a limit, or no fidelity measured).
How a pass combines with the task metrics (basis) is harness.decide's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Literal, Mapping

from harness import units
from harness.fidelity.summary import FidelityItem, FidelitySummary, summarize_fidelity
from harness.policy import Policy

Status = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class FidelityJudgment:
    evalset: str
    status: Status
    detail: str
    summary: FidelitySummary | None
    max_kl: float
    min_top1_agreement: float

    def as_dict(self) -> dict:
        return {**(self.summary.as_dict() if self.summary else {}), "status": self.status, "detail": self.detail,
                "max_kl": self.max_kl, "min_top1_agreement": self.min_top1_agreement}


def judge_fidelity(evalset: str, items: Mapping[str, FidelityItem] | None, policy: Policy, *,
                   clusters: Mapping[str, str] | None = None, language: str | None = None,
                   note: str | None = None, scored: Collection[str] | None = None) -> FidelityJudgment:
    """The rule on one evalset. `scored`: the items the task metrics scored on both sides; fidelity speaks for
    the set only when it covers every one of them (a pass on part of them is inconclusive, naming the rest)."""
    rule = policy.fidelity
    max_kl, min_agree = rule.kl_limit(evalset, language), rule.agreement_limit(evalset, language)

    def judged(status: Status, detail: str, summary: FidelitySummary | None = None) -> FidelityJudgment:
        return FidelityJudgment(evalset, status, detail, summary, max_kl, min_agree)

    if not items:
        return judged("inconclusive", f"fidelity {note or 'not measured for this evalset'}")
    summary = summarize_fidelity(items, clusters, confidence=policy.confidence, resamples=policy.resamples,
                                 seed=policy.seed)
    kl, agree = summary.kl, summary.top1_agreement
    measured = (f"KL {kl_text(kl.value)} [{kl_text(kl.ci_low)}, {kl_text(kl.ci_high)}] nats/token, top-1 agreement "
                f"{pct(agree.value)} [{pct(agree.ci_low)}, {pct(agree.ci_high)}] over {summary.items} items "
                f"({summary.positions:,} tokens)")
    limits = f"max KL {kl_text(max_kl)}, min agreement {pct(min_agree)}"
    uncovered = [i for i in scored if i not in items] if scored is not None else []
    coverage = (f"; fidelity covers {len(scored) - len(uncovered)} of the {len(scored)} scored items, not "
                f"{len(uncovered)} ({_preview(uncovered)})" if uncovered else "")
    if kl.ci_low is None or agree.ci_low is None or kl.ci_high is None or agree.ci_high is None:
        return judged("inconclusive", f"{measured}: no interval on fewer than 2 items; add items{coverage}", summary)
    if kl.ci_low > max_kl or agree.ci_high < min_agree:
        return judged("fail", f"{measured} is further from the baseline than the policy allows ({limits})"
                      + coverage, summary)
    needed = rule.min_items or policy.min_items
    if kl.ci_high <= max_kl and agree.ci_low >= min_agree:
        flat = _zero_width(kl, agree, summary.items)
        if flat:
            return judged("inconclusive", f"{measured}: {flat}{coverage}", summary)
        tail = confident_flip_tail(items)
        if tail:
            return judged("inconclusive", f"{measured} is within {limits}, but {tail}{coverage}", summary)
        if summary.items < needed:
            return judged("inconclusive", f"{measured} is within {limits}, but on only {summary.items} items; "
                                          f"the fidelity rule needs at least {needed}{coverage}", summary)
        if uncovered:
            return judged("inconclusive", f"{measured} is within {limits}, but it cannot speak for the set"
                                          f"{coverage}: measure fidelity on every scored item (rerun without "
                                          "--resume, or add the items' fidelity objects)", summary)
        return judged("pass", f"{measured} is within {limits}", summary)
    return judged("inconclusive", f"{measured} straddles {limits}; add items to narrow it{coverage}", summary)


CONFIDENT_KL = 1.0  # nats at one position: the format pushes a token the baseline was sure of well down
MAX_CONFIDENT_SHARE = 0.10  # of items; more is a tail the mean may hide


def confident_flip_tail(items: Mapping[str, FidelityItem]) -> str | None:
    """Why a mean within the limits does not speak for the set, or None: more than MAX_CONFIDENT_SHARE of the items
    (and more than one) hold a position with KL above CONFIDENT_KL. Damage confined to one kind of token (the digits
    of numeric answers, a name) is diluted by every other token of the answer, but where it bites it is a confident
    disagreement; close formats show few (int8 on the demo model: 1 of 88 item measurements, its largest 1.31 nats;
    GPTQ and AWQ 4-bit: 17-100% of items). Items without per-position figures (`quantgate decide` input) are not
    counted."""
    known = {i: item for i, item in items.items() if item.kl_by_position}
    tail = sorted(i for i, item in known.items() if max(item.kl_by_position) > CONFIDENT_KL)
    if len(tail) <= max(1, MAX_CONFIDENT_SHARE * len(known)):
        return None
    return (f"{len(tail)} of its {len(known)} items hold a position where the format is confidently off the "
            f"baseline's token (KL above {CONFIDENT_KL:g} nat: {_preview(tail)}), more than "
            f"{MAX_CONFIDENT_SHARE:.0%}: damage confined to a kind of token (numbers, names) that the mean dilutes; "
            "judge by the task metrics, or read those items")


def _zero_width(kl, agree, items: int) -> str | None:
    """Why intervals without spread are not evidence (as a constant difference is not for the task rule), or None.
    Agreement of 100% on every item beside a KL that varies is what a close format shows, and stands; so does
    KL 0 with 100% agreement on every item, a format that reproduces the baseline exactly. A constant KL above 0
    is what no real pair of models produces: figures copied or made up."""
    if kl.ci_low == kl.ci_high and not (kl.value == 0.0 and agree.value == 100.0):
        return (f"every one of the {items} items has the same KL, so its interval has zero width and is not "
                "evidence (real outputs vary item to item; check that the fidelity figures were measured)")
    if agree.ci_low == agree.ci_high and agree.value is not None and agree.value < 100.0:
        return (f"every one of the {items} items has the same top-1 agreement below 100%, so its interval has zero "
                "width and is not evidence (check that the fidelity figures were measured)")
    return None


def _preview(ids: list[str], limit: int = 5) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f", … {len(ids) - limit} more" if len(ids) > limit else "")


def kl_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else units.format_number(value, 1, missing="n/a") + "%"
