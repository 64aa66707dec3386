"""Multi-process tests: run by tests/run_all.py as `mpiexec -n N python -m mpi4py -m pytest tests/mpi`
for N = 1..4. Each rank runs the same tests; results are compared with the MPI library's own
comm.Allreduce on the same data, and the verdict is agreed across ranks before asserting."""
import os

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import blocks  # noqa: E402
from tests.helpers import integer_valued, random_floats, tolerance  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}
MPI_DTYPES = [np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                    "uint64", "float32", "float64")]
OPTIONS = {"tree": {"segment_bytes": 64}, "double_binary_tree": {"segment_bytes": 64},
           "hierarchical_copy": {"group_size": 2}, "reduce_to_one": {"root": WORLD.size - 1}}


def agree(ok, message):
    """All ranks fail together, or none."""
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {WORLD.rank}: {message}" if not ok else "another rank failed"


def native(x, op):
    ref = np.empty_like(x)
    WORLD.Allreduce(x, ref, op=MPI_OPS[op])
    if op == "avg":
        ref = (ref / x.dtype.type(WORLD.size)).astype(x.dtype)
    return ref


def identical_everywhere(y):
    digests = WORLD.allgather(y.tobytes())
    return all(d == digests[0] for d in digests)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_matches_native_exactly_on_integer_data(algorithm):
    ok, why = True, ""
    for options in ({}, OPTIONS.get(algorithm, {})):
        for dtype in MPI_DTYPES:
            for op in [o for o in collectives.OPS if o != "avg" or dtype.kind == "f"]:
                for count in (0, 1, WORLD.size + 1, 1000):
                    x = integer_valued(WORLD.rank, count, dtype, op, seed=count)
                    keep = x.copy()
                    y = collectives.allreduce(x, op=op, algorithm=algorithm, **options)
                    if not (np.array_equal(y, native(x, op)) and np.array_equal(x, keep)
                            and identical_everywhere(y)):
                        ok, why = False, f"{dtype} {op} count={count} {options}"
    agree(ok, why)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_random_floats_close_to_native_and_bitwise_identical(algorithm):
    ok, why = True, ""
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        for op in ("sum", "avg", "min"):
            x = random_floats(WORLD.rank, 3001, dtype)
            y = collectives.allreduce(x, op=op, algorithm=algorithm, **OPTIONS.get(algorithm, {}))
            if not np.allclose(y, native(x, op), rtol=tolerance(dtype, WORLD.size), atol=tolerance(dtype, 4)):
                ok, why = False, f"{dtype} {op} not close"
            if not identical_everywhere(y):
                ok, why = False, f"{dtype} {op} differs across ranks"
    agree(ok, why)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_in_place_and_given_recvbuf(algorithm):
    x = random_floats(WORLD.rank, 777, np.dtype(np.float64)).reshape(7, 111)
    expected = native(x, "sum")
    inplace = x.copy()
    collectives.allreduce(inplace, inplace, algorithm=algorithm)
    target = np.empty_like(x)
    collectives.allreduce(x, target, algorithm=algorithm, comm=WORLD)
    agree(np.allclose(inplace, expected) and np.array_equal(inplace, target) and identical_everywhere(target),
          "in place or recvbuf result wrong")


