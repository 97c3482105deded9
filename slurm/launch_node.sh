#!/bin/bash
# One SLURM task per node: start torchrun for this node with a static rendezvous derived from SLURM_*.
#
#   srun --ntasks-per-node=1 bash slurm/launch_node.sh NPROC_PER_NODE SCRIPT [ARGS...]
#   srun --ntasks-per-node=1 bash slurm/launch_node.sh NPROC_PER_NODE -m MODULE [ARGS...]   # e.g. the evaluation
#
# Master address: the first host of SLURM_JOB_NODELIST (`scontrol show hostnames`); master port:
# MASTER_PORT_BASE (default 12000) + job id % 20000, the same on every node of a job, different between jobs
# sharing a node, and below Linux's ephemeral ports (32768-60999 by default, net.ipv4.ip_local_port_range), so no
# outgoing connection of the node holds it. No ssh, no pdsh, no hostfile.
# TORCHRUN overrides the launcher command (default: "$PYTHON -m torch.distributed.run").
set -uo pipefail

if (($# < 2)); then
    echo "usage: $0 NPROC_PER_NODE SCRIPT|-m MODULE [ARGS...]" >&2
    exit 2
fi
nproc=$1
shift
: "${SLURM_JOB_ID:?not inside a SLURM job}" "${SLURM_JOB_NODELIST:?}" "${SLURM_NODEID:?}"
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$((${MASTER_PORT_BASE:-12000} + SLURM_JOB_ID % 20000))
NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
NODE_RANK=$SLURM_NODEID
export MASTER_ADDR MASTER_PORT
read -r -a TORCHRUN <<<"${TORCHRUN:-${PYTHON:-python} -m torch.distributed.run}"

echo "launch_node: node $NODE_RANK/$NNODES on $(hostname), master $MASTER_ADDR:$MASTER_PORT, $nproc process(es)"
# A signal sent to the job step (srun forwards the batch script's USR1) reaches every process of the
# step, the trainers included; torchrun must survive it, so it starts with USR1 ignored (the trainers
# install their own handler). TERM keeps torchrun's own handling: it passes TERM on to the workers.
trap '' USR1
exec "${TORCHRUN[@]}" --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$nproc" \
    --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --max_restarts=0 "$@"
