"""Fit the simulator's alpha, beta, gamma on this machine, then compare predictions with runs.

Run under mpiexec with 2 or more ranks:

    mpiexec -n 2 python -m collectives.simulate --calibrate

alpha and beta come from a least-squares fit of ping-pong half round trips (8 B .. 4 MiB)
between ranks 0 and 1; gamma from timing np.add into out= on 8 MiB. Then every algorithm
runs at a few sizes and the table shows predicted time (the simulator with the fitted
values) against measured time (median of runs).
"""
import sys
import time

import numpy as np


def _pingpong(comm, nbytes, reps):
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        if comm.rank == 0:
            comm.Send(buf, 1, 7)
            comm.Recv(buf, 1, 7)
        elif comm.rank == 1:
            comm.Recv(buf, 0, 7)
            comm.Send(buf, 0, 7)
    return (time.perf_counter() - start) / reps / 2


def fit(comm):
    sizes = [8, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22]
    times = [min(_pingpong(comm, s, max(3, 200 >> (s.bit_length() // 3))) for _ in range(3)) for s in sizes]
    times = comm.bcast(times, root=0)
    slope, intercept = np.polyfit(np.array(sizes, float), np.array(times), 1)
    a = np.ones(1 << 21, np.float32)
    b = np.ones_like(a)
    reps = []
    for _ in range(5):
        start = time.perf_counter()
        np.add(a, b, out=a)
        reps.append(time.perf_counter() - start)
    gamma = float(np.median(reps)) / a.nbytes
    gamma = comm.allreduce(gamma) / comm.size
    return max(float(intercept), 1e-7), max(float(slope), 1e-12), gamma


def main():
    from mpi4py import MPI

    import collectives

    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("calibration needs at least 2 ranks: mpiexec -n 2 python -m collectives.simulate --calibrate")
        return 2
    alpha, beta, gamma = fit(comm)
    if comm.rank == 0:
        print(f"# fitted on {comm.size} ranks: alpha {alpha * 1e6:.2f} us, beta {beta * 1e9:.4f} ns/B "
              f"({1 / beta / 1e9:.2f} GB/s), gamma {gamma * 1e9:.4f} ns/B ({1 / gamma / 1e9:.2f} GB/s)")
        print(f"{'size(B)':>10}{'algorithm':>20}{'predicted(us)':>15}{'measured(us)':>14}{'measured/pred':>15}")
    for nbytes in (8, 8 << 10, 1 << 20, 8 << 20):
        x = np.ones(nbytes // 4, np.float32)
        for name in collectives.algorithms():
            predicted = collectives.simulate(name, ranks=comm.size, nbytes=nbytes, alpha=alpha, beta=beta,
                                             gamma=gamma, verify_data=False).time
            runs = []
            for _ in range(7):
                comm.Barrier()
                start = time.perf_counter()
                collectives.allreduce(x, algorithm=name)
                runs.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
            measured = float(np.median(runs[2:]))
            if comm.rank == 0:
                print(f"{nbytes:>10}{name:>20}{predicted * 1e6:>15.1f}{measured * 1e6:>14.1f}"
                      f"{measured / predicted if predicted else float('nan'):>15.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
