#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine, for tests/workflow/test_slurm.py and
# `make slurm`. Idempotent: installs Debian's slurm-wlm + munge when missing (root +
# apt-get), writes /etc/slurm/slurm.conf, starts munged, slurmctld and slurmd, and waits
# until the node accepts jobs. Prints nothing on success but the final `sinfo` line.
#
# The cluster has no accounting database (AccountingStorageType=accounting_storage/none),
# so `sacct` cannot report job states. The snakemake SLURM executor then needs
# `status_command: squeue`, which only sees jobs for MinJobAge seconds after they end;
# hence MinJobAge=600 below (the plugin itself falls back to sacct below 3 x its first
# status-check delay). No cgroups (containers rarely allow them): proctrack/linuxproc,
# task/none. No GPUs (no gres.conf); profiles/slurm-test sets gpu=0.
#
# Env: SPECBUILD_SLURM_CPUS (default: nproc, at least 2), SPECBUILD_SLURM_MEM_MB (default:
# 90% of RAM), SPECBUILD_SLURM_FORCE_CONF=1 rewrites a
# slurm.conf this script did not write (never done silently: a real cluster's config
# must not be clobbered). SPECBUILD_SLURM_STARTED=<file>: on exit, append "<daemon> <pid>"
# for each daemon that was not running when the script began (tests/slurm/cluster.py stops
# those, and only those, after the last test; a daemon it found running, even one restarted
# for a new slurm.conf, is never listed).
set -euo pipefail

MARKER="# specbuild single-node test cluster (tests/slurm/start_slurm.sh)"
CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm

die() { echo "start_slurm.sh: $*" >&2; exit 1; }

need_install=0
for tool in munged slurmctld slurmd sbatch squeue srun; do
    command -v "$tool" >/dev/null 2>&1 || need_install=1
done
if [[ $need_install == 1 ]]; then
    [[ $(id -u) == 0 ]] || die "SLURM is not installed and installing it needs root"
    command -v apt-get >/dev/null || die "SLURM is not installed and apt-get is missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
fi
[[ $(id -u) == 0 ]] || die "starting slurmctld/slurmd/munged needs root"

host=$(hostname -s)
# At least 2 CPUs (profiles/slurm-test caps jobs at 2 threads): with no cgroups, SLURM
# takes the configured count as given (SlurmdParameters=config_overrides).
cpus=${SPECBUILD_SLURM_CPUS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}
# 90% of physical memory (--mem requests above it are refused at submission).
mem_mb=${SPECBUILD_SLURM_MEM_MB:-$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)}

if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF" && [[ ${SPECBUILD_SLURM_FORCE_CONF:-0} != 1 ]]; then
    die "$CONF exists and was not written by this script; set SPECBUILD_SLURM_FORCE_CONF=1 to replace it"
fi

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR" /run/munge
new_conf=$(cat <<EOF
$MARKER
ClusterName=specbuild
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Cores are consumable, memory is not: --mem is checked against RealMemory but two
# jobs on this node never wait for each other's memory (there is no cgroup to enforce it).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# squeue must still list finished jobs when the executor polls (see header).
MinJobAge=600
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
conf_changed=0
if [[ ! -e $CONF ]] || [[ "$(cat "$CONF")" != "$new_conf" ]]; then
    printf '%s\n' "$new_conf" > "$CONF"
    conf_changed=1
fi

# A daemon runs if the pid in its pid file is alive (no pgrep: procps may be absent).
DAEMONS=(munged slurmctld slurmd)
pidfile() { case $1 in munged) echo /run/munge/munged.pid ;; *) echo "/run/$1.pid" ;; esac; }
running() { local f; f=$(pidfile "$1"); [[ -s $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; }
found=()
for d in "${DAEMONS[@]}"; do running "$d" && found+=("$d"); done
report_started() {
    [[ -n ${SPECBUILD_SLURM_STARTED:-} ]] || return 0
    local d
    for d in "${DAEMONS[@]}"; do
        [[ " ${found[*]} " == *" $d "* ]] && continue
        running "$d" && echo "$d $(cat "$(pidfile "$d")")" >> "$SPECBUILD_SLURM_STARTED"
    done
    return 0
}
# on failure too: what did start is stopped all the same
trap report_started EXIT

if ! running munged; then
    # The package's postinst makes the key; an image built without it may lack one.
    [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    mkdir -p /var/lib/munge /var/log/munge
    chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 0600 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.2; done
munge -n </dev/null | unmunge >/dev/null || die "munged does not answer"

if [[ $conf_changed == 1 ]]; then
    # A changed config needs fresh daemons (and a clean state, the node name may differ).
    # Stop them by the pid files they wrote, never by name.
    for d in slurmd slurmctld; do
        if running "$d" && kill "$(cat "$(pidfile "$d")")"; then
            for _ in $(seq 50); do running "$d" || break; sleep 0.2; done
        fi
    done
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
fi
running slurmctld || /usr/sbin/slurmctld
running slurmd || /usr/sbin/slurmd

# Wait until the node is idle (or mixed/allocated: someone is already using it).
for _ in $(seq 120); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
    case $state in
        idle*|mixed*|alloc*) sinfo -h -N -o "%N %T cpus=%c mem=%m"; exit 0 ;;
        drain*|down*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
done
echo "--- slurmctld.log" >&2; tail -20 "$LOGDIR/slurmctld.log" >&2 || true
echo "--- slurmd.log" >&2; tail -20 "$LOGDIR/slurmd.log" >&2 || true
die "node $host did not become idle (state: ${state:-unknown})"
