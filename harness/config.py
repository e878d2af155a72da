"""The run spec: every setting of a run, from a TOML file and CLI flags, validated with readable errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import UserError
from harness.formats import check_format_names, default_formats, known_formats
from harness.quantize import DEFAULT_CALIBRATION_SAMPLES

BUNDLED_EVALSETS = Path(__file__).resolve().parent.parent / "evalsets"


class FormatSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int | None = Field(default=None, gt=0)
    calibration_samples: int | None = Field(default=None, gt=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)


class CapacitySettings(BaseModel):
    """The target of the report's serving plans. target_gpu: a GPU of the table (harness.capacity.gpus), at
    its memory as torch reports it, or at gpu_memory_gib when both are given (a MIG slice, a shared card: its compute
    capability kept); without it the target is a GPU of gpu_memory_gib (compute capability unknown). What the run leaves unset comes from the policy's [serving] target
    (for_report), else an 80 GiB GPU and the run's longest request."""

    model_config = ConfigDict(extra="forbid")
    target_gpu: str | None = None
    gpu_memory_gib: float | None = Field(default=None, gt=0)  # None: not given (see for_report)
    # None: the vLLM version's own default (0.92 on 0.32/0.33; 0.34 sets the KV cache with --kv-cache-memory-bytes)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, gt=0)
    # Measured CUDA context + non-torch memory per GPU (vLLM logs it as non_torch_memory at start-up); replaces the
    # planners' estimate. None: the estimate (harness.capacity.memory.NON_TORCH_BYTES).
    overhead_gib: float | None = Field(default=None, ge=0)
    # The vLLM rules the plans follow; None: the vLLM serving the run, else the installed one, else the newest.
    vllm_version: str | None = None

    @field_validator("vllm_version")
    @classmethod
    def _known_version(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from harness.capacity import resolve_version

        return resolve_version(value)[0]  # ValueError names the known versions

    @field_validator("target_gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from harness.capacity.gpus import gpu_by_name

        return gpu_by_name(value).name  # ValueError names the known GPUs

    def target(self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1):
        """The capacity.Target of the plans: the named GPU, or without one a GPU of gpu_memory_gib, that many times
        (the run's --tensor-parallel-size x --pipeline-parallel-size)."""
        from harness.capacity import Target, gpu_by_name, gpu_of_size

        named = gpu_by_name(self.target_gpu) if self.target_gpu else None
        size = self.gpu_memory_gib
        if named is None:
            gpu = gpu_of_size(size or DEFAULT_GPU_MEMORY_GIB)
        elif size is None or abs(size * 2**30 - named.memory_bytes) < 2**20:  # its own size (for_report fills it)
            gpu = named
        else:
            gpu = gpu_of_size(size, like=named)
        return Target(gpu, tensor_parallel_size, pipeline_parallel_size)

    def for_report(self, serving) -> ReportCapacity:
        """The settings the report's serving plans use: the run's own target where it names one (target_gpu or
        gpu_memory_gib; max_model_len), the policy's [serving] target (a policy.ServingTarget) for what it leaves
        open, so that the printed commands are for the deployment the capacity check judges; else an 80 GiB GPU
        (max_model_len None: the run's longest request)."""
        from harness.capacity import gpu_by_name

        named = self.target_gpu is not None or self.gpu_memory_gib is not None
        update: dict = {}
        if serving.checked and not named:
            update["target_gpu"] = serving.target_gpu
        if serving.checked and self.max_model_len is None:
            update["max_model_len"] = serving.length
        settings = self.model_copy(update=update)
        gpu_memory_gib = settings.gpu_memory_gib or (gpu_by_name(settings.target_gpu).memory_bytes / 2**30
                                                      if settings.target_gpu else DEFAULT_GPU_MEMORY_GIB)
        source = "run" if named else "policy" if serving.checked else "default"
        return ReportCapacity(settings=settings.model_copy(update={"gpu_memory_gib": gpu_memory_gib}),
                              target_source=source)


DEFAULT_GPU_MEMORY_GIB = 80.0


class ReportCapacity(BaseModel):
    """CapacitySettings.for_report: the settings the report's plans follow, and where their GPU came from ("run":
    --target-gpu/--gpu-memory-gib or the config; "policy": its [serving] target_gpu; "default": an 80 GiB GPU)."""

    model_config = ConfigDict(frozen=True)
    settings: CapacitySettings
    target_source: Literal["run", "policy", "default"]


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = "demo"
    formats: list[str] = Field(default_factory=default_formats)
    evalsets: list[str] = Field(default_factory=lambda: [str(BUNDLED_EVALSETS)])
    out: str = "quantgate-report"
    policy: str | None = None
    group_size: int | None = Field(default=None, gt=0)
    format_settings: dict[str, FormatSettings] = Field(default_factory=dict)
    calibration: str | None = None
    allow_calibration_overlap: bool = False
    allow_outside_paths: bool = False  # evalset specs may name data and calibration files outside their directory
    calibration_samples: int = Field(default=DEFAULT_CALIBRATION_SAMPLES, gt=0)
    max_items: int | None = Field(default=None, gt=0)
    max_new_tokens: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=8, gt=0)
    threads: int = Field(default=1, gt=0)
    dtype: str = "auto"
    seed: int = 0
    latency_requests: int = Field(default=20, gt=0)
    warmup_requests: int = Field(default=2, ge=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)  # per format subprocess; killed above it
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    use_cache: bool = True
    # Set by --no-cache: entries written since then (by this run) still count, so that --resume of a --no-cache
    # run redoes only what it had not finished.
    fresh_after: float | None = None
    trust_remote_code: bool = False
    # Checkpoints quantized elsewhere, judged like the built-in formats (harness.candidates): name -> directory.
    candidates: dict[str, str] = Field(default_factory=dict)
    baseline_is_quantized: bool = False  # allow a --model that carries a quantization_config
    allow_tokenizer_mismatch: bool = False
    # The backend that scores and times each format: transformers in-process, or a vLLM server (harness.served).
    backend: str = "transformers"
    vllm: str | None = None  # the user's own `vllm` executable
    vllm_endpoints: dict[str, str] = Field(default_factory=dict)  # format -> URL of a server the user runs
    vllm_kv_cache_gib: int = Field(default=1, gt=0)  # CPU: VLLM_CPU_KVCACHE_SPACE (vLLM takes whole GiB)
    max_num_seqs: int | None = Field(default=None, gt=0)  # vLLM --max-num-seqs (default: the plan's; CPU: batch size)
    concurrency: list[int] | None = None  # served latency at these concurrencies (default: 1 and max-num-seqs)
    tensor_parallel_size: int = Field(default=1, gt=0)
    pipeline_parallel_size: int = Field(default=1, gt=0)
    vllm_startup_timeout_s: float = Field(default=900.0, gt=0)
    devices: list[int] | None = None  # CUDA devices to spread formats over, in groups of TP x PP devices
    # How the formats' chains run (harness.executors.registry): "local" (this machine: one after another, or lanes
    # with devices), "ray" (one Ray task a format, on the cluster at ray_address: None is RAY_ADDRESS, else a local
    # Ray started for the run).
    executor: str = "local"
    ray_address: str | None = None
    cache_url: str | None = None  # --cache URL: the cache in an fsspec store every node reads (executors.remote_cache)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, value: str) -> str:
        from harness.executors.registry import EXECUTORS

        if value not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}")
        return value

    @model_validator(mode="after")
    def _devices_split_into_groups(self) -> "RunSpec":
        if self.devices:
            size = self.tensor_parallel_size * self.pipeline_parallel_size
            if len(set(self.devices)) != len(self.devices) or len(self.devices) % size:
                raise ValueError(f"devices {self.devices}: give distinct device numbers, a multiple of "
                                 f"tensor x pipeline parallel size ({size}) of them")
        return self

    def device_groups(self) -> list[str]:
        """--devices 0,1,2,3 with tensor parallel 2 -> ["0,1", "2,3"]; [] without --devices."""
        if not self.devices:
            return []
        size = self.tensor_parallel_size * self.pipeline_parallel_size
        return [",".join(str(d) for d in self.devices[i:i + size]) for i in range(0, len(self.devices), size)]

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from harness.runtime.registry import RUNTIMES
        from harness.runtime.serving_engine import SERVING_ENGINES

        if value not in SERVING_ENGINES and value not in RUNTIMES:
            raise ValueError(f"backend must be a registered serving engine ({', '.join(SERVING_ENGINES)}) or "
                             f"runtime ({', '.join(RUNTIMES)})")
        return value

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v <= 0 for v in value)):
            raise ValueError("concurrency: positive integers, e.g. [1, 8, 32]")
        return value

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, value: list[str]) -> list[str]:
        try:
            return check_format_names(value, "formats")
        except UserError as exc:
            raise ValueError(str(exc).removeprefix("formats: ")) from None

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError("dtype must be auto, bfloat16, float16 or float32")
        return value

    @field_validator("candidates")
    @classmethod
    def _candidate_names(cls, value: dict[str, str]) -> dict[str, str]:
        from harness.candidates import check_candidate_name

        for name in value:
            try:
                check_candidate_name(name, f"candidates.{name}", known_formats())
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return value

    def all_formats(self) -> list[str]:
        """The built-in formats (baseline first) and then the candidates, in the order given."""
        return [*self.formats, *self.candidates]

    def group_size_for(self, fmt: str) -> int | None:
        settings = self.format_settings.get(fmt)
        return settings.group_size if settings and settings.group_size else self.group_size

    def memory_limit_bytes_for(self, fmt: str) -> int | None:
        settings = self.format_settings.get(fmt)
        gib = settings.memory_limit_gib if settings and settings.memory_limit_gib else self.memory_limit_gib
        return int(gib * 2**30) if gib else None

    def calibration_samples_for(self, fmt: str) -> int:
        settings = self.format_settings.get(fmt)
        return settings.calibration_samples if settings and settings.calibration_samples else self.calibration_samples


