#!/bin/bash
# Run from anywhere: /work/main is this checkout, /work/wt-before a c50a0f4 worktree built in place
# (setup.py build_ext --inplace) with this bench.py copied in; other work on the machine paused.
R="$(cd "$(dirname "$0")" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for i in 1 2 3 4 5; do
  for tree in before after; do
    d=/work/wt-before; [ $tree = after ] && d=/work/main
    (cd $d && /work/main/.venv/bin/mpirun -np 2 /work/main/.venv/bin/python -m torch_mpi_gpu.bench --sizes 8,4K,64K,256K,1M,16M --ops allreduce --backends torch,mpi,mpigpu -n 3000 -w 300 --no-progress --json $R/${tree}_2ranks_run$i.json > /dev/null 2>&1)
  done
done
for np in 2 3 4; do
  (cd /work/main && /work/main/.venv/bin/mpirun --oversubscribe -np $np /work/main/.venv/bin/python -m torch_mpi_gpu.bench --sizes 8,512,4K,32K,64K,256K,1M,4M --ops allreduce --backends "torch,mpi,mpigpu,mpigpu[ALGO=mpi]" -n 1000 -w 100 --no-progress --json $R/algorithms_${np}ranks.json > $R/algorithms_${np}ranks.txt 2>&1)
done
