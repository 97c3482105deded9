#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh) and run the whole suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# DeepSpeed JIT-compiles a small C++ op on its first start (~40 s); keep it between runs.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/neox-dar/torch_extensions}
export WANDB_MODE=${WANDB_MODE:-offline}
export PYTHONUNBUFFERED=1
exec python3 -m pytest -q "$@"
