"""Real frozen records for tests that feed a stage directly: stages take real records, never look-alike fakes.

`run_inputs(**overrides)` is a harness.records.RunInputs with cheap defaults (no model is resolved or loaded, no
evalset read); `format_run(name, **values)` a harness.records.FormatRun. A test passes what its stage reads."""

from __future__ import annotations

from pathlib import Path

from harness.config import RunSpec
from harness.policy import Policy
from harness.records import FormatRun, RunInputs
from harness.report.schema import Served
from harness.source import ModelSource

NOWHERE = Path("/nonexistent")
# A source by value: nothing resolves, fingerprints or reads it (harness.source.resolve_source would).
SOURCE = ModelSource("demo", "demo", NOWHERE, "sha256:test", "a test source")


def run_inputs(**overrides) -> RunInputs:
    """A RunInputs: RunSpec() defaults, no evalsets, prompts, recipes or calibration, the default Policy, an empty
    model config; `overrides` name RunInputs fields and replace those defaults."""
    defaults = {"spec": RunSpec(), "out_dir": NOWHERE, "source": SOURCE, "model_config": {}, "evalsets": [],
                "policy": Policy(), "recipes": {}, "prompts": {}, "calibration": None}
    return RunInputs(**{**defaults, **overrides})


def served_entry(**values) -> Served:
    """A format's `served` block (harness.served.served_block's keys): served by vLLM, nothing measured unless
    `values` say so."""
    block = {"status": "ok", "reason": None, "engine": "vllm", "scored": True, "source": "a test", "version": "0.32.0",
             "endpoint": None, "command": None, "flags": {}, "kernels": [], "cpu_kernel_library": None,
             "startup_s": None, "log": None, "kv_cache": None, "latency": {}, "saturation": None,
             "rss_peak_bytes": None, "baseline_probe": None}
    return Served.model_validate({**block, **values})


def format_run(name: str = "baseline", **values) -> FormatRun:
    """A FormatRun named `name` (status "ok", nothing measured or generated unless `values` say so)."""
    return FormatRun(name, **values)
