#!/usr/bin/env bash
# Builds a CUDA-aware Open MPI from a source tarball and installs it where torch_mpi_gpu looks
# first (/opt/openmpi-cuda), then checks that the result really is CUDA-aware.
#
#   scripts/build_openmpi_cuda.sh openmpi-5.0.x.tar.bz2 [PREFIX]      (4.1.x works too)
#
# Settings: CUDA_HOME (default /usr/local/cuda; only cuda.h and the libcuda stub are needed, the
# real libcuda is loaded at run time), JOBS (default: all cores), EXTRA_CONFIGURE (appended to
# configure, e.g. "--with-ucx=/opt/ucx" for GPUDirect RDMA across nodes).
# Afterwards: MPI_HOME=PREFIX pip install --no-build-isolation .   (or just the default PREFIX)
set -euo pipefail
src=$(realpath "${1:?usage: build_openmpi_cuda.sh OPENMPI_SOURCE_TARBALL [PREFIX]}")
prefix=${2:-/opt/openmpi-cuda}
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=${JOBS:-$(nproc)}
[ -f "$cuda/include/cuda.h" ] || { echo "no cuda.h under CUDA_HOME=$cuda: set CUDA_HOME to a CUDA toolkit" >&2; exit 1; }
work=$(mktemp -d)
trap 'echo "build logs kept in $work" >&2' ERR
tar xf "$src" -C "$work"
cd "$work"/openmpi-*/
version=$(basename "$PWD")
# Open MPI 5 links libcuda at configure time: the toolkit's stub lets it build without a GPU.
stubs=""
[ -d "$cuda/lib64/stubs" ] && stubs="--with-cuda-libdir=$cuda/lib64/stubs"
case "$version" in openmpi-4.*) stubs="" ;; esac
echo "configuring $version for $prefix with CUDA from $cuda (log: $work/configure.log)"
# Fortran, Java and OpenSHMEM are not needed by torch; building them only costs time.
./configure --prefix="$prefix" --with-cuda="$cuda" $stubs \
  --disable-mpi-fortran --disable-oshmem --disable-mpi-java \
  --enable-mpirun-prefix-by-default ${EXTRA_CONFIGURE:-} > "$work/configure.log" 2>&1
echo "building with $jobs jobs (log: $work/make.log)"
make -j"$jobs" > "$work/make.log" 2>&1
make install > "$work/install.log" 2>&1
# (grep reads it all: with -q it would leave early, ompi_info would die of SIGPIPE, and pipefail
# would call a CUDA build a failure)
if "$prefix/bin/ompi_info" --parsable --all | grep "mpi_built_with_cuda_support:value:true" >/dev/null; then
  echo "$version installed in $prefix, built with CUDA support"
else
  echo "$version installed in $prefix but ompi_info does not report CUDA support; see $work/configure.log" >&2
  exit 1
fi
# (4.1 defines the macro in an mpiext header that mpi-ext.h includes)
grep -rqs "MPIX_CUDA_AWARE_SUPPORT 1" "$prefix/include" && echo "mpi-ext.h: MPIX_CUDA_AWARE_SUPPORT 1"
rm -rf "$work"
echo "next: MPI_HOME=$prefix pip install --no-build-isolation .   (run from the torch_mpi_gpu checkout)"
