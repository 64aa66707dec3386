"""Run on an emulated cluster by tests/test_cluster.py: ring all-reduce calls in a loop, for as
long as SECONDS (default 60); prints LOOP-STARTED rank R after the first call, LOOP-DONE at the end."""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
x = np.ones(16384, np.float32)
end = time.monotonic() + float(os.environ.get("SECONDS_TO_RUN", "60"))
first = True
while time.monotonic() < end:
    collectives.allreduce(x, algorithm=os.environ.get("LOOP_ALGO", "ring"))
    if first:
        print(f"LOOP-STARTED rank {rank}", flush=True)
        first = False
print(f"LOOP-DONE rank {rank}", flush=True)
