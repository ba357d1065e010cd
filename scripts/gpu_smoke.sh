#!/usr/bin/env bash
# A prepared check for a machine with one CUDA GPU (not part of the tests): a
# small Llama in bf16 on the GPU against the fp32 CPU reference, within the
# tolerance scripts/gpu_smoke.py states. Needs a CUDA build of torch:
#   pip install -e . --extra-index-url https://download.pytorch.org/whl/cu126 (or the machine's own)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_smoke.py
