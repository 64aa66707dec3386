"""Measure the MPI library's eager limit between two ranks of one node.

    mpiexec -n 2 python -m collectives.protocol        # prints the exchange times and the limit

A message up to the eager limit travels at once (into the receiver's shared cells); past it
the library first asks the receiver (rendezvous), which adds a round trip. Ranks 0 and 1
exchange messages (Sendrecv both ways, as a ring step does) over a grid of sizes from 1 KiB to
256 KiB, interleaved over rounds, and the first lasting step up in time between neighbouring
sizes (a jump of at least MIN_STEP where the sizes grow 1.19x, found alike by two scans) marks the limit, which bisection then narrows to 64 bytes. Where no step stands out (a
library that is eager throughout the range, or a noisy machine) the answer is 0: unknown, no
splitting. ``python -m collectives.tune`` runs the same measurement and records the limit in
the tuning table with the library's name and version; ``collectives.mpilib.eager_limit`` reads
it there.
"""
import sys
import time

import numpy as np

from .api import barrier
from .mpilib import describe, load

GRID = sorted({int(round((1 << k) * f / 64)) * 64 for k in range(10, 18) for f in (1, 1.19, 1.41, 1.68)}
              | {1 << 18})
MIN_STEP = 1.45  # a neighbour's time past this ratio (sizes 1.19x apart) is a handshake, not bytes
LASTING = 1.3  # and the next three sizes all take this much longer than the three before


class _OutOfTime(Exception):
    pass


def _exchange_time(comm, peer, nbytes, buffers, deadline, target=5e-4):
    """Median seconds of one Sendrecv of ``nbytes`` each way between this rank and ``peer``;
    _OutOfTime on both ranks once rank 0 passes ``deadline`` (a loaded machine)."""
    send, recv = buffers
    s, r = send[:nbytes], recv[:nbytes]
    iters, times = 8, []
    for _ in range(5):
        comm.Sendrecv(s, peer, 7, r, peer, 7)  # both ranks start together
        start = time.perf_counter()
        for _ in range(iters):
            comm.Sendrecv(s, peer, 7, r, peer, 7)
        elapsed = (time.perf_counter() - start) / iters
        times.append(elapsed)
        # both ranks run the same number of calls next, and stop together: rank 0 decides
        figure = np.array([elapsed, float(time.monotonic() > deadline)])
        comm.Bcast(figure, root=0)
        if figure[1]:
            raise _OutOfTime
        iters = max(4, min(2000, int(target / max(float(figure[0]), 1e-7))))
    return float(np.median(times))


def measure(comm, log=None, budget=20.0):
    """The eager limit in bytes between ranks 0 and 1 of ``comm`` (every rank gets the answer;
    ranks past 1 wait in a bounded barrier); 0 when no step stands out, or when the measurement
    runs past ``budget`` seconds (a loaded machine, where one exchange can take milliseconds).
    ``log(line)`` prints the measured times on rank 0."""
    from mpi4py import MPI


    limit = np.zeros(1, dtype=np.int64)
    barrier(comm)
    if comm.size >= 2 and comm.rank < 2:
        pair = comm.Split(0, comm.rank)
    else:
        pair = comm.Split(MPI.UNDEFINED, comm.rank)
    if pair != MPI.COMM_NULL:
        try:
            limit[0] = _measure_pair(pair, log, time.monotonic() + budget)
        except _OutOfTime:
            if log and pair.rank == 0:
                log(f"# the measurement ran past {budget:g} s (a busy machine): eager limit unknown (0)")
        pair.Free()
    comm.Bcast(limit, root=0)
    return int(limit[0])


def _scan(pair, peer, buffers, deadline, log):
    """(ratio, lo, hi, times): the first lasting step over the grid, as rank 0 measured it."""
    times = {n: [] for n in GRID}
    for _ in range(3):
        for n in GRID:
            times[n].append(_exchange_time(pair, peer, n, buffers, deadline))
    # the quietest round (noise only adds time), as rank 0 saw it: both ranks then decide alike
    median = pair.bcast({n: min(t) for n, t in times.items()}, root=0)
    ratios = [(median[b] / median[a], a, b) for a, b in zip(GRID, GRID[1:])]
    # a step that lasts: the next sizes all stay above the sizes before it (a burst of noise does not)
    steps = [(r, a, b) for i, (r, a, b) in enumerate(ratios) if r >= MIN_STEP
             and min(median[n] for n in GRID[i + 1:i + 4]) >= LASTING * max(median[n] for n in GRID[max(0, i - 2):i + 1])]
    ratio, lo, hi = steps[0] if steps else max(ratios)  # the first step: where one message stops going at once
    if log and pair.rank == 0:
        log("# Sendrecv each way, us: " + ", ".join(f"{n}: {median[n] * 1e6:.1f}" for n in GRID))
    return (ratio, lo, hi, median) if ratio >= MIN_STEP else (ratio, 0, 0, median)


def _measure_pair(pair, log, deadline):
    """The limit between the two ranks of ``pair`` (both get the same answer)."""
    peer = 1 - pair.rank
    buffers = (np.zeros(GRID[-1], np.uint8), np.zeros(GRID[-1], np.uint8))
    # two scans, each of 3 rounds over the whole grid (a burst of noise hits one round of many
    # sizes); a step both scans find is the limit, scans that disagree give 0
    found = [_scan(pair, peer, buffers, deadline, log) for _ in range(2)]
    if found[0][1:3] != found[1][1:3]:
        if log and pair.rank == 0:
            log(f"# the two scans disagree ({found[0][1]} and {found[1][1]} bytes): eager limit unknown (0)")
        return 0
    ratio, lo, hi, median = found[0]
    if ratio >= MIN_STEP:
        fast, slow = median[lo], median[hi]
        while hi - lo > 64:
            mid = (lo + hi) // 2 // 64 * 64 or lo + 64
            if mid <= lo or mid >= hi:
                break
            t = min(_exchange_time(pair, peer, mid, buffers, deadline) for _ in range(3))
            if pair.bcast(t < (fast * slow) ** 0.5, root=0):  # rank 0 decides for both
                lo = mid
            else:
                hi = mid
        if log and pair.rank == 0:
            log(f"# step x{ratio:.2f} between {lo} and {hi} bytes: eager limit {lo} bytes")
        return lo
    if log and pair.rank == 0:
        log(f"# no step in time past x{MIN_STEP} (largest x{ratio:.2f}): eager limit unknown (0)")
    return 0


def main(argv=None):

    MPI = load()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("python -m collectives.protocol: run under mpiexec -n 2 (ranks of one node)", file=sys.stderr)
        return 2
    if comm.rank == 0:
        print(f"# {describe()}: eager limit between ranks 0 and 1")
    limit = measure(comm, log=print)
    if comm.rank == 0:
        print(f"eager_limit {limit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
