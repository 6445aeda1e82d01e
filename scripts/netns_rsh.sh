#!/usr/bin/env bash
# rsh agent for mpirun across the simulated hosts of scripts/two_hosts.sh: called as
# `netns_rsh.sh [ssh options] HOST COMMAND...` like ssh, it runs COMMAND through a shell in HOST's
# network namespace, with HOST's hostname (h0/h1, or their IPs as the hostfile names them).
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done  # ssh options mpirun may add (-x, ...)
host=$1
shift
case "$host" in
  h0|10.231.0.1) ns=mpigpu-h0 name=h0 ;;
  h1|10.231.0.2) ns=mpigpu-h1 name=h1 ;;
  *) echo "netns_rsh.sh: unknown host $host" >&2; exit 255 ;;
esac
# like ssh: the words of the command are joined and run by a shell
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"
