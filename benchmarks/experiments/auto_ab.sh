#!/bin/bash
# Alternate auto_ab.py over f00f99f (its own tuning table) and this tree (calibrated on first use, in
# the first round, stored for the rest): OLD=worktree-of-f00f99f N=2 ROUNDS="1 2 3 4 5" SIZES=... auto_ab.sh
set -u
NEW=$(cd "$(dirname "$0")/../.." && pwd); OLD=${OLD:?set OLD to a worktree of commit f00f99f}
M=$NEW/.venv/bin/mpiexec; P=$NEW/.venv/bin/python; N=${N:-2}
CAL=${CAL:-$NEW/auto-ab-cal-n$N.json}; rm -f "$CAL"
for round in ${ROUNDS:-1 2 3 4 5}; do
  order="old new"; [ $((round % 2)) = 0 ] && order="new old"
  for tree in $order; do
    if [ $tree = old ]; then cd "$OLD"; T=$OLD/benchmarks/results/tuning-n$N.json; else cd "$NEW"; T=/nonexistent.json; fi
    echo "== $tree n=$N round $round $(date +%T) load$(uptime | sed 's/.*average://')"
    COLLECTIVES_AUTOTUNE_FILE=$CAL COLLECTIVES_TUNING=$T PYTHONPATH=. \
      timeout 900 $M -n $N $P "$NEW/benchmarks/experiments/auto_ab.py" ${SIZES:-8,128,2K,8K,32K,128K,512K,2M,8M,32M}
  done
done
