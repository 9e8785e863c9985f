#!/usr/bin/env bash
# A real single-node Slurm for the tests (tests/test_slurm.py): munge, slurmctld, slurmd.
#
#   .ci/setup-slurm.sh          install (apt, when missing), configure and start; idempotent
#   .ci/setup-slurm.sh stop     stop the daemons this script started (by their pid files)
#   .ci/setup-slurm.sh status   exit 0 when a job could be run now
#
# No systemd needed: the daemons are started directly. The configuration is written only
# when /etc/slurm/slurm.conf is absent or was written by this script (marker line), so a
# real cluster's configuration is never replaced. Needs root (Debian/Ubuntu).
set -euo pipefail

MARK="# written by dlscale .ci/setup-slurm.sh"
CONF=/etc/slurm/slurm.conf
RUN=/run/dlscale-slurm
LOG=/var/log/slurm
NODE=$(hostname -s)
CPUS=${DLSCALE_SLURM_CPUS:-$(nproc)}

say() { echo "setup-slurm: $*" >&2; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
    for d in slurmd slurmctld munged; do
        if pid_alive "$RUN/$d.pid"; then
            kill "$(cat "$RUN/$d.pid")" 2>/dev/null || true
        fi
    done
    sleep 1
    for d in slurmd slurmctld munged; do
        if pid_alive "$RUN/$d.pid"; then kill -9 "$(cat "$RUN/$d.pid")" 2>/dev/null || true; fi
        rm -f "$RUN/$d.pid"
    done
    say "stopped"
}

ready() {
    command -v sinfo >/dev/null 2>&1 || return 1
    pgrep -x slurmd >/dev/null && pgrep -x slurmctld >/dev/null || return 1
    local state
    state=$(timeout 10 sinfo -h -N -o '%T' 2>/dev/null | head -n 1) || return 1
    case "$state" in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac
}

case "${1:-start}" in
    stop) stop; exit 0 ;;
    status) ready; exit $? ;;
    start) ;;
    *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac

if ready; then say "Slurm is up ($(sinfo -h -N -o '%N %T' | head -n 1))"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { say "needs root"; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi

mkdir -p "$RUN" "$LOG" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key

if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    say "$CONF exists and was not written by this script: using it as it is"
else
    cat >"$CONF" <<EOF
$MARK
ClusterName=dlscale
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# no cgroups (containers, CI): track processes by parent id, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
fi

if ! pid_alive "$RUN/munged.pid"; then
    say "starting munged"
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
    for _ in $(seq 1 20); do [ -s /run/munge/munged.pid ] && break; sleep 0.25; done
    cp /run/munge/munged.pid "$RUN/munged.pid"
fi
munge -n | unmunge >/dev/null || { say "munge does not work"; exit 1; }

if ! pid_alive "$RUN/slurmctld.pid"; then
    say "starting slurmctld"
    /usr/sbin/slurmctld -i
fi
if ! pid_alive "$RUN/slurmd.pid"; then
    say "starting slurmd"
    /usr/sbin/slurmd
fi

for _ in $(seq 1 60); do
    if ready; then say "Slurm is up ($(sinfo -h -N -o '%N %T' | head -n 1))"; exit 0; fi
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1 || true)
    case "$state" in down*|drain*|fail*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;; esac
    sleep 0.5
done
say "Slurm did not come up; last lines of the logs:"
tail -n 20 "$LOG/slurmctld.log" "$LOG/slurmd.log" >&2 || true
exit 1
