#!/usr/bin/env bash
# Install and start a one-node Slurm cluster on this machine (Debian/Ubuntu; run as root,
# a non-root run only checks that the cluster is up).
#
#   scripts/local_slurm.sh            # then: srun -n 2 python train.py
#
# Installs slurm-wlm and munge with apt-get when missing, creates the munge key, writes
# /etc/slurm/slurm.conf for one node (this host's short name, reached at localhost) and starts
# munged, slurmctld and slurmd directly (no systemd needed: works in containers). The node
# advertises max(nproc, 8) CPUs (SlurmdParameters=config_overrides; override with
# LOCAL_SLURM_CPUS) so that `srun -n 4` runs on a 2-core machine. No cgroups: processes are
# tracked with proctrack/linuxproc, tasks are not bound (task/none), no accounting.
# Idempotent: a second run only checks that all is up (restarting dead daemons, and all the
# daemons when the config changed) and ends with a `srun -n 2 hostname` check.
# Logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log, /var/log/munge/munged.log.
set -euo pipefail

conf=/etc/slurm/slurm.conf
logdir=/var/log/slurm
statedir=/var/lib/slurm/slurmctld
spooldir=/var/lib/slurm/slurmd
ctld_pid=/run/slurmctld.pid
slurmd_pid=/run/slurmd.pid
munge_key=/etc/munge/munge.key
timeout_s=120

node=$(hostname -s)
cpus=${LOCAL_SLURM_CPUS:-$(( $(nproc) > 8 ? $(nproc) : 8 ))}

say() { echo "local_slurm: $*"; }
die() { echo "local_slurm: error: $*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || die "$1 needs root: run 'sudo $0'"; }

logs() {
    local f
    for f in /var/log/munge/munged.log "$logdir/slurmctld.log" "$logdir/slurmd.log"; do
        [[ -r $f ]] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
    done
    return 0
}
fail() { echo "local_slurm: error: $*" >&2; logs; exit 1; }

# pid of a live daemon named $1 from pidfile $2, or nothing (zombies count as dead: the
# container's init may reap them late)
live_pid() {
    local pid
    pid=$(cat "$2" 2>/dev/null || true)
    [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] \
        && ! grep -q '^State:[[:space:]]*[ZX]' "/proc/$pid/status" 2>/dev/null && echo "$pid"
    return 0
}

stop() {  # stop daemon $1 (pidfile $2), SIGKILL after 30 s
    local pid i
    pid=$(live_pid "$1" "$2")
    [[ -n $pid ]] || return 0
    say "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do
        [[ -n $(live_pid "$1" "$2") ]] || return 0
        sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null || true
}

# --- packages
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for pkg in munge slurmctld slurmd slurm-client; do
    installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    need_root "installing ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install Slurm and munge by hand"
    say "installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# --- munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    need_root "starting munged"
    if [[ ! -s $munge_key ]]; then
        say "creating $munge_key"
        install -d -m 700 -o munge -g munge /etc/munge
        dd if=/dev/urandom of="$munge_key" bs=1024 count=1 status=none
        chown munge:munge "$munge_key"
        chmod 400 "$munge_key"
    fi
    stop munged /run/munge/munged.pid  # alive but not answering
    say "starting munged"
    install -d -m 755 -o munge -g munge /run/munge
    install -d -m 700 -o munge -g munge /var/lib/munge /var/log/munge
    # --force: take over a stale socket left by a munged that died
    runuser -u munge -- /usr/sbin/munged --force || fail "munged did not start"
    for ((i = 0; i < 20; i++)); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.5
    done
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || fail "munged does not answer"
fi

# --- slurm.conf
want=$(cat <<EOF
# Written by tfdist scripts/local_slurm.sh: one-node cluster, no cgroups, no accounting.
ClusterName=local
SlurmctldHost=$node(localhost)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$statedir
SlurmdSpoolDir=$spooldir
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$logdir/slurmctld.log
SlurmdLogFile=$logdir/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
NodeName=$node NodeAddr=localhost CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
)
restart=0
if [[ -f $conf ]] && ! head -n 1 "$conf" | grep -q '^# Written by tfdist scripts/local_slurm.sh'; then
    die "$conf exists and was not written by this script: this machine already has a Slurm
configuration, which this script will not replace. Use that cluster's srun, or move the file away."
fi
if [[ ! -f $conf ]] || [[ $(cat "$conf") != "$want" ]]; then
    need_root "writing $conf"
    say "writing $conf ($node, $cpus CPUs)"
    mkdir -p "$(dirname "$conf")"
    printf '%s\n' "$want" >"$conf.tmp"
    mv "$conf.tmp" "$conf"
    restart=1
fi

# --- daemons
if ((restart)) || [[ -z $(live_pid slurmctld "$ctld_pid") ]] || [[ -z $(live_pid slurmd "$slurmd_pid") ]]; then
    need_root "starting the Slurm daemons"
    install -d -m 755 -o slurm -g slurm "$logdir" "$statedir"
    install -d -m 755 "$spooldir"
    if ((restart)); then
        stop slurmd "$slurmd_pid"
        stop slurmctld "$ctld_pid"
    fi
    if [[ -z $(live_pid slurmctld "$ctld_pid") ]]; then
        say "starting slurmctld"
        /usr/sbin/slurmctld || fail "slurmctld did not start"
    fi
    if [[ -z $(live_pid slurmd "$slurmd_pid") ]]; then
        say "starting slurmd"
        slurmd_since=$(date +%FT%T)
        /usr/sbin/slurmd || fail "slurmd did not start"
    fi
fi

# --- wait for the node: registered by the slurmd just started, then idle/mixed/allocated
# (a job that was on the node when slurmd died stays "completing" for up to ~2 minutes)
slurmd_since=${slurmd_since:-}
state= resumed=0 deadline=$((SECONDS + timeout_s))
while ((SECONDS < deadline)); do
    state=$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n 1 || true)
    if [[ -n $slurmd_since ]]; then
        since=$(scontrol show node -o "$node" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' || true)
        since=${since#*=}
        [[ $since =~ ^[0-9] ]] && ! [[ $since < $slurmd_since ]] || state=unregistered
    fi
    case $state in
        idle | mixed | allocated) break ;;
        down | drained | draining | fail | failing)
            if ((!resumed)); then
                resumed=1
                need_root "resuming node $node (state $state)"
                say "node $node is $state: resuming it"
                scontrol update nodename="$node" state=resume || true
            fi ;;
    esac
    sleep 0.5
done
case $state in
    idle | mixed | allocated) ;;
    *) fail "node $node not up after ${timeout_s}s (sinfo state: '${state:-no answer}')" ;;
esac

cpu_use=$(sinfo -h -N -n "$node" -o %C | head -n 1)  # allocated/idle/other/total
idle_cpus=$(cut -d/ -f2 <<<"$cpu_use")
if ! ((idle_cpus >= 2)); then
    say "one-node Slurm up ($cpus CPUs, $idle_cpus idle): busy, srun check skipped"
    exit 0
fi

out=$(cd / && timeout "$timeout_s" srun --quiet -n 2 -J local_slurm_check hostname 2>&1) \
    || fail "'srun -n 2 hostname' failed: $out"
[[ $(grep -c . <<<"$out") == 2 ]] || fail "'srun -n 2 hostname' printed: $out"
say "one-node Slurm up ($cpus CPUs): srun ready"
