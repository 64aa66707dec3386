"""Any thread may call the library on its own communicator: ranks of a threaded world calling
``allreduce`` on contiguous arrays many times with thread switches forced every few microseconds
(the fast paths' caches are each communicator's own, never shared between threads)."""
import sys

import numpy as np
import pytest

import collectives


@pytest.fixture
def tiny_switch_interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(5e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "auto"])
def test_ranks_of_a_threaded_world_repeat_calls_with_frequent_switches(tiny_switch_interval, monkeypatch, algorithm):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "20")
    calls = 150

    def rank_fn(comm):
        x = np.arange(64, dtype=np.float64) + comm.rank
        out = np.empty_like(x)
        results = []
        for i in range(calls):
            if i % 3 == 0:
                y = collectives.allreduce(x, algorithm=algorithm, comm=comm)
            elif i % 3 == 1:
                y = collectives.allreduce(x, out, algorithm=algorithm, comm=comm)
            else:
                y = x.copy()
                collectives.allreduce(y, y, algorithm=algorithm, comm=comm)
            results.append(y.tobytes())
        return results

    for _ in range(3):
        results = collectives.run_threaded(4, rank_fn)
        expected = (np.arange(64, dtype=np.float64) * 4 + 6).tobytes()
        for by_rank in results:
            assert by_rank == [expected] * calls
