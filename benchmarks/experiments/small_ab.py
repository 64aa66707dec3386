# Named recursive doubling at 8 B (n=2) and native, 15 rounds of 2,000 calls; run from the checkout of
# each tree to alternate them: PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/small_ab.py
import os, sys
import numpy as np
from mpi4py import MPI
import collectives
from benchmarks.allreduce_perf import time_batch
c = MPI.COMM_WORLD
x = np.ones(2, np.float32); y = np.empty_like(x)
for _ in range(1000): collectives.allreduce(x, y, algorithm="recursive_doubling")
ts = [time_batch(c, lambda: collectives.allreduce(x, y, algorithm="recursive_doubling"), 2000) for _ in range(15)]
ns = [time_batch(c, lambda: c.Allreduce(x, y), 2000) for _ in range(15)]
if c.rank == 0: print("old" if os.getcwd().endswith("old") else "new", f"8 B rd: {np.median(ts)*1e6:.2f} us, native {np.median(ns)*1e6:.2f}")
