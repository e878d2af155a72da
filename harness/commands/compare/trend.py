"""A series of runs, oldest first: per format its verdicts, and per gated metric its scores, with the verdict turns.

The records here are what both the text and the HTML (trend_html.py) render.
"""

from __future__ import annotations

from dataclasses import dataclass
from harness.commands.compare.changes import effective_verdict
from harness.commands.compare.comparability import ARROW, Difference, find_differences
from harness.commands.compare.inputs import Run
from harness.decide import num, signed
from harness.report.view import gated_scores, ordered_format_names

DASH = "\u2014"


@dataclass(frozen=True)
class Point:
    value: float | None
    delta: float | None  # vs the run's own baseline; None for the baseline itself
    status: str | None  # the gate's pass / fail / inconclusive


@dataclass(frozen=True)
class Turn:
    at: int  # index of the run where the verdict is new
    old: str
    new: str  # "absent" when the run no longer has the format

    def describe(self) -> str:
        return f"{self.old}{ARROW}{self.new}"


@dataclass(frozen=True)
class FormatTrend:
    name: str
    verdicts: list[str | None]  # one per run; None where the run has no such format
    metrics: dict[str, list[Point | None]]  # "evalset/metric" -> one per run
    turns: list[Turn]

    def turn_at(self, index: int) -> Turn | None:
        return next((t for t in self.turns if t.at == index), None)


@dataclass(frozen=True)
class PairDifferences:
    old: int  # run indices, new = old + 1
    new: int
    differences: list[Difference]

    @property
    def label(self) -> str:
        return f"#{self.old + 1}{ARROW}#{self.new + 1}"


@dataclass(frozen=True)
class Trend:
    runs: list[Run]
    formats: list[FormatTrend]
    pairs: list[PairDifferences]  # every consecutive pair, oldest first


def build_trend(runs: list[Run]) -> Trend:
    names = list(dict.fromkeys(name for run in runs for name in ordered_format_names(run.report)))
    formats = [_format_trend(name, runs) for name in names]
    pairs = [PairDifferences(i, i + 1, find_differences(runs[i].report, runs[i + 1].report))
             for i in range(len(runs) - 1)]
    return Trend(runs, formats, pairs)


def _format_trend(name: str, runs: list[Run]) -> FormatTrend:
    entries = [run.report.formats.get(name) for run in runs]
    verdicts = [effective_verdict(e) if e is not None else None for e in entries]
    metrics: dict[str, list[Point | None]] = {}
    for index, (run, entry) in enumerate(zip(runs, entries)):
        for gated in gated_scores(run.report, entry) if entry is not None else []:
            series = metrics.setdefault(f"{gated.evalset}/{gated.metric}", [None] * len(runs))
            score = gated.score
            series[index] = Point(score.value, score.delta, score.status)
    turns = [Turn(i, verdicts[i - 1], verdicts[i] or "absent") for i in range(1, len(runs))
             if verdicts[i - 1] is not None and verdicts[i] != verdicts[i - 1]]
    return FormatTrend(name, verdicts, metrics, turns)


def verdict_cell(fmt: FormatTrend, index: int) -> str:
    turn = fmt.turn_at(index)
    return turn.describe() if turn else fmt.verdicts[index] or DASH


def point_cell(point: Point | None) -> str:
    if point is None:
        return DASH
    return num(point.value) + (f" ({signed(point.delta)})" if point.delta is not None else "")


def render_trend(trend: Trend) -> list[str]:
    """The runs, then per format a row of verdicts and one row per gated metric, a column per run."""
    lines = ["Runs (oldest first):"]
    lines += [f"  #{i + 1}  {run.created_at}  {run.path}" for i, run in enumerate(trend.runs)]
    lines += ["", "Trend (gated metrics: value (delta vs baseline); A\u2192B marks a verdict that turned):"]
    columns = [f"#{i + 1}" for i in range(len(trend.runs))]
    for fmt in trend.formats:
        rows = [("verdict", [verdict_cell(fmt, i) for i in range(len(trend.runs))])]
        rows += [(label, [point_cell(p) for p in series]) for label, series in fmt.metrics.items()]
        lines += [f"  {fmt.name}", *_table([("", columns), *rows], indent=4)]
    return lines


def _table(rows: list[tuple[str, list[str]]], indent: int) -> list[str]:
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(rows[0][1]))]
    return [(" " * indent + label.ljust(label_width) + "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)))
            .rstrip() for label, cells in rows]
