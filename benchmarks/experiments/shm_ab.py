# Recursive doubling in place over the shared-memory transport (n=2), 9 rounds of 50 calls; run from
# each checkout to alternate trees (f00f99f ran a named recursive doubling in place over shm there).
import sys, os
import numpy as np
from mpi4py import MPI
import collectives
from benchmarks.allreduce_perf import time_batch
c = MPI.COMM_WORLD
new = not os.getcwd().endswith("old")
kw = {"transport": "shm"} if new else {}
res = []
for nbytes in (32768, 131072):
    n = nbytes // 4
    x = np.random.default_rng(c.rank).random(n, dtype=np.float32)
    w = x.copy()
    collectives.allreduce(w, w, algorithm="recursive_doubling", **kw)
    ts = []
    for r in range(9):
        w[:] = x
        ts.append(time_batch(c, lambda: collectives.allreduce(w, w, algorithm="recursive_doubling", **kw), 50))
    res.append(f"{nbytes}: {np.median(ts)*1e6:.0f}")
if c.rank == 0: print("new" if new else "old", "rd@shm in place:", ", ".join(res))
