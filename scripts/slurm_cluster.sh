#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (Debian's slurm-wlm + munge), for running the
# multi-rank tests under srun as users on clusters do:
#
#   slurm_cluster.sh up      install what is missing (apt), write the config, start munged,
#                            slurmctld and slurmd; waits until the node takes jobs
#   slurm_cluster.sh down    stop the daemons
#   slurm_cluster.sh check   exit 0 when a cluster answers (`srun hostname` works)
#
# Then: srun --mpi=pmix -n 3 --overcommit python ... (Open MPI), --mpi=pmi2 for MPICH.
# Points learnt on Debian 12: the pmix plugin needs libpmix-dev (mpi_pmix.so loads libpmix.so,
# which only the -dev package links), and slurmd must start after it is installed; the node
# declares only the CPUs this machine has (more, and Open MPI busy-waits oversubscribed), so
# more tasks than CPUs need --overcommit. Needs root (daemons run as root).
set -euo pipefail
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
LOG=/var/log/mpigpu-slurm

stop() {
  for d in slurmd slurmctld; do
    pkill -x "$d" 2>/dev/null || true
  done
  for _ in $(seq 50); do pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break; sleep 0.1; done
}

up() {
  [ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root" >&2; exit 1; }
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null \
      || ! dpkg -s libpmix-dev >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q slurm-wlm munge libpmix-dev >/dev/null
  fi
  stop
  mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /run/munge "$LOG"
  cat > "$CONF" <<EOF
ClusterName=mpigpu
SlurmctldHost=$NODE
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
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || runuser -u munge -- munged --force
  slurmctld -c   # -c: a fresh state, no jobs from an earlier run
  slurmd
  for _ in $(seq 100); do
    if timeout 10 srun -N1 -n1 true 2>/dev/null; then
      echo "slurm: node $NODE up ($(nproc) CPUs); mpi plugins: $(srun --mpi=list 2>&1 | tr -s '\n ' ' ')"
      return 0
    fi
    sleep 0.3
  done
  echo "slurm_cluster.sh: the node did not take jobs; logs in $LOG" >&2
  tail -20 "$LOG"/*.log >&2 || true
  exit 1
}

case "${1:-}" in
  up) up ;;
  down) stop ;;
  check) timeout 20 srun -N1 -n1 true ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
