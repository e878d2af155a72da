"""The fidelity rule of the verdict, per evalset: does the format reproduce the baseline closely enough?

pass  the KL interval's upper end is at most max_kl and the top-1 agreement interval's lower end at least
      min_top1_agreement, on at least min_items items;
fail  the KL interval lies wholly above max_kl, or the agreement interval wholly below its minimum;
inconclusive otherwise (too few items, an interval that straddles a limit, or no fidelity measured).
How a pass combines with the task metrics (basis) is harness.decide's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

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
                   note: str | None = None) -> FidelityJudgment:
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
    if kl.ci_low is None or agree.ci_low is None or kl.ci_high is None or agree.ci_high is None:
        return judged("inconclusive", f"{measured}: no interval on fewer than 2 items; add items", summary)
    if kl.ci_low > max_kl or agree.ci_high < min_agree:
        return judged("fail", f"{measured} is further from the baseline than the policy allows ({limits})", summary)
    needed = rule.min_items or policy.min_items
    if kl.ci_high <= max_kl and agree.ci_low >= min_agree:
        if summary.items < needed:
            return judged("inconclusive", f"{measured} is within {limits}, but on only {summary.items} items; "
                                          f"the fidelity rule needs at least {needed}", summary)
        return judged("pass", f"{measured} is within {limits}", summary)
    return judged("inconclusive", f"{measured} straddles {limits}; add items to narrow it", summary)


def kl_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else units.format_number(value, 1, missing="n/a") + "%"
