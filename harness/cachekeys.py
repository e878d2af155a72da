"""Cache keys of the stage results and whether an entry may be reused: every key is a content hash of what decides
the result (artifact, settings with library versions and device, prompts as rendered), so a change to one input
reruns only the stages that depend on it."""

from __future__ import annotations

from pathlib import Path

from harness import __version__
from harness.cache import read_json, stable_hash
from harness.config import RunSpec
from harness.environment import environment
from harness.evalsets import Prompt
from harness.measure.probe import ProbeWorkload
from harness.runtime.serving_engine import is_serving_engine


def device_runtime(spec: RunSpec) -> str:
    """The runtime of the device stage's worker (harness.runtime.registry): --backend's, where it names one. With
    --backend vllm, transformers still measures every format (and generates for one vLLM cannot serve); the
    server's generations are keyed by served.served_key."""
    return "transformers" if is_serving_engine(spec.backend) else spec.backend


def evaluation_settings(spec: RunSpec) -> dict:
    """Everything but the artifact and the prompts that decides a measurement or a generation, library versions
    included: an upgraded torch or transformers reruns every format's measure and generate stages. "backend" is the
    runtime that measures and generates, whatever --backend says (a served format's generations have keys of their
    own)."""
    return {"backend": device_runtime(spec), "dtype": spec.dtype, "threads": spec.threads, "batch_size": spec.batch_size,
            "device": measure_device_key(spec.threads), "quantgate": __version__, "environment": environment()}


def measure_key(artifact_key: str, settings: dict, workload: ProbeWorkload, warmup: int,
                profile: tuple[int, int] | None = None) -> str:
    """`profile`: the (tokens, sequences) of the profile forward the measurement includes; None (no profile) keeps
    the key a measurement without one always had."""
    batch1, batched, batched_new = workload
    key = {"artifact": artifact_key, "settings": settings, "batch1": batch1, "batched": batched,
           "batched_max_new_tokens": batched_new, "warmup": warmup}
    if profile:
        key["profile"] = list(profile)
    return stable_hash(key)


GENERATION_RECORD = 2  # 2: outputs carry their token ids (the fidelity stage's reference continuation)


def generate_key(artifact_key: str, settings: dict, evalset_hash: str, prompts: list[Prompt]) -> str:
    """Prompts as rendered (template included) with their max_new_tokens: a change to either reruns the set."""
    return stable_hash({"artifact": artifact_key, "settings": settings, "evalset": evalset_hash,
                        "prompts": [[p.item_id, p.text, p.max_new_tokens] for p in prompts],
                        "record": GENERATION_RECORD})


def reusable(spec: RunSpec, path: Path) -> bool:
    """May a cache entry be used at all: always with the cache on; under --no-cache only if this run wrote it."""
    if spec.use_cache:
        return True
    try:
        return spec.fresh_after is not None and path.stat().st_mtime >= spec.fresh_after
    except OSError:
        return False


def valid_result(path: Path, required_key: str) -> bool:
    value = read_json(path)
    return isinstance(value, dict) and required_key in value


def quantize_device_key(quantizer, source_path: Path) -> dict:
    """What changes a quantized artifact besides the recipe: the device kind and the dtype calibration ran in
    (on a CPU without bf16 units GPTQ calibrates in float32). Not the CPU model: an artifact made on one CPU
    serves on another."""
    from harness.runtime.device import is_cuda

    if is_cuda():
        return {"kind": "cuda"}
    return {"kind": "cpu", "calibration_dtype": quantizer.calibration_dtype(source_path)}


def measure_device_key(threads: int) -> dict:
    """What changes a measured figure: GPU model and driver, or CPU model, bf16 units and thread count (engine
    versions are in the environment part of the key)."""
    from harness.runtime.device import device_key

    return device_key(threads)

