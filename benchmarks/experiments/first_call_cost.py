"""What auto's first call of a bucket costs when it calibrates (no stored pick): the first call's
time against the second's, per size, out of place then in place. Run with a fresh file:
  COLLECTIVES_AUTOTUNE_FILE=/tmp/x.json mpiexec -n 2 python benchmarks/experiments/first_call_cost.py 8,32K,1M,32M
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives
from benchmarks.allreduce_perf import time_batch
from collectives.cli import parse_size

comm = MPI.COMM_WORLD


def timed(fn):
    return time_batch(comm, fn, 1)


for text in sys.argv[1].split(","):
    nbytes = parse_size(text)
    send = np.ones(nbytes // 4, np.float32)
    recv = np.empty_like(send)
    cells = []
    for call in (lambda: collectives.allreduce(send, recv), lambda: collectives.allreduce(recv, recv)):
        first, second = timed(call), timed(call)
        cells.append(f"{first:6.3f} s (then {second * 1e3:7.3f} ms)")
    if comm.rank == 0:
        print(f"n={comm.size} {nbytes:>10} B  out of place {cells[0]}   in place {cells[1]}", flush=True)
