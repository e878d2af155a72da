"""The frozen records that pass between the run's stages (harness.pipeline): the run's checked inputs, and per
format what each stage produced: its artifact, the device stage's result files, the served block, and the format's
result as the evaluation reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cache import read_json
from harness.calibration import CalibrationSet
from harness.config import RunSpec
from harness.evalsets import EvalSet, Prompt
from harness.fidelity.plan import FidelityPlan
from harness.jobs import GenerateTask, MeasureTask
from harness.measure.probe import Measurement, ProbeWorkload, probe_workload
from harness.policy import Policy
from harness.quantize.base import Recipe
from harness.report.schema import Artifact as ArtifactEntry
from harness.report.schema import Served as ServedEntry
from harness.runtime.base import BatchTiming
from harness.source import ModelSource

if TYPE_CHECKING:
    from harness.candidates import ExternalCheckpoint


@dataclass(frozen=True)
class GeneratedOutput:
    """One item's generation, as it is scored."""

    id: str
    prediction: str
    new_tokens: int


@dataclass(frozen=True)
class EvalsetGeneration:
    """One evalset's generations as their result file holds them (harness.worker.generate_evalset, or a server's in
    harness.served)."""

    evalset: str
    outputs: tuple[GeneratedOutput, ...]
    wall_s: float = 0.0
    latency: dict = field(default_factory=dict)  # measure.latency.latency_block of its batches; {} from a server
    batches: tuple[BatchTiming, ...] = ()  # the evaluation's own batches (in-process runtimes)

    @classmethod
    def from_result(cls, result: dict) -> EvalsetGeneration:
        return cls(result["evalset"],
                   tuple(GeneratedOutput(o["id"], o["prediction"], o["new_tokens"]) for o in result["outputs"]),
                   result.get("wall_s", 0.0), result.get("latency") or {},
                   tuple(BatchTiming(**b) for b in result.get("batches") or ()))

    @property
    def new_tokens(self) -> int:
        return sum(o.new_tokens for o in self.outputs)


@dataclass(frozen=True)
class FormatRun:
    """One format's result, built once from its stages' records (collect_results)."""

    name: str
    status: str = "ok"  # ok | failed | interrupted
    error: str | None = None
    artifact: ArtifactEntry | None = None  # the report's artifact block
    measurement: Measurement = field(default_factory=Measurement)
    generations: dict[str, EvalsetGeneration | None] = field(default_factory=dict)  # None: its result is missing
    stages_run: list[str] = field(default_factory=list)
    served: ServedEntry | None = None  # a serving-engine backend: the format's `served` block (harness.served)
    devices: str | None = None  # --devices: the CUDA devices this format's workers and server see ("0,1")
    fidelity: dict[str, dict] = field(default_factory=dict)  # evalset -> its comparison (harness.fidelity.teacher)
    fidelity_note: str | None = None  # why fidelity was not measured (for every evalset or some)


@dataclass(frozen=True)
class RunInputs:
    spec: RunSpec
    out_dir: Path
    source: ModelSource
    model_config: dict
    evalsets: list[EvalSet]
    policy: Policy
    recipes: dict[str, Recipe]
    prompts: dict[str, list[Prompt]]
    calibration: CalibrationSet | None  # None when no format calibrates
    # a serving-engine backend: the install its servers start from (ServingEngine.locate; None: endpoints only)
    serving_install: object | None = None
    candidates: dict[str, ExternalCheckpoint] = field(default_factory=dict)
    candidate_notes: dict[str, list[str]] = field(default_factory=dict)  # name -> notes (tokenizer mismatch)

    def probe_workload(self) -> ProbeWorkload:
        """What memory and latency are measured on (measure.probe.probe_workload), from this run's prompts."""
        return probe_workload([self.prompts[e.name] for e in self.evalsets], self.spec.latency_requests,
                              self.spec.batch_size)


@dataclass(frozen=True)
class Artifact:
    """Stage quantize: the checkpoint a format runs from (the baseline, a --candidate, or quantized here)."""

    key: str | None
    path: Path | None
    entry: ArtifactEntry | None  # the report's artifact block
    stages_run: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ResultFile:
    """A stage result in the cache: where it is and the key it was written under."""

    path: str
    key: str

    def read(self, required_key: str | None = None) -> dict | None:
        value = read_json(Path(self.path))
        return value if isinstance(value, dict) and (required_key is None or required_key in value) else None

    def as_dict(self) -> dict:
        return {"path": self.path, "key": self.key}


@dataclass(frozen=True)
class DevicePlan:
    """What the device stage has left to do (tasks) and where every result lives, done or not."""

    measure: MeasureTask | None
    generate: tuple[GenerateTask, ...]
    measurement: ResultFile
    generations: dict[str, ResultFile]
    fidelity: FidelityPlan = FidelityPlan((), {})


@dataclass(frozen=True)
class DeviceRun:
    """Stage run_on_device: the format's one model load that measured and generated."""

    measurement: ResultFile
    generations: dict[str, ResultFile]
    stages_run: tuple[str, ...] = ()
    error: str | None = None
    fidelity: FidelityPlan = FidelityPlan((), {})


@dataclass(frozen=True)
class Served:
    """Stage serve (a serving-engine backend): the format's `served` block and the server's generations (none if
    refused)."""

    block: ServedEntry
    generations: dict[str, ResultFile]
    stages_run: tuple[str, ...] = ()
    error: str | None = None
    fidelity: FidelityPlan = FidelityPlan((), {})

