#!/usr/bin/env bash
# A Slurm cluster on this machine (Debian's slurm-wlm + munge), for running the multi-rank tests
# under srun as users on clusters do: one node, or two nodes on the simulated hosts of
# scripts/two_hosts.sh.
#
#   slurm_cluster.sh up            install what is missing (apt), write the config, start munged,
#                                  slurmctld and slurmd; waits until the node takes jobs
#   slurm_cluster.sh up-two-hosts  the same with two nodes, h0 and h1: the simulated hosts (made
#                                  afresh, names known), one slurmd in each, slurmctld in h0
#   slurm_cluster.sh srun ARGS...  srun from h0 on the two-node cluster (on-h0 CMD...: any command)
#   slurm_cluster.sh down          stop the daemons (the two-node cluster's hosts are removed)
#   slurm_cluster.sh check         exit 0 when a cluster answers (`srun hostname` works)
#
# Then: srun --mpi=pmix -n 3 --overcommit python ... (Open MPI), --mpi=pmi2 for MPICH.
# Points learnt on Debian 12: the pmix plugin needs libpmix-dev (mpi_pmix.so loads libpmix.so,
# which only the -dev package links), and slurmd must start after it is installed; the node
# declares only the CPUs this machine has (more, and Open MPI busy-waits oversubscribed), so
# more tasks than CPUs need --overcommit. Needs root (daemons run as root).
# Two nodes on one machine: each slurmd runs in its host's network and UTS namespaces, entered
# with nsenter rather than `ip netns exec` (which mounts a /sys without cgroups, where slurmd
# 22.05 stops: "No filesystem mounted on /sys/fs/cgroup"), in a mount namespace of its own with
# the host's /etc/hosts and a /sys of the host's network namespace, the cgroups bound back in. The nodes share /tmp, where each step's PMIx client directory
# would collide (`/tmp/spmix_appdir_<uid>_<job>.<step>`: "File exists"), so TmpFS is per node (%n).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONF=/etc/slurm/slurm.conf
TWO_HOSTS_CONF=/etc/slurm/slurm-two-hosts.conf
TWO_HOSTS_UP=/run/mpigpu-slurm-two-hosts  # exists while the two-node cluster runs
NODE=$(hostname -s)
LOG=/var/log/mpigpu-slurm

stop() {
  for d in slurmd slurmctld; do
    pkill -x "$d" 2>/dev/null || true
  done
  for _ in $(seq 50); do pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break; sleep 0.1; done
  # a step's daemon left by a job that never ended would answer a new cluster's step of the same
  # number (job numbers start again at 1): a hang at launch
  pkill -9 -f '^slurmstepd' 2>/dev/null || true
  if [ -e "$TWO_HOSTS_UP" ]; then
    rm -f "$TWO_HOSTS_UP"
    "$ROOT/scripts/two_hosts.sh" down
  fi
}

install_and_start_munge() {
  [ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root" >&2; exit 1; }
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null \
      || ! dpkg -s libpmix-dev >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q slurm-wlm munge libpmix-dev >/dev/null
  fi
  stop
  mkdir -p /etc/slurm /var/spool/slurmctld /run/munge "$LOG"
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || runuser -u munge -- munged --force
}

# The settings both clusters share (each adds its hosts, nodes and files).
common_conf() {
  cat <<EOF
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
EOF
}

# Waits until `srun -N NODES` runs; the words after NODES: how to reach srun.
wait_for_nodes() {
  local nodes=$1
  shift
  for _ in $(seq 100); do
    if timeout 10 "$@" srun -N"$nodes" -n"$nodes" true 2>/dev/null; then
      echo "slurm: $nodes node(s) up ($(nproc) CPUs each); mpi plugins: $("$@" srun --mpi=list 2>&1 | tr -s '\n ' ' ')"
      return 0
    fi
    sleep 0.3
  done
  echo "slurm_cluster.sh: the nodes did not take jobs; logs in $LOG" >&2
  tail -20 "$LOG"/*.log >&2 || true
  exit 1
}

up() {
  install_and_start_munge
  rm -rf /var/spool/slurmd  # (as for two hosts, below)
  mkdir -p /var/spool/slurmd
  { echo "ClusterName=mpigpu"
    echo "SlurmctldHost=$NODE"
    common_conf
    cat <<EOF
SlurmctldPidFile=/run/slurmctld.pid
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
SlurmdLogFile=$LOG/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  } > "$CONF"
  slurmctld -c   # -c: a fresh state, no jobs from an earlier run
  slurmd
  wait_for_nodes 1 env
}

# HOST_PREFIX: the words that run a command on simulated host $1 (0: h0, 1: h1), in its network
# and UTS namespaces, with its /etc/hosts and a /sys of its network namespace (UCX finds its
# network devices there) that keeps the machine's cgroup mounts (slurmd needs them).
host_prefix() {
  local cgroups="/run/mpigpu-cgroup-h$1"
  HOST_PREFIX=(nsenter --net="/run/netns/mpigpu-h$1" unshare --uts --mount sh -c
    "mount --bind /etc/netns/mpigpu-h$1/hosts /etc/hosts && mkdir -p $cgroups \
     && mount --rbind /sys/fs/cgroup $cgroups && mount -t sysfs sysfs /sys \
     && mount --rbind $cgroups /sys/fs/cgroup && hostname h$1 && exec \"\$@\"" sh)
}
in_host() {
  host_prefix "$1"
  shift
  "${HOST_PREFIX[@]}" "$@"
}

up_two_hosts() {
  install_and_start_munge
  "$ROOT/scripts/two_hosts.sh" up names
  touch "$TWO_HOSTS_UP"
  # job numbers start again at 1 (slurmctld -c): an earlier run's step sockets would collide
  rm -rf /var/spool/slurmctld-two-hosts /var/spool/slurmd-h[01] /tmp/mpigpu-slurm-h[01]
  mkdir -p /var/spool/slurmctld-two-hosts /var/spool/slurmd-h0 /var/spool/slurmd-h1 /tmp/mpigpu-slurm-h0 /tmp/mpigpu-slurm-h1
  { echo "ClusterName=mpigpu-two-hosts"
    echo "SlurmctldHost=h0(10.231.0.1)"
    common_conf
    cat <<EOF
SlurmctldPidFile=/run/slurmctld-two-hosts.pid
StateSaveLocation=/var/spool/slurmctld-two-hosts
SlurmctldLogFile=$LOG/slurmctld-two-hosts.log
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmdLogFile=$LOG/slurmd-%n.log
TmpFS=/tmp/mpigpu-slurm-%n
NodeName=h0 NodeAddr=10.231.0.1 CPUs=$(nproc) State=UNKNOWN
NodeName=h1 NodeAddr=10.231.0.2 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=h0,h1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  } > "$TWO_HOSTS_CONF"
  in_host 0 slurmctld -c -f "$TWO_HOSTS_CONF"
  in_host 0 slurmd -f "$TWO_HOSTS_CONF"
  in_host 1 slurmd -f "$TWO_HOSTS_CONF"
  wait_for_nodes 2 "$0" on-h0
}

case "${1:-}" in
  up) up ;;
  up-two-hosts) up_two_hosts ;;
  # exec: srun itself gets the caller's signals (Ctrl-C, SIGTERM), as when run directly
  srun) shift; exec "$0" on-h0 srun "$@" ;;
  on-h0) shift; host_prefix 0; SLURM_CONF="$TWO_HOSTS_CONF" exec "${HOST_PREFIX[@]}" "$@" ;;
  down) stop ;;
  check) timeout 20 srun -N1 -n1 true ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
