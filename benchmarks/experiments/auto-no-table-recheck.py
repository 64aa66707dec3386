# The script behind auto-no-table-recheck.txt: PYTHONPATH=. mpiexec -n N python -m mpi4py benchmarks/experiments/auto-no-table-recheck.py SIZES_KIB ROWS
import sys, time, statistics
import numpy as np
from mpi4py import MPI
import collectives, os
comm = MPI.COMM_WORLD
rows = sys.argv[2].split(",")
def batch(fn, iters):
    comm.Barrier(); t = time.perf_counter()
    for _ in range(iters): fn()
    return comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)
for nbytes in [int(x) << 10 for x in sys.argv[1].split(",")]:
    count = nbytes // 4
    send = np.random.default_rng(comm.rank).random(count, dtype=np.float32)
    recv = np.empty_like(send)
    def mk(name):
        if name == "native":
            return lambda: comm.Allreduce(send, recv)
        alg, _, tr = name.partition("@")
        kw = {"transport": tr} if tr else {}
        return lambda: collectives.allreduce(send, recv, algorithm=alg, comm=comm, **kw)
    fns = {r: mk(r) for r in rows}
    times = {r: [] for r in rows}
    iters = max(5, int(0.02 / (nbytes / 2e9)))
    for rnd in range(9):
        order = rows[rnd % len(rows):] + rows[:rnd % len(rows)]
        for r in order:
            fns[r]()
            times[r].append(batch(fns[r], iters))
    from benchmarks.allreduce_perf import row_label
    label = row_label('auto', collectives.as_comm(comm), nbytes, np.dtype(np.float32))
    if comm.rank == 0:
        med = {r: statistics.median(v) * 1e6 for r, v in times.items()}
        best = min(v for k, v in med.items() if k != "native")
        print(f"{nbytes >> 10:6d} KiB iters={iters} " + "  ".join(f"{r}={med[r]:.0f}" for r in rows) + f"  auto/best={med['auto']/best:.2f} picks {label}", flush=True)
