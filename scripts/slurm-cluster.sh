#!/usr/bin/env bash
# A two-node SLURM cluster on this machine, for testing the workflow's SLURM profile the way a cluster runs it
# (tests/test_slurm.py, `make test-slurm`). Needs root, iproute2 and Debian's slurm packages (`start` installs them).
#
#   slurmctld      the root network namespace, 10.77.0.1 on the bridge mgslurm0 (the "login node": sbatch runs here)
#                  under this machine's host name
#   slurmd node1   network namespace mg-node1, host name node1, 10.77.0.11, 2 stand-in GPUs
#   slurmd node2   network namespace mg-node2, host name node2, 10.77.0.12, 2 stand-in GPUs
#
# Each node has a UTS namespace (its own host name) and a mount namespace with its own /etc/hosts, as a cluster's
# DNS would give: both nodes by address, except node1's own name, which its hosts file maps to 127.0.1.1 as Debian's
# installer writes it (so node1 does not find itself under the address SLURM gives: the rendezvous must not need it).
# Jobs inherit both from their slurmd. Tasks are bound to their CPUs (task/affinity), two per node: this machine's. The GPUs are generic resources on empty device files:
# SLURM counts, binds and exports them (CUDA_VISIBLE_DEVICES) without any hardware. Nothing outside this machine is
# reached.
#
# Accounting as a real cluster has it: slurmdbd on a MariaDB of its own (a data directory under $STATE, 127.0.0.1
# only, port 3307), so `sacct` (the status command Snakemake's SLURM plugin uses by default) answers from the
# database. Two partitions: `debug` (the default) and `urgent` on the same nodes, whose jobs preempt debug's
# (PreemptMode=CANCEL: the preempted job ends PREEMPTED, not requeued). Usage: scripts/slurm-cluster.sh start | stop | status
set -euo pipefail
NODES=(node1 node2)
ADDRS=(10.77.0.11 10.77.0.12)
BRIDGE=mgslurm0
CTL_ADDR=10.77.0.1
CONF_DIR=/etc/slurm
STATE=/var/lib/margrpo-slurm
LOGS=/var/log/slurm
CPUS=2          # per node, bound (task/affinity): this machine's 2 cores, shared by both nodes
MEM=6000        # MiB per node
GPUS=2          # stand-in GPUs per node
DB_PORT=3307    # slurmdbd's MariaDB, on 127.0.0.1 (not MariaDB's own 3306)
DB=$STATE/db    # its data directory, socket and pid file (owned by mysql)

install() {
  local tool missing=0
  for tool in slurmctld slurmd slurmdbd munged mariadbd mariadb-install-db; do
    command -v "$tool" >/dev/null || missing=1
  done
  [ "$missing" = 0 ] && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client slurmdbd munge iproute2 \
    mariadb-server >/dev/null
}

network() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  }
  ip link set "$BRIDGE" up
  for i in "${!NODES[@]}"; do
    local node=${NODES[$i]} ns=mg-${NODES[$i]}
    ip netns list | grep -qw "$ns" && continue
    # a process of an earlier cluster's job that outlived it (its slurmstepd) keeps that namespace and its veth
    ip link del "mgv-$node" 2>/dev/null || true
    ip netns add "$ns"
    ip link add "mgv-$node" type veth peer name eth0 netns "$ns"
    ip link set "mgv-$node" master "$BRIDGE" up
    ip -n "$ns" addr add "${ADDRS[$i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

MARK="# margrpo test cluster (scripts/slurm-cluster.sh)"

configure() {
  if [ -e "$CONF_DIR/slurm.conf" ] && ! grep -qxF "$MARK" "$CONF_DIR/slurm.conf"; then
    echo "slurm-cluster: $CONF_DIR/slurm.conf is not this script's: refusing to overwrite it (a real SLURM here?)" >&2
    return 1
  fi
  mkdir -p "$CONF_DIR" "$STATE/ctld" "$LOGS" /run/munge
  for i in "${!NODES[@]}"; do
    {
      echo "127.0.0.1 localhost"
      echo "$CTL_ADDR $(hostname -s)"
      for j in "${!NODES[@]}"; do
        if [ "$i" = 0 ] && [ "$j" = 0 ]; then echo "127.0.1.1 ${NODES[$j]}"; else echo "${ADDRS[$j]} ${NODES[$j]}"; fi
      done
    } > "$STATE/hosts-${NODES[$i]}"
  done
  local nodes_conf="" gres_conf="AutoDetect=off"$'\n'
  for i in "${!NODES[@]}"; do
    local node=${NODES[$i]}
    mkdir -p "$STATE/$node/spool" "$STATE/$node/dev"
    for g in $(seq 0 $((GPUS - 1))); do  # character devices (/dev/null's numbers): SLURM binds only devices
      [ -c "$STATE/$node/dev/nvidia$g" ] || { rm -f "$STATE/$node/dev/nvidia$g"; mknod "$STATE/$node/dev/nvidia$g" c 1 3; }
    done
    nodes_conf+="NodeName=$node NodeAddr=${ADDRS[$i]} NodeHostname=$node CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN"$'\n'
    gres_conf+="NodeName=$node Name=gpu File=$STATE/$node/dev/nvidia[0-$((GPUS - 1))]"$'\n'
  done
  printf '%s' "$gres_conf" > "$CONF_DIR/gres.conf"
  cat > "$CONF_DIR/slurm.conf" <<CONF
$MARK
ClusterName=margrpo-test
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/%n/spool
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
TaskPluginParam=Cores
KillWait=30
JobRequeue=1
# a requeued job may start again after the job credential's lifetime (120 s by default, slurm.conf(5) AuthInfo;
# at least 5): 10 s here, and the scheduler looks at pending jobs every 5 s (60 s and the backfill's 30 s by
# default), so that a requeued job starts again within seconds of its hold, not at the next minute's pass
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
AccountingStorageType=accounting_storage/slurmdbd
# the controller's address, not localhost: sacct inside a job (a node's own network namespace) reaches slurmdbd too,
# as on a cluster (a stopped train job reads its state there: margrpo.infra.slurm.ending_state)
AccountingStorageHost=$CTL_ADDR
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
${nodes_conf}PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP PriorityTier=10
CONF
  cat > "$CONF_DIR/slurmdbd.conf" <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=margrpo-test
StorageLoc=slurm_acct_db
LogFile=$LOGS/slurmdbd.log
PidFile=/run/slurmdbd.pid
CONF
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown -R munge:munge /etc/munge /run/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
}

