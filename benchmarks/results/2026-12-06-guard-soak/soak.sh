#!/bin/bash
# the program, 20 runs on a fixed commit (worktree /work/soak), 3 hosts x 2 ranks, 250 Mbit/s
cd /work/soak
for i in $(seq 1 20); do
  start=$(date +%s)
  flock /work/machine.lock nice -n 5 /work/main/.venv/bin/python -m benchmarks.cluster --hosts 3 --ranks-per-host 2 --rate 250M --timeout 900 -- /work/main/.venv/bin/python -m benchmarks.allreduce_perf -b 4M -e 16M -f 4 -n 1 -w 1 -r 1 -c 0 -a all > /work/runs/v2/run$i.txt 2>&1
  rc=$?
  err=$(grep -c "MismatchError\|CollectiveTimeout\|Error" /work/runs/v2/run$i.txt)
  echo "run $i rc $rc errors $err seconds $(( $(date +%s) - start )) $(date +%T)" >> /work/runs/v2/summary.txt
done
echo finished >> /work/runs/v2/summary.txt
echo finished >> /work/runs/summary.txt
