"""auto against the best (algorithm, transport) pair, size by size, out of place and in place.

    PYTHONPATH=. mpiexec -n N python benchmarks/experiments/auto_vs_best.py [-b 8] [-e 128M] [-f 4] [-r 11]

Two passes per size, on one buffer pair per size:
1. screening: every algorithm over MPI and over shared memory (and auto), three rounds (each in its own order) of
   batches of about 10 ms;
2. final: auto and the four fastest pairs of the screening, ``-r`` rounds (each in its own order) of batches of
   about 20 ms (at least 2 calls), the slowest rank's time per batch, medians.
Prints auto's time over the best pair's from the final pass (below 1.1: within 10%), and what auto
ran. A single all-rows pass with a few calls per row spreads rows of the same pair by 15-20% on
this VM, which is why the final pass compares only a few rows, many times.
"""
import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from benchmarks.allreduce_perf import time_batch
from collectives.autotune import agreed, round_order
from collectives.cli import parse_size

WORLD = MPI.COMM_WORLD
OURS = collectives.as_comm(WORLD)


def rounds_of(rows, rounds, seconds, fns):
    calls = {}
    for row in rows:
        fns[row]()
        once = time_batch(WORLD, fns[row], 1)
        calls[row] = max(2, min(2000, int(seconds / max(once, 1e-7))))
    times = {row: [] for row in rows}
    for index in range(rounds):
        for row in (rows[i] for i in round_order(len(rows), index)):
            times[row].append(time_batch(WORLD, fns[row], calls[row]))
    return {row: statistics.median(t) for row, t in times.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=128 << 20)
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-r", type=int, default=11)
    args = p.parse_args()
    names = [n for n in collectives.algorithms() if n != "two_level"]
    pairs = [f"{n}@{t}" for n in names for t in ("mpi", "shm")]
    if WORLD.rank == 0:
        print(f"# {time.strftime('%H:%M:%S')} n={WORLD.size}, {len(pairs)} pairs; load {open('/proc/loadavg').read().split()[:3]}",
              flush=True)
    nbytes = args.b
    while nbytes <= args.e:
        count = max(1, nbytes // 4)
        source = np.random.default_rng(WORLD.rank).random(count, dtype=np.float32)
        target = np.empty_like(source)
        work = source.copy()
        out = []
        for in_place in (False, True):
            fns = {}
            for row in ["auto"] + pairs:
                name, _, transport = row.partition("@")
                kw = {"transport": transport} if transport else {}
                if in_place:
                    fns[row] = lambda name=name, kw=kw: collectives.allreduce(work, work, algorithm=name, comm=WORLD, **kw)
                else:
                    fns[row] = lambda name=name, kw=kw: collectives.allreduce(source, target, algorithm=name, comm=WORLD, **kw)
            with np.errstate(all="ignore"):
                screened = rounds_of(["auto"] + pairs, 3, 0.01, fns)
                top = sorted(pairs, key=screened.get)[:4]
                final = rounds_of(["auto"] + top, args.r, 0.02, fns)
            best = min(top, key=final.get)
            ran = agreed(OURS, source.dtype, source.nbytes, in_place)
            ran = f"{ran[0]}@{ran[1]}" if ran else "cost model"
            out.append(f"{'in place' if in_place else 'out of place'}: auto {final['auto'] * 1e6:.1f} us ({ran}) "
                       f"best {best} {final[best] * 1e6:.1f} us ratio {final['auto'] / final[best]:.2f}")
        if WORLD.rank == 0:
            print(f"{nbytes:>10} B  " + "; ".join(out), flush=True)
        nbytes *= args.f
    if WORLD.rank == 0:
        print(f"# {time.strftime('%H:%M:%S')} load {open('/proc/loadavg').read().split()[:3]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
