"""The fidelity figures as the Markdown and HTML reports show them (plain text; the renderers escape it)."""

from __future__ import annotations

from harness.fidelity.rule import kl_text, pct
from harness.report.schema import FidelityEntry, FormatResult
from harness.units import DASH

FIDELITY_COLUMNS = ("Evalset", "KL nats/token [95% CI]", "Top-1 agreement [95% CI]", "Items with a flip",
                    "Median first flip", "Limits", "Status")


def fidelity_cell(fmt: FormatResult) -> tuple[str, str]:
    """The verdict table's fidelity cell and its status: the worst evalset's bounds, the rule's overall status."""
    if fmt.role == "baseline":
        return "reference", ""
    entries = [e for e in (fmt.fidelity or {}).values()]
    measured = [e for e in entries if e.kl is not None and e.top1_agreement is not None]
    if not measured:
        return ("not measured" if not entries else entries[0].detail.removeprefix("fidelity ")), \
            "inconclusive" if entries else ""
    worst_kl = max((e.kl.ci_high if e.kl.ci_high is not None else e.kl.value or 0.0) for e in measured)
    lowest = min((e.top1_agreement.ci_low if e.top1_agreement.ci_low is not None else e.top1_agreement.value or 0.0)
                 for e in measured)
    statuses = {e.status for e in entries}
    status = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    sets = f"{len(measured)} set" + ("s" if len(measured) != 1 else "")
    return f"KL ≤ {kl_text(worst_kl)}, top-1 ≥ {pct(lowest)} ({sets}, 95% bounds)", status


def verdict_text(fmt: FormatResult) -> str:
    """'GO (fidelity rule)' where a rule carried the verdict, else the verdict."""
    return f"{fmt.verdict} ({fmt.rule} rule{'s' if ' and ' in fmt.rule else ''})" if fmt.rule else fmt.verdict


def fidelity_rows(fmt: FormatResult) -> list[list[str]]:
    rows = []
    for evalset, entry in (fmt.fidelity or {}).items():
        if entry.kl is None or entry.top1_agreement is None:
            rows.append([evalset, DASH, DASH, DASH, DASH, _limits(entry), f"{entry.status}: {entry.detail}"])
            continue
        rows.append([evalset, _interval(entry.kl.value, entry.kl.ci_low, entry.kl.ci_high, kl_text),
                     _interval(entry.top1_agreement.value, entry.top1_agreement.ci_low, entry.top1_agreement.ci_high,
                               pct),
                     f"{entry.flipped_items} of {entry.items}",
                     DASH if entry.median_first_flip is None else f"token {entry.median_first_flip:g}",
                     _limits(entry), entry.status])
    return rows


def fidelity_caption(fmt: FormatResult, served: bool = False) -> str:
    entries = list((fmt.fidelity or {}).values())
    method = next((e.method for e in entries if e.method), None)
    tokens = ("the baseline's top-20 tokens that the format's server also names (vLLM prompt_logprobs)" if served
              else "the baseline's top-32 tokens")
    text = (f"Teacher-forced on the baseline's greedy output: KL(baseline ‖ format) over {tokens} plus the rest (a "
            "lower bound of the full-vocabulary KL) and how often the format's top token is the baseline's, at every "
            "output position.")
    return text + (f" {method[0].upper() + method[1:]}." if method else "")


def position_lines(fmt: FormatResult) -> list[str]:
    """Per evalset, mean KL by band of output positions: does divergence grow with length?"""
    lines = []
    for evalset, entry in (fmt.fidelity or {}).items():
        if entry.by_position and len(entry.by_position) > 1:
            bands = ", ".join(f"{b.start}-{b.end}: {kl_text(b.kl)}" for b in entry.by_position)
            lines.append(f"{evalset}: KL by output position {bands}")
    return lines


def largest_lines(fmt: FormatResult) -> list[str]:
    lines = []
    for evalset, entry in (fmt.fidelity or {}).items():
        for item in entry.largest or []:
            flip = "no flip" if item.first_flip is None else f"first flip at token {item.first_flip}"
            lines.append(f"{evalset}/{item.id}: KL {kl_text(item.kl)}, top-1 {pct(item.top1_agreement)} over "
                         f"{item.tokens} tokens, {flip}")
    return lines


def _interval(value, low, high, show) -> str:
    if low is None or high is None:
        return show(value)
    return f"{show(value)} [{show(low)}, {show(high)}]"


def _limits(entry: FidelityEntry) -> str:
    return f"KL ≤ {kl_text(entry.max_kl)}, top-1 ≥ {pct(entry.min_top1_agreement)}"
