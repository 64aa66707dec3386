"""Fault scenarios for tests/test_faults_mpi.py: each CASE breaks one rank on purpose.

Run as ``mpiexec -n N python tests/faults/scenario.py CASE`` (``python -m mpi4py`` for
``raises``), with COLLECTIVES_TIMEOUT small (2). Every rank does a few all-reduce calls
and checks each result; only a rank whose every call was right prints
``SCENARIO-OK rank R``; a wrong result prints ``SCENARIO-WRONG``. A CollectiveError that
reaches this script (COLLECTIVES_CHECK=1, or COLLECTIVES_ON_ERROR=raise) is printed as
``SCENARIO-ERROR rank R: Type: message``; the rank then waits (bounded) for the others at
a barrier on COMM_WORLD so that every rank's line is out before the job ends nonzero.

Cases (the faulty rank is 1):
  ok           nothing wrong: the control case (exits 0, every rank prints SCENARIO-OK)
  count        rank 1 passes one element more
  dtype        rank 1 passes float64 where the others pass float32 (same count)
  dtype_same   rank 1 passes int32 where the others pass float32 (same byte size)
  never_calls  rank 1 does the first call, then sleeps instead of the second
  absent       rank 1 makes no call at all (it sleeps from the start): the others' very first
               collective (creating the library's communicator) must time out naming it
  op           rank 1 reduces with max where the others reduce with sum
  root         rank 1 names root 1 where the others name root 0 (broadcast, reduce)
  reuse        (COLLECTIVES_ON_ERROR=raise) rank 1 passes one element more in the first call;
               every rank then calls again on the same communicator and prints
               ``SCENARIO-REUSE rank R: Type: message`` for the error that call raises
  raises       rank 1 raises RuntimeError after the first call
  sigkill      rank 1 kills itself with SIGKILL after the first call

SCENARIO_ALGO picks the algorithm (default ring); SCENARIO_CALLS the number of calls (4);
SCENARIO_COUNT the element count (1000); SCENARIO_CALL the collective: allreduce (default),
reduce_scatter, allgather, broadcast, reduce or barrier (building blocks use their default
algorithm).
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import collectives  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
FAULTY = 1
COUNT = int(os.environ.get("SCENARIO_COUNT", "1000"))


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def bounded_barrier(limit=15.0):
    """Wait for every rank (bounded); a rank that never comes (it sleeps, or is gone) would also
    keep MPI_Finalize from returning, so then the job is aborted."""
    req = WORLD.Ibarrier()
    deadline = time.monotonic() + limit
    while not req.Test():
        if time.monotonic() > deadline:
            say(f"SCENARIO-BARRIER-TIMEOUT rank {RANK}")
            WORLD.Abort(1)
        time.sleep(0.005)


def buffers(case, call):
    """This rank's input and the result every rank should get when nothing is wrong."""
    count, dtype = COUNT, np.dtype(np.float32)
    if RANK == FAULTY:
        if case in ("count", "reuse"):
            count += 1
        elif case == "dtype":
            dtype = np.dtype(np.float64)
        elif case == "dtype_same":
            dtype = np.dtype(np.int32)
    x = np.full(count, RANK + 1 + call, dtype)
    expected = np.full(count, sum(r + 1 + call for r in range(SIZE)), dtype)
    return x, expected


def collective(kind, x, expected, call, op, root, algorithm):
    """Run the collective ``kind`` on ``x``; True when its result is what a faultless job gets."""
    if kind == "allreduce":
        y = collectives.allreduce(x, op=op, algorithm=algorithm)
        return np.array_equal(y, expected if op == "sum" else np.full_like(expected, SIZE + call))
    if kind == "reduce_scatter":
        y = collectives.reduce_scatter(x, op=op)
        return np.array_equal(y, np.array_split(expected if op == "sum" else np.full_like(expected, SIZE + call),
                                                SIZE)[RANK])
    if kind == "allgather":
        y = collectives.allgather(x)
        return np.array_equal(y, np.concatenate([np.full(x.size, r + 1 + call, x.dtype) for r in range(SIZE)]))
    if kind == "broadcast":
        y = collectives.broadcast(x, root=root)
        return np.array_equal(y, np.full_like(x, root + 1 + call))
    if kind == "reduce":
        y = collectives.reduce(x, root=root, op=op)
        return y is None if RANK != root else np.array_equal(y, expected)
    if kind == "barrier":
        collectives.barrier()
        return True
    if kind == "multi_worker_strategy":
        import tf_bridge

        tf_bridge.multi_worker_strategy()
        return True
    raise SystemExit(f"unknown SCENARIO_CALL {kind!r}")


def main(case):
    algorithm = os.environ.get("SCENARIO_ALGO", "ring")
    kind = os.environ.get("SCENARIO_CALL", "allreduce")
    calls = int(os.environ.get("SCENARIO_CALLS", "4"))
    if RANK == FAULTY and case == "absent":
        time.sleep(120)  # never calls anything: the others' first collective must time out
    op = "max" if RANK == FAULTY and case == "op" else "sum"
    root = 1 if RANK == FAULTY and case == "root" else 0
    ok = True
    for call in range(calls):
        if RANK == FAULTY and call == 1:
            if case == "never_calls":
                time.sleep(120)  # a hung rank: the others must time out and end the job
            elif case == "raises":
                raise RuntimeError(f"scenario: rank {RANK} failed on purpose between calls")
            elif case == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
        x, expected = buffers(case, call)
        try:
            ok = collective(kind, x, expected, call, op, root, algorithm) and ok
        except collectives.CollectiveError as exc:
            if case != "reuse":
                raise
            say(f"SCENARIO-ERROR rank {RANK}: {type(exc).__name__}: {exc}")
            x, expected = buffers("ok", call + 1)
            try:
                collective(kind, x, expected, call + 1, op, root, algorithm)
                say(f"SCENARIO-REUSE rank {RANK}: no error")
            except collectives.CollectiveError as again:
                say(f"SCENARIO-REUSE rank {RANK}: {type(again).__name__}: {again}")
            bounded_barrier()
            return 1
    say(f"SCENARIO-{'OK' if ok else 'WRONG'} rank {RANK}")
    return 0 if ok else 2


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "ok"
    try:
        code = main(what)
    except collectives.CollectiveError as exc:
        say(f"SCENARIO-ERROR rank {RANK}: {type(exc).__name__}: {exc}")
        bounded_barrier(3.0 if what == "absent" else 15.0)  # the absent rank never comes
        code = 1
    sys.exit(code)
