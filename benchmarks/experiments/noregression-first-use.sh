#!/bin/bash
# old (f00f99f, its table), new with the same table, new with no table (first-use calibration): auto vs native
set -u
NEW=$(cd "$(dirname "$0")/../.." && pwd); OLD=${OLD:?set OLD to a worktree of commit f00f99f}
M=$NEW/.venv/bin/mpiexec; P=$NEW/.venv/bin/python
N=${N:-2}
rm -f ${CAL:-$NEW/noregression-cal-n$N.json}
for round in ${ROUNDS_LIST:-1 2 3}; do
  for tree in ${TREES:-old new newcal}; do
    if [ $tree = old ]; then cd "$OLD"; else cd "$NEW"; fi
    T=$PWD/benchmarks/results/tuning-n$N.json; [ $tree = newcal ] && T=/nonexistent.json
    echo "== $tree n=$N round $round $(date +%T) load$(uptime | sed 's/.*average://')"
    COLLECTIVES_AUTOTUNE_FILE=${CAL:-$NEW/noregression-cal-n$N.json} COLLECTIVES_TUNING=$T PYTHONPATH=. timeout 900 $M -n $N $P -m benchmarks.allreduce_perf \
      -b ${B:-8} -e ${E:-128M} -f 4 -a auto -c 1 -r ${R:-7} -n ${ITERS:-35} -w 3 2>&1 | grep -E "^\s+[0-9]|Avg"
  done
done
