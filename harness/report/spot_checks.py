"""People's spot checks as the Markdown and HTML reports show them (plain text; the renderers escape it)."""

from __future__ import annotations

from harness.report.schema import FormatResult, SpotCheckShare

SPOT_CHECK_COLUMNS = ("Judged by people", "Share [95% CI, exact]")


def _share(share: SpotCheckShare) -> str:
    return f"{share.count} of {share.of} = {share.value:.1f}% [{share.ci_low:.1f}%, {share.ci_high:.1f}%]"


def spot_check_caption(fmt: FormatResult) -> str:
    s = fmt.spot_checks
    reviewers = ", ".join(s.reviewers) or "nobody yet"
    agreement = (f"; agreement between reviewers (Fleiss' kappa on acceptability) {s.agreement:.2f} over "
                 f"{s.multiply_judged} item(s) judged twice or more" if s.agreement is not None else "")
    status = s.status or "not required by the policy"
    plan = f"plan {s.plan}" if s.plan else "no review plan made yet"
    return (f"Blind A/B judgments of a random sample ({plan}) by {reviewers}: {s.judged} item(s) judged"
            f"{agreement}. Rule: {status}: {s.detail}.")


def spot_check_cell(fmt: FormatResult) -> str:
    """One short cell for summary.md: what people found and the rule's status."""
    s = fmt.spot_checks
    if s is None:
        return ""
    status = s.status or "advisory"
    if not s.judged:
        return f"none judged ({status})"
    return (f"{s.candidate_unacceptable.count} of {s.judged} unacceptable, baseline "
            f"{s.baseline_unacceptable.count} ({status})")


def spot_check_rows(fmt: FormatResult) -> list[list[str]]:
    s = fmt.spot_checks
    rows = [["candidate judged worse than the baseline", _share(s.worse)],
            ["candidate unacceptable", _share(s.candidate_unacceptable)],
            ["baseline unacceptable", _share(s.baseline_unacceptable)],
            ["increase of the unacceptable share",
             f"{s.increase:+.1f} points (bounds {s.increase_low:.1f} to {s.increase_high:.1f})"]]
    if s.worst_judged:
        rows.append(["worst items (not counted)", f"{s.worst_unacceptable} of {s.worst_judged} unacceptable"])
    return rows


def unacceptable_quotes(fmt: FormatResult) -> list[tuple[str, str, str, str]]:
    """(heading, candidate, baseline, reference) per item judged unacceptable for the candidate."""
    quotes = []
    for item in fmt.spot_checks.unacceptable_items:
        heading = f"{item.evalset} / {item.id}" + (" (worst items, not counted)" if item.stratum == "worst" else "") \
            + ("" if item.baseline_acceptable else "; the baseline's was unacceptable too") \
            + (f"; comments: {' / '.join(item.comments)}" if item.comments else "")
        quotes.append((heading, item.candidate, item.baseline, item.reference))
    return quotes
