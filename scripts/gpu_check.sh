#!/usr/bin/env bash
# GPU check of quantgate's memory predictions (see scripts/gpu_check/): offline, at most 8 minutes.
# Direct measurements of a random-weight TinyLlama-shaped model (baseline, int8, gptq when GPTQModel's kernels work),
# then `quantgate run` itself on that model (baseline,int8,fp8,nvfp4: FP8 and NVFP4 as a GPU runs them), with its
# report.json figures checked.
# Exit codes: 0 all checks passed; 1 a check failed or a format errored; 3 no CUDA device (nothing to check);
# 124 the 8-minute timeout hit. Extra arguments go to `python -m scripts.gpu_check` (e.g. --formats baseline,int8,
# --harness-formats baseline, --keep-model DIR to keep the random model for a rerun).
# On a lent GPU machine, fetch the wheels its image lacks first (scripts/gpu_wheels.sh) and carry .whl.
# GPU_CHECK_SERVED=1 adds the vLLM backend's check on the kept model (scripts/gpu_check_served.py: vLLM's KV
# figures within 3% of the prediction, saturation holds, no server left), when a vLLM is installed there; with two
# GPUs or more, again at tensor parallel 2, at pipeline parallel 2 and with --devices 0,1.
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# On a lent GPU machine: the wheels scripts/gpu_wheels.sh fetched (carried as .whl) go into a scratch folder first.
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE="${GPU_CHECK_SITE:-/tmp/quantgate-gpu-site}"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || { echo "installing the carried wheels (.whl/) failed"; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# The script stops starting direct formats in time to leave the quantgate step 180 s of its 470 s budget, so the
# hard timeout below is a backstop.
if [ "${GPU_CHECK_SERVED:-0}" != "1" ]; then
  exec timeout --kill-after=15 480 "$PYTHON" -m scripts.gpu_check "$@"
fi
MODEL_DIR="${GPU_CHECK_MODEL_DIR:-/tmp/quantgate-gpu-check-model}"
timeout --kill-after=15 480 "$PYTHON" -m scripts.gpu_check --keep-model "$MODEL_DIR" "$@"
code=$?
timeout --kill-after=15 300 "$PYTHON" scripts/gpu_check_served.py "$MODEL_DIR"
served=$?
# Past one GPU: the same check with the plan split by tensor, then by pipeline parallelism, then two formats in
# parallel lanes, one per GPU (int8 is reported as not servable and skipped by the check).
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$gpus" -ge 2 ] && [ "$served" -ne 3 ]; then
  for split in "--tensor-parallel-size 2" "--pipeline-parallel-size 2" "--devices 0,1 --formats baseline,int8"; do
    # shellcheck disable=SC2086 # the split is two words on purpose
    timeout --kill-after=15 300 "$PYTHON" scripts/gpu_check_served.py "$MODEL_DIR" $split || served=1
  done
fi
[ "$code" -ne 0 ] && exit "$code"
[ "$served" -eq 3 ] && exit 0
exit "$served"
