"""Per format: score its outputs item by item and decide it against the baseline (its serving plans, which the
capacity check reads: harness.format_plans).

What the report is built from (harness.report.build); nothing here writes a file."""

from __future__ import annotations

from dataclasses import dataclass

from harness.decide import FormatDecision, FormatOutcome, decide_format
from harness.fidelity.summary import FidelityItem
from harness.format_plans import serving_fit
from harness.metrics import score_item
from harness.records import FormatRun, RunInputs
from harness.report.schema import LatencyRun, ServedLatency


@dataclass(frozen=True)
class Evaluation:
    """Every format's scored outcome, every candidate's decision, and the per-item samples (samples.jsonl)."""

    outcomes: dict[str, FormatOutcome]
    decisions: dict[str, FormatDecision]
    samples: tuple[dict, ...]


def evaluate_formats(inputs: RunInputs, runs: dict[str, FormatRun]) -> Evaluation:
    samples: list[dict] = []
    outcomes = {name: score(inputs, run, samples) for name, run in runs.items()}
    return Evaluation(outcomes, decide(inputs, outcomes), tuple(samples))


def score(inputs: RunInputs, run: FormatRun, samples: list[dict]) -> FormatOutcome:
    """The format's per-item scores with what its budgets judge (samples gets one row per scored item)."""
    name = run.name
    items = score_format(inputs, run, samples)
    budget_latency, latency_source = budget_latency_of(run, inputs.policy.latency_budgets_judge)
    served = run.served
    return FormatOutcome(
        name=name, status=run.status if run.status in ("ok", "interrupted") else "failed", error=run.error,
        items=items,
        gates={e.name: list(e.gate) for e in inputs.evalsets},
        peak_bytes=run.measurement.memory.peak_bytes,
        ttft_p95_ms=budget_latency.ttft_ms.p95 if budget_latency else None,
        tpot_p95_ms=budget_latency.tpot_ms.p95 if budget_latency else None,
        latency_requests=budget_latency.requests if budget_latency else None, latency_source=latency_source,
        served_refusal=served.reason if served and served.status == "unsupported" else None,
        saturation=served.saturation if served else None,
        clusters={e.name: e.clusters() for e in inputs.evalsets},
        cluster_by={e.name: e.cluster_by for e in inputs.evalsets},
        calibration_overlap=_calibration_overlap(inputs, name),
        serving_fit=serving_fit(inputs, run) if name != "baseline" else None,
        fidelity=fidelity_items(run, samples), fidelity_note=run.fidelity_note,
        languages={e.name: e.language for e in inputs.evalsets},
    )


def fidelity_items(run: FormatRun, samples: list[dict]) -> dict[str, dict[str, FidelityItem]]:
    """The format's per-item fidelity (harness.fidelity), also added to its samples.jsonl rows as `fidelity`."""
    by_set = {name: {str(row["id"]): FidelityItem.from_json(row) for row in result["items"]}
              for name, result in run.fidelity.items()}
    for sample in samples:
        item = by_set.get(sample["evalset"], {}).get(sample["id"]) if sample["format"] == run.name else None
        if item is not None:
            sample["fidelity"] = {"kl": item.kl, "top1_agreement": item.top1_agreement,
                                  "first_flip": item.first_flip, "tokens": item.positions}
    return by_set


def decide(inputs: RunInputs, outcomes: dict[str, FormatOutcome]) -> dict[str, FormatDecision]:
    baseline = outcomes["baseline"]
    return {name: decide_format(baseline, outcome, inputs.policy)
            for name, outcome in outcomes.items() if name != "baseline"}


def budget_latency_of(run: FormatRun, judge: str = "served") -> tuple[LatencyRun | ServedLatency | None, str]:
    """The latency the policy's budgets judge: with judge "served", the vLLM server's at concurrency 1 where the
    format was served; else (and for formats not served) transformers' batch-1 figures (None: not timed)."""
    at_one = run.served.latency.get("concurrency_1") if run.served and run.served.status == "ok" else None
    if judge == "served" and at_one is not None:
        return at_one, "vLLM server, concurrency 1"
    return run.measurement.latency.batch_1, "transformers"


def score_format(inputs: RunInputs, run: FormatRun, samples: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    items_by_set: dict[str, dict[str, dict[str, float]]] = {}
    for evalset in inputs.evalsets:
        generation = run.generations.get(evalset.name)
        if not generation:
            continue
        prompts = {p.item_id: p.text for p in inputs.prompts[evalset.name]}
        outputs = {o.id: o for o in generation.outputs}
        scores = {}
        for item in evalset.items:
            output = outputs.get(item.id)
            if output is None:
                continue
            metrics = score_item(evalset, item, output.prediction)
            scores[item.id] = metrics
            samples.append({"format": run.name, "evalset": evalset.name, "id": item.id, "prompt": prompts[item.id],
                            "prediction": output.prediction,
                            "references": list(item.answers if evalset.task == "qa" else item.references),
                            "new_tokens": output.new_tokens, **metrics})  # schema.SAMPLE_FIELDS, then metrics
        items_by_set[evalset.name] = scores
    return items_by_set


def _calibration_overlap(inputs: RunInputs, name: str) -> tuple[str, ...]:
    """The evaluated items a format's calibration texts contained (only ever non-empty when the run allowed it)."""
    recipe = inputs.recipes.get(name)
    if inputs.calibration is None or recipe is None or not recipe.calibration_samples:
        return ()
    overlap = inputs.calibration.overlap
    return overlap.overlapping if overlap and overlap.items_overlapping else ()


