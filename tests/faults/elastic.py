"""An elastic job for tests/test_elastic_mpi.py: one rank dies in the middle of a collective and
the others go on (COLLECTIVES_ON_ERROR=shrink, Open MPI launched with --with-ft ulfm).

Run as ``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self -n N python tests/faults/elastic.py``.
Every rank makes ELASTIC_CALLS all-reduces of ELASTIC_COUNT float32 (integer values: every
order of summation gives the same bits) with ELASTIC_ALGO, in place or out of place
(ELASTIC_PLACE), and checks each result against MPI_Allreduce of the same inputs on the same
communicator. Rank ELASTIC_VICTIM kills itself (SIGKILL) at its ELASTIC_STEP-th message step
from call ELASTIC_FAIL_AT on: mid-call (``shm``, which has no such steps, dies as the call
starts); with ELASTIC_DELAY seconds it waits that long at that step first (its peers that do not
need it finish the call meanwhile: they are then one call ahead). A survivor catches RanksLost,
goes on with ``error.survivors`` and repeats the call the library names (the recipe of
docs/reliability.md: call ``error.completed`` of the failed communicator).

Lines: ``ELASTIC-LOST rank R: call C lost=[..] world=[..] survivors=S repeat=K ahead=A
seconds=T timings=...`` per recovery (C: the call it was in, K: the call it repeats),
``ELASTIC-WRONG`` for a result that differs from MPI's, ``ELASTIC-OK rank R lost=[..]`` at the end.
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import collectives  # noqa: E402
from collectives.comm import mpi as _mpi  # noqa: E402

ALGO = os.environ.get("ELASTIC_ALGO", "ring")
IN_PLACE = os.environ.get("ELASTIC_PLACE", "out") == "in"
CALLS = int(os.environ.get("ELASTIC_CALLS", "5"))
COUNT = int(os.environ.get("ELASTIC_COUNT", "100000"))  # 400 kB: the step loop (no prepared program)
FAIL_AT = int(os.environ.get("ELASTIC_FAIL_AT", "2"))
STEP = int(os.environ.get("ELASTIC_STEP", "2"))
DELAY = float(os.environ.get("ELASTIC_DELAY", "0"))
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
VICTIM = int(os.environ.get("ELASTIC_VICTIM", str(SIZE - 1)))


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def die_at_step(step):
    """From now on, this rank's ``step``-th message step kills it."""
    original, seen = _mpi.MPIComm.exchange, [0]

    def exchange(self, *args, **kwargs):
        seen[0] += 1
        if seen[0] >= step:
            time.sleep(DELAY)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)
    _mpi.MPIComm.exchange = exchange


def inputs(call):
    """This rank's input of call ``call``: small integers, by world rank."""
    return ((np.arange(COUNT) % 7) + RANK * 3 + call).astype(np.float32)


def main():
    comm, lost, call = WORLD, [], 0
    base = 0  # the number of the first call made on ``comm``
    while call < CALLS:
        x = inputs(call)
        expected = np.empty_like(x)
        if RANK == VICTIM and call == FAIL_AT:
            if ALGO == "shm":
                os.kill(os.getpid(), signal.SIGKILL)
            die_at_step(STEP)
        start = time.monotonic()
        try:
            if IN_PLACE:
                got = x.copy()
                collectives.allreduce(got, got, algorithm=ALGO, comm=comm)
            else:
                got = np.empty_like(x)
                collectives.allreduce(x, got, algorithm=ALGO, comm=comm)
                if not np.array_equal(x, inputs(call)):
                    say(f"ELASTIC-WRONG rank {RANK}: call {call} changed its sendbuf")
        except collectives.RanksLost as error:
            seconds = time.monotonic() - start
            comm = error.survivors
            lost = sorted(set(lost) | set(_world_ranks(error)))
            timings = {k: round(v, 4) for k, v in getattr(error, "timings", {}).items()}
            repeat = base + error.completed  # the call that did not complete on every survivor
            say(f"ELASTIC-LOST rank {RANK}: call {call} lost={list(error.lost)} world={_world_ranks(error)} "
                f"survivors={comm.Get_size()} repeat={repeat} ahead={error.ahead} seconds={seconds:.4f} "
                f"timings={timings} ({error})")
            call = base = repeat
            continue
        try:
            comm.Allreduce(x, expected)  # MPI's own all-reduce on the same communicator
        except MPI.Exception:
            # this rank completed a call the others could not (the lost rank had sent it all it
            # needed): the library tells it at its next call, with the call to repeat
            call += 1
            continue
        if not np.array_equal(got, expected):
            bad = np.flatnonzero(got != expected)
            say(f"ELASTIC-WRONG rank {RANK}: call {call} on {comm.Get_size()} ranks: {bad.size} elements differ "
                f"(first {bad[0]}: {got[bad[0]]} != {expected[bad[0]]})")
        call += 1
    say(f"ELASTIC-OK rank {RANK} lost={lost} size={comm.Get_size()}")
    # the end of a job that lost a rank now and then never comes under Open MPI 5.0.11 with ULFM
    # (MPI_Finalize, docs/reliability.md): the survivors leave without it once all are done
    try:
        comm.Barrier()
    except MPI.Exception:
        pass
    time.sleep(2.0)  # a rank that leaves while a peer still finishes the barrier looks failed to it
    os._exit(0)


_WORLD_GROUP = WORLD.Get_group()


def _world_ranks(error):
    """The lost ranks of ``error`` as COMM_WORLD ranks (its ``lost`` are ranks of the communicator
    the call ran on; the first failure's is COMM_WORLD itself)."""
    failed_group = error.survivors.Get_group()
    survivors_world = MPI.Group.Translate_ranks(failed_group, list(range(error.survivors.Get_size())), _WORLD_GROUP)
    known_lost = set(range(SIZE)) - set(survivors_world)
    return sorted(known_lost)


if __name__ == "__main__":
    main()
