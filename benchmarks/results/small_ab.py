# Named recursive doubling at 8 B (n=2) and native, 15 rounds of 2,000 calls; run from the checkout of
# each tree to alternate them: PYTHONPATH=. mpiexec -n 2 python benchmarks/results/small_ab.py
import time, os, sys
import numpy as np
from mpi4py import MPI
import collectives
c = MPI.COMM_WORLD
x = np.ones(2, np.float32); y = np.empty_like(x)
for _ in range(1000): collectives.allreduce(x, y, algorithm="recursive_doubling")
ts = []
for r in range(15):
    c.Barrier(); t = time.perf_counter()
    for _ in range(2000): collectives.allreduce(x, y, algorithm="recursive_doubling")
    ts.append(c.allreduce((time.perf_counter() - t) / 2000, op=MPI.MAX))
ns = []
for r in range(15):
    c.Barrier(); t = time.perf_counter()
    for _ in range(2000): c.Allreduce(x, y)
    ns.append(c.allreduce((time.perf_counter() - t) / 2000, op=MPI.MAX))
if c.rank == 0: print("old" if os.getcwd().endswith("old") else "new", f"8 B rd: {np.median(ts)*1e6:.2f} us, native {np.median(ns)*1e6:.2f}")
