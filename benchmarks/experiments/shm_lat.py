# Recursive doubling over the shared-memory transport named by the caller (n=2), 8 B - 128 KiB, in place (i)
# and out of place (o); TAG labels the line (used to alternate a change against git stash).
import sys, os
import numpy as np
from mpi4py import MPI
import collectives
from benchmarks.allreduce_perf import time_batch
c = MPI.COMM_WORLD
res = []
for nbytes in (8, 32768, 131072):
    n = max(1, nbytes // 4)
    x = np.random.default_rng(c.rank).random(n, dtype=np.float32)
    w = x.copy(); y = np.empty_like(x)
    for inplace in (True, False):
        ts = []
        for r in range(9):
            w[:] = x
            if inplace:
                ts.append(time_batch(c, lambda: collectives.allreduce(w, w, algorithm="recursive_doubling",
                                                                      transport="shm"), 100))
            else:
                ts.append(time_batch(c, lambda: collectives.allreduce(x, y, algorithm="recursive_doubling",
                                                                      transport="shm"), 100))
        res.append(f"{nbytes}{'i' if inplace else 'o'}: {np.median(ts)*1e6:.1f}")
if c.rank == 0: print(os.environ.get("TAG", ""), "rd@shm:", ", ".join(res))
