"""Reliability on the threaded world: properties over world size, count, dtype, op, algorithm
and options (valid ones give the exact result on every rank, invalid ones a clear ValueError
before any communication); failures reach the caller and release the other ranks; silent
ranks and mismatches end as CollectiveTimeout/MismatchError, never a wrong result; a corrupt
or foreign tuning file warns and falls back to the cost model."""
import contextlib
import importlib
import json
import os
import re
import threading
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import collectives
from collectives import blocks, config, tuning
from collectives.errors import CollectiveError, CollectiveTimeout, MismatchError, PeerAborted
from tests.helpers import ALL_DTYPES, integer_valued, ops_for, reference

select = importlib.import_module("collectives.select")
ALGORITHMS = collectives.algorithm_names()
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def env(**values):
    """Set (or, with None, unset) environment variables for a block; restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------ valid calls: exact results
def valid_options(draw, algorithm, n):
    declared = collectives.algorithm_options(algorithm)
    options = {}
    if "segment_bytes" in declared and draw(st.booleans()):
        options["segment_bytes"] = draw(st.sampled_from([1, 2, 8, 24, 64, 1 << 18]))
    if "group_size" in declared and draw(st.booleans()):
        options["group_size"] = draw(st.integers(1, n + 1))
    if "root" in declared and draw(st.booleans()):
        options["root"] = draw(st.integers(0, n - 1))
    return options


@st.composite
def calls(draw):
    n = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    op = draw(st.sampled_from(ops_for(dtype)))
    algorithm = draw(st.sampled_from(ALGORITHMS + ["auto"]))
    options = valid_options(draw, algorithm, n) if algorithm != "auto" else {}
    count = draw(st.integers(0, 300) if options.get("segment_bytes", 99) >= 8 else st.integers(0, 40))
    return n, count, dtype, op, algorithm, options, draw(st.integers(0, 1000))


@PROPERTY
@given(calls())
def test_valid_calls_give_the_exact_result_on_every_rank(call):
    n, count, dtype, op, algorithm, options, seed = call
    inputs = [integer_valued(r, count, dtype, op, seed=seed) for r in range(n)]
    kept = [x.copy() for x in inputs]

    def body(comm):
        return collectives.allreduce(inputs[comm.rank], op=op, algorithm=algorithm, comm=comm, **options)

    with env(COLLECTIVES_TIMEOUT=30):
        results = collectives.run_threaded(n, body)
    expected = reference(inputs, op)
    for rank, y in enumerate(results):
        assert y.dtype == dtype and y.shape == (count,)
        assert y.tobytes() == results[0].tobytes(), f"rank {rank} differs from rank 0"
        assert np.array_equal(y.astype(np.float64), expected.astype(np.float64)), f"rank {rank} wrong"
        assert inputs[rank].tobytes() == kept[rank].tobytes(), "sendbuf modified"


@PROPERTY
@given(n=st.integers(1, 5), count=st.integers(0, 60), seed=st.integers(0, 100),
       rs=st.sampled_from(list(blocks.REDUCE_SCATTER)), ag=st.sampled_from(list(blocks.ALLGATHER)),
       bc=st.sampled_from(list(blocks.BROADCAST)), rd=st.sampled_from(list(blocks.REDUCE)), data=st.data())
def test_building_blocks_give_the_exact_result(n, count, seed, rs, ag, bc, rd, data):
    root = data.draw(st.integers(0, n - 1))
    dtype = np.dtype(np.int32)
    inputs = [integer_valued(r, count, dtype, "sum", seed=seed) for r in range(n)]
    full = reference(inputs, "sum")

    def body(comm):
        x = inputs[comm.rank]
        b = x.copy()
        collectives.broadcast(b, root=root, comm=comm, algorithm=bc)
        return (collectives.reduce_scatter(x, comm=comm, algorithm=rs),
                collectives.allgather(x[:comm.rank + 1], comm=comm, algorithm=ag), b,
                collectives.reduce(x, root=root, comm=comm, algorithm=rd))

    with env(COLLECTIVES_TIMEOUT=30):
        results = collectives.run_threaded(n, body)
    gathered = np.concatenate([inputs[r][:r + 1] for r in range(n)])
    for rank, (block, allg, bcast, red) in enumerate(results):
        assert np.array_equal(block, np.array_split(full, n)[rank])
        assert np.array_equal(allg, gathered)
        assert np.array_equal(bcast, inputs[root])
        assert (red is None) if rank != root else np.array_equal(red, full)


# ------------------------------------------------------------------ invalid input: clear ValueError
def _rank0_only(comm, call):
    if comm.rank == 0:  # an error raised after communicating would time out instead
        call(comm)


@st.composite
def invalid_options(draw):
    n = draw(st.integers(1, 5))
    algorithm = draw(st.sampled_from(ALGORITHMS))
    declared = collectives.algorithm_options(algorithm)
    choices = ["unknown"]
    if "segment_bytes" in declared:
        choices.append("segment_bytes")
    if "group_size" in declared:
        choices.append("group_size")
    if "root" in declared:
        choices.append("root")
    kind = draw(st.sampled_from(choices))
    if kind == "unknown":
        name = draw(st.sampled_from(["fanout", "segments", "chunk", "root", "group_size", "segment_bytes"]))
        assume(name not in declared)
        return n, algorithm, {name: 1}, r"valid options|takes no option"
    if kind == "root":
        bad = draw(st.sampled_from([-1, -7, n, n + 3, "0", 1.0, True, None]))
        return n, algorithm, {"root": bad}, r"root"
    bad = draw(st.sampled_from([0, -1, -1024, "64", 2.5, True, False] + ([None] if kind != "group_size" else [])))
    return n, algorithm, {kind: bad}, kind


@PROPERTY
@given(invalid_options())
def test_invalid_options_raise_a_clear_value_error_before_communicating(case):
    n, algorithm, options, match = case
    with env(COLLECTIVES_TIMEOUT=5):
        start = time.monotonic()
        with pytest.raises(ValueError, match=match):
            collectives.run_threaded(n, _rank0_only,
                                     lambda c: collectives.allreduce(np.ones(8), algorithm=algorithm, comm=c,
                                                                     **options))
        assert time.monotonic() - start < 4, "the error came from a timeout, not from validation"


@pytest.mark.parametrize("call, match", [
    (lambda c: collectives.allreduce(np.ones(4), op="bitor", comm=c), "valid ops"),
    (lambda c: collectives.allreduce(np.ones(4, np.complex64), comm=c), "supported dtypes"),
    (lambda c: collectives.allreduce(np.ones(4, np.int16), op="avg", comm=c), "floating dtype"),
    (lambda c: collectives.allreduce(np.ones(4), algorithm="butterfly", comm=c), "valid algorithms"),
    (lambda c: collectives.allreduce(np.ones(4), np.ones(3), comm=c), "recvbuf must match"),
    (lambda c: collectives.reduce(np.ones(4), root=9, comm=c), "root must be a rank"),
    (lambda c: collectives.broadcast(np.ones(4), root=True, comm=c), "root must be a rank"),
    (lambda c: collectives.allgather(np.ones(4), algorithm="tree", comm=c), "valid: ring"),
])
def test_bad_arguments_are_value_errors_before_communicating(call, match):
    with env(COLLECTIVES_TIMEOUT=5):
        with pytest.raises(ValueError, match=match):
            collectives.run_threaded(3, _rank0_only, call)


@pytest.mark.parametrize("raw", ["abc", "-1", "1s"])
def test_bad_timeout_setting_is_a_value_error(raw):
    with env(COLLECTIVES_TIMEOUT=raw), pytest.raises(ValueError, match="COLLECTIVES_TIMEOUT"):
        config.timeout()


def test_timeout_zero_disables_the_bound():
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.3)
        return collectives.allreduce(np.ones(3), comm=comm, algorithm="ring")

    with env(COLLECTIVES_TIMEOUT=0):
        assert config.timeout() == 0
        results = collectives.run_threaded(2, body)
    assert all((y == 2).all() for y in results)
    with env(COLLECTIVES_TIMEOUT=None):
        assert config.timeout() == config.DEFAULT_TIMEOUT == 300


def test_error_hierarchy():
    for cls in (CollectiveTimeout, MismatchError, PeerAborted):
        assert issubclass(cls, CollectiveError)
    assert issubclass(CollectiveTimeout, TimeoutError) and issubclass(MismatchError, ValueError)
    assert collectives.CollectiveError is CollectiveError


# ------------------------------------------------------------------ failures
@pytest.mark.parametrize("where", ["before", "between", "split", "barrier"])
def test_first_exception_reaches_the_caller_and_others_are_released(where):
    released = {}

    def body(comm):
        try:
            collectives.allreduce(np.ones(100), comm=comm, algorithm="ring")
            if comm.rank == 2 and where != "before":
                raise ZeroDivisionError("rank 2 broke")
            if where == "split":
                comm.split(comm.rank % 2)
            elif where == "barrier":
                comm.barrier()
            collectives.allreduce(np.ones(100), comm=comm, algorithm="tree")
        except PeerAborted as exc:
            released[comm.rank] = exc
            raise

    def first(comm):
        if comm.rank == 2 and where == "before":
            raise ZeroDivisionError("rank 2 broke")
        body(comm)

    with env(COLLECTIVES_TIMEOUT=60):
        start = time.monotonic()
        with pytest.raises(ZeroDivisionError, match="rank 2 broke"):
            collectives.run_threaded(4, first)
        elapsed = time.monotonic() - start
    assert elapsed < 20, f"the other ranks were not released ({elapsed:.0f} s)"
    assert set(released) == {0, 1, 3}, f"released: {sorted(released)}"
    assert all("rank 2 failed" in str(exc) for exc in released.values())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rank_that_never_calls_times_out_naming_it(algorithm):
    silent = 2

    def body(comm):
        if comm.rank != silent:
            collectives.allreduce(np.ones(50), comm=comm, algorithm=algorithm)

    with env(COLLECTIVES_TIMEOUT=1):
        start = time.monotonic()
        with pytest.raises(CollectiveTimeout) as info:
            collectives.run_threaded(4, body)
        elapsed = time.monotonic() - start
    assert elapsed < 15, f"{elapsed:.0f} s for a 1 s timeout"
    message = str(info.value)
    # the rank that timed out first names the peer it waited on and, where that peer is itself
    # blocked, the silent rank behind it
    match = re.match(rf"allreduce\({algorithm}\) step \d+/\d+: no message from ranks? ([\d, ]+) after 1 s"
                     rf"(; (it|they) waits? in turn on silent ranks? ([\d, ]+))?$", message)
    assert match, message
    named = match.group(4) or match.group(1)
    assert [int(r) for r in named.split(", ")] == [silent], message


def test_split_waits_are_bounded_too():
    def body(comm):
        if comm.rank != 1:
            comm.split(0)

    with env(COLLECTIVES_TIMEOUT=1), pytest.raises(CollectiveTimeout, match=r"split: no call from ranks \[1\]"):
        collectives.run_threaded(3, body)


@st.composite
def mismatched_counts(draw):
    n = draw(st.integers(2, 5))
    base = draw(st.integers(0, 40))
    counts = draw(st.lists(st.sampled_from([base, base + 1, base + 7, max(0, base - 1)]), min_size=n, max_size=n))
    assume(len(set(counts)) > 1)
    return n, counts, draw(st.sampled_from(ALGORITHMS))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mismatched_counts())
def test_mismatched_counts_are_an_error_never_a_result(case):
    n, counts, algorithm = case

    def body(comm):
        return collectives.allreduce(np.ones(counts[comm.rank], np.float32), comm=comm, algorithm=algorithm)

    with env(COLLECTIVES_TIMEOUT=0.3):
        with pytest.raises((MismatchError, CollectiveTimeout)) as info:
            results = collectives.run_threaded(n, body)
            pytest.fail(f"counts {counts}: no error, results {[r.tolist() for r in results]}")
    if isinstance(info.value, MismatchError):
        assert re.search(r"message from rank \d+ has \d+ bytes, expected \d+|rank \d+ sent a message of another call",
                         str(info.value)), info.value


@pytest.mark.parametrize("other", [np.float64, np.float16, np.int8])
def test_mismatched_dtype_size_is_a_mismatch(other):
    def body(comm):
        dtype = other if comm.rank == 1 else np.float32
        return collectives.allreduce(np.ones(64, dtype), comm=comm, algorithm="ring")

    with env(COLLECTIVES_TIMEOUT=2), pytest.raises((MismatchError, CollectiveTimeout)):
        collectives.run_threaded(3, body)


FOREIGN = r"rank \d+ sent a message of another call"


def _first_option(algorithm):
    declared = collectives.algorithm_options(algorithm)
    return next((k for k in ("segment_bytes", "group_size", "root") if k in declared), None)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("fault, algorithm", [(f, a) for f in ("dtype_same", "op") for a in ALGORITHMS]
                         + [("option", a) for a in ALGORITHMS if _first_option(a)])
def test_same_size_mismatch_never_gives_a_result(fault, algorithm, n):
    # without the check: the signature in the tags keeps the calls apart, a waiting rank meets
    # the peer's foreign message (MismatchError), or times out; no rank returns
    name = _first_option(algorithm)
    returned = []

    def body(comm):
        dtype, op, opts = np.float32, "sum", {}
        if comm.rank == 1:
            if fault == "dtype_same":
                dtype = np.int32
            elif fault == "op":
                op = "max"
            else:
                opts = {name: {"segment_bytes": 8, "group_size": 1, "root": n - 1}[name]}
        result = collectives.allreduce(np.ones(40, dtype), comm=comm, algorithm=algorithm, op=op, **opts)
        returned.append(comm.rank)
        return result

    with env(COLLECTIVES_TIMEOUT=2), pytest.raises((MismatchError, CollectiveTimeout, PeerAborted)) as info:
        collectives.run_threaded(n, body)
    if algorithm != "shm" and fault != "option":  # another root or group: the peers may just never send
        assert isinstance(info.value, MismatchError) and re.search(FOREIGN, str(info.value)), info.value
    assert len(returned) < n, "every rank returned a result"


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("call, algorithm", [("broadcast", a) for a in blocks.BROADCAST]
                         + [("reduce", a) for a in blocks.REDUCE])
def test_root_mismatch_never_gives_a_result(call, algorithm, n):
    # rank 1 names itself the root, the others rank 0: neither root returns, and a rank that does
    # return (it only exchanged messages with ranks that made its very call) holds root 0's data
    returned = {}

    def body(comm):
        root = 1 if comm.rank == 1 else 0
        buf = np.full(10, comm.rank + 1, np.int64)
        if call == "broadcast":
            result = collectives.broadcast(buf, root=root, comm=comm, algorithm=algorithm)
        else:
            result = collectives.reduce(buf, root=root, comm=comm, algorithm=algorithm)
        returned[comm.rank] = None if result is None else result.copy()

    with env(COLLECTIVES_TIMEOUT=2), pytest.raises((MismatchError, CollectiveTimeout, PeerAborted)):
        collectives.run_threaded(n, body)
    assert 0 not in returned and 1 not in returned, f"a root returned: {sorted(returned)}"
    for rank, result in returned.items():
        assert result is None or np.array_equal(result, np.full(10, 1, np.int64)), (rank, result)


def test_a_failed_communicator_refuses_later_calls():
    seen = {}

    def body(comm):
        dtype = np.int32 if comm.rank == 1 else np.float32
        try:
            collectives.allreduce(np.ones(8, dtype), comm=comm, algorithm="ring")
        except (MismatchError, CollectiveTimeout, PeerAborted):
            pass
        try:
            collectives.allreduce(np.ones(8, np.float32), comm=comm, algorithm="ring")
        except CollectiveError as exc:
            seen[comm.rank] = str(exc)

    with env(COLLECTIVES_TIMEOUT=2), pytest.raises(CollectiveError):
        collectives.run_threaded(2, body)
    assert set(seen) == {0, 1}, seen
    for text in seen.values():
        assert re.match(r"this communicator cannot be used: allreduce\(ring\) failed on it \(\w+: .*new "
                        r"communicator", text), text


def test_stale_mpi_litter_is_found_and_removed_but_never_what_is_in_use(tmp_path, monkeypatch):
    from collectives import cleanup

    monkeypatch.setattr(cleanup, "SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(cleanup, "TMP_DIR", str(tmp_path / "tmp"))
    (tmp_path / "shm").mkdir()
    (tmp_path / "tmp").mkdir()
    dead = tmp_path / "shm" / "mpich_shm_dead_0"
    held = tmp_path / "shm" / "mpich_shm_held_0"
    hydra = tmp_path / "tmp" / "hydra_hwloc_xmlfile_abc"
    other = tmp_path / "shm" / "somebody_else"
    for path in (dead, held, hydra, other):
        path.write_bytes(b"x")
    with open(held, "rb"):
        assert cleanup.stale() == sorted([str(dead), str(hydra)])
        assert cleanup.remove_stale([str(dead)]) == [str(dead)]
        assert not dead.exists() and hydra.exists() and held.exists() and other.exists()
    assert cleanup.main([]) == 0
    assert not held.exists() and not hydra.exists() and other.exists()


@pytest.mark.parametrize("extra", [-3, 5])
def test_short_and_long_messages_name_the_peer(extra):
    def body(comm):
        if comm.rank == 0:
            comm.exchange([(1, np.ones(10 + extra, np.uint8), 0)], [], 0, "probe")
        else:
            comm.exchange([], [(0, np.zeros(10, np.uint8), 0)], 0, "probe")

    with env(COLLECTIVES_TIMEOUT=5), pytest.raises(MismatchError) as info:
        collectives.run_threaded(2, body)
    assert str(info.value).startswith(f"probe: message from rank 0 has {10 + extra} bytes, expected 10")


@pytest.mark.parametrize("field, call", [
    ("count", lambda c: collectives.allreduce(np.ones(10 + (c.rank == 2)), comm=c, algorithm="ring")),
    ("dtype", lambda c: collectives.allreduce(np.ones(10, np.int32 if c.rank == 2 else np.float32), comm=c,
                                              algorithm="ring")),
    ("op", lambda c: collectives.allreduce(np.ones(10), op="min" if c.rank == 2 else "sum", comm=c)),
    ("algorithm", lambda c: collectives.allreduce(np.ones(10), comm=c, algorithm="tree" if c.rank == 2 else "ring")),
    ("options", lambda c: collectives.allreduce(np.ones(10), comm=c, algorithm="reduce_to_one",
                                                root=1 if c.rank == 2 else 0)),
    ("options", lambda c: collectives.broadcast(np.ones(10), root=1 if c.rank == 2 else 0, comm=c)),
    ("call", lambda c: (collectives.reduce if c.rank == 2 else collectives.reduce_scatter)(np.ones(10), comm=c)),
])
def test_check_raises_the_same_mismatch_on_every_rank(field, call):
    def body(comm):
        try:
            call(comm)
        except MismatchError as exc:
            return str(exc)
        return None

    with env(COLLECTIVES_CHECK=1, COLLECTIVES_TIMEOUT=10):
        messages = collectives.run_threaded(4, body)
    assert all(m is not None for m in messages), f"a rank did not raise: {messages}"
    assert len(set(messages)) == 1, messages
    assert f"ranks disagree on {field} (ranks 2 differ from rank 0)" in messages[0], messages[0]


def test_check_passes_agreeing_calls():
    def body(comm):
        return (collectives.allreduce(np.ones(10), comm=comm, algorithm="tree", segment_bytes=16),
                collectives.reduce(np.ones(3), root=1, comm=comm))

    with env(COLLECTIVES_CHECK=1, COLLECTIVES_TIMEOUT=10):
        results = collectives.run_threaded(3, body)
    assert all((y == 3).all() for y, _ in results)
    assert results[1][1].tolist() == [3, 3, 3]


# ------------------------------------------------------------------ tuning file
@pytest.fixture
def tuning_file(tmp_path):
    where = tmp_path / "tuning.json"

    def use(content):
        if isinstance(content, bytes):
            where.write_bytes(content)
        elif content is not None:
            where.write_text(content)
        tuning.reload()
        select._choices.clear()
        collectives.clear_caches()
        return str(where)

    saved = os.environ.get("COLLECTIVES_TUNING")
    yield use
    if saved is None:
        os.environ.pop("COLLECTIVES_TUNING", None)
    else:
        os.environ["COLLECTIVES_TUNING"] = saved
    tuning.reload()
    select._choices.clear()
    collectives.clear_caches()


def _auto_choice(n, nbytes):
    box = {}

    def body(comm):
        if comm.rank == 0:
            box["name"] = select.choose_pair(comm, nbytes, np.dtype(np.float32))[0]
        return collectives.allreduce(np.ones(nbytes // 4, np.float32), comm=comm)

    results = collectives.run_threaded(n, body)
    assert all((y == n).all() for y in results)
    return box["name"]


def _cost_model_choice(n, nbytes):
    from collectives.algorithms import shm  # noqa: F401 - the threaded world never takes its fast path

    candidates = [a for a in ALGORITHMS if a != "shm"]
    return select.cost_choice(n, nbytes, alpha=select.ALPHA_NODE_STEP, candidates=candidates)[0]


CORRUPT = {
    "truncated json": '{"format": "collectives-tuning-1", "entries": [',
    "binary": b"\x80\x81\xff\x00garbage",
    "foreign json": json.dumps({"format": "someone-else-9", "entries": []}),
    "json list": json.dumps([1, 2, 3]),
    "entries missing": json.dumps({"format": "collectives-tuning-1"}),
    "bad entry": json.dumps({"format": "collectives-tuning-1", "entries": [{"size": "two", "nbytes": 8}]}),
    "bad transport": json.dumps({"format": "collectives-tuning-1", "entries": [
        {"size": 3, "dtype": "float32", "nbytes": 4096, "algorithm": "ring", "transport": "pigeon"}]}),
    "empty": "",
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_corrupt_or_foreign_tuning_file_warns_once_and_falls_back(tuning_file, kind):
    where = tuning_file(CORRUPT[kind])
    with env(COLLECTIVES_TUNING=where, COLLECTIVES_TIMEOUT=30):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            name = _auto_choice(3, 4096)
            _auto_choice(3, 64)  # a second shape: the file is not read (or warned about) again
            assert tuning.lookup(3, 4096, np.dtype(np.float32)) is None
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning) and where in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "using the cost model" in str(ours[0].message)
    assert name == _cost_model_choice(3, 4096)


def test_tuning_directory_in_place_of_a_file_warns_and_falls_back(tuning_file, tmp_path):
    where = tmp_path / "a-directory"
    where.mkdir()
    tuning_file(None)
    with env(COLLECTIVES_TUNING=str(where), COLLECTIVES_TIMEOUT=30):
        with pytest.warns(RuntimeWarning, match="ignoring tuning file"):
            name = _auto_choice(2, 1024)
    assert name == _cost_model_choice(2, 1024)


def test_valid_tuning_file_is_used_and_unknown_algorithms_ignored(tuning_file):
    table = {"format": "collectives-tuning-1", "entries": [
        {"size": 3, "dtype": "float32", "nbytes": 4096, "algorithm": "reduce_to_one"},
        {"size": 2, "dtype": "*", "nbytes": 4096, "algorithm": "no_such_algorithm"}]}
    where = tuning_file(json.dumps(table))
    with env(COLLECTIVES_TUNING=where, COLLECTIVES_TIMEOUT=30):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _auto_choice(3, 4096) == "reduce_to_one"
            assert _auto_choice(2, 4096) == _cost_model_choice(2, 4096)


def test_tuning_entries_pair_an_algorithm_with_a_transport(tuning_file):
    table = {"format": "collectives-tuning-1", "entries": [
        {"size": 3, "dtype": "float32", "nbytes": 4096, "algorithm": "ring", "transport": "shm"},
        {"size": 3, "dtype": "float32", "nbytes": 64, "algorithm": "tree"},  # written before transports
        {"size": 3, "dtype": "float32", "nbytes": 1 << 20, "algorithm": "shm"},  # the old shm routine
        {"size": 3, "dtype": "float32", "nbytes": 1 << 24, "algorithm": "shm", "transport": "mpi"}]}
    where = tuning_file(json.dumps(table))
    with env(COLLECTIVES_TUNING=where, COLLECTIVES_TIMEOUT=30):
        assert tuning.lookup_pair(3, 4096, np.dtype(np.float32)) == ("ring", "shm")
        assert tuning.lookup_pair(3, 64, np.dtype(np.float32)) == ("tree", None)
        assert tuning.lookup(3, 4096, np.dtype(np.float32)) == "ring"
        # auto runs an entry written before transports over MPI, where it was measured
        select.reset()
        assert select._decide(3, 64, np.dtype(np.float32), False, ((0, 1, 2),))[::2] == ("tree", "mpi")
        assert select._decide(3, 4096, np.dtype(np.float32), False, ((0, 1, 2),))[::2] == ("ring", "shm")
        # an old entry for shm was measured over its own transport; a pair measured over MPI runs
        # there although the algorithm asks for shared memory when named by the caller
        assert select._decide(3, 1 << 20, np.dtype(np.float32), False, ((0, 1, 2),))[::2] == ("shm", "shm")
        assert select._decide(3, 1 << 24, np.dtype(np.float32), False, ((0, 1, 2),))[::2] == ("shm", "mpi")
        select.reset()


def test_missing_tuning_file_is_silent(tuning_file, tmp_path):
    tuning_file(None)
    with env(COLLECTIVES_TUNING=str(tmp_path / "absent.json"), COLLECTIVES_TIMEOUT=30):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _auto_choice(2, 256) == _cost_model_choice(2, 256)


def test_without_a_table_a_step_within_a_node_costs_the_executors_alpha(tuning_file, tmp_path):
    """Over MPI within a node a step costs ALPHA_NODE_STEP (the executor's Python on top of
    MPI's latency), so one exchange of the whole buffer (recursive doubling) wins at n=2 up to a few
    hundred KiB, where MPI's own alpha had the ring win earlier; from 1 MiB the ring's half-size
    reduction wins (docs/performance.md#cost-model-constants)."""
    tuning_file(None)
    with env(COLLECTIVES_TUNING=str(tmp_path / "absent.json")):
        select.reset()
        f32 = np.dtype(np.float32)
        assert select._decide(2, 256 << 10, f32, False, ((0, 1),))[0] == "recursive_doubling"
        assert select._decide(2, 1 << 20, f32, False, ((0, 1),))[0] == "ring"
        assert select.cost_choice(2, 256 << 10)[0] != "recursive_doubling"  # MPI's own alpha alone
        select.reset()


def test_corrupt_tuning_file_read_by_many_threads_warns_once(tuning_file):
    where = tuning_file(CORRUPT["truncated json"])
    barrier = threading.Barrier(6)
    with env(COLLECTIVES_TUNING=where):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def look():
                barrier.wait()
                tuning.lookup(2, 64, np.dtype(np.float32))

            threads = [threading.Thread(target=look) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert len([w for w in caught if where in str(w.message)]) == 1


def test_every_cost_model_breaks_a_tie_within_rounding_alike(monkeypatch):
    """A tie, rounding included, goes to the first candidate in every cost model (cost_choice as
    shm_cost_choice and two_level_choice), so the same costs never pick differently."""
    from collectives import select

    class First:
        NAME = "first"

        def cost(p, nbytes, alpha, beta, gamma):
            return 1.0

    class Second(First):
        NAME = "second"

        def cost(p, nbytes, alpha, beta, gamma):
            return 1.0 - 1e-12  # below the first by rounding only

    algorithms = importlib.import_module("collectives.algorithms")
    monkeypatch.setattr(algorithms, "get", {"first": First, "second": Second}.get)
    assert select.cost_choice(4, 1024, candidates=["first", "second"])[0] == "first"


def test_shm_cost_model_counts_steps_and_survives_a_plugin_that_cannot_build():
    """Over shared memory a step costs ALPHA_SHM_STEP and a message ALPHA_SHM_MESSAGE: the direct
    plan (2 steps) beats Rabenseifner (2 log n) and the ring (2(n-1)) at 4 ranks, while at 2 ranks
    they tie; an algorithm whose plan cannot be built with defaults pays a step per message."""
    from collectives import select
    from collectives.model import ALPHA_SHM_MESSAGE, ALPHA_SHM_STEP

    algorithms = importlib.import_module("collectives.algorithms")
    name, costs = select.shm_cost_choice(4, 4 << 20, 4, candidates=["ring", "rabenseifner", "shm"])
    assert name == "shm"
    ring = algorithms.get("ring")
    assert costs["ring"] == pytest.approx(ring.cost(4, 4 << 20, ALPHA_SHM_MESSAGE, select.BETA, select.GAMMA)
                                          + 6 * ALPHA_SHM_STEP)
    _, costs = select.shm_cost_choice(2, 4 << 20, 4, candidates=["ring", "rabenseifner", "shm"])
    assert len({round(c, 12) for c in costs.values()}) == 1

    class Broken:
        NAME = "broken_build"
        OPTIONS = {}

        @staticmethod
        def build(rank, size, count, itemsize=1):
            raise RuntimeError("needs a topology")

        @staticmethod
        def cost(p, nbytes, alpha, beta, gamma):
            return 2 * (p - 1) * alpha

    algorithms.names()  # the built-ins first
    algorithms.register("broken_build", Broken)
    try:
        _, costs = select.shm_cost_choice(4, 1 << 20, 4, candidates=["broken_build"])
        assert costs["broken_build"] == pytest.approx(6 * ALPHA_SHM_STEP)
    finally:
        algorithms.unregister("broken_build")
