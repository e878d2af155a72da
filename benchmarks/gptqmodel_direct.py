"""GPTQModel called directly, the floor for quantgate's GPTQ/AWQ stage: `python -m benchmarks.gptqmodel_direct JOB`.

The same calls as harness/quantize/gptqmodel_engine.py makes (load, quantize with batch_size=1, save) with the same
recipe, config, backend and calibration texts, all taken from there (AWQ's clip search, float32 calibration of GPTQ
where the CPU lacks bf16), so both sides do the same work. Only the reload-and-generate check after saving, which
GPTQModel does not do, is left out.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.common import read_job, write_result


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    job = read_job(argv)
    import torch

    torch.set_num_threads(int(job["threads"]))
    # As in quantgate's quantizer, GPTQModel's import counts as its work.
    work_started = time.perf_counter()
    from gptqmodel import GPTQModel

    from harness.quantize.base import Recipe
    from harness.quantize.gptqmodel_engine import GptqModelQuantizer, _awq_clip_search, calibration_plan

    recipe = Recipe(**job["recipe"])
    calibration = json.loads(Path(job["calibration_path"]).read_text(encoding="utf-8"))
    quantizer = GptqModelQuantizer(recipe.format)
    plan = calibration_plan(Path(job["source_path"]), recipe.format)
    config = quantizer.quantize_config(recipe, offload_to_disk=not plan.cast_after)
    model = GPTQModel.load(job["source_path"], config, device=plan.device, dtype=plan.load_dtype)
    with _awq_clip_search(bool(recipe.extra.get("apply_clip", True))):
        model.quantize(calibration, batch_size=1, backend=quantizer.backend(plan))
    if plan.cast_after:
        model.model.to(plan.store_dtype)
        model.model.config.dtype = plan.store_dtype
    model.save(job["out_dir"])
    write_result(job, {"quantize_s": time.perf_counter() - work_started, "in_process_s": time.perf_counter() - started,
                       "calibration_texts": len(calibration)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
