#!/usr/bin/env bash
# GPU check of quantgate's memory predictions (see scripts/gpu_check.py): offline, at most 8 minutes.
# Exit codes: 0 all checks passed; 1 a check failed or a format errored; 3 no CUDA device (nothing to check);
# 124 the 8-minute timeout hit. Extra arguments go to gpu_check.py (e.g. --formats baseline,int8).
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The script stops starting new formats after 470 s, so the hard timeout below is a backstop.
exec timeout --kill-after=15 480 "$PYTHON" scripts/gpu_check.py "$@"
