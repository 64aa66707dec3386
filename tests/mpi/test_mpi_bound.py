"""Mid-size calls that repeat their buffers run their plan bound to them (executor.BoundProgram):
the same bytes as the executor, on every rank; ranks on different paths (one bound, one on the
executor) meet; a mismatch after binding is an error on every rank; the session's budget caps
what bound programs hold; without the guard (no signed tags) nothing binds. Run by
tests/run_all.py at N = 1..4 ranks, under MPICH, Open MPI and Intel MPI."""
import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import api, calls  # noqa: E402
from collectives.executor import BoundProgram  # noqa: E402
from tests.helpers import agree_all, bitwise_alike  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
WORLD = MPI.COMM_WORLD
RANK, N = WORLD.rank, WORLD.size
# between the small-message programs and the bound limit; one odd count
COUNTS = [calls.PROGRAM_MAX_BYTES // 4 + 1000, calls.BOUND_MAX_BYTES // 4 - 7]
# shm runs on the shared-memory transport, which has no prepared programs
ALGORITHMS = [name for name in collectives.algorithm_names() if name != "shm"]


def agree(ok, message):
    agree_all(WORLD, ok, message)


def data(count, seed=0):
    return np.random.default_rng(1000 * seed + RANK).standard_normal(count).astype(np.float32)


def bound_programs(comm):
    return [p for p in comm.session.programs.values() if isinstance(p, BoundProgram) and p.bound is not None]


@pytest.fixture
def comm():
    mpi_comm = WORLD.Dup()
    ours = collectives.as_comm(mpi_comm)
    yield ours
    mpi_comm.Free()


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_repeated_buffers_run_bound_with_the_executors_bytes(comm, monkeypatch, algorithm, in_place):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    ok, why = True, ""
    for count in COUNTS:
        x = data(count)
        executor = collectives.allreduce(x, comm=comm, algorithm=algorithm)  # fresh buffers: the executor
        buf = x.copy() if in_place else np.empty_like(x)
        for call in range(4):  # the second call binds; the later ones run bound
            if in_place:
                buf[...] = x
                collectives.allreduce(buf, buf, comm=comm, algorithm=algorithm)
            else:
                collectives.allreduce(x, buf, comm=comm, algorithm=algorithm)
            if not np.array_equal(buf.view(np.uint32), executor.view(np.uint32)):
                ok, why = False, f"count {count} call {call}: bound bytes differ from the executor's"
        ok &= bitwise_alike(WORLD, buf)
    if not bound_programs(comm):
        ok, why = False, "no program was bound"
    agree(ok, why or "ranks hold different bytes")


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "tree"])
def test_ranks_on_different_paths_meet(comm, monkeypatch, algorithm, count):
    """Even ranks repeat their buffers (bound), odd ranks bring new ones every call (executor):
    the messages are the same (the executor's tags, whole messages even where a small-message
    program would send eager pieces: ring's chunks at n=4), so every call completes with the
    same result everywhere."""
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "10")
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    x = data(count, seed=1)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    out = np.empty_like(x)
    ok, why = True, ""
    for call in range(5):
        if RANK % 2:
            out = np.empty_like(x)
        collectives.allreduce(x, out, comm=comm, algorithm=algorithm)
        if not np.allclose(out, expected, rtol=1e-4, atol=1e-4):
            ok, why = False, f"call {call}: wrong result"
        if not bitwise_alike(WORLD, out):
            ok, why = False, f"call {call}: ranks hold different bytes"
    if N > 1 and RANK % 2 == 0 and not bound_programs(comm):
        ok, why = False, "the repeating rank never ran bound"
    agree(ok, why)


def test_a_mismatch_after_binding_is_an_error_on_every_rank(comm, monkeypatch):
    if N < 2:
        pytest.skip("a mismatch needs two ranks")
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "2")
    x = data(COUNTS[0], seed=2)
    out = np.empty_like(x)
    for _ in range(3):
        collectives.allreduce(x, out, comm=comm, algorithm="ring")
    ok, why = bool(bound_programs(comm)), "no program was bound"
    try:  # rank 1 asks for max, the others run their bound sum
        collectives.allreduce(x, out, op="max" if RANK == 1 else "sum", comm=comm, algorithm="ring")
        ok, why = False, "returned a result"
    except (collectives.MismatchError, collectives.CollectiveTimeout):
        pass
    except Exception as exc:  # noqa: BLE001 - any other outcome is the failure reported
        ok, why = False, f"{type(exc).__name__}: {exc}"
    agree(ok, why)