start_node() {  # slurmd in the node's network namespace, with its own host name and /etc/hosts
  local node=$1
  pgrep -f "slurmd -N $node" >/dev/null && return
  # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs the cgroup file system under it
  nsenter --net="/run/netns/mg-$node" unshare --uts --mount --propagation private sh -c \
    "hostname $node && mount --bind $STATE/hosts-$node /etc/hosts && exec slurmd -N $node" </dev/null >/dev/null 2>&1
}

database() {  # MariaDB for slurmdbd, on a data directory, socket and port of its own; then slurmdbd
  if [ ! -d "$DB/data/mysql" ]; then
    mkdir -p "$DB/data"
    chown -R mysql:mysql "$DB"
    mariadb-install-db --user=mysql --datadir="$DB/data" --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1
  fi
  chown -R mysql:mysql "$DB"
  mariadbd --user=mysql --datadir="$DB/data" --socket="$DB/mysqld.sock" --pid-file="$DB/mysqld.pid" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --skip-log-bin </dev/null >"$LOGS/mariadb.log" 2>&1 &
  local sql=(mariadb --socket="$DB/mysqld.sock" -u root)
  for _ in $(seq 60); do "${sql[@]}" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
  "${sql[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'margrpo-test';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES; DROP DATABASE IF EXISTS slurm_acct_db;"
  slurmdbd </dev/null >/dev/null 2>&1
  for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
  sacctmgr -i add cluster margrpo-test >/dev/null 2>&1 || true  # already there on a second start
  sacctmgr -i add account margrpo Description=tests Organization=margrpo >/dev/null 2>&1 || true
  sacctmgr -i add user root Account=margrpo >/dev/null 2>&1 || true
}

start() {
  install
  stop_daemons
  # every start a clean slate: a job an earlier cluster saved in its state (a held or suspended test job, whose
  # processes may outlive that cluster in its namespaces) would hold a node, and its accounting would share job ids
  rm -rf "$STATE/ctld" "$STATE"/node*/spool
  network
  configure
  if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- munged || munged --force
    pgrep -nx munged > "$STATE/munged.pid"  # ours: `stop` ends it
  fi
  database
  slurmctld </dev/null >/dev/null 2>&1
  for node in "${NODES[@]}"; do start_node "$node"; done
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null | grep -cE 'idle|mixed|alloc')" -eq "${#NODES[@]}" ]; then
      sinfo -N -p debug -o '%N %T %c %m %G'; return 0
    fi
    for node in "${NODES[@]}"; do scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true; done
    sleep 1
  done
  echo "slurm-cluster: the nodes never became idle; see $LOGS/" >&2
  sinfo -N >&2 || true
  tail -n 20 "$LOGS"/slurmctld.log "$LOGS"/slurmd-*.log >&2 || true
  return 1
}

stop_daemons() {  # the daemons this script started, by their pid files: never another SLURM's
  local pids=() f
  for f in /run/slurmctld.pid /run/slurmd-*.pid /run/slurmdbd.pid "$DB/mysqld.pid" "$STATE/munged.pid"; do
    [ -s "$f" ] && grep -qxF "$MARK" "$CONF_DIR/slurm.conf" 2>/dev/null && pids+=("$(cat "$f")")
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.5; done
  kill -9 "${pids[@]}" 2>/dev/null || true  # a slurmd stuck on a job of a namespace gone would block the next start
  rm -f /run/slurmctld.pid /run/slurmd-*.pid /run/slurmdbd.pid "$DB/mysqld.pid" "$STATE/munged.pid"
}

stop() {
  stop_daemons
  for node in "${NODES[@]}"; do
    ip netns del "mg-$node" 2>/dev/null || true
    ip link del "mgv-$node" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo -N -p debug -o '%N %T %c %m %G' ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
