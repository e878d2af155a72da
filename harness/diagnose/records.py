"""The records `quantgate diagnose` answers with (its --json is Diagnosis.as_dict())."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Kind = Literal["kv_cache_too_small", "no_kv_cache_memory", "memory_held_elsewhere", "weights_do_not_fit",
               "activation_peak", "cuda_graph_capture", "fragmentation", "out_of_memory", "over_watermark",
               "within_watermark", "kv_exhausted_under_load", "oom_under_load", "sampler_warm_up", "state_cache",
               "training_step", "optimizer_state", "generate", "attention_mask", "weights_loading",
               "profiling_disturbed", "preallocated", "not_recognised", "fits"]


@dataclass(frozen=True)
class Figure:
    label: str
    value: str
    source: str  # "log line N", "given on the command line", "--model config.json", "memory model", ...


@dataclass(frozen=True)
class Change:
    setting: str  # a flag, an environment variable, or an action ("quantize to awq")
    effect: str  # its predicted effect, with the arithmetic
    lever: str = ""  # the normalized lever id (harness.diagnose.levers): "max_model_len_down", "free_other_process"


@dataclass(frozen=True)
class Diagnosis:
    source: str  # the file read, or "stdin"
    reader: Literal["pytorch-oom", "vllm", "sglang", "tgi", "trtllm", "llama.cpp", "lmdeploy", "nvidia-smi", "none"]
    kind: Kind
    summary: str  # which memory ran out, in one sentence
    figures: tuple[Figure, ...] = ()
    changes: tuple[Change, ...] = ()  # best first
    missing: tuple[str, ...] = field(default=())  # what would sharpen the answer, and how to get it
    failing_line: str = ""  # the error line this diagnosis answers, quoted
    lines: str = ""  # "12-40": the part of a log with several failures this diagnosis reads ("" for the whole)

    def as_dict(self) -> dict:
        return asdict(self)
