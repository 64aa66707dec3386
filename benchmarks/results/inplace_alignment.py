# Our recursive doubling in place (n=2) on a buffer at a chosen offset from a page: 64-byte
# aligned against not (NumPy's allocator gives 16-byte alignment), twice each, in one run:
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/results/inplace_alignment.py BYTES
# NOBOUND=1 keeps mid-size calls on the executor (no BoundProgram).
import sys, time
import numpy as np
from mpi4py import MPI
import collectives, os
if os.environ.get("NOBOUND"): collectives.api.BOUND_MAX_BYTES = 16384
c = MPI.COMM_WORLD
n = int(sys.argv[1]) // 4
def at(off):
    raw = np.empty(n * 4 + 8192, np.uint8)
    base = (-raw.ctypes.data) % 4096
    return raw[base + off: base + off + n * 4].view(np.float32)
x = np.random.default_rng(c.rank).random(n, dtype=np.float32)
out = []
for off in (0, 16, 48, 0, 16, 48):
    w = at(off); w[:] = x
    t_in = []
    for r in range(7):
        c.Barrier(); t = time.perf_counter()
        for _ in range(50): collectives.allreduce(w, w, algorithm="recursive_doubling")
        t_in.append(c.allreduce((time.perf_counter() - t) / 50, op=MPI.MAX)); w[:] = x
    out.append(f"w%64={off}: {np.median(t_in)*1e6:.0f}")
if c.rank == 0:
    print(collectives.__file__.split("/")[3], sys.argv[1], "in place:", ", ".join(out))
