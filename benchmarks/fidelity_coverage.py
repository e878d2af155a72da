"""Does the fidelity interval hold at small n? A coverage simulation of harness.fidelity.summary's intervals.

Each population is a set of real per-item fidelity figures (the `fidelity` objects of a run's samples.jsonl: one
population per format and evalset) or, with --generated, a synthetic one (per-item KL gamma-distributed with a
heavy lognormal tail, 10-60 output tokens an item, agreement falling with KL). From each population, n items are
drawn with replacement (the set standing for the larger population of items a team's evalset samples), the
fidelity summary is computed on them as the verdict computes it, and its KL and agreement intervals are checked
against the population's own token-weighted KL and agreement. A 95% interval should cover 95% of the time; the
misses are split by side, since a NO-GO rests on the lower end of KL (a miss "below": the truth lies under
ci_low) and a GO on its upper end (a miss "above").

    PYTHONPATH=. .venv/bin/python benchmarks/fidelity_coverage.py --samples reports/example/samples.jsonl
    PYTHONPATH=. .venv/bin/python benchmarks/fidelity_coverage.py --generated
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.fidelity.summary import FidelityItem, summarize_fidelity  # noqa: E402

SIZES = (3, 4, 5, 6, 8, 10, 15, 20, 30, 40)


@dataclass(frozen=True)
class Population:
    name: str
    tokens: np.ndarray  # output positions per item
    kl_sums: np.ndarray  # summed KL per item, nats
    agree: np.ndarray  # positions whose top-1 agrees, per item

    @property
    def kl(self) -> float:
        return float(self.kl_sums.sum() / self.tokens.sum())

    @property
    def agreement(self) -> float:
        return float(100.0 * self.agree.sum() / self.tokens.sum())


@dataclass(frozen=True)
class Coverage:
    n: int
    draws: int
    inconclusive: int  # draws the rule would not judge: no interval, or a zero-width one it refuses
    kl_covered: int
    kl_truth_below: int  # the population's KL lies under ci_low: a NO-GO could be wrong
    kl_truth_above: int  # ... over ci_high: a GO could be wrong
    agree_covered: int
    agree_truth_below: int
    agree_truth_above: int

    def row(self) -> dict:
        judged = max(self.draws - self.inconclusive, 1)
        return {"n": self.n, "draws": self.draws, "judged": self.draws - self.inconclusive,
                "kl_coverage": self.kl_covered / judged, "kl_truth_below": self.kl_truth_below / judged,
                "kl_truth_above": self.kl_truth_above / judged,
                "agree_coverage": self.agree_covered / judged, "agree_truth_below": self.agree_truth_below / judged,
                "agree_truth_above": self.agree_truth_above / judged}


def populations_from_samples(path: Path, min_items: int = 20) -> list[Population]:
    """One population per (format, evalset) of a samples.jsonl whose lines carry `fidelity` objects."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        figures = row.get("fidelity")
        if isinstance(figures, dict) and figures.get("tokens"):
            grouped.setdefault((row["format"], row["evalset"]), []).append(figures)
    found = []
    for (fmt, evalset), rows in sorted(grouped.items()):
        if len(rows) < min_items:
            continue
        tokens = np.array([r["tokens"] for r in rows], dtype=float)
        found.append(Population(f"{fmt}/{evalset}", tokens, np.array([r["kl"] for r in rows]) * tokens,
                                np.array([r["top1_agreement"] for r in rows]) / 100.0 * tokens))
    return found


