# Mid-size calls that repeat their buffers: the plan bound to them (BoundProgram) against the
# executor (the code before it: api.BOUND_MAX_BYTES set to the small-message limit), beside the
# MPI library's own MPI_Allreduce, in one run, rounds rotated, medians of the slowest rank:
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/bound_vs_executor.py [ALGORITHM] [BYTES ...]
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives import api
from benchmarks.allreduce_perf import time_batch

world = MPI.COMM_WORLD
algorithm = sys.argv[1] if len(sys.argv) > 1 else "recursive_doubling"
sizes = [int(s) for s in sys.argv[2:]] or [32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
ON, OFF = api.BOUND_MAX_BYTES, api.PROGRAM_MAX_BYTES
rounds, calls = 11, 40
if world.rank == 0:
    print(f"# {MPI.Get_library_version().splitlines()[0][:40]}, n={world.size}, {algorithm}: us per call, "
          f"medians of {rounds} rotated rounds of {calls} calls (slowest rank)")
    print(f"{'bytes':>8} {'native':>8} {'executor':>9} {'bound':>8} {'bound/exec':>10} {'bound/native':>12} | "
          f"{'nat_inpl':>8} {'exec_inpl':>9} {'bnd_inpl':>8} {'bound/exec':>10} {'bound/native':>12}")
for nbytes in sizes:
    count = nbytes // 4
    x = np.random.default_rng(world.rank).random(count, dtype=np.float32)
    y, w = np.empty_like(x), x.copy()
    comms = {"executor": world.Dup(), "bound": world.Dup()}
    limits = {"executor": OFF, "bound": ON}

    def ours(kind, inplace):
        comm = comms[kind]
        api.BOUND_MAX_BYTES = limits[kind]
        if inplace:
            return lambda: collectives.allreduce(w, w, comm=comm, algorithm=algorithm)
        return lambda: collectives.allreduce(x, y, comm=comm, algorithm=algorithm)

    native = world.Dup()
    rows = {"native": lambda: native.Allreduce(x, y), "executor": ours("executor", False),
            "bound": ours("bound", False),
            "nat_inpl": lambda: native.Allreduce(MPI.IN_PLACE, w), "exec_inpl": ours("executor", True),
            "bnd_inpl": ours("bound", True)}
    names = list(rows)
    times = {name: [] for name in names}
    with np.errstate(all="ignore"):
        for r in range(rounds + 1):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                run = rows[name]
                if name in ("executor", "bound", "exec_inpl", "bnd_inpl"):
                    run = ours(name.replace("exec_inpl", "executor").replace("bnd_inpl", "bound"), "inpl" in name)
                elapsed = time_batch(world, run, calls)
                if r:
                    times[name].append(elapsed * 1e6)
                w[:] = x  # keep in-place values bounded
    med = {name: float(np.median(t)) for name, t in times.items()}
    if world.rank == 0:
        print(f"{nbytes:>8} {med['native']:>8.1f} {med['executor']:>9.1f} {med['bound']:>8.1f} "
              f"{med['bound'] / med['executor']:>10.2f} {med['bound'] / med['native']:>12.2f} | "
              f"{med['nat_inpl']:>8.1f} {med['exec_inpl']:>9.1f} {med['bnd_inpl']:>8.1f} "
              f"{med['bnd_inpl'] / med['exec_inpl']:>10.2f} {med['bnd_inpl'] / med['nat_inpl']:>12.2f}", flush=True)
    for comm in list(comms.values()) + [native]:
        comm.Free()
