"""The session's count of the caller's calls that returned (RanksLost.completed agrees on it in
recovery, collectives/comm/ulfm.py): every public collective that returns counts once, on every
path of the all-reduce (the fast path, the short path, the whole path), and nothing the library
runs inside a call (first-use measurement) counts."""
import numpy as np

import collectives


def completed(comm):
    return comm.session.completed_calls()


def test_every_public_call_that_returns_counts_once():
    def body(comm):
        counts = [completed(comm)]
        x, y = np.ones(1000, np.float32), np.empty(1000, np.float32)
        for _ in range(3):  # the whole path, then the short path and the fast path
            collectives.allreduce(x, y, algorithm="ring", comm=comm)
            counts.append(completed(comm))
        collectives.allreduce(np.ones(10, np.float64), comm=comm)  # auto: its own choosing not counted
        counts.append(completed(comm))
        collectives.reduce_scatter(x, comm=comm)
        collectives.allgather(x[:comm.rank + 1], comm=comm)
        collectives.broadcast(x, root=1, comm=comm)
        collectives.reduce(x, root=0, comm=comm)
        collectives.barrier(comm)
        counts.append(completed(comm))
        return counts
    for counts in collectives.run_threaded(3, body):
        assert counts == [0, 1, 2, 3, 4, 9], counts


def test_a_call_that_raises_does_not_count():
    def body(comm):
        collectives.allreduce(np.ones(8, np.float32), algorithm="ring", comm=comm)
        try:
            collectives.allreduce(np.ones(8, np.float32), algorithm="no-such-algorithm", comm=comm)
        except ValueError:
            pass
        return completed(comm)
    assert collectives.run_threaded(2, body) == [1, 1]


def test_iallreduce_requests_count_on_the_progress_communicator():
    def body(comm):
        requests = [collectives.iallreduce(np.full(100, i, np.float32), algorithm="ring", comm=comm)
                    for i in range(4)]
        collectives.waitall(requests)
        from collectives import nonblocking
        return completed(comm), completed(nonblocking._progress_of(comm).comm)
    assert collectives.run_threaded(2, body) == [(0, 4), (0, 4)]
