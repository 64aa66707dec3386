#!/bin/bash
# auto_ab at 32K-2M, MPICH n=4: old and new shuffled per round
OUT=$1; ROUNDS=$2
H=/work/new/benchmarks/experiments/auto_ab.py
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
for round in $(seq $ROUNDS); do
  for tree in $(shuf -e old new); do
    cd /work/$tree
    echo "== mpich $tree n=4 round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT
    COLLECTIVES_AUTOTUNE_FILE=/work/runs/abq-cal-mpich-n4.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      flock /work/machine.lock timeout 300 $M -n 4 $P $H 32K,128K,512K,2M >> $OUT 2>&1
  done
done
echo "== finished $(date +%T)" >> $OUT
