"""What auto's first call of a bucket costs when it calibrates (no stored pick): the first call's
time against the second's, per size, out of place then in place. Run with a fresh file:
  COLLECTIVES_AUTOTUNE_FILE=/tmp/x.json mpiexec -n 2 python benchmarks/results/first_call_cost.py 8,32K,1M,32M
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives

comm = MPI.COMM_WORLD


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(fn):
    comm.Barrier()
    start = time.perf_counter()
    fn()
    elapsed = np.array([time.perf_counter() - start])
    comm.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)
    return elapsed[0]


for text in sys.argv[1].split(","):
    nbytes = size_of(text)
    send = np.ones(nbytes // 4, np.float32)
    recv = np.empty_like(send)
    cells = []
    for call in (lambda: collectives.allreduce(send, recv), lambda: collectives.allreduce(recv, recv)):
        first, second = timed(call), timed(call)
        cells.append(f"{first:6.3f} s (then {second * 1e3:7.3f} ms)")
    if comm.rank == 0:
        print(f"n={comm.size} {nbytes:>10} B  out of place {cells[0]}   in place {cells[1]}", flush=True)
