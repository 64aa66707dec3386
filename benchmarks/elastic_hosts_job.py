"""The job benchmarks/elastic_hosts.py (and tests/test_cluster_elastic.py) runs on the emulated
cluster under Open MPI with ULFM: all-reduce calls in a loop until a host is lost, then on the
survivors (COLLECTIVES_ON_ERROR=shrink).

Every rank makes all-reduces of COUNT float32 (small integers by world rank and call number:
every order of summation gives the same bits) with ALGO, and checks each result against the
sum it must be over the ranks of its communicator. The driver waits for ``HOSTS-STARTED``, then
loses a host (its processes killed, its link cut). Each survivor catches RanksLost, repeats call
``first + error.completed`` on ``error.survivors``, and makes AFTER more calls there, each
checked against MPI_Allreduce on the survivors too (the survivors' communicator is healthy).

Lines: ``HOSTS-LOST rank R: lost=[..] repeat=K ahead=A call=C at=T raised=T timings={..}``
(``at``, ``raised``: time.monotonic() when this rank's failed call started and when RanksLost
reached it; the machine's one clock, so the driver can compare with the moment it killed the host),
``HOSTS-FIRST rank R seconds=S`` (the first call on the survivors), ``HOSTS-WRONG`` for a wrong
result, ``HOSTS-OK rank R calls=N size=S`` at the end; ``HOSTS-NOLOSS`` where SECONDS passed
without a loss.
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collectives  # noqa: E402

ALGO = os.environ.get("ALGO", "ring")
COUNT = int(os.environ.get("COUNT", "100000"))
AFTER = int(os.environ.get("AFTER", "10"))
SECONDS = float(os.environ.get("SECONDS_TO_RUN", "60"))
WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def inputs(call):
    return ((np.arange(COUNT) % 7) + RANK * 3 + call).astype(np.float32)


def expected(call, world_ranks):
    base = (np.arange(COUNT) % 7 + call).astype(np.float32)
    return (base * len(world_ranks) + 3 * sum(world_ranks)).astype(np.float32)


def world_ranks(comm):
    return MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), WORLD.Get_group())


def main():
    signal.signal(signal.SIGUSR1, lambda *_: os._exit(3))  # the driver's --kill exit: a rank that crashes
    comm, members = WORLD, list(range(WORLD.Get_size()))
    call = first = 0
    after, lost, out = None, [], np.empty(COUNT, np.float32)
    end = time.monotonic() + SECONDS
    while after is None or after < AFTER:
        if after is None and time.monotonic() > end:
            say(f"HOSTS-NOLOSS rank {RANK}: {call} calls in {SECONDS:g} s")
            os._exit(1)
        x = inputs(call)
        started = time.monotonic()
        try:
            collectives.allreduce(x, out, algorithm=ALGO, comm=comm)
        except collectives.RanksLost as error:
            raised = time.monotonic()
            comm, members = error.survivors, world_ranks(error.survivors)
            lost = sorted(set(range(WORLD.Get_size())) - set(members))
            repeat = first + error.completed
            timings = {k: round(v, 4) for k, v in error.timings.items()}
            say(f"HOSTS-LOST rank {RANK}: lost={lost} repeat={repeat} ahead={error.ahead} call={call} "
                f"at={started:.4f} raised={raised:.4f} timings={timings}")
            call = first = repeat
            after = 0
            continue
        if not np.array_equal(out, expected(call, members)):
            say(f"HOSTS-WRONG rank {RANK}: call {call} on {comm.Get_size()} ranks")
        if after is not None:
            if after == 0:
                say(f"HOSTS-FIRST rank {RANK} seconds={time.monotonic() - started:.4f}")
            native = np.empty_like(x)
            comm.Allreduce(x, native)  # MPI's own all-reduce on the survivors
            if not np.array_equal(out, native):
                say(f"HOSTS-WRONG rank {RANK}: call {call} differs from MPI_Allreduce on the survivors")
            after += 1
        elif call == 2:
            say(f"HOSTS-STARTED rank {RANK}")
        call += 1
    say(f"HOSTS-OK rank {RANK} calls={call} size={comm.Get_size()} lost={lost}")
    # the end of a job that lost a rank can hang in MPI_Finalize under Open MPI 5.0.11 with ULFM
    # (docs/reliability.md): the survivors leave without it once all are done
    comm.Barrier()
    time.sleep(2.0)  # a rank that leaves while a peer still finishes the barrier looks failed to it
    os._exit(0)


if __name__ == "__main__":
    main()
