#!/usr/bin/env bash
# Install neox-dar and everything its jobs and tests need into one Python (>= 3.10): $PYTHON if set, else the
# active virtual environment's python ($VIRTUAL_ENV), else python3 on PATH.
# On a machine without a GPU it pins the CPU build of torch; with a GPU it keeps the torch you have.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY=$VIRTUAL_ENV/bin/python
else
  PY=python3
fi
echo "setup: installing into $("$PY" -c 'import sys; print(sys.prefix)') ($PY)" >&2
if command -v nvidia-smi >/dev/null 2>&1 && "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  "$PY" -m pip install -q -e ".[dev]"
else
  "$PY" -m pip install -q torch==2.13.0
  "$PY" -m pip install -q -c constraints-cpu.txt -e ".[dev]"
fi
