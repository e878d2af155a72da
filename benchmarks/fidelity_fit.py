"""The fit behind the fidelity rule's defaults (issue #42 item 4), over the ladder's rows (fidelity_bench.ladder_rows):
drop in margins against KL and against disagreement, through the origin, with cluster-bootstrap intervals (a rung is
the cluster: its sets share one checkpoint); the factor of safety of the policy's max_kl; the rows and rungs where
"fidelity passes" and "the task interval lies past the margin" coincide (must be none); the scatter plot; and
fidelity's share of each format's time, read from the run's own progress lines."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

RESAMPLES = 2000


@dataclass(frozen=True)
class Slope:
    value: float
    ci_low: float
    ci_high: float


def _points(rows: list[dict], kl_below: float | None = None) -> list[tuple[str, float, float, float]]:
    """(rung, KL, disagreement in points, drop in margins) of every fitted row: decoys are built to break the
    relation, so they are kept out, as are rows without a margin; with kl_below, only rows under that KL."""
    return [(f"{r.get('model', '')}/{r['format']}", r["kl"]["value"], 100 - r["top1_agreement"]["value"],
             -r["delta"] / r["margin"]) for r in rows if r.get("margin") and r.get("family") != "decoy"
            and (kl_below is None or r["kl"]["value"] <= kl_below)]


def _slope(pairs: list[tuple[float, float]]) -> float:
    return sum(x * y for x, y in pairs) / max(sum(x * x for x, _ in pairs), 1e-12)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    return ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (at - low)


def _bootstrap(points, column: int, seed: int) -> Slope:
    rungs = sorted({p[0] for p in points})
    by_rung = {r: [(p[column], p[3]) for p in points if p[0] == r] for r in rungs}
    rng = random.Random(seed)
    slopes = []
    for _ in range(RESAMPLES):
        drawn = [pair for _ in rungs for pair in by_rung[rng.choice(rungs)]]
        slopes.append(_slope(drawn))
    return Slope(_slope([(p[column], p[3]) for p in points]), _percentile(slopes, 0.025), _percentile(slopes, 0.975))


def at_margin(slope: float) -> float | None:
    """The x at which the fitted drop reaches one margin."""
    return 1 / slope if slope > 0 else None


def fit(rows: list[dict], seed: int = 0, kl_below: float | None = None) -> dict:
    """Slopes of drop-in-margins on KL and on disagreement with 95% cluster-bootstrap intervals (rungs resampled), and
    where one margin falls: KL one margin = 1 / slope, so the interval's high slope gives its low KL. kl_below: the
    fit over the decision region only (a through-origin fit over every rung is led by the far rungs, where the task
    metric saturates)."""
    points = _points(rows, kl_below)
    if len({p[0] for p in points}) < 2:
        return {}
    kl, dis = _bootstrap(points, 1, seed), _bootstrap(points, 2, seed + 1)
    return {"points": len(points), "rungs": len({p[0] for p in points}),
            "models": sorted({p[0].split("/")[0] for p in points if p[0].split("/")[0]}),
            "drop_per_nat": kl.value, "drop_per_nat_ci": [kl.ci_low, kl.ci_high],
            "drop_per_point_disagreement": dis.value, "drop_per_point_disagreement_ci": [dis.ci_low, dis.ci_high],
            "kl_at_margin": at_margin(kl.value),
            "kl_at_margin_ci": [at_margin(kl.ci_high), at_margin(kl.ci_low)],
            "agreement_at_margin": 100 - 1 / dis.value if dis.value > 0 else None,
            "agreement_at_margin_ci": [100 - 1 / dis.ci_low if dis.ci_low > 0 else None,
                                       100 - 1 / dis.ci_high if dis.ci_high > 0 else None]}


def safety_factor(result: dict, max_kl: float) -> dict:
    """How far below the fitted one-margin KL the policy's max_kl sits: at the fit and at its interval's low end."""
    if not result.get("kl_at_margin"):
        return {}
    low = result["kl_at_margin_ci"][0]
    return {"at_fit": result["kl_at_margin"] / max_kl, "at_low_end": low / max_kl if low else None}


def fidelity_passes(row: dict, max_kl: float, min_agreement: float) -> bool:
    """The fidelity rule's own pass on one set: the whole KL interval within max_kl and the whole agreement interval
    at or above min_agreement."""
    return row["kl"]["ci_high"] <= max_kl and row["top1_agreement"]["ci_low"] >= min_agreement


def past_margin(row: dict) -> bool:
    """The task interval lies wholly past the margin: the format is worse by more than the margin on this set."""
    return row.get("ci_high") is not None and bool(row.get("margin")) and row["ci_high"] < -row["margin"]


def coincidences(rows: list[dict], max_kl: float, min_agreement: float) -> dict:
    """Rows (every family, decoys included) where fidelity passes (the run's own check where it has one, else the
    intervals against the limits) while the task interval lies past the margin, and
    rungs given GO while one of their sets lies past the margin. Both must be empty at the defaults. Beside them: the
    passes whose task interval lies wholly below 0, and GOs the fidelity rule carried over such a set (must be none)."""
    passing = [r for r in rows if r.get("fidelity_status") == "pass"
               or (r.get("fidelity_status") is None and fidelity_passes(r, max_kl, min_agreement))]
    bad_rows = [r for r in passing if past_margin(r)]
    bad_go = sorted({f"{r.get('model', '')}/{r['format']}".lstrip("/") for r in rows
                     if r.get("verdict") == "GO" and past_margin(r)})
    return {"rows": len(rows), "fidelity_passes": len(passing), "passes_past_margin": bad_rows,
            "share": len(bad_rows) / len(rows) if rows else None, "go_past_margin": bad_go,
            "passes_with_real_drop": [r for r in passing if real_drop(r)],
            "go_by_fidelity_over_real_drop": [r for r in rows if r.get("rule") == "fidelity" and real_drop(r)]}


def departures(row: dict) -> dict | None:
    """From a row's per-item figures (fidelity_bench.with_item_figures): the items whose output text differs from
    the baseline's, those of them where teacher forcing saw no flip, the items with a teacher-forced flip and the
    share of compared tokens before it (what fidelity vouches for verbatim), and the mean score difference of the
    items whose output differs and of the rest (0 up to scoring noise: the same text scores the same)."""
    figures = row.get("items_figures") or []
    if not figures:
        return None
    same = [f for f in figures if f[5]]
    departed = [f for f in figures if not f[5]]
    tokens = sum(f[1] or 0 for f in figures)
    verbatim = sum(min(f[2], f[1] or 0) if f[2] is not None else (f[1] or 0) for f in figures)

    def mean_delta(group: list) -> float | None:
        values = [f[4] for f in group if f[4] is not None]
        return sum(values) / len(values) if values else None

    return {"items": len(figures), "departed": len(departed), "departed_share": len(departed) / len(figures),
            "departed_unflipped": sum(1 for f in departed if f[2] is None),
            "flipped": sum(1 for f in figures if f[2] is not None),
            "verbatim_token_share": verbatim / tokens if tokens else None,
            "delta_departed": mean_delta(departed), "delta_kept": mean_delta(same)}


def real_drop(row: dict) -> bool:
    """The task interval lies wholly below 0: the format loses score measurably on this set, which the fidelity
    rule may not talk over (harness.decide._real_drop), within the margin or not."""
    return row.get("ci_high") is not None and row["ci_high"] < 0


_PROGRESS = re.compile(r"^\[quantgate\] (?P<fmt>[^:\s]+): (?P<step>generating|fidelity reference|fidelity) (?P<set>\S+) "
                       r"\[#+\] (?P<done>\d+)/(?P=done)\s+(?P<s>[\d.]+)s\s*$")


def time_shares(run_log: str, formats=None, sets=None) -> dict[str, dict]:
    """{format: {generation_s, fidelity_s, share}} from a `quantgate run` log's finished progress bars: fidelity's
    cost beside the format's generation on the same sets (the baseline's is its reference pass). The log of a work
    directory is appended to by every ladder run there: `formats` and `sets`, where given, keep this run's bars."""
    shares: dict[str, dict] = {}
    for line in run_log.splitlines():
        m = _PROGRESS.match(line.strip())
        if not m or (formats is not None and m["fmt"] not in formats) or (sets is not None and m["set"] not in sets):
            continue
        entry = shares.setdefault(m["fmt"], {"generation_s": 0.0, "fidelity_s": 0.0})
        entry["generation_s" if m["step"] == "generating" else "fidelity_s"] += float(m["s"])
    for entry in shares.values():
        entry["share"] = entry["fidelity_s"] / entry["generation_s"] if entry["generation_s"] else None
    return shares


def plot(rows: list[dict], path: Path, max_kl: float) -> Path | None:
    """Drop in margins against KL (log axis), one marker per family and model; the policy's max_kl and one margin
    drawn as lines. PNG, for the bench report."""
    points = [r for r in rows if r.get("margin") and r["kl"]["value"] > 0]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    markers = {"rtn": "o", "format": "s", "decoy": "x", "candidate": "^"}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in points:
        groups.setdefault((r.get("model") or "demo", r.get("family", "format")), []).append(r)
    for (model, family), group in sorted(groups.items()):
        ax.errorbar([r["kl"]["value"] for r in group], [-r["delta"] / r["margin"] for r in group],
                    yerr=[[(r["ci_high"] - r["delta"]) / r["margin"] for r in group],
                          [(r["delta"] - r["ci_low"]) / r["margin"] for r in group]],
                    fmt=markers.get(family, "o"), alpha=0.7, capsize=2, label=f"{model} {family}")
    ax.axvline(max_kl, color="red", linestyle="--", linewidth=1, label=f"max_kl {max_kl}")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="one margin")
    ax.set_xscale("log")
    ax.set_xlabel("KL to the baseline, nats/token (log)")
    ax.set_ylabel("drop of the gated metric, in margins")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