def test_wrapped_communicators_and_splits():
    sub = WORLD.Split(WORLD.rank % 2, WORLD.rank)
    ours = collectives.as_comm(sub)
    x = np.full(10, WORLD.rank + 1, np.int64)
    for _ in range(3):  # successive calls on two communicators, interleaved
        y_sub = collectives.allreduce(x, comm=ours, algorithm="ring")
        y_all = collectives.allreduce(x, comm=None, algorithm="recursive_doubling")
    members = [r for r in range(WORLD.size) if r % 2 == WORLD.rank % 2]
    agree((y_sub == sum(m + 1 for m in members)).all() and (y_all == sum(range(1, WORLD.size + 1))).all(),
          "split or world result wrong")
    sub.Free()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_messages_just_past_the_eager_limit_travel_in_pieces_and_stay_exact(algorithm):
    """8-16 KiB messages of prepared programs go as pieces within the eager limit on one tag
    (MPICH: past its 8,000 B): odd and even element counts, 1- to 8-byte elements, repeated
    calls, in place."""
    from collectives.comm import mpi as mpi_comm

    split = mpi_comm._pieces(0, np.empty(2001, np.int32), 0, 8000)
    assert [piece.size for _, piece, _ in split] == [1000, 1001]
    assert np.shares_memory(split[0][1], split[1][1]) is False
    assert len(mpi_comm._pieces(0, np.empty(2000, np.int32), 0, 8000)) == 1  # 8,000 B: eager as it is
    three = mpi_comm._pieces(0, np.empty(4001, np.int32), 0, 8000)  # past twice the limit: three pieces
    assert [p.size for _, p, _ in three] == [1333, 1334, 1334] and all(p.nbytes <= 8000 for _, p, _ in three)
    assert len(mpi_comm._pieces(0, np.empty(3, np.float64), 0, 12)) == 3  # pieces hold whole elements
    assert len(mpi_comm._pieces(0, np.empty(8001, np.int32), 0, 8000)) == 1  # past MAX_PIECES: whole
    assert len(mpi_comm._pieces(0, np.empty(2001, np.int32), 0, 0)) == 1  # 0: off
    ok, why = True, ""
    for dtype, count in ((np.int8, 8001), (np.int32, 2001), (np.float64, 1999), (np.int64, 2000)):
        for call in range(3):
            x = integer_valued(WORLD.rank, count, np.dtype(dtype), "sum", seed=call)
            y = collectives.allreduce(x, algorithm=algorithm)
            z = x.copy()
            collectives.allreduce(z, z, algorithm=algorithm)
            expected = native(x, "sum")
            if not (np.array_equal(y, expected) and np.array_equal(z, expected) and identical_everywhere(y)):
                ok, why = False, f"{np.dtype(dtype)} x {count}, call {call}"
    agree(ok, why)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("times, limit, requests", [(1.5, None, 4), (1.5, "0", 2), (2.5, None, 6)])
def test_a_prepared_steps_requests_follow_the_eager_limit(monkeypatch, times, limit, requests):
    """At n=2 recursive doubling on 1.5x this library's eager limit is one exchange step of one
    message each way: four persistent requests under the library's limit (two pieces each way),
    two with it off; on 2.5x the limit, three pieces each way."""
    from collectives import mpilib
    from collectives.comm import mpi as mpi_comm

    monkeypatch.delenv("COLLECTIVES_EAGER_LIMIT", raising=False)
    eager = mpi_comm._eager_limit()
    if WORLD.size != 2 or not eager:
        pytest.skip(f"needs two ranks and a measured eager limit ({mpilib.describe()}: "
                    f"{eager} B; python -m collectives.protocol measures it)")
    if limit is not None:
        monkeypatch.setenv("COLLECTIVES_EAGER_LIMIT", limit)
    count = int(eager * times) // 4
    if count * 4 > collectives.calls.PROGRAM_MAX_BYTES:
        pytest.skip(f"{count * 4} B is past the small-message programs ({mpilib.describe()}'s limit: {eager} B)")
    sub = WORLD.Dup()
    y = collectives.allreduce(np.ones(count, np.float32), comm=sub, algorithm="recursive_doubling")
    steps = [step for step in list(mpi_comm._live_steps) if step.mpi_comm is collectives.as_comm(sub).mpi_comm]
    counts = sorted(len(step.requests) for step in steps)
    sub.Free()
    agree((y == 2).all() and counts == [requests], f"requests per prepared step: {counts}")


def test_a_malformed_eager_limit_is_refused_before_any_message(monkeypatch):
    if WORLD.size < 2:
        pytest.skip("one rank's plan has no messages to prepare")
    monkeypatch.setenv("COLLECTIVES_EAGER_LIMIT", "8k")
    sub = WORLD.Dup()
    try:
        with pytest.raises(ValueError, match="COLLECTIVES_EAGER_LIMIT must be a whole number of bytes"):
            collectives.allreduce(np.ones(2400, np.float32), comm=sub, algorithm="ring")
    finally:
        sub.Free()


@pytest.mark.timeout(120)
def test_freeing_a_communicator_frees_what_the_library_made_for_it():
    """A job that splits, reduces on and frees communicators in a loop: each free releases the
    wrapper's duplicate, prepared requests and shm window. MPICH holds about 2,048 communicators,
    so a leaked duplicate per loop fails with "Too many communicators" before the loop ends."""
    ok, why = True, ""
    expected = WORLD.size * (WORLD.size + 1) // 2
    for loop in range(2100):
        sub = WORLD.Split(0, WORLD.rank)
        for algorithm, count in (("recursive_doubling", 4), ("shm", 64)) if loop % 100 == 0 else \
                (("recursive_doubling", 4),):
            y = collectives.allreduce(np.full(count, WORLD.rank + 1, np.int64), comm=sub, algorithm=algorithm)
            if not (y == expected).all():
                ok, why = False, f"loop {loop}, {algorithm}: got {y[0]}, expected {expected}"
        sub.Free()
    agree(ok, why)
    with pytest.raises(ValueError, match="COMM_NULL"):  # the freed one is refused with a clear error
        collectives.allreduce(np.ones(4), comm=sub)


