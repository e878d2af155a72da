"""The jobs a harness.worker subprocess runs, as the parent writes them: a quantize job, or a device job (one
model load that measures and generates). Each is a frozen record with a JSON round trip (to_json/from_json);
read_job tells them apart by their "kind"."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class MeasureTask:
    """The memory/latency probe: batch-1 requests (prompt, max new tokens), then the longest prompts as one batch;
    with profile_tokens, a profile forward of that many tokens over profile_sequences sequences (harness.measure.
    profile) after the job's generations. 0: no profile."""

    result_path: str
    batch1: tuple[tuple[str, int], ...]
    batched: tuple[str, ...]
    batched_max_new_tokens: int
    warmup: int = 2
    profile_tokens: int = 0
    profile_sequences: int = 0

    @classmethod
    def from_json(cls, data: dict) -> MeasureTask:
        return cls(data["result_path"], tuple((p, int(n)) for p, n in data["batch1"]), tuple(data["batched"]),
                   int(data["batched_max_new_tokens"]), int(data.get("warmup", 2)),
                   int(data.get("profile_tokens", 0)), int(data.get("profile_sequences", 0)))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GenerateItem:
    id: str
    prompt: str


@dataclass(frozen=True)
class GenerateTask:
    """One evalset's prompts, generated in batches; the result is written to result_path."""

    evalset: str
    key: str
    max_new_tokens: int
    items: tuple[GenerateItem, ...]
    result_path: str = ""

    @classmethod
    def from_json(cls, data: dict) -> GenerateTask:
        return cls(data["evalset"], data["key"], int(data["max_new_tokens"]),
                   tuple(GenerateItem(i["id"], i["prompt"]) for i in data["items"]), data.get("result_path", ""))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FidelityTask:
    """One evalset's fidelity work (harness.fidelity): mode "reference" (the baseline: teacher-force its own
    generations at generation_path, items' prompt ids given, write reference_path) or "compare" (another format:
    teacher-force the reference's ids, write result_path)."""

    evalset: str
    key: str
    mode: str  # "reference" | "compare"
    reference_path: str
    result_path: str = ""
    generation_path: str = ""
    items: tuple[tuple[str, tuple[int, ...]], ...] = ()  # reference mode: (id, prompt token ids)

    @classmethod
    def from_json(cls, data: dict) -> FidelityTask:
        return cls(**{**data, "items": tuple((i, tuple(ids)) for i, ids in data.get("items") or ())})

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class QuantizeJob:
    source_path: str
    recipe: dict  # Recipe.as_dict()
    calibration_path: str
    out_dir: str
    manifest: dict
    format: str = ""
    devices: str | None = None
    trust_remote_code: bool = False
    threads: int = 1
    failure_path: str = ""
    kind: str = "quantize"

    @classmethod
    def from_json(cls, data: dict) -> QuantizeJob:
        return cls(**data)

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def seed(self) -> int:
        return int(self.recipe.get("seed", 0))


@dataclass(frozen=True)
class DeviceJob:
    """The format's one model load in a worker: it measures (measure), generates (generate) and compares to the
    baseline token by token (fidelity); scoring and deciding happen later, in the parent (harness.evaluate)."""

    artifact_path: str
    batch_size: int
    measure: MeasureTask | None = None
    generate: tuple[GenerateTask, ...] = ()
    fidelity: tuple[FidelityTask, ...] = ()  # after the generations, outside the measured timeline
    format: str = ""
    devices: str | None = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    threads: int = 1
    seed: int = 0
    runtime: str = "transformers"  # the Runtime that loads the artifact (harness.runtime.registry)
    failure_path: str = ""
    kind: str = "device"

    @classmethod
    def from_json(cls, data: dict) -> DeviceJob:
        measure = data.get("measure")
        return cls(**{**data, "measure": MeasureTask.from_json(measure) if measure else None,
                      "generate": tuple(GenerateTask.from_json(t) for t in data.get("generate") or ()),
                      "fidelity": tuple(FidelityTask.from_json(t) for t in data.get("fidelity") or ())})

    def to_json(self) -> dict:
        return asdict(self)


JOB_KINDS = {"quantize": QuantizeJob, "device": DeviceJob}


def read_job(path: Path) -> QuantizeJob | DeviceJob:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return JOB_KINDS[data.get("kind", "device")].from_json(data)


def stage_dir(out_dir: Path, fmt: str) -> Path:
    """The run's directory of one format's job files (OUT/stages/FORMAT), created on first use."""
    path = out_dir / "stages" / fmt
    path.mkdir(parents=True, exist_ok=True)
    return path
