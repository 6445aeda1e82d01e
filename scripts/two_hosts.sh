#!/usr/bin/env bash
# Two simulated hosts on this machine: network namespaces mpigpu-h0 and mpigpu-h1 joined by a veth
# pair (10.231.0.1 and 10.231.0.2, nothing else but loopback inside), each process started in one
# gets its own hostname (h0, h1) through a UTS namespace. mpirun runs inside h0 and reaches h1
# through scripts/netns_rsh.sh, an rsh agent that enters the other namespace.
#
#   two_hosts.sh up [names|ip-only] [RATE]   create them; names: each host's /etc/hosts knows
#                                            both names; ip-only: neither knows the other's name.
#                                            RATE (e.g. 10gbit): shape each direction with tc tbf
#   two_hosts.sh down                        remove them (also what `up` does first)
#   two_hosts.sh check                       exit 0 when this machine can create them (root, netns)
#   two_hosts.sh mpirun ARGS...              run mpirun (from PATH) from h0 over h0 and h1: Open
#                                            MPI's with a hostfile, MPICH's Hydra with -hosts
#                                            (ARGS: -np N, -x NAME, the program);
#                                            MPIGPU_TWO_HOSTS_MAP_BY=node (default: round-robin,
#                                            ranks 0,2 on h0, so 2 ranks span both hosts) or
#                                            slot (a plain hostfile's filling: 0-1 on h0, 2-3 on
#                                            h1). Up to 4 ranks (the slots) Open MPI binds them
#                                            to cores as it does for users; --oversubscribe
#                                            (no binding) only above that. Hydra binds nothing
# Needs root, iproute2 and util-linux's unshare; tests/conftest.py uses it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NS=(mpigpu-h0 mpigpu-h1)
NAMES=(h0 h1)
IPS=(10.231.0.1 10.231.0.2)
STATE=/tmp/mpigpu-two-hosts

down() {
  for ns in "${NS[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  rm -rf "$STATE"
}

up() {
  local mode=${1:-names} rate=${2:-}
  down
  mkdir -p "$STATE"
  ip link add mpigpu-v0 type veth peer name mpigpu-v1
  for i in 0 1; do
    local ns=${NS[$i]}
    ip netns add "$ns"
    ip link set "mpigpu-v$i" netns "$ns"
    ip -n "$ns" addr add "${IPS[$i]}/24" dev "mpigpu-v$i"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "mpigpu-v$i" up
    if [ -n "$rate" ]; then
      # a link of RATE each way (tbf); this kernel may lack netem, so no added delay
      ip netns exec "$ns" tc qdisc add dev "mpigpu-v$i" root tbf rate "$rate" burst 1mb latency 10ms
    fi
    # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      if [ "$mode" = names ]; then
        echo "${IPS[0]} ${NAMES[0]}"
        echo "${IPS[1]} ${NAMES[1]}"
      else
        echo "${IPS[$i]} ${NAMES[$i]}"  # a host knows its own name only
      fi
    } > "/etc/netns/$ns/hosts"
  done
  if [ "$mode" = names ]; then
    printf '%s slots=2\n%s slots=2\n' "${NAMES[0]}" "${NAMES[1]}" > "$STATE/hostfile"
  else
    printf '%s slots=2\n%s slots=2\n' "${IPS[0]}" "${IPS[1]}" > "$STATE/hostfile"
  fi
  echo "$mode" > "$STATE/mode"
}

check() {
  [ "$(id -u)" = 0 ] || { echo "not root: cannot create network namespaces"; return 1; }
  command -v ip >/dev/null || { echo "no ip (iproute2)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare (util-linux)"; return 1; }
  ip netns add mpigpu-probe 2>/dev/null || { echo "ip netns add failed (no CAP_SYS_ADMIN?)"; return 1; }
  ip netns del mpigpu-probe
  unshare --uts true 2>/dev/null || { echo "unshare --uts failed"; ip netns del mpigpu-probe 2>/dev/null; return 1; }
}

# --oversubscribe when -np asks for more ranks than the hostfile's 4 slots (it also turns off
# Open MPI's binding, which users get otherwise: both "hosts" share this machine's cores, so two
# ranks bound to one core is what the tests must survive)
oversubscribe_above_slots() {
  while [ $# -gt 1 ]; do
    if [ "$1" = -np ] || [ "$1" = -n ]; then
      [ "$2" -gt 4 ] && echo --oversubscribe
      return 0
    fi
    shift
  done
}

# MPICH's Hydra (mpirun of the MPICH build): the same hosts and placement in its words. -hosts
# with each host's slot count (slot: fill h0 first) or one per host, cycled (node); its rsh
# launcher through the same agent; `-x NAME` becomes -genv NAME VALUE (Hydra passes the rest of
# the environment itself). Program arguments after the first non-option word are left alone.
hydra_args() {
  local per=2 hosts=() h args=() program=0
  [ "${MPIGPU_TWO_HOSTS_MAP_BY:-node}" = node ] && per=1
  while read -r h _; do hosts+=("$h:$per"); done < "$STATE/hostfile"
  args=(-launcher rsh -launcher-exec "$ROOT/scripts/netns_rsh.sh"
    -hosts "$(IFS=,; echo "${hosts[*]}")")
  while [ $# -gt 0 ]; do
    if [ $program = 0 ] && [ "$1" = -x ]; then
      args+=(-genv "$2" "${!2-}")
      shift 2
      continue
    fi
    case "$1" in -np|-n) args+=("$1" "$2"); shift 2; continue ;; -*) ;; *) program=1 ;; esac
    args+=("$1")
    shift
  done
  printf '%s\n' "${args[@]}"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  check) check ;;
  mpirun)
    shift
    [ -f "$STATE/hostfile" ] || { echo "two_hosts.sh: run '$0 up' first" >&2; exit 2; }
    # (not `| grep -q`: grep leaving early may kill mpirun with SIGPIPE, and pipefail then
    # takes Hydra for Open MPI)
    version=$(mpirun --version 2>&1 || true)
    if [[ "${version,,}" == *hydra* ]]; then
      mapfile -t hydra < <(hydra_args "$@")
      set -- "${hydra[@]}"
    else
      # The agent is given the host as the hostfile names it (name or IP).
      set -- --hostfile "$STATE/hostfile" --map-by "${MPIGPU_TWO_HOSTS_MAP_BY:-node}" \
        $(oversubscribe_above_slots "$@") --mca plm_rsh_agent "$ROOT/scripts/netns_rsh.sh" "$@"
    fi
    exec ip netns exec "${NS[0]}" unshare --uts sh -c 'hostname "$0"; exec "$@"' "${NAMES[0]}" \
      mpirun "$@" ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
