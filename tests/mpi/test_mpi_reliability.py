"""Reliability under MPI (run by tests/run_all.py under mpiexec -n 1..4): successive calls,
split communicators and the user's own traffic never mix messages; no pickling in the data
path; COLLECTIVES_CHECK names the field on every rank; mismatched sizes end as errors on
every rank under COLLECTIVES_ON_ERROR=raise. Verdicts are agreed across ranks before asserting,
and no test leaves a rank waiting."""
import pickle
import re

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import blocks  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
N, RANK = WORLD.size, WORLD.rank
OPTIONS = {"tree": {"segment_bytes": 64}, "double_binary_tree": {"segment_bytes": 64},
           "hierarchical_copy": {"group_size": 2}, "reduce_to_one": {"root": N - 1}}


def agree(ok, message):
    """All ranks fail together, or none (a plain allreduce of one bool: pickles, so only here)."""
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {RANK}: {message}" if not ok else "another rank failed"


def value(rank, call, count):
    """Data unique to (rank, call): a result mixed with another call's messages shows."""
    return (np.arange(count, dtype=np.int64) * 7 + 1000 * call + rank) % 100003


def expected_sum(call, count):
    return sum(value(r, call, count) for r in range(N))


def test_successive_calls_of_every_size_and_algorithm_never_mix():
    ok, why = True, ""
    names = collectives.algorithm_names()
    sizes = (0, 1, 3, N + 1, 257, 4099)
    call = 0
    for rep in range(3):
        for algorithm in names:
            for count in sizes:
                call += 1
                options = OPTIONS.get(algorithm, {}) if rep == 1 else {}
                y = collectives.allreduce(value(RANK, call, count), algorithm=algorithm, **options)
                if not np.array_equal(y, expected_sum(call, count)):
                    ok, why = False, f"call {call}: {algorithm} count={count} {options}"
    agree(ok, why)


def test_blocks_interleaved_with_allreduce_never_mix():
    ok, why = True, ""
    for call in range(12):
        count = 5 + 13 * call
        x = value(RANK, call, count)
        full = expected_sum(call, count)
        rs = collectives.reduce_scatter(x, algorithm=list(blocks.REDUCE_SCATTER)[call % 2])
        y = collectives.allreduce(x, algorithm=collectives.algorithm_names()[call % len(collectives.algorithm_names())])
        g = collectives.allgather(x[:RANK + call % 3], algorithm=list(blocks.ALLGATHER)[call % 2])
        b = x.copy()
        collectives.broadcast(b, root=call % N, algorithm=list(blocks.BROADCAST)[call % 2])
        r = collectives.reduce(x, root=(call + 1) % N, algorithm=list(blocks.REDUCE)[call % 2])
        gathered = np.concatenate([value(q, call, count)[:q + call % 3] for q in range(N)])
        checks = {
            "reduce_scatter": np.array_equal(rs, np.array_split(full, N)[RANK]),
            "allreduce": np.array_equal(y, full),
            "allgather": np.array_equal(g, gathered),
            "broadcast": np.array_equal(b, value(call % N, call, count)),
            "reduce": np.array_equal(r, full) if RANK == (call + 1) % N else r is None,
        }
        for name, good in checks.items():
            if not good:
                ok, why = False, f"call {call}: {name} wrong"
    agree(ok, why)