def test_the_budget_caps_what_bound_programs_hold(comm, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    monkeypatch.setattr(calls, "BOUND_BUDGET", 0)
    x = data(COUNTS[1], seed=3)
    out = np.empty_like(x)
    for _ in range(4):
        collectives.allreduce(x, out, comm=comm, algorithm="recursive_doubling")
    held = collectives.library_memory(comm)["programs"]
    ok = held == 0 and not bound_programs(comm)
    expected = collectives.allreduce(x, comm=comm, algorithm="recursive_doubling")
    ok &= np.array_equal(out, expected)
    agree(ok, f"a zero budget still bound a program ({held} B held) or changed the result")


def test_the_budget_counts_what_binding_holds(comm, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    x = data(COUNTS[1], seed=4)
    out = np.empty_like(x)
    for _ in range(3):
        collectives.allreduce(x, out, comm=comm, algorithm="recursive_doubling")
    held = collectives.library_memory(comm)["programs"]
    tmp_bytes = sum(p.plan.tmp_count * 4 for p in bound_programs(comm))
    pinned = sum(p.pinned() for p in bound_programs(comm))
    ok = N == 1 or (held == tmp_bytes > 0 and pinned == tmp_bytes + x.nbytes + out.nbytes)
    agree(ok, f"programs hold {held} B, bound scratch is {tmp_bytes} B, bindings keep {pinned} B")


@pytest.mark.parametrize("spare", [-1, 0])
def test_the_budget_counts_the_callers_arrays_a_binding_keeps_alive(comm, monkeypatch, spare):
    """A binding keeps the caller's arrays alive: they count against the budget with its scratch."""
    if N == 1:
        pytest.skip("one rank's plan has no scratch to budget")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    x = data(COUNTS[0], seed=6)
    out = np.empty_like(x)
    collectives.allreduce(x, out, comm=comm, algorithm="recursive_doubling")  # makes the program
    program = next(p for p in comm.session.programs.values() if isinstance(p, BoundProgram))
    monkeypatch.setattr(program, "budget", program.plan.tmp_count * 4 + x.nbytes + out.nbytes + spare)
    for _ in range(3):
        collectives.allreduce(x, out, comm=comm, algorithm="recursive_doubling")
    agree((program.bound is not None) == (spare == 0), f"budget {program.budget} B: bound {program.bound is not None}")


def test_the_last_pair_is_not_kept_alive(comm, monkeypatch):
    """Arrays a call used once (unbound) are freed when the caller drops them."""
    import gc
    import weakref

    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    x = data(COUNTS[0], seed=7)
    out = np.empty_like(x)
    collectives.allreduce(x, out, comm=comm, algorithm="ring")
    other = data(COUNTS[1], seed=8)  # another program's call: the API's own memo of the last call forgets x, out
    collectives.allreduce(other, np.empty_like(other), comm=comm, algorithm="ring")
    gone = weakref.ref(x), weakref.ref(out)
    del x, out
    gc.collect()
    agree(gone[0]() is None and gone[1]() is None, "a program kept the previous call's arrays alive")


def test_without_the_guard_nothing_binds(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_GUARD", "0")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    mpi_comm = WORLD.Dup()
    comm = collectives.as_comm(mpi_comm)  # the guard is read when the communicator is wrapped
    try:
        x = data(COUNTS[0], seed=5)
        out = np.empty_like(x)
        for _ in range(3):
            collectives.allreduce(x, out, comm=comm, algorithm="ring")
        expected = np.empty_like(x)
        WORLD.Allreduce(x, expected)
        ok = np.allclose(out, expected, rtol=1e-4, atol=1e-4) and not comm.session.programs
        agree(ok, f"unsigned calls made programs {list(comm.session.programs)} or a wrong result")
    finally:
        mpi_comm.Free()


@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_bound_and_shared_memory_reductions_store_their_bulk_aligned(comm, monkeypatch, transport):
    """On buffers 16 bytes past a cache line, a bound program's reductions (over MPI) and the
    shared-memory transport's write every output but a head of under 64 bytes from a 64-byte
    boundary, with the executor's bytes."""
    from collectives.comm import shm as shm_transport
    from tests.helpers import at, reduction_spy

    if N == 1 or (transport == "shm" and not shm_transport.available(comm)):
        pytest.skip("one rank reduces nothing; shared memory needs two ranks on a node")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    outs = reduction_spy(monkeypatch, api)
    count = COUNTS[0]
    x = data(count, seed=9)
    expected = collectives.allreduce(x, comm=comm, algorithm="recursive_doubling", transport=transport)
    w = at(16, count)
    try:
        for _ in range(3):  # over MPI the second call binds, the third runs bound
            w[...] = x
            del outs[:]
            collectives.allreduce(w, w, comm=comm, algorithm="recursive_doubling", transport=transport)
        bound = bool(bound_programs(comm))
    finally:
        collectives.clear_caches()
    bulk = [(address, nbytes) for address, nbytes in outs if nbytes >= 64]
    # (a rank that folds its data into a peer's, n=3, reduces nothing itself)
    ok = WORLD.allreduce(bool(bulk), op=MPI.LOR) and all(address % 64 == 0 for address, _ in bulk) \
        and np.array_equal(w, expected)
    ok &= transport == "shm" or bound
    agree(ok, f"reductions {outs}, bound {bound}, same bytes {np.array_equal(w, expected)}")


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_calls_alternating_between_two_shapes_each_run_bound(comm, monkeypatch, in_place):
    """A training step's buckets: two buffer pairs of different sizes, called in turn. Each call
    takes the session's short path (the last call was the other pair), and each size's program
    still binds to its own caller's arrays (it must see the same arrays, not fresh views)."""
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    pairs = []
    for count in (64, COUNTS[0]):  # a small-message program and a bound mid-size one
        x = data(count, seed=count)
        pairs.append((x, x.copy() if in_place else np.empty_like(x), x))
    for _ in range(4):
        for send, recv, x in pairs:
            if in_place:
                recv[...] = x
                collectives.allreduce(recv, recv, comm=comm, algorithm="ring")
            else:
                collectives.allreduce(send, recv, comm=comm, algorithm="ring")
    ok, why = True, ""
    programs = list(comm.session.programs.values())
    for send, recv, x in pairs:
        mine = [p for p in programs if p.bound is not None and p.bound[1] is recv]
        if not mine or (mine[0].bound[0] is not (recv if in_place else send)):
            ok, why = False, f"no program bound to the {x.size}-element pair"
        expected = np.empty_like(x)
        WORLD.Allreduce(x, expected, op=MPI.SUM)
        if not np.allclose(recv, expected, rtol=1e-5, atol=1e-5) or not bitwise_alike(WORLD, recv):
            ok, why = False, f"{x.size} elements: wrong or differing result"
    agree(ok, why)


def test_the_shortest_path_runs_only_the_binding_its_program_holds(comm, monkeypatch):
    """``session.last`` keeps the last pair's binding; once the program binds another pair (here
    through the pipeline's full path, which does not record it), a call on the first pair must
    go back through the program, never rerun the binding the program dropped."""
    from collectives import pipeline

    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "30")
    shortest = []
    real_run = pipeline.run
    monkeypatch.setattr(pipeline, "run", lambda actions: (shortest.append(actions), real_run(actions)))
    x, other = data(64, seed=1), data(64, seed=2)
    recv, other_recv = np.empty_like(x), np.empty_like(x)
    for _ in range(3):  # the second call binds, the third takes the shortest path
        collectives.allreduce(x, recv, comm=comm, algorithm="ring")
    ok, why = len(shortest) == 1, f"the shortest path ran {len(shortest)} times in 3 calls (expected 1)"
    for _ in range(2):  # the same program binds the other pair; session.last still names the first
        pipeline.call(other, other_recv, "sum", "ring", comm, {}, shape=None)
    x[...] = data(64, seed=3)
    collectives.allreduce(x, recv, comm=comm, algorithm="ring")
    if ok and len(shortest) != 1:
        ok, why = False, "a call ran the binding its program had dropped"
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected, op=MPI.SUM)
    if ok and not (np.allclose(recv, expected, rtol=1e-5, atol=1e-5) and bitwise_alike(WORLD, recv)):
        ok, why = False, "wrong or differing result"
    agree(ok, why)
