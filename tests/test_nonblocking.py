"""iallreduce on threaded worlds: many requests in flight in posting order beside blocking calls,
results bitwise identical to the blocking call's, errors and timeouts raised at wait, and a
process that exits with requests open ends (subprocesses under a hard timeout)."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import collectives
from collectives.errors import CollectiveError, CollectiveTimeout, MismatchError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = ["ring", "tree", "recursive_doubling", "rabenseifner", "double_binary_tree", "reduce_to_one"]


def _data(rank, i, count=None):
    rng = np.random.default_rng(1000 * i + rank)
    return rng.standard_normal(count if count is not None else 1 + 997 * i % 5003).astype(np.float32)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_many_requests_in_flight_match_the_blocking_call_bitwise(n):
    def body(comm):
        requests, blocking = [], []
        for i in range(24):
            algorithm = ALGORITHMS[i % len(ALGORITHMS)]
            requests.append(collectives.iallreduce(_data(comm.rank, i), comm=comm, algorithm=algorithm))
            if i % 5 == 0:  # blocking calls on the same communicator in between
                blocking.append(collectives.allreduce(_data(comm.rank, i), comm=comm, algorithm=algorithm))
        results = [r.wait() for r in requests]
        assert all(r.test() for r in requests)
        exact = [collectives.allreduce(_data(comm.rank, i), comm=comm, algorithm=ALGORITHMS[i % len(ALGORITHMS)])
                 for i in range(24)]
        return results, blocking, exact

    out = collectives.run_threaded(n, body)
    for results, blocking, exact in out:
        for i, (got, want) in enumerate(zip(results, exact)):
            assert got.tobytes() == want.tobytes() == out[0][0][i].tobytes(), i
        for j, got in enumerate(blocking):
            assert got.tobytes() == exact[5 * j].tobytes()
    np.testing.assert_allclose(out[0][0][3], sum(_data(r, 3) for r in range(n)), rtol=1e-5, atol=1e-5)


def test_in_place_recvbuf_result_and_compression():
    def body(comm):
        x = np.arange(1000, dtype=np.float64) * (comm.rank + 1)
        y = x.copy()
        into = np.empty_like(x)
        a = collectives.iallreduce(y, y, comm=comm, algorithm="ring")
        b = collectives.iallreduce(x, into, comm=comm, op="max")
        c = collectives.iallreduce(x, comm=comm, compression="bf16", compression_scope="all", algorithm="ring")
        assert a.result() is y and b.wait(timeout=60) is into
        return y, into, c.result()

    out = collectives.run_threaded(3, body)
    want = np.arange(1000, dtype=np.float64) * 6
    for y, into, compressed in out:
        assert np.array_equal(y, want) and np.array_equal(into, np.arange(1000) * 3.0)
        assert compressed.tobytes() == out[0][2].tobytes()
        assert np.all(np.abs(compressed - want) <= 5 * 2.0 ** -8 * want + 1e-12)


def test_bad_input_raises_at_post_before_any_message():
    def body(comm):
        with pytest.raises(ValueError, match="takes float32 or float64"):
            collectives.iallreduce(np.ones(3, np.int32), comm=comm, compression="bf16")
        with pytest.raises(ValueError, match="unknown algorithm|valid"):
            collectives.iallreduce(np.ones(3), comm=comm, algorithm="nope")
        with pytest.raises(ValueError, match="recvbuf must match"):
            collectives.iallreduce(np.ones(3), np.ones(4), comm=comm)
        with pytest.raises(ValueError):
            collectives.iallreduce(np.ones(3), comm=comm, op="xor")
        with pytest.raises(ValueError, match="residual must be"):
            collectives.iallreduce(np.ones(3), comm=comm, compression="bf16", residual=np.zeros(2))
        with pytest.raises(ValueError, match="residual needs compression"):
            collectives.iallreduce(np.ones(3), comm=comm, residual=np.zeros(3))
        return collectives.open_requests(comm)

    assert collectives.run_threaded(2, body) == [0, 0]


def test_wait_with_a_timeout_leaves_the_request_in_flight():
    def body(comm):
        collectives.iallreduce(np.ones(1), comm=comm).wait()  # the first post is collective (progress comm)
        if comm.rank == 1:
            time.sleep(0.5)  # rank 1 posts late: rank 0's request cannot finish yet
        request = collectives.iallreduce(np.ones(10), comm=comm, algorithm="ring")
        early = None
        if comm.rank == 0:
            with pytest.raises(CollectiveTimeout, match="still in flight"):
                request.wait(timeout=0.05)
            early = request.test()
        return early, request.wait(timeout=60)

    out = collectives.run_threaded(2, body)
    assert out[0][0] is False
    assert all(np.array_equal(r, np.full(10, 2.0)) for _, r in out)


def test_a_rank_that_never_posts_gives_the_blocking_timeout_at_wait(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "1")
    seen = {}

    def blocking(comm):
        if comm.rank == 0:
            try:
                collectives.allreduce(np.ones(4), comm=comm, algorithm="ring")
            except CollectiveTimeout as exc:
                seen["blocking"] = str(exc)
        else:
            time.sleep(1.5)

    def nonblocking(comm):
        collectives.iallreduce(np.ones(1), comm=comm, algorithm="ring").wait()  # makes the progress comm
        if comm.rank == 1:
            time.sleep(1.5)
            return
        request = collectives.iallreduce(np.ones(4), comm=comm, algorithm="ring")
        with pytest.raises(CollectiveTimeout) as caught:
            request.wait(timeout=30)
        seen["nonblocking"] = str(caught.value)
        later = collectives.iallreduce(np.ones(4), comm=comm, algorithm="ring")
        with pytest.raises(CollectiveError, match="cannot be used"):
            later.wait(timeout=30)
        seen["later"] = True

    for fn in (blocking, nonblocking):  # the world reports the failure it saw once every rank is done
        with pytest.raises(CollectiveTimeout):
            collectives.run_threaded(2, fn)
    want, got = seen["blocking"], seen["nonblocking"]
    assert seen["later"] and want == got == "allreduce(ring) step 1/2: no message from rank 1 after 1 s", (want, got)


def test_posting_order_mismatch_is_found_under_check(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")

    def body(comm):
        sizes = (10, 20) if comm.rank == 0 else (20, 10)
        requests = [collectives.iallreduce(np.ones(s), comm=comm, algorithm="ring") for s in sizes]
        errors = []
        for r in requests:
            try:
                r.wait(timeout=60)
            except CollectiveError as exc:
                errors.append(exc)
        return errors

    for errors in collectives.run_threaded(2, body):  # the check raises alike on every rank
        assert errors and isinstance(errors[0], MismatchError) and "count" in str(errors[0]), errors


def _exit_script(body):
    return textwrap.dedent(f"""
        import atexit, sys, time
        import numpy as np
        sys.path.insert(0, {ROOT!r})
        held = []
        def check_at_the_very_end():  # registered before the library's: runs after its exit handler
            print("results:", [bool(r.test()) for r in held], flush=True)
        atexit.register(check_at_the_very_end)
        import collectives
    """) + textwrap.dedent(body)


def _run_script(source, env=None, limit=60):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=limit,
                          env=dict(os.environ, **(env or {})))
    return proc, time.monotonic() - start


def test_exit_with_requests_open_finishes_them_and_ends():
    proc, seconds = _run_script(_exit_script("""
        def body(comm):
            for i in range(6):
                held.append(collectives.iallreduce(np.ones(200000) * comm.rank, comm=comm, algorithm="ring"))
        collectives.run_threaded(3, body)
        print("posted", sum(not r.test() for r in held) >= 0, flush=True)
    """))
    assert proc.returncode == 0, proc.stderr
    assert "results: [True, True, True" in proc.stdout and "False" not in proc.stdout, proc.stdout
    assert seconds < 50


def test_exit_with_a_request_no_peer_will_match_ends_after_the_timeout():
    proc, seconds = _run_script(_exit_script("""
        def body(comm):
            collectives.iallreduce(np.ones(3), comm=comm).wait()
            if comm.rank == 0:
                held.append(collectives.iallreduce(np.ones(3), comm=comm, algorithm="ring"))
        collectives.run_threaded(2, body)
    """), env={"COLLECTIVES_TIMEOUT": "2"})
    assert proc.returncode == 0, proc.stderr
    assert "results: [True]" in proc.stdout, proc.stdout  # finished: with its timeout error
    assert 1.5 < seconds < 40


def test_requests_progress_while_the_caller_does_something_else():
    """No wait, no test: the progress thread finishes the requests while every rank sleeps."""
    def body(comm):
        collectives.iallreduce(np.ones(1), comm=comm).wait()  # the first post is collective
        requests = [collectives.iallreduce(np.ones(100000) * comm.rank, comm=comm, algorithm="ring")
                    for _ in range(3)]
        deadline = time.monotonic() + 30
        while not all(r._done.is_set() for r in requests) and time.monotonic() < deadline:
            time.sleep(0.05)  # the caller never calls into the library here
        return [r.test() for r in requests], requests[-1].result()

    for done, result in collectives.run_threaded(3, body):
        assert done == [True] * 3 and np.array_equal(result, np.full(100000, 3.0))
