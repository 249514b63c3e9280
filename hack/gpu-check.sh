#!/usr/bin/env bash
# Prove gpujob's CUDA and NVML paths on a machine with one NVIDIA GPU, in under 5 minutes.
#
#   bash hack/gpu-check.sh [--bench-seconds 40] [--work DIR]
#
# Installs nothing: it uses the venv's python ($PYTHON, else $VENV/bin/python, else the
# venv hack/venv.sh made for this checkout, else python3). It runs the example trainer on
# CUDA (one rank, then two processes sharing the GPU), scrapes it, runs `gpujob diagnose`
# and bench/trainer_overhead.py on CUDA, and prints a table of what held (hack/gpu_check.py).
# Exit: 0 all held, 1 a check failed, 3 no usable CUDA device (every check SKIPPED, with why).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" && -n "${VENV:-}" ]]; then py="$VENV/bin/python"; fi
if [[ -z "$py" ]]; then
  for candidate in "$HOME"/.cache/gpujob/venv-*/bin/python; do
    if [[ -x "$candidate" ]]; then py="$candidate"; break; fi
  done
fi
py="${py:-python3}"
export PYTHONPATH="$repo/operator:$repo/trainer_image:$repo/localcluster:$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
cd "$repo"
exec timeout --signal=TERM --kill-after=10 "${GPU_CHECK_TIMEOUT:-290}" "$py" hack/gpu_check.py "$@"
