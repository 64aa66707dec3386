"""How long survivors take to go on after a rank dies (COLLECTIVES_ON_ERROR=shrink, ULFM).

    COLLECTIVES_ON_ERROR=shrink COLLECTIVES_TIMEOUT=20 mpiexec --with-ft ulfm --mca pml ob1 \\
        --mca btl tcp,self -n 4 python -m benchmarks.elastic_recovery [--algorithm ring] [--count 100000]

The last rank exits after a first all-reduce; each survivor's next all-reduce finds the loss.
Printed per survivor: detection (call start to the start of recovery), revoke, shrink (the new
communicator), agreement on the lost set, agreement on the call to repeat (``calls``), the
RanksLost raised, and the first call on the survivors (which includes wrapping the new
communicator). Seconds.
"""
import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import collectives


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--count", type=int, default=100000)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    x = np.ones(args.count, np.float32)
    collectives.allreduce(x, algorithm=args.algorithm, comm=world)
    world.Barrier()
    if rank == size - 1:
        os._exit(1)
    start = time.monotonic()
    try:
        collectives.allreduce(x, algorithm=args.algorithm, comm=world)
        raise SystemExit("the call succeeded without the lost rank")
    except collectives.RanksLost as error:
        raised = time.monotonic() - start
        t = error.timings
        comm, completed, ahead = error.survivors, error.completed, error.ahead
    again = time.monotonic()
    y = collectives.allreduce(x, algorithm=args.algorithm, comm=comm)
    first = time.monotonic() - again
    assert y[0] == size - 1
    recovery = t["calls"]
    print(f"ELASTIC-RECOVERY rank {rank}: detect {raised - recovery:.4f} revoke {t['revoke']:.4f} "
          f"shrink {t['shrink'] - t['revoke']:.4f} agree {t['agree'] - t['shrink']:.4f} "
          f"calls {t['calls'] - t['agree']:.4f} raised {raised:.4f} first_call {first:.4f} "
          f"completed {completed} ahead {ahead}", flush=True)
    comm.Barrier()
    time.sleep(2.0)  # a rank that leaves while a peer still finishes the barrier looks failed to it
    os._exit(0)  # MPI_Finalize after a loss can hang under Open MPI 5.0.11 (docs/reliability.md)


if __name__ == "__main__":
    main()
