"""The checkpoint each format is judged on: the baseline and a --candidate as they are, a built-in format quantized
in a worker (or taken from the cache, sealed under the hash of everything that decides it)."""

from __future__ import annotations

import time
from pathlib import Path

from harness import __version__, progress
from harness.cache import SEAL, atomic_write_json, cache_dir, is_sealed, read_json, remove_tree, seal_dir, stable_hash
from harness.cachekeys import quantize_device_key, reusable
from harness.collect import failure_reason
from harness.jobs import QuantizeJob, stage_dir
from harness.launcher import run_worker
from harness.quantize import quantizer_for
from harness.quantize.base import Recipe
from harness.records import Artifact, RunInputs
from harness.report.schema import Artifact as ArtifactEntry
from harness.report.schema import Manifest
from harness.runtime.serving_engine import is_serving_engine


def artifact_for(inputs: RunInputs, fmt: str, devices: str | None) -> Artifact:
    """The baseline and a --candidate are ready checkpoints; a built-in format is quantized (or taken from the
    cache)."""
    if fmt == "baseline":
        path = inputs.source.path
        return Artifact(inputs.source.fingerprint, path, artifact_entry(
            path, True, {"engine": "none", "format": "baseline", "source": inputs.source.fingerprint}))
    if fmt in inputs.candidates:
        from harness.candidates import not_runnable_here
        from harness.runtime.device import is_cuda

        candidate = inputs.candidates[fmt]
        entry = artifact_entry(candidate.path, True, {**candidate.provenance(), "recipe": inputs.recipes[fmt].as_dict()})
        blocked = None if is_serving_engine(inputs.spec.backend) else not_runnable_here(candidate, cuda=is_cuda())
        if blocked:
            progress.say(f"{fmt}: not runnable on this device: {blocked}")
            return Artifact(None, None, entry, error=f"not runnable on this device: {blocked}")
        return Artifact(candidate.fingerprint, candidate.path, entry)
    return ensure_artifact(inputs, fmt, devices)


def ensure_artifact(inputs: RunInputs, fmt: str, devices: str | None) -> Artifact:
    recipe = inputs.recipes[fmt]
    quantizer = quantizer_for(fmt)
    calibration = list(inputs.calibration.texts[: recipe.calibration_samples]) if recipe.calibration_samples else []
    manifest = {"engine": quantizer.engine, "versions": quantizer.versions(), "format": fmt,
                "recipe": recipe.as_dict(), "source": inputs.source.fingerprint,
                "calibration_hash": "sha256:" + stable_hash(calibration), "calibration_texts": len(calibration),
                "calibration_source": inputs.calibration.source if calibration else None,
                "device": quantize_device_key(quantizer, inputs.source.path), "quantgate": __version__}
    key = stable_hash({k: v for k, v in manifest.items() if k != "quantgate"})
    out_dir = cache_dir("artifacts") / f"{fmt}-{key[:20]}"
    cached = reusable(inputs.spec, out_dir / SEAL) and is_sealed(out_dir, required=("quantgate_manifest.json",))
    if not cached:
        remove_tree(out_dir)
        progress.say(f"{fmt}: quantizing ({manifest['engine']} {manifest['versions'].get(manifest['engine'], '')}, "
                     f"{recipe_text(recipe)})")
        calibration_path = stage_dir(inputs.out_dir, fmt) / "calibration.json"
        atomic_write_json(calibration_path, calibration)
        failure_path = stage_dir(inputs.out_dir, fmt) / "quantize.failed.json"
        failure_path.unlink(missing_ok=True)
        job = QuantizeJob(format=fmt, devices=devices, source_path=str(inputs.source.path),
                          recipe=recipe.as_dict(), calibration_path=str(calibration_path), out_dir=str(out_dir),
                          manifest=manifest, trust_remote_code=inputs.spec.trust_remote_code,
                          threads=inputs.spec.threads, failure_path=str(failure_path))
        started = time.time()
        exit_ = run_worker(job, stage_dir(inputs.out_dir, fmt) / "quantize.job.json", inputs.out_dir / "logs" / f"{fmt}.log",
                           fmt, inputs.spec.memory_limit_bytes_for(fmt))
        if exit_.returncode != 0 or not (out_dir / "quantgate_manifest.json").is_file():
            engine = f"{manifest['engine']} {manifest['versions'].get(manifest['engine'], '')}".strip()
            return Artifact(None, None, None, ("quantize",),
                            failure_reason(failure_path, exit_, "quantization", engine=engine))
        seal_dir(out_dir)
        progress.say(f"{fmt}: quantized in {time.time() - started:.0f}s -> {out_dir}")
    else:
        progress.say(f"{fmt}: reusing cached artifact {out_dir.name}")
    entry = artifact_entry(out_dir, cached, read_json(out_dir / "quantgate_manifest.json"))
    return Artifact(key, out_dir, entry, () if cached else ("quantize",))


def artifact_entry(path: Path, cached: bool, manifest: dict | None) -> ArtifactEntry:
    """The report's artifact block of the checkpoint at `path`."""
    return ArtifactEntry(path=str(path), size_bytes=weights_size(path), cached=cached,
                         manifest=Manifest.model_validate(manifest) if manifest is not None else None)


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin"))


def recipe_text(recipe: Recipe) -> str:
    parts = [f"{recipe.bits}-bit"]
    if recipe.group_size:
        parts.append(f"group {recipe.group_size}")
    if recipe.calibration_samples:
        parts.append(f"{recipe.calibration_samples} calibration texts")
    return ", ".join(parts)