@pytest.mark.timeout(60)
def test_library_memory_counts_programs_scratch_and_window():
    sub = WORLD.Dup()
    before = collectives.library_memory(sub)
    small = np.ones(1000, np.float64)  # 8,000 B: a prepared program
    collectives.allreduce(small, comm=sub, algorithm="ring")
    collectives.allreduce(small, comm=sub, algorithm="ring")  # the same shape: nothing new is held
    big = np.ones(1 << 17, np.float32)  # 512 KiB: past the bound programs, executor scratch over MPI
    collectives.allreduce(big, comm=sub, algorithm="ring", transport="mpi")
    after = collectives.library_memory(sub)
    ok = before == {"scratch": 0, "programs": 0, "program_shapes": 0, "shm_window": 0} \
        and after["program_shapes"] == 1 and small.nbytes <= after["programs"] <= 2 * small.nbytes \
        and after["scratch"] <= big.nbytes and after["shm_window"] == 0
    # over the shared-memory transport the node's window holds the staging
    collectives.allreduce(big, comm=sub, algorithm="ring", transport="shm")
    window = collectives.library_memory(sub)["shm_window"]
    ok = ok and (0 < window <= 4 * big.nbytes if sub.size > 1 else window == 0)
    sub.Free()
    agree(ok, f"library memory before {before}, after {after}, window {window}")


def test_building_blocks_match_mpi():
    n, r = WORLD.size, WORLD.rank
    ok = True
    x = integer_valued(r, 23, np.dtype(np.int32), "sum")
    full = native(x, "sum")
    for algorithm in blocks.REDUCE_SCATTER:
        block = collectives.reduce_scatter(x, algorithm=algorithm)
        ok &= np.array_equal(block, np.array_split(full, n)[r])
    for algorithm in blocks.ALLGATHER:
        mine = np.arange(r + 1, dtype=np.float64) + 10 * r
        gathered = collectives.allgather(mine, algorithm=algorithm)
        ok &= np.array_equal(gathered, np.concatenate(WORLD.allgather(mine)))
    for algorithm in blocks.BROADCAST:
        buf = np.full(9, r, np.int16)
        collectives.broadcast(buf, root=n - 1, algorithm=algorithm)
        ok &= bool((buf == n - 1).all())
    for algorithm in blocks.REDUCE:
        got = collectives.reduce(x, root=0, algorithm=algorithm)
        ok &= np.array_equal(got, full) if r == 0 else got is None
    agree(ok, "a building block differs from MPI")


def test_node_groups_from_shared_memory_split():
    comm = collectives.as_comm(WORLD)
    colors = comm.node_colors()
    # one machine: every rank on the same node, named by its lowest rank
    agree(colors == (0,) * WORLD.size, f"node colors {colors}")
    y = collectives.allreduce(np.ones(5), algorithm="hierarchical_copy")
    agree((y == WORLD.size).all(), "hierarchical_copy by node")


def test_check_catches_mismatched_count(monkeypatch):
    if WORLD.size < 2:
        pytest.skip("a mismatch needs two ranks")
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    count = 10 if WORLD.rank == 0 else 11
    with pytest.raises(collectives.MismatchError, match="count") as info:
        collectives.allreduce(np.ones(count), algorithm="ring")
    assert "rank 0: 10" in str(info.value)


def test_timeout_names_the_silent_rank(monkeypatch):
    if WORLD.size < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "1")
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    comm = collectives.as_comm(WORLD.Dup())
    if WORLD.rank == 1:
        WORLD.Barrier()  # rank 1 never calls; waits for the others to time out
    else:
        with pytest.raises(collectives.CollectiveTimeout, match="no message from rank"):
            collectives.allreduce(np.ones(4), algorithm="ring", comm=comm)
        WORLD.Barrier()
    assert os.environ["COLLECTIVES_TIMEOUT"] == "1"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["sum", "max", "min", "avg"])
