#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a lent GPU machine that its image lacks, downloaded here into .whl/
# (git-ignored). That machine has no network; its image (/work/.library/device/KINDS.md) holds Python 3.12, torch
# (CUDA), transformers 5.17, accelerate, numpy, pandas, pyarrow, matplotlib, psutil, nvidia-ml-py, but not
# bitsandbytes, pydantic, datasets or rouge-score, and not the transformers quantgate pins. The device call carries
# .whl (64 MiB at most, the working tree included) and gpu_check.sh installs it into a scratch folder on PYTHONPATH:
#
#   scripts/gpu_wheels.sh             then, with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# vLLM does not fit: its CUDA wheel alone is 326.5 MB (vllm 0.32.0) and it pins another torch, so the served check
# (GPU_CHECK_SERVED=1) needs a machine where vLLM is installed. GPTQModel is left out too (it builds CUDA kernels
# from source); the check treats gptq as optional.
# GPU_WHEELS_PYTHON=3.11 fetches for another Python. Rehearsed on a CPU machine, in a Python 3.11 environment holding
# the image's packages (transformers 5.17, accelerate 1.15, numpy 2.4) and none of these:
#   GPU_WHEELS_PYTHON=3.11 scripts/gpu_wheels.sh
#   PYTHON=ENV/bin/python QUANTGATE_DEVICE=cpu scripts/gpu_check.sh --cpu-smoke --formats baseline   # all checks passed
# (without the wheels it stops at `import pydantic`). Exit 1 when a download fails or
# the wheels and the tracked files together pass the carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION="${GPU_WHEELS_PYTHON:-3.12}"
DEST=.whl
LIMIT_BYTES=$((64 * 1024 * 1024))  # what one device call may carry, the working tree included
# Pinned as in pyproject.toml (tests/test_gpu_check.py fails when they drift) and as resolved in .venv.
WHEELS=(
  bitsandbytes==0.50.2 transformers==5.24.0 datasets==5.2.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 nltk==3.10.4
)
SDISTS=(rouge-score==0.1.2)  # published as a source archive only: built into a pure-Python wheel here

rm -rf "$DEST" && mkdir -p "$DEST"
tag="${PY_VERSION/./}"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp --abi "cp$tag" --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$DEST" "${WHEELS[@]}" 2> >(grep -v "^WARNING: Location" >&2)
python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$DEST" "${SDISTS[@]}" \
  2> >(grep -v "^WARNING: Location" >&2)
wheel_bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((wheel_bytes + tree_bytes))
echo "$(ls "$DEST" | wc -l) wheels, $((wheel_bytes / 1048576)) MiB, with the working tree $((total / 1048576)) MiB, in $DEST/"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "too large to carry: $((total / 1048576)) MiB of the $((LIMIT_BYTES / 1048576)) MiB allowed" >&2
  exit 1
fi
