# Raw in-place loop (n=2): exchange, then np.add on a buffer aligned or 16/48 bytes off a cache line,
# whole or split at its first 64-byte (or 4096-byte) boundary: mpiexec -n 2 python benchmarks/results/inplace_split.py BYTES
import sys, time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; peer = 1 - c.rank
n = int(sys.argv[1]) // 4
def at(off):
    raw = np.empty(n * 4 + 8192, np.uint8)
    base = (-raw.ctypes.data) % 4096
    return raw[base + off: base + off + n * 4].view(np.float32)
x = np.random.default_rng(c.rank).random(n, dtype=np.float32)
def make(off, split, align_to=64):
    w, tmp = at(off), at(0); w[:] = x
    k = ((-w.ctypes.data) % align_to) // 4 if split else 0
    wh, th, wb, tb = w[:k], tmp[:k], w[k:], tmp[k:]
    def f():
        reqs = [c.Irecv(tmp, peer, 1), c.Isend(w, peer, 1)]
        while not MPI.Request.Testall(reqs): pass
        if k:
            np.add(wh, th, out=wh)
        np.add(wb, tb, out=wb)
    return w, f
rows = {"aligned": make(0, False), "misaligned16": make(16, False), "misaligned16+split64": make(16, True),
        "misaligned48+split64": make(48, True), "misaligned16+split4096": make(16, True, 4096)}
times = {k: [] for k in rows}
with np.errstate(all="ignore"):
    for r in range(9):
        for k, (w, f) in rows.items():
            w[:] = x; c.Barrier(); t = time.perf_counter()
            for _ in range(50): f()
            times[k].append(c.allreduce((time.perf_counter() - t) / 50, op=MPI.MAX))
if c.rank == 0: print(sys.argv[1], "  ".join(f"{k}={np.median(v)*1e6:.1f}" for k, v in times.items()))