def generated_population(seed: int, items: int = 400, mean_kl: float = 0.05, shape: float = 1.5,
                         sigma: float = 0.5) -> Population:
    """Per-item KL gamma(shape) times a lognormal tail (sigma), scaled to mean_kl: a few items far above the
    rest, as a format that breaks on some answers gives; 10-60 tokens an item; agreement falls with KL. The
    default (coefficient of variation about 1.1, largest item 5-8x the mean) is a little heavier than the real
    sets' 0.24-0.86 and 1.7-4.9x; shape 0.8, sigma 1.0 (2 and 13-23x) is a stress test past anything measured."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(10, 61, size=items).astype(float)
    kl = rng.gamma(shape, 1.0, size=items) * rng.lognormal(0.0, sigma, size=items)
    kl *= mean_kl / float((kl * tokens).sum() / tokens.sum())
    agreement = np.clip(1.0 - 0.9 * kl / (kl + 0.3) + rng.normal(0, 0.02, size=items), 0.0, 1.0)
    return Population(f"generated(mean KL {mean_kl}, seed {seed})", tokens, kl * tokens,
                      np.round(agreement * tokens))


def measure(populations: list[Population], sizes=SIZES, draws: int = 200, resamples: int = 2000,
            confidence: float = 0.95, seed: int = 0) -> list[Coverage]:
    """Coverage per n, pooled over the populations (draws per population per n)."""
    rng = np.random.default_rng(seed)
    table = []
    for n in sizes:
        counts = np.zeros(8, dtype=int)
        for population in populations:
            truth_kl, truth_agree = population.kl, population.agreement
            for _ in range(draws):
                pick = rng.integers(0, population.tokens.size, size=n)
                items = {f"d{i}": FidelityItem(int(population.tokens[j]), float(population.kl_sums[j]),
                                               float(population.agree[j])) for i, j in enumerate(pick)}
                summary = summarize_fidelity(items, confidence=confidence, resamples=resamples,
                                             seed=int(rng.integers(2**31)))
                kl, agree = summary.kl, summary.top1_agreement
                if kl.ci_low is None or agree.ci_low is None or _refused(kl, agree):
                    counts[0] += 1
                    continue
                counts[1:] += [kl.ci_low <= truth_kl <= kl.ci_high, truth_kl < kl.ci_low, truth_kl > kl.ci_high,
                               agree.ci_low <= truth_agree <= agree.ci_high, truth_agree < agree.ci_low,
                               truth_agree > agree.ci_high, 0]
        total = draws * len(populations)
        table.append(Coverage(n, total, int(counts[0]), *(int(c) for c in counts[1:7])))
    return table


def _refused(kl, agree) -> bool:
    """The zero-width intervals harness.fidelity.rule does not take as evidence (it says inconclusive)."""
    from harness.fidelity.rule import _zero_width

    return _zero_width(kl, agree, 0) is not None


def markdown(table: list[Coverage]) -> str:
    lines = ["| n | judged draws | KL coverage | truth < KL low | truth > KL high | agreement coverage | "
             "truth < agr. low | truth > agr. high |", "|---|---|---|---|---|---|---|---|"]
    for entry in table:
        r = entry.row()
        lines.append(f"| {r['n']} | {r['judged']} | {r['kl_coverage']:.1%} | {r['kl_truth_below']:.1%} | "
                     f"{r['kl_truth_above']:.1%} | {r['agree_coverage']:.1%} | {r['agree_truth_below']:.1%} | "
                     f"{r['agree_truth_above']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=Path, default=ROOT / "reports/example/samples.jsonl",
                        help="a run's samples.jsonl with per-item fidelity (default: the example report's)")
    parser.add_argument("--generated", action="store_true", help="synthetic heavy-tailed populations instead")
    parser.add_argument("--stress", action="store_true", help="with --generated: a far heavier tail")
    parser.add_argument("--draws", type=int, default=200, help="draws per population per n")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (the policy's default)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args(argv)
    if args.generated:
        tail = {"shape": 0.8, "sigma": 1.0} if args.stress else {}
        populations = [generated_population(seed, mean_kl=kl, **tail) for seed, kl in enumerate((0.02, 0.05, 0.2))]
    else:
        populations = populations_from_samples(args.samples)
    if not populations:
        print(f"error: no per-item fidelity figures in {args.samples}", file=sys.stderr)
        return 2
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(f"{len(populations)} populations: " + ", ".join(p.name for p in populations))
    print(markdown(measure(populations, sizes, args.draws, args.resamples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
