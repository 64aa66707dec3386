# Raw mpi4py exchanges beside our recursive doubling (n=2), out of place and in place:
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/p2p_vs_ours.py BYTES
# PMAX=bytes raises api.PROGRAM_MAX_BYTES (the plan then runs as a prepared program).
# raw_inplace sends a buffer this core has just written (np.add's output), raw an untouched one;
# raw_inplace_spin20 waits 20 us first; raw_inplace_copy sends a copy made by np.copyto.
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from benchmarks.allreduce_perf import time_batch

if os.environ.get("PMAX"):
    collectives.api.PROGRAM_MAX_BYTES = int(os.environ["PMAX"])
c = MPI.COMM_WORLD
peer = 1 - c.rank
n = int(sys.argv[1]) // 4
a = np.random.default_rng(c.rank).random(n, dtype=np.float32)
tmp, out, w = np.empty_like(a), np.empty_like(a), a.copy()


def raw(send, into, tag):
    reqs = [c.Irecv(tmp, peer, tag), c.Isend(send, peer, tag)]
    while not MPI.Request.Testall(reqs):
        pass
    np.add(send, tmp, out=into)


fns = {"native": lambda: c.Allreduce(a, out),
       "sendrecv": lambda: (c.Sendrecv(a, peer, 5, tmp, peer, 5), np.add(a, tmp, out=out)),
       "raw": lambda: raw(a, out, 7),
       "raw_inplace": lambda: raw(w, w, 8),
       "ours": lambda: collectives.allreduce(a, out, comm=c, algorithm="recursive_doubling"),
       "ours_inplace": lambda: collectives.allreduce(w, w, comm=c, algorithm="recursive_doubling"),
       "raw_inplace_spin20": lambda: (spin(20e-6), raw(w, w, 9)),
       "raw_inplace_copy": lambda: (np.copyto(w2, w), raw(w2, w, 10))}
w2 = np.empty_like(w)


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


times = {k: [] for k in fns}
with np.errstate(all="ignore"):
    for f in fns.values():
        f()
    for _ in range(15):
        for k, f in fns.items():
            times[k].append(time_batch(c, f, 50))
if c.rank == 0:
    print(" ".join(MPI.Get_library_version().split()[:3]), sys.argv[1], "B, us:",
          "  ".join(f"{k}={np.median(v) * 1e6:.1f}" for k, v in times.items()))