def test_repeated_small_calls_on_the_same_buffers(op):
    """Small messages run as prepared programs, bound straight to buffers seen twice in a row:
    new contents each call, out of place and in place, must still give the native answer."""
    ok, why = True, ""
    dtype = np.float64 if op == "avg" else np.int32
    for algorithm in collectives.algorithm_names():
        for count in (1, 5, 1000):
            sendbuf = np.empty(count, dtype)
            recvbuf = np.empty(count, dtype)
            for call in range(5):
                sendbuf[:] = (np.arange(count) * (WORLD.rank + 1) + call) % 97
                expected = native(sendbuf, op)
                collectives.allreduce(sendbuf, recvbuf, op=op, algorithm=algorithm, comm=WORLD)
                if not np.array_equal(recvbuf, expected):
                    ok, why = False, f"{algorithm} count={count} call {call} out of place"
                inplace = sendbuf.copy()
                for _ in range(2):  # the same in-place buffer twice: bound on the second call
                    inplace[:] = sendbuf
                    collectives.allreduce(inplace, inplace, op=op, algorithm=algorithm, comm=WORLD)
                if not np.array_equal(inplace, expected):
                    ok, why = False, f"{algorithm} count={count} call {call} in place"
    agree(ok, why)


@pytest.mark.timeout(60)
def test_partly_overlapping_small_buffers_are_never_bound():
    base = np.zeros(12, np.int64)
    sendbuf, recvbuf = base[:8], base[4:12]  # the same two views every call, overlapping by 4
    ok = True
    for call in range(4):
        sendbuf[:] = np.arange(8) + WORLD.rank + call
        expected = native(sendbuf.copy(), "sum")
        collectives.allreduce(sendbuf, recvbuf, algorithm="ring", comm=WORLD)
        ok = ok and np.array_equal(recvbuf, expected)
    agree(ok, "overlapping sendbuf/recvbuf gave a wrong result")


@pytest.mark.timeout(120)
def test_small_programs_agree_when_one_rank_lost_its_cache(monkeypatch):
    """Small messages run as programs with fixed tags and persistent requests. Rank 0 drops its
    cached programs between calls (as eviction does when it runs calls the others do not):
    its rebuilt programs must still meet the other ranks' cached ones, with the right sums."""
    if WORLD.size < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "20")  # a tag disagreement times out, never hangs
    ok, why = True, ""
    comm = WORLD.Dup()
    for round_ in range(3):
        for algorithm in collectives.algorithm_names():
            for count in (1, 7, 1000):
                sendbuf = (np.arange(count, dtype=np.int64) + WORLD.rank * 5 + round_) % 31
                result = collectives.allreduce(sendbuf, algorithm=algorithm, comm=comm)
                if not np.array_equal(result, native(sendbuf, "sum")):
                    ok, why = False, f"{algorithm} count={count} round {round_}"
        if WORLD.rank == 0:
            collectives.clear_caches()
    comm.Free()
    agree(ok, why)


@pytest.mark.timeout(120)
def test_shm_large_windows_across_repeated_and_changing_shapes():
    """Past 1 MiB the shm window has one region, reused while the shape repeats and
    republished after one more barrier when it changes: a rank that runs ahead into its next
    call must never overwrite a block a slower rank is still reading. Rank 0 lags on purpose."""
    import time

    class SlowCopies(np.ndarray):  # rank 0's result buffer: every copy into it lags
        def __setitem__(self, index, value):
            time.sleep(0.01)
            super().__setitem__(index, value)

    ok, why = True, ""
    comm = collectives.as_comm(WORLD.Dup())
    shapes = [(400_000, np.int32)] * 3 + [(300_000, np.int64), (700_000, np.int16), (400_000, np.int32),
                                          (350_001, np.int32), (350_001, np.int32), (1000, np.int32)]
    sendbufs = [((np.arange(count) * 3 + call * 11 + WORLD.rank) % 1000).astype(dtype)
                for call, (count, dtype) in enumerate(shapes)]
    recvbufs = [np.empty_like(sendbuf) for sendbuf in sendbufs]
    if WORLD.rank == 0:
        recvbufs = [recvbuf.view(SlowCopies) for recvbuf in recvbufs]
    for sendbuf, recvbuf in zip(sendbufs, recvbufs):  # back to back: nothing else synchronises
        collectives.allreduce(sendbuf, recvbuf, comm=comm, algorithm="shm")
    for call, (sendbuf, recvbuf) in enumerate(zip(sendbufs, recvbufs)):
        count, dtype = shapes[call]
        y = np.asarray(recvbuf)
        right, same = np.array_equal(y, native(sendbuf, "sum")), identical_everywhere(y)  # both collective
        if not (right and same):
            ok, why = False, f"call {call} ({count} x {np.dtype(dtype)}) wrong or not identical"
    agree(ok, why)
