#!/bin/bash
# A one-node SLURM cluster on this machine, for tests and for trying the sweep tool without a cluster.
#
#   slurm/local_cluster.sh start DIR [CPUS]   # munged (if none runs), slurmctld, slurmd; state in DIR
#   slurm/local_cluster.sh stop DIR           # stops the daemons this script started, by their pid files
#   slurm/local_cluster.sh env DIR            # prints `export SLURM_CONF=DIR/slurm.conf`
#
# Needs Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and root (slurmd runs jobs as
# their submitting user). The node is named by `hostname` and has CPUS CPUs (default: nproc; more than the
# machine has is allowed, SlurmdParameters=config_overrides, to run more small jobs at once than there are
# cores); ProctrackType=proctrack/linuxproc and
# TaskPlugin=task/none need no cgroups; no accounting database. Clients (sbatch, squeue, scontrol)
# find the cluster through SLURM_CONF.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop|env DIR [CPUS]" >&2
    exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"

wait_for() {  # wait_for SECONDS COMMAND...: retry COMMAND until it succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then return 1; fi
        sleep 0.1
    done
}

start() {
    local cpus=${1:-$(nproc)}
    for b in munged slurmctld slurmd sbatch; do
        command -v "$b" >/dev/null || { echo "$b not found: apt-get install -y slurm-wlm munge" >&2; exit 1; }
    done
    local host
    host=$(hostname)
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    # munged: the system key, a socket of our own, run as the munge user. Its directory lies directly
    # under /tmp: the munge user must reach it (pytest's and mktemp's directories are private to root).
    local mdir
    if [[ -f "$dir/munge.path" ]]; then mdir=$(cat "$dir/munge.path"); else
        mdir=$(mktemp -d /tmp/neox-dar-munge.XXXXXX)
        echo "$mdir" > "$dir/munge.path"
    fi
    if [[ ! -S "$mdir/munge.socket" ]]; then
        chown munge:munge "$mdir"
        chmod 0755 "$mdir"
        runuser -u munge -- munged --socket="$mdir/munge.socket" --pid-file="$mdir/munged.pid" \
            --log-file="$mdir/munged.log" --seed-file="$mdir/munged.seed" --force
        wait_for 10 test -S "$mdir/munge.socket" || { echo "munged did not start; see $mdir/munged.log" >&2; exit 1; }
        cp "$mdir/munged.pid" "$dir/munged.pid"
    fi
    cat > "$conf" <<CONF
ClusterName=local
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$mdir/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$((6800 + RANDOM % 1000))
SlurmdPort=$((7800 + RANDOM % 1000))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
MinJobAge=600
SlurmdParameters=config_overrides
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName=$host CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    export SLURM_CONF="$conf"
    slurmctld -f "$conf"
    wait_for 20 scontrol ping || { echo "slurmctld did not start; see $dir/log/slurmctld.log" >&2; exit 1; }
    slurmd -f "$conf"
    wait_for 30 bash -c "sinfo -h -o %T | grep -Eq '^(idle|mixed|allocated)'" \
        || { echo "slurmd did not register; see $dir/log/slurmd.log" >&2; exit 1; }
    echo "export SLURM_CONF=$conf"
}

stop_pidfiles() {  # stop_pidfiles FILE...: TERM the processes in the FILEs at once and wait for them to exit
    # (each daemon takes ~2 s to exit on TERM; stopped one after another they took ~6 s)
    local f pid pids=()
    for f in "$@"; do
        [[ -f "$f" ]] || continue
        pid=$(cat "$f")
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" && pids+=("$pid")
        fi
    done
    for pid in "${pids[@]}"; do
        wait_for 20 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null || true
    done
    rm -f "$@"
}

case "$cmd" in
    start) start "${3:-}" ;;
    stop)
        stop_pidfiles "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"
        if [[ -f "$dir/munge.path" ]]; then rm -rf "$(cat "$dir/munge.path")" "$dir/munge.path"; fi
        ;;
    env) echo "export SLURM_CONF=$conf" ;;
    *) echo "usage: $0 start|stop|env DIR [CPUS]" >&2; exit 2 ;;
esac
