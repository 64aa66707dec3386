# In place (n=2) on a buffer at a chosen offset from a page: 64-byte aligned against not (NumPy's
# allocator gives 16 or 48 bytes past a cache line), in one run:
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/inplace_alignment.py BYTES       # our recursive doubling
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/inplace_alignment.py BYTES raw   # a raw mpi4py loop
# NOBOUND=1 keeps our mid-size calls on the executor (no BoundProgram). The raw loop exchanges, then
# runs np.add in place, whole or split at the output's first 64-byte (or 4096-byte) boundary.
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives
from benchmarks.allreduce_perf import time_batch

if os.environ.get("NOBOUND"):
    collectives.api.BOUND_MAX_BYTES = 16384
c = MPI.COMM_WORLD
peer = 1 - c.rank
n = int(sys.argv[1]) // 4
raw_loop = sys.argv[2:] == ["raw"]


def at(off):
    raw = np.empty(n * 4 + 8192, np.uint8)
    base = (-raw.ctypes.data) % 4096
    return raw[base + off: base + off + n * 4].view(np.float32)


x = np.random.default_rng(c.rank).random(n, dtype=np.float32)


def ours(off):
    w = at(off)
    return w, lambda: collectives.allreduce(w, w, algorithm="recursive_doubling")


def raw(off, split, align_to=64):
    w, tmp = at(off), at(0)
    k = ((-w.ctypes.data) % align_to) // 4 if split else 0
    wh, th, wb, tb = w[:k], tmp[:k], w[k:], tmp[k:]

    def f():
        reqs = [c.Irecv(tmp, peer, 1), c.Isend(w, peer, 1)]
        while not MPI.Request.Testall(reqs):
            pass
        if k:
            np.add(wh, th, out=wh)
        np.add(wb, tb, out=wb)
    return w, f


if raw_loop:
    rows = {"aligned": raw(0, False), "misaligned16": raw(16, False), "misaligned16+split64": raw(16, True),
            "misaligned48+split64": raw(48, True), "misaligned16+split4096": raw(16, True, 4096)}
    rounds = 9
else:
    rows = {f"w%64={off}" + (" again" if i >= 3 else ""): ours(off) for i, off in enumerate((0, 16, 48, 0, 16, 48))}
    rounds = 7
times = {k: [] for k in rows}
with np.errstate(all="ignore"):
    for r in range(rounds):
        for k, (w, f) in rows.items():
            w[:] = x
            times[k].append(time_batch(c, f, 50))
if c.rank == 0:
    print("raw" if raw_loop else "ours", sys.argv[1], "in place, us:",
          "  ".join(f"{k}={np.median(v) * 1e6:.1f}" for k, v in times.items()))
