#!/usr/bin/env bash
# Install neox-dar and everything its jobs and tests need into the current Python (>= 3.10).
# On a machine without a GPU it pins the CPU build of torch; with a GPU it keeps the torch you have.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if command -v nvidia-smi >/dev/null 2>&1 && "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  "$PY" -m pip install -q -e ".[dev]"
else
  "$PY" -m pip install -q torch==2.13.0
  "$PY" -m pip install -q -c constraints-cpu.txt -e ".[dev]"
fi
