"""The metrics an evalset may name: one MetricSpec per metric, declared here (built-in) or by register_metric.

A metric scores one prediction against its golds (QA: the answers; generation: the references), 0-100. The
built-in ones are computed together by their task's scorer (metrics.qa, metrics.rouge); a registered one brings
its own `item_score(prediction, golds, language)`. Adding a metric is one function plus one register_metric call
(docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from harness.metrics.qa import QA_METRICS
from harness.metrics.rouge import ROUGE_TYPES

ItemScore = Callable[[str, Sequence[str], str], float]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    task: str  # "qa" or "generation"
    item_score: ItemScore | None = None  # None: the task's built-in scorer computes it
    default_gate: bool = False  # gated when an evalset names no gate
    binary: bool = False  # every value is 0 or 100

    @property
    def built_in(self) -> bool:
        return self.item_score is None


METRIC_SPECS: dict[str, MetricSpec] = {}


def register_metric(spec: MetricSpec) -> MetricSpec:
    if spec.task not in ("qa", "generation"):
        raise ValueError(f"metric {spec.name!r}: task must be qa or generation, not {spec.task!r}")
    METRIC_SPECS[spec.name] = spec
    return spec


for _name in QA_METRICS:
    register_metric(MetricSpec(_name, "qa", default_gate=_name == "f1", binary=_name in ("em", "contains")))
for _name in ROUGE_TYPES:
    register_metric(MetricSpec(_name, "generation", default_gate=_name == "rougeL"))


def metric_names(task: str | None = None) -> tuple[str, ...]:
    """Every metric (QA first, then generation, then registered ones), or one task's."""
    return tuple(name for name, spec in METRIC_SPECS.items() if task is None or spec.task == task)


def default_gate(task: str) -> tuple[str, ...]:
    return tuple(name for name, spec in METRIC_SPECS.items() if spec.task == task and spec.default_gate)
