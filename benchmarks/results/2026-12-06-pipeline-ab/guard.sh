#!/bin/bash
# the guard's cost per call (allreduce_perf --guard-cost), n=2 MPICH, each tree three times, alternated
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
out=/work/runs/guard.txt
for round in 1 2 3; do
  order="old soak"; [ $((round % 2)) = 0 ] && order="soak old"
  for tree in $order; do
    cd /work/$tree
    echo "== guard $tree round $round $(date +%T)" >> $out
    COLLECTIVES_AUTOTUNE_FILE=/work/runs/ab-cal-mpich-n2.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      flock /work/machine.lock timeout 600 $M -n 2 $P -m benchmarks.allreduce_perf -b 8 -e 1M -f 8 -a auto --guard-cost -r 5 -c 0 2>&1 | grep "guard cost" >> $out
  done
done
echo "== finished $(date +%T)" >> $out
