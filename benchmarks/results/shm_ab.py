# Recursive doubling in place over the shared-memory transport (n=2), 9 rounds of 50 calls; run from
# each checkout to alternate trees (f00f99f ran a named recursive doubling in place over shm there).
import sys, time, os
import numpy as np
from mpi4py import MPI
import collectives
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
        w[:] = x; c.Barrier(); t = time.perf_counter()
        for _ in range(50): collectives.allreduce(w, w, algorithm="recursive_doubling", **kw)
        ts.append(c.allreduce((time.perf_counter() - t) / 50, op=MPI.MAX))
    res.append(f"{nbytes}: {np.median(ts)*1e6:.0f}")
if c.rank == 0: print("new" if new else "old", "rd@shm in place:", ", ".join(res))
