"""Multi-process tests of iallreduce, Bucketer and wire compression (run by tests/run_all.py under
mpiexec -n 1..4): results against the MPI library's comm.Allreduce, bytes compared across ranks,
the verdict agreed across ranks before asserting."""
import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import compression  # noqa: E402
from tests.helpers import integer_valued  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]
WORLD = MPI.COMM_WORLD


def agree(ok, message):
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {WORLD.rank}: {message}" if not ok else "another rank failed"


def identical_everywhere(y):
    digests = WORLD.allgather(y.tobytes())
    return all(d == digests[0] for d in digests)


def native_sum(x):
    ref = np.empty_like(x)
    WORLD.Allreduce(x, ref, op=MPI.SUM)
    return ref


def test_many_requests_in_flight_beside_blocking_calls_match_native():
    ok, why = True, ""
    names = collectives.algorithm_names()
    requests, inputs = [], []
    for i in range(30):
        dtype = (np.int64, np.float64, np.int32)[i % 3]
        x = integer_valued(WORLD.rank, 1 + 1237 * i % 70000, np.dtype(dtype), "sum", seed=i)
        inputs.append(x)
        requests.append(collectives.iallreduce(x, algorithm=names[i % len(names)]))
        if i % 4 == 0:  # a blocking call on the same communicator while requests are in flight
            y = collectives.allreduce(x, algorithm="ring")
            if not np.array_equal(y, native_sum(x)):
                ok, why = False, f"blocking call {i} during requests"
    results = collectives.waitall(requests, timeout=120)
    for i, (x, y) in enumerate(zip(inputs, results)):
        if not (np.array_equal(y, native_sum(x)) and identical_everywhere(y)):
            ok, why = False, f"request {i} ({names[i % len(names)]})"
    agree(ok and collectives.open_requests() == 0, why)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_compression_every_algorithm_bitwise_identical_within_bound(algorithm):
    ok, why = True, ""
    n = WORLD.size
    for fmt in compression.FORMATS:
        for dtype in (np.float32, np.float64):
            for count in (0, 1, 1001, 70001):
                rng = np.random.default_rng(count * 7 + WORLD.rank)
                x = rng.standard_normal(count).astype(dtype)
                y = collectives.allreduce(x, algorithm=algorithm, compression=fmt, compression_scope="all")
                z = collectives.iallreduce(x, algorithm=algorithm, compression=fmt, compression_scope="all").wait(60)
                exact = native_sum(x.astype(np.float64))
                scale = native_sum(np.abs(x.astype(np.float64)))
                u = compression.UNIT_ROUNDOFF[fmt] + 2.0 ** -24
                bound = (n + 2) * (u * scale + (2.0 ** -24 if fmt == "fp16" else 0.0))
                if not (identical_everywhere(y) and y.tobytes() == z.tobytes()
                        and (np.abs(y - exact) <= bound).all()):
                    ok, why = False, f"{fmt} {np.dtype(dtype)} count={count}"
    agree(ok, why)


def test_buckets_in_a_different_readiness_order_on_every_rank():
    shapes = [(100,), (3, 7), (5000,), (1,), (64, 64), (0,), (9,)]
    grads = [np.zeros(s, np.float64) for s in shapes]
    buckets = collectives.Bucketer(grads, 8 << 10, op="sum")
    ok, why = True, ""
    for round_ in range(3):
        fresh = [integer_valued(WORLD.rank, int(np.prod(s)), np.dtype(np.float64), "sum", seed=round_ * 10 + i)
                 .reshape(s) for i, s in enumerate(shapes)]
        for i in np.random.default_rng(WORLD.rank + 17 * round_).permutation(len(shapes)):
            grads[i][...] = fresh[i]
            buckets.mark_ready(int(i))
        buckets.wait(timeout=120)
        for i, (g, f) in enumerate(zip(grads, fresh)):
            if not (np.array_equal(g, native_sum(f)) and identical_everywhere(g)):
                ok, why = False, f"round {round_} array {i}"
    agree(ok and len(buckets.buckets) > 1, why)


@pytest.mark.skipif(WORLD.size < 2, reason="needs two ranks")
def test_posting_order_mismatch_raises_at_wait_under_check(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    comm = WORLD.Dup()
    try:
        sizes = (10, 20) if WORLD.rank == 0 else (20, 10)
        requests = [collectives.iallreduce(np.ones(s), comm=comm, algorithm="ring") for s in sizes]
        errors = []
        for r in requests:
            try:
                r.wait(timeout=60)
            except collectives.MismatchError as exc:
                errors.append(str(exc))
        agree(len(errors) == 2 and "count" in errors[0], errors)
    finally:
        monkeypatch.delenv("COLLECTIVES_CHECK")
        comm.Free()


def test_freeing_the_communicator_finishes_its_requests_first():
    comm = WORLD.Dup()
    requests = [collectives.iallreduce(np.full(5000, WORLD.rank + 1.0), comm=comm, algorithm="ring")
                for _ in range(4)]
    comm.Free()  # closes our wrapper: its progress thread finishes the requests, then its communicator goes
    want = np.full(5000, WORLD.size * (WORLD.size + 1) / 2)
    agree(all(r.test() for r in requests) and all(np.array_equal(r.wait(1), want) for r in requests),
          [r for r in requests])


def test_requests_progress_while_the_caller_sleeps():
    import time

    collectives.iallreduce(np.ones(1)).wait()
    requests = [collectives.iallreduce(np.full(200000, WORLD.rank + 1.0), algorithm="ring") for _ in range(3)]
    deadline = time.monotonic() + 60
    while not all(r._done.is_set() for r in requests) and time.monotonic() < deadline:
        time.sleep(0.05)  # no MPI call and no library call on this thread
    done = all(r._done.is_set() for r in requests)
    agree(done and np.array_equal(requests[-1].wait(), np.full(200000, WORLD.size * (WORLD.size + 1) / 2)),
          "requests did not finish while the caller slept")
