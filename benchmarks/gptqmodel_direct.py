"""GPTQModel called directly, the floor for quantgate's GPTQ/AWQ stage: `python -m benchmarks.gptqmodel_direct JOB`.

The same calls as harness/quantize/gptqmodel_engine.py makes (load, quantize with batch_size=1, save) with the same
recipe, backend and calibration texts. The recipe switches quantgate applies through GPTQModel's own classes (AWQ's
clip search, float32 calibration where the CPU lacks bf16) are imported from there, so both sides do the same work.
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
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.quantization import AWQConfig, GPTQConfig

    from harness.quantize.gptqmodel_engine import _awq_clip_search, _float32_packing, _source_dtype

    recipe = job["recipe"]
    calibration = json.loads(Path(job["calibration_path"]).read_text(encoding="utf-8"))
    awq = recipe["format"] == "awq"
    config = (AWQConfig if awq else GPTQConfig)(bits=recipe["bits"], group_size=recipe["group_size"])
    backend = BACKEND.AWQ_TORCH if awq else BACKEND.AUTO
    fp32 = bool(job["calibrate_fp32"])
    model = GPTQModel.load(job["source_path"], config, device="cpu", dtype=torch.float32 if fp32 else "auto")
    with _float32_packing(fp32), _awq_clip_search(bool(recipe["extra"].get("apply_clip", True))):
        model.quantize(calibration, batch_size=1, backend=backend)
    if fp32:
        target = _source_dtype(Path(job["source_path"]))
        model.model.to(target)
        model.model.config.dtype = target
    model.save(job["out_dir"])
    write_result(job, {"quantize_s": time.perf_counter() - work_started, "in_process_s": time.perf_counter() - started,
                       "calibration_texts": len(calibration)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
