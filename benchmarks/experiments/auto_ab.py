"""auto against native in one harness that runs unchanged over either tree: the no-regression A/B.

Run it from each checkout in turn (PYTHONPATH=. selects the tree), alternating, e.g.
  mpiexec -n 2 python benchmarks/experiments/auto_ab.py 8,128,2K,32K,128K,512K,2M,8M
It prints one line per size: native and auto, out of place and in place, in us (medians of
rotated rounds; a batch of back-to-back calls lasting about 5 ms follows one untimed call; the
slowest rank's time counts). Buffers hold zeros, written, so in-place sums neither overflow nor
read never-touched pages. The old tree's allreduce_perf harness differs from today's (floor rows,
an untimed call before each batch), so figures of the two trees are compared here, not there.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives
from benchmarks.allreduce_perf import time_batch  # the same loop in f00f99f's tree
from collectives.cli import parse_size

comm = MPI.COMM_WORLD
ROUNDS = int(os.environ.get("AB_ROUNDS", "9"))
# another row than auto: AB_ALGORITHM=NAME, and where the tree has transports AB_TRANSPORT=mpi|shm
NAMED = {"algorithm": os.environ["AB_ALGORITHM"]} if os.environ.get("AB_ALGORITHM") else {}
if os.environ.get("AB_TRANSPORT"):
    NAMED["transport"] = os.environ["AB_TRANSPORT"]


def batch(fn, calls):
    fn()  # untimed: the row's buffers back in the caches
    return time_batch(comm, fn, calls)


def rows_for(nbytes):
    count = nbytes // 4
    send, recv = np.empty(count, np.float32), np.empty(count, np.float32)
    send.fill(0.0), recv.fill(0.0)
    return {("native", "oop"): lambda: comm.Allreduce(send, recv, op=MPI.SUM),
            ("native", "ip"): lambda: comm.Allreduce(MPI.IN_PLACE, recv, op=MPI.SUM),
            ("auto", "oop"): (lambda: collectives.allreduce(send, recv, **NAMED)) if NAMED else
            (lambda: collectives.allreduce(send, recv)),  # as a caller who names nothing calls it
            ("auto", "ip"): (lambda: collectives.allreduce(recv, recv, **NAMED)) if NAMED else
            (lambda: collectives.allreduce(recv, recv))}


tree = os.path.basename(os.getcwd())
for text in sys.argv[1].split(","):
    nbytes = parse_size(text)
    rows = rows_for(nbytes)
    for fn in rows.values():  # warm up (auto calibrates here on first use)
        for _ in range(3):
            fn()
    probe = batch(rows[("auto", "ip")], 3)
    calls = max(2, min(2000, int(5e-3 / max(probe, 1e-7))))
    times = {key: [] for key in rows}
    keys = list(rows)
    for r in range(ROUNDS):
        # each round in another order, the same on every rank (a rotation keeps each row's predecessor)
        for key in (keys[i] for i in (range(len(keys)) if r == 0 else np.random.default_rng(r).permutation(len(keys)))):
            times[key].append(batch(rows[key], calls))
    med = {key: float(np.median(v)) * 1e6 for key, v in times.items()}
    if comm.rank == 0:
        print(f"{tree} n={comm.size} {nbytes:>10} native {med[('native', 'oop')]:9.1f} {med[('native', 'ip')]:9.1f}"
              f"  auto {med[('auto', 'oop')]:9.1f} {med[('auto', 'ip')]:9.1f}"
              f"  ratio {med[('auto', 'oop')] / med[('native', 'oop')]:5.2f} {med[('auto', 'ip')] / med[('native', 'ip')]:5.2f}",
              flush=True)
