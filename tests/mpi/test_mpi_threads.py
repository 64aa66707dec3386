"""Two user threads per rank, each calling ``allreduce`` on its own duplicate of COMM_WORLD
(MPI_THREAD_MULTIPLE), with thread switches forced every few microseconds: every call matches
native and every rank ends with the same bits (run by tests/run_all.py under mpiexec -n 1..4)."""
import sys
import threading

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]
WORLD = MPI.COMM_WORLD


def test_two_user_threads_on_two_communicators(monkeypatch):
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip(f"the MPI library gave thread level {MPI.Query_thread()}, not MPI_THREAD_MULTIPLE")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    comms = [WORLD.Dup(), WORLD.Dup()]
    sizes = (16, 4096)
    calls = 600
    outcomes = [None, None]

    def body(index):
        comm, count = comms[index], sizes[index]
        x = np.arange(count, dtype=np.float64) + WORLD.rank
        out = np.empty_like(x)
        got = []
        try:
            for i in range(calls):
                if i % 3 == 0:
                    y = collectives.allreduce(x, comm=comm)
                elif i % 3 == 1:
                    y = collectives.allreduce(x, out, comm=comm)
                else:
                    y = x.copy()
                    collectives.allreduce(y, y, comm=comm)
                got.append(y.tobytes())
            outcomes[index] = got
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcomes[index] = exc

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=body, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    ok = True
    for index, count in enumerate(sizes):
        got = outcomes[index]
        if not isinstance(got, list):
            ok = False
            continue
        x = np.arange(count, dtype=np.float64) + WORLD.rank
        ref = np.empty_like(x)
        WORLD.Allreduce(x, ref, op=MPI.SUM)
        ok = ok and got == [ref.tobytes()] * calls
        digests = WORLD.allgather(got[-1])
        ok = ok and all(d == digests[0] for d in digests)
    everyone = WORLD.allreduce(ok, op=MPI.LAND)
    for comm in comms:
        comm.Free()
    assert everyone, f"rank {WORLD.rank}: {outcomes!r:.300}"


def test_a_thread_never_reuses_a_communicator_freed_on_another():
    # a thread remembers the last mpi4py communicator it resolved; the main thread frees it between
    # the thread's two calls: the second must be a clear error, not a call on the freed wrapper
    comm = WORLD.Dup()
    x, out = np.ones(8, np.float32), np.empty(8, np.float32)
    results, called, freed = [], threading.Event(), threading.Event()

    def worker():
        for _ in range(2):
            try:
                collectives.allreduce(x, out, comm=comm)
                results.append(float(out[0]))
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                results.append(exc)
            called.set()
            freed.wait(60)

    thread = threading.Thread(target=worker)
    thread.start()
    called.wait(60)
    comm.Free()
    freed.set()
    thread.join(60)
    assert results[0] == WORLD.size, results
    assert isinstance(results[1], ValueError) and "COMM_NULL" in str(results[1]), results
