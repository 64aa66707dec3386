#!/bin/bash
# n=4 under MPICH at 8 B - 32 KiB, trees alternated five times (n4.sh old new): the rows where
# ab-final.txt's n=4 rounds scattered most. Uses ab.sh's calibration file, so both trees run the same picks.
P=/work/main/.venv/bin/python; M=/work/main/.venv/bin/mpiexec
for r in 1 2 3 4 5; do for t in "$@"; do cd /work/$t
 echo "$t $(COLLECTIVES_AUTOTUNE_FILE=/work/runs/abq-cal-mpich-n4.json COLLECTIVES_TUNING=/nonexistent.json PYTHONPATH=. flock /work/machine.lock timeout 300 $M -n 4 $P /work/new/benchmarks/experiments/auto_ab.py 8,128,2K,32K | grep -v '^#' | awk '{print $3, $5, $6, $8, $9}' | tr '\n' ';')"
done; done