def test_split_communicators_interleaved_never_mix():
    halves = WORLD.Split(RANK % 2, RANK)
    reversed_world = WORLD.Split(0, N - RANK)  # same ranks, reversed order: different peers per rank
    ours = collectives.as_comm(WORLD)
    sub_of_ours = ours.split(RANK // 2, key=RANK)  # a split of the collectives communicator itself
    comms = [(halves, [r for r in range(N) if r % 2 == RANK % 2]),
             (reversed_world, list(range(N))),
             (sub_of_ours, [r for r in range(N) if r // 2 == RANK // 2]),
             (None, list(range(N)))]
    ok, why = True, ""
    for call in range(6):
        for index, (comm, members) in enumerate(comms):
            algorithm = collectives.algorithm_names()[(call + index) % len(collectives.algorithm_names())]
            tag = call * 10 + index
            y = collectives.allreduce(value(RANK, tag, 50 + call), comm=comm, algorithm=algorithm)
            if not np.array_equal(y, sum(value(m, tag, 50 + call) for m in members)):
                ok, why = False, f"call {call} comm {index} ({algorithm}) mixed"
    assert collectives.as_comm(WORLD) is ours, "the wrapper of a communicator is cached"
    halves.Free()
    reversed_world.Free()
    agree(ok, why)


def test_user_traffic_on_the_same_communicator_never_mixes():
    # the user's own messages, pending on WORLD with tags the library also uses, while it runs
    right, left = (RANK + 1) % N, (RANK - 1) % N
    incoming = np.full(64, -1, np.int64)
    outgoing = np.full(64, 5000 + RANK, np.int64)
    reqs = [WORLD.Irecv(incoming, source=left, tag=0)]
    ok, why = True, ""
    for index, algorithm in enumerate(collectives.algorithm_names()):
        for rep in range(4):
            call, count = 4 * index + rep, 64  # the user's message size: a mix-up passes the size check
            y = collectives.allreduce(value(RANK, call, count), comm=WORLD, algorithm=algorithm)
            if not np.array_equal(y, expected_sum(call, count)):
                ok, why = False, f"{algorithm} result mixed with user traffic"
    reqs.append(WORLD.Isend(outgoing, dest=right, tag=0))
    MPI.Request.Waitall(reqs)
    if not (incoming == 5000 + left).all():
        ok, why = False, "the user's message was taken or changed by the library"
    agree(ok, why)


@pytest.fixture
def no_pickle():
    """mpi4py's pickle made to fail: any pickled (lowercase) communication raises."""
    saved = MPI.pickle.PROTOCOL

    def refuse(*args, **kwargs):
        raise AssertionError("the data path pickled")

    MPI.pickle.__init__(refuse, refuse)
    try:
        yield
    finally:
        MPI.pickle.__init__(pickle.dumps, pickle.loads, saved)


def _data_path_without_pickle():
    """Every call once, on a fresh communicator and on WORLD; returns (ok, why)."""
    fresh = collectives.as_comm(WORLD.Dup())  # new wrapper: node colours etc. computed now
    ok, why = True, ""
    x = value(RANK, 1, 301)
    full = expected_sum(1, 301)
    for comm in (fresh, None):
        for algorithm in collectives.algorithm_names():
            for options in ({}, OPTIONS.get(algorithm, {})):
                if not np.array_equal(collectives.allreduce(x, algorithm=algorithm, comm=comm, **options), full):
                    ok, why = False, f"allreduce {algorithm}"
        ok &= np.array_equal(collectives.allreduce(x, comm=comm), full)  # auto
        for algorithm in blocks.REDUCE_SCATTER:
            ok &= np.array_equal(collectives.reduce_scatter(x, algorithm=algorithm, comm=comm),
                                 np.array_split(full, N)[RANK])
        for algorithm in blocks.ALLGATHER:
            ok &= np.array_equal(collectives.allgather(x[:RANK + 1], algorithm=algorithm, comm=comm),
                                 np.concatenate([value(q, 1, 301)[:q + 1] for q in range(N)]))
        for algorithm in blocks.BROADCAST:
            b = x.copy()
            collectives.broadcast(b, root=N - 1, algorithm=algorithm, comm=comm)
            ok &= np.array_equal(b, value(N - 1, 1, 301))
        for algorithm in blocks.REDUCE:
            r = collectives.reduce(x, root=0, algorithm=algorithm, comm=comm)
            ok &= np.array_equal(r, full) if RANK == 0 else r is None
        if comm is not None:
            comm.barrier()
    if not ok and not why:
        why = "a building block was wrong"
    return ok, why


def test_no_pickling_in_the_data_path(no_pickle):
    try:
        ok, why = _data_path_without_pickle()
    except AssertionError as exc:  # pickled: every rank gets here (the same calls in the same order)
        ok, why = False, str(exc)
    MPI.pickle.__init__(pickle.dumps, pickle.loads)  # agree() below pickles
    agree(ok, why)


def test_no_pickling_in_the_check_either(no_pickle, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    try:
        ok, why = _data_path_without_pickle()
    except AssertionError as exc:
        ok, why = False, str(exc)
    MPI.pickle.__init__(pickle.dumps, pickle.loads)
    agree(ok, why)


def _mismatch_everywhere(call, field):
    """Run ``call(rank)`` under COLLECTIVES_CHECK=1 on a fresh communicator; every rank must raise
    MismatchError naming ``field``. Returns (ok, why)."""
    comm = collectives.as_comm(WORLD.Dup())
    try:
        call(comm)
    except collectives.MismatchError as exc:
        if f"ranks disagree on {field}" not in str(exc) or "ranks 1 differ from rank 0" not in str(exc):
            return False, f"wrong message: {exc}"
        return True, ""
    except Exception as exc:  # noqa: BLE001 - any other outcome is the failure reported
        return False, f"{type(exc).__name__}: {exc}"
    return False, "no MismatchError"


@pytest.mark.parametrize("field, call", [
    ("count", lambda c: collectives.allreduce(np.ones(10 + (RANK == 1)), comm=c, algorithm="ring")),
    ("dtype", lambda c: collectives.allreduce(np.ones(10, np.int32 if RANK == 1 else np.float32), comm=c,
                                              algorithm="ring")),
    ("op", lambda c: collectives.allreduce(np.ones(10), op="max" if RANK == 1 else "sum", comm=c,
                                           algorithm="ring")),
    ("algorithm", lambda c: collectives.allreduce(np.ones(10), comm=c,
                                                  algorithm="tree" if RANK == 1 else "ring")),
    ("options", lambda c: collectives.allreduce(np.ones(100), comm=c, algorithm="tree",
                                                segment_bytes=64 if RANK == 1 else 128)),
    ("options", lambda c: collectives.broadcast(np.ones(10), root=1 if RANK == 1 else 0, comm=c)),
    ("op", lambda c: collectives.reduce(np.ones(10), op="min" if RANK == 1 else "sum", comm=c)),
    ("count", lambda c: collectives.reduce_scatter(np.ones(10 + (RANK == 1)), comm=c)),
    ("dtype", lambda c: collectives.allgather(np.ones(3 + RANK, np.int32 if RANK == 1 else np.float32), comm=c)),
    ("algorithm", lambda c: collectives.allgather(np.ones(3), comm=c,
                                                  algorithm="recursive_doubling" if RANK == 1 else "ring")),
], ids=["count", "dtype", "op", "algorithm", "options", "broadcast-root", "reduce-op", "reduce_scatter-count",
        "allgather-dtype", "allgather-algorithm"])
def test_check_names_the_field_on_every_rank(monkeypatch, field, call):
    if N < 2:
        pytest.skip("a mismatch needs two ranks")
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "10")
    ok, why = _mismatch_everywhere(call, field)
    agree(ok, why)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_mismatched_count_is_an_error_on_every_rank_never_a_result(monkeypatch, algorithm):
    # COLLECTIVES_ON_ERROR=raise: the detecting rank raises MismatchError, a rank left waiting
    # raises CollectiveTimeout; no rank may return a result
    if N < 2:
        pytest.skip("a mismatch needs two ranks")
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "1")
    comm = collectives.as_comm(WORLD.Dup())
    ok, why = True, ""
    try:
        collectives.allreduce(np.ones(100 + (RANK == 1), np.float32), comm=comm, algorithm=algorithm)
        ok, why = False, "returned a result"
    except collectives.MismatchError:
        pass
    except collectives.CollectiveTimeout as exc:
        if algorithm == "shm":  # every rank reads every header: every rank raises MismatchError
            ok, why = False, f"CollectiveTimeout instead of MismatchError: {exc}"
    except Exception as exc:  # noqa: BLE001
        ok, why = False, f"{type(exc).__name__}: {exc}"
    agree(ok, why)


def _shm_mismatch(comm, make, field):
    """Every rank must raise the same MismatchError(shm) naming ``field``; returns (ok, why, text)."""
    try:
        collectives.allreduce(make(), comm=comm, algorithm="shm")
        return False, "returned a result", ""
    except collectives.MismatchError as exc:
        text = str(exc)
        if not re.match(rf"allreduce\(shm\)( step \d+/\d+)?: ranks disagree on {field} \(", text) \
                or "rank 1: " not in text:
            return False, f"wrong message: {text}", text
        return True, "", text
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}", ""


@pytest.mark.parametrize("field, make", [
    ("count", lambda: np.ones(100 + (RANK == 1), np.float32)),
    # only rank 1 needs a bigger window: every rank must still agree before Allocate_shared
    ("count", lambda: np.ones(1_000_000 if RANK == 1 else 100, np.float32)),
    ("count", lambda: np.ones(100 if RANK == 1 else 1_000_000, np.float32)),
    ("dtype", lambda: np.ones(100, np.int32 if RANK == 1 else np.float32)),  # same byte size
], ids=["count", "one-rank-grows", "others-grow", "same-size-dtype"])
def test_shm_mismatch_without_check_is_the_same_error_on_every_rank(monkeypatch, field, make):
    if N < 2 or "shm" not in collectives.algorithm_names():
        pytest.skip("a mismatch needs two ranks and the shm algorithm")
    monkeypatch.delenv("COLLECTIVES_CHECK", raising=False)
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "10")
    comm = collectives.as_comm(WORLD.Dup())
    ok, why = True, ""
    # a window already in use, then the mismatch, then correct calls on the same communicator:
    # every rank raised at the same point, so the window and the call sequence stay in step
    x = value(RANK, 1, 64)
    ok &= np.array_equal(collectives.allreduce(x, comm=comm, algorithm="shm"), expected_sum(1, 64))
    good, why, text = _shm_mismatch(comm, make, field)
    texts = WORLD.allgather(text)
    if good and len(set(texts)) != 1:
        good, why = False, f"the ranks' messages differ: {texts}"
    ok &= good
    # the communicator failed, as after any error: a later call is refused on every rank, and a
    # new communicator works
    try:
        collectives.allreduce(value(RANK, 2, 64), comm=comm, algorithm="shm")
        ok, why = False, "the failed communicator took another call"
    except collectives.CollectiveError as exc:
        if "cannot be used" not in str(exc):
            ok, why = False, f"refused with {exc}"
    fresh = collectives.as_comm(WORLD.Dup())
    for call, count in ((3, 64), (4, 300_000), (5, 5)):
        y = collectives.allreduce(value(RANK, call, count), comm=fresh, algorithm="shm")
        if not np.array_equal(y, expected_sum(call, count)):
            ok, why = False, f"call {call} on a new communicator was wrong"
    agree(ok, why)
