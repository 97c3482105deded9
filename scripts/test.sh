#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh) and run the whole suite on CPU.
#   bash scripts/test.sh                          # every test, the end-to-end tier included
#   bash scripts/test.sh --fast                   # the fast tier: pytest -m "not e2e" (the e2e list: tests/conftest.py)
#   bash scripts/test.sh tests/test_model.py -x   # extra arguments go to pytest
# The interpreter is $PYTHON if set, else the active virtual environment's python, else python3 (setup.sh
# installs into the same one). The suite's wall time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
fi
if [ -z "${PYTHON:-}" ] && [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PYTHON=$VIRTUAL_ENV/bin/python
fi
PYTHON=${PYTHON:-python3}
export PYTHON
bash scripts/setup.sh
# Nothing is JIT-compiled: training never builds DeepSpeed's CPU shm_comm op (neox_dar/training/distributed.py),
# so no torch extension lock is taken at start-up and none is built here either.
# The SLURM acceptance test (end-to-end tier) runs a real one-node cluster: it needs Debian's slurm-wlm and munge.
if [ "$FAST" = 0 ] && { ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
  else
    echo "note: slurm-wlm/munge not installed and not root: tests/test_slurm_cluster.py will be skipped" >&2
  fi
fi
export WANDB_MODE=${WANDB_MODE:-offline}
export PYTHONUNBUFFERED=1
# Two workers (the CI machine has two cores), each test handed to whichever is free: about 1.6x faster than one.
ARGS=(-q -n 2 --dist worksteal)
TIER="whole suite"
if [ "$FAST" = 1 ]; then
  ARGS+=(-m "not e2e")
  TIER='fast tier (-m "not e2e")'
fi
start=$(date +%s)
rc=0
"$PYTHON" -m pytest "${ARGS[@]}" "$@" || rc=$?
elapsed=$(( $(date +%s) - start ))
printf 'test.sh: %s took %d min %02d s wall (pytest exit %d)\n' "$TIER" $((elapsed / 60)) $((elapsed % 60)) "$rc"
exit "$rc"
