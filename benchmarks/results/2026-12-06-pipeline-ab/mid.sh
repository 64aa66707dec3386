#!/bin/bash
# auto_ab at 512K,2M,8M n=2 under MPICH and Open MPI: trees shuffled per round
OUT=$1; ROUNDS=$2; shift 2; TREES="$@"
H=/work/new/benchmarks/experiments/auto_ab.py
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
OE=$HOME/.cache/collectives/test-envs/openmpi-py311/bin
CAL=/work/runs/abq-cal
for round in $(seq $ROUNDS); do
  for tree in $(shuf -e $TREES); do
    cd /work/$tree
    echo "== mpich $tree n=2 round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT
    COLLECTIVES_AUTOTUNE_FILE=$CAL-mpich-n2.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      flock /work/machine.lock timeout 300 $M -n 2 $P $H 512K,2M,8M >> $OUT 2>&1
    echo "== openmpi $tree n=2 round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx COLLECTIVES_AUTOTUNE_FILE=$CAL-ompi-n2.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      flock /work/machine.lock timeout 300 $OE/mpiexec --oversubscribe -n 2 $OE/python $H 512K,2M,8M >> $OUT 2>&1
  done
done
echo "== finished $(date +%T)" >> $OUT
