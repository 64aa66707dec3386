#!/bin/bash
# No regression: the code before the transport axis (commit f00f99f) and this checkout alternate,
# each running native and auto with its own tuning table for the world size (tuning-nN.json).
#   git worktree add /some/where/old f00f99f
#   OLD=/some/where/old N=2 benchmarks/experiments/noregression.sh > out.txt
#   python benchmarks/experiments/noregression_ratio.py out.txt      # auto / native per run, medians
# Environment: N ranks (2), ROUNDS_LIST ("1 2"), B/E sizes (8/128M), R rounds (7), ITERS (35).
set -u
NEW=$(cd "$(dirname "$0")/../.." && pwd)
OLD=${OLD:?set OLD to a worktree of commit f00f99f}
M=$NEW/.venv/bin/mpiexec; P=$NEW/.venv/bin/python
N=${N:-2}
for round in ${ROUNDS_LIST:-1 2}; do
  for tree in old new; do
    if [ $tree = old ]; then cd "$OLD"; else cd "$NEW"; fi
    echo "== $tree n=$N round $round $(date +%T) load$(uptime | sed 's/.*average://')"
    COLLECTIVES_TUNING=$PWD/benchmarks/results/tuning-n$N.json PYTHONPATH=. timeout 900 $M -n $N $P -m benchmarks.allreduce_perf \
      -b ${B:-8} -e ${E:-128M} -f 4 -a auto -c 1 -r ${R:-7} -n ${ITERS:-35} -w 3 2>&1 | grep -E "^\s+[0-9]|Avg"
  done
done
