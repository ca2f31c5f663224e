#!/usr/bin/env bash
# A single-node SLURM cluster on localhost, for testing workflow/profiles/slurm against a real
# scheduler (the `slurm`-marked test of tests/test_workflow.py). Needs root and Debian's packages; `start` installs them.
#   scripts/slurm-local.sh start    install (if needed), configure, start munged, slurmctld, slurmd
#   scripts/slurm-local.sh stop
set -euo pipefail
CONF_DIR=/etc/slurm
STATE=/var/spool/slurm-local
JOBCOMP=/var/log/slurm/jobcomp.log

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

configure() {
  local cpus mem host
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  host=$(hostname -s)
  mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" /var/log/slurm /run/munge
  cat > "$CONF_DIR/slurm.conf" <<CONF
ClusterName=margrpo-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
}

start() {
  install
  configure
  pgrep -x munged >/dev/null || runuser -u munge -- munged || munged --force
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed"; then sinfo; return 0; fi
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm-local: the node never became idle; see /var/log/slurm/*.log" >&2
  tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
  return 1
}

stop() {
  pkill -x slurmd || true
  pkill -x slurmctld || true
  pkill -x munged || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
