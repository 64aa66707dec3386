"""Where a small all-reduce's time goes at n=2: native MPI_Allreduce, raw mpi4py exchanges and
the library's call, side by side in one run (batches interleaved; minimum and median per row).

    mpiexec -n 2 python -m benchmarks.small_floor 8 4096

A raw persistent exchange (Startall + Testall, what a prepared program step does) is the floor
of any plan that moves its messages through mpi4py; the library's call adds its own work (entry,
program lookup, copies, the reduction).
"""
import sys
import time

import numpy as np

import collectives
from collectives import mpilib

MPI = mpilib.load()


def persistent_exchange(comm, peer, x):
    r = np.empty_like(x)
    reqs = [comm.Recv_init(r, peer, 5), comm.Send_init(x, peer, 5)]

    def run():
        MPI.Prequest.Startall(reqs)
        while not MPI.Request.Testall(reqs):
            pass
    return run


def main(argv):
    world = MPI.COMM_WORLD
    if world.size != 2:
        print("run under mpiexec -n 2", file=sys.stderr)
        return 2
    peer = 1 - world.rank
    lines = []
    for nbytes in [int(a) for a in argv] or [8]:
        x = np.ones(max(1, nbytes // 4), np.float32)
        y, r = np.empty_like(x), np.empty_like(x)
        rows = {"native": lambda: world.Allreduce(x, y),
                "sendrecv": lambda: world.Sendrecv(x, peer, 3, r, peer, 3),
                "persistent exchange": persistent_exchange(world.Dup(), peer, x),
                "allreduce auto": lambda: collectives.allreduce(x, y)}
        times = {name: [] for name in rows}
        for run in rows.values():
            for _ in range(300):
                run()
        for _ in range(40):
            for name, run in rows.items():
                world.Barrier()
                start = time.perf_counter()
                for _ in range(500):
                    run()
                times[name].append((time.perf_counter() - start) / 500 * 1e6)
        lines.append(f"{nbytes} B: " + ", ".join(f"{name} {min(t):.2f} / {np.median(t):.2f}"
                                                  for name, t in times.items()))
    if world.rank == 0:
        print(f"# {mpilib.describe()}, 2 ranks: us per call, minimum / median of 40 interleaved batches")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
