#!/usr/bin/env bash
# The one prepared check for a GPU machine: TorchScript on CUDA with CUDA graphs for the default recipe, parity
# against eager PyTorch on the GPU, eager vs TorchScript vs CUDA graphs timed per shape, a 30 s warmup at
# concurrency 4, one JSON report (scripts/gpu_check.py says what and how). Needs CUDA torch, numpy, onnx,
# onnxruntime, pydantic and pyyaml; no TVM, no TensorRT, no network. Without a GPU: one line, exit 0.
#
#   scripts/gpu_check.sh [REPORT.json]          # PYTHON=... picks the interpreter (default .venv/bin/python, python3)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" scripts/gpu_check.py "$@"
