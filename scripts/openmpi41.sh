#!/usr/bin/env bash
# Open MPI 4.1 on CPU without installing it: Debian 12's 4.1.4 packages (the version of the
# CUDA-aware build the GPU runs use, MPI_HOME's default) downloaded and unpacked into DIR, and
# relocated there with OPAL_PREFIX. Nothing system-wide changes: the MPI is not installed (a
# second libmpi.so.40 on the loader's path would be found by the other legs' programs); the
# libraries it needs that are not MPI come from apt where missing. Its plugins for networks this
# machine lacks (libfabric, verbs, UCX, PSM2) stay unloaded, silently.
#
#   scripts/openmpi41.sh DIR     unpack into DIR (once), then print the variables to export:
#                                eval "$(scripts/openmpi41.sh DIR)"; MPI_HOME=$OPAL_PREFIX ...
set -euo pipefail
DIR="$(mkdir -p "${1:?usage: openmpi41.sh DIR}" && cd "$1" && pwd)"
PREFIX="$DIR/usr"
PACKAGES="libopenmpi3 openmpi-bin openmpi-common libopenmpi-dev"
# libopenmpi3's dependencies for the shared-memory and TCP transports (libevent, hwloc, PMIx)
NEEDS="libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libhwloc-plugins libpmix2"

if [ ! -x "$PREFIX/bin/mpirun" ]; then
  command -v apt-get >/dev/null || { echo "openmpi41.sh: no apt-get (Debian's packages are used)" >&2; exit 1; }
  # shellcheck disable=SC2086  # the names, split
  if ! dpkg -s $NEEDS >/dev/null 2>&1; then
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $NEEDS >/dev/null
  fi
  debs="$DIR/debs"
  mkdir -p "$debs"
  # shellcheck disable=SC2086
  (cd "$debs" && apt-get download $PACKAGES >/dev/null 2>&1) ||
    (apt-get update -q >/dev/null && cd "$debs" && apt-get download $PACKAGES >/dev/null)
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$DIR"; done
  # Debian names its programs mpicc.openmpi, mpirun.openmpi (alternatives): the plain names here
  for program in "$PREFIX"/bin/*.openmpi; do ln -sf "$(basename "$program")" "${program%.openmpi}"; done
  rm -rf "$debs"
fi
libdir=$(ls -d "$PREFIX"/lib/*-linux-gnu | head -1)
echo "export OPAL_PREFIX='$PREFIX'"
echo "export PATH='$PREFIX/bin':\"\$PATH\""
# libmpi's own libraries (libopen-rte, libopen-pal) lie beside it, outside any rpath
echo "export LD_LIBRARY_PATH='$libdir':\"\${LD_LIBRARY_PATH:-}\""
echo "export OMPI_MCA_mca_base_component_show_load_errors=0"