def config_candidates(table: dict, config_dir: Path) -> dict:
    """[candidates] name = path; a relative path is relative to the config file's directory (not the shell's)."""
    resolved = {}
    for name, given in table.items():
        if isinstance(given, str) and given.strip():
            path = Path(given.strip()).expanduser()
            resolved[name] = str(path if path.is_absolute() else config_dir / path)
        else:
            resolved[name] = given  # left for the field's own validation to name
    return resolved


def build_spec(config_path: str | None, overrides: dict, source_name: str = "command line") -> RunSpec:
    """Config file values first, CLI flags (non-None overrides) on top."""
    values: dict = {}
    if config_path:
        path = Path(config_path)
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"--config {path}: no such file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not valid TOML ({exc})") from None
        if isinstance(values.get("formats"), dict):  # [formats.gptq] tables: names and per-format settings
            values["format_settings"] = values["formats"]
            values["formats"] = list(values["formats"])
        if isinstance(values.get("candidates"), dict):
            values["candidates"] = config_candidates(values["candidates"], path.parent)
        source_name = str(path)
    values.update({k: v for k, v in overrides.items() if v is not None and k != "candidates"})
    if overrides.get("candidates"):  # --candidate adds to [candidates], and replaces the entry of the same name
        table = values.get("candidates")
        values["candidates"] = {**(table if isinstance(table, dict) else {}), **overrides["candidates"]}
    if values.get("candidates") and "formats" not in values:
        values["formats"] = ["baseline"]  # judging checkpoints made elsewhere: quantize nothing unless asked
    try:
        return RunSpec(**values)
    except ValidationError as exc:
        problems = [f"{source_name}: field '{'.'.join(str(p) for p in e['loc'])}': {e['msg']}" for e in exc.errors()]
        raise UserError(problems[0], problems=problems[1:]) from None
