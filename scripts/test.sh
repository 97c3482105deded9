#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh) and run the whole suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Nothing is JIT-compiled: training never builds DeepSpeed's CPU shm_comm op (neox_dar/training/distributed.py),
# so no torch extension lock is taken at start-up and none is built here either.
# The SLURM acceptance test runs a real one-node cluster: it needs Debian's slurm-wlm and munge.
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
  else
    echo "note: slurm-wlm/munge not installed and not root: tests/test_slurm_cluster.py will be skipped" >&2
  fi
fi
export WANDB_MODE=${WANDB_MODE:-offline}
export PYTHONUNBUFFERED=1
# Two workers (the CI machine has two cores), each test handed to whichever is free: about 1.6x faster than one.
exec python3 -m pytest -q -n 2 --dist worksteal "$@"
