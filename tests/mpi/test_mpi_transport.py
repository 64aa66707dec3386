"""The transport axis under MPI: every algorithm's plan over MPI point-to-point and over the
node's shared memory gives the same bits (the plan fixes every reduction's order), in place and
out of place, on ordinary and on shared arrays (``collectives.empty``); the choice of transport,
its environment variables and its errors. Run by tests/run_all.py at N = 1..4 ranks."""
import logging
import re

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives.comm import cma, shm as shm_transport  # noqa: E402
from collectives.select import SHM_MIN_BYTES, choose_transport  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
WORLD = MPI.COMM_WORLD
OPTIONS = {"tree": {"segment_bytes": 256}, "double_binary_tree": {"segment_bytes": 256},
           "hierarchical_copy": {"group_size": 2}, "reduce_to_one": {"root": WORLD.size - 1}}
COUNTS = (1, WORLD.size + 1, 5003, 40_000)  # past a prepared program's 16 KiB from 5003 float64


def agree(ok, message):
    """All ranks fail together, or none."""
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {WORLD.rank}: {message}" if not ok else "another rank failed"


def identical_everywhere(y):
    digests = WORLD.allgather(np.ascontiguousarray(y).tobytes())
    return all(d == digests[0] for d in digests)


def data(count, call=0):
    rng = np.random.default_rng(1000 * WORLD.rank + call)
    return rng.standard_normal(count)


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_every_algorithm_gives_the_same_bits_over_both_transports(algorithm):
    agree(*same_bits_over_both_transports(algorithm, None))


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_every_algorithm_the_same_with_cross_memory_attach_for_every_message(algorithm, monkeypatch):
    """As above with CMA_MIN_BYTES at 0 (it is 8 MiB: smaller messages are staged), so that every
    message a receiver only copies is read out of the sender's process, where the node allows it."""
    from collectives.comm import shm_layout

    reads = []
    monkeypatch.setattr(shm_layout, "CMA_MIN_BYTES", 0)
    monkeypatch.setattr(cma, "read", lambda *args, _read=cma.read: reads.append(1) or _read(*args))
    comm = WORLD.Dup()  # its own transport: layouts made with the threshold at 0
    ok, why = same_bits_over_both_transports(algorithm, comm)
    ours = collectives.as_comm(comm)
    used = shm_transport.available(ours) and shm_transport.for_comm(ours).cma
    comm.Free()
    agree(ok and (not used or WORLD.allreduce(len(reads)) > 0), why or "no message was read by cross-memory attach")


def same_bits_over_both_transports(algorithm, comm):
    options = OPTIONS.get(algorithm, {})
    ok, why = True, ""
    for count in COUNTS:
        x = data(count)
        by_transport = {}
        for transport in ("mpi", "shm"):
            out = collectives.allreduce(x, algorithm=algorithm, transport=transport, comm=comm, **options)
            inplace = x.copy()
            collectives.allreduce(inplace, inplace, algorithm=algorithm, transport=transport, comm=comm, **options)
            by_transport[transport] = out
            if not np.array_equal(out, inplace):
                ok, why = False, f"{algorithm}@{transport} count={count}: in place differs from out of place"
        if not np.array_equal(by_transport["mpi"], by_transport["shm"]):
            ok, why = False, f"{algorithm} count={count}: shm gives other bits than mpi"
        if not identical_everywhere(by_transport["shm"]):
            ok, why = False, f"{algorithm}@shm count={count}: ranks differ"
        want = np.empty_like(x)
        WORLD.Allreduce(x, want, op=MPI.SUM)
        if not np.allclose(by_transport["shm"], want, rtol=1e-12, atol=1e-12 * WORLD.size * 8):
            ok, why = False, f"{algorithm}@shm count={count}: far from MPI_Allreduce"
    return ok, why


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "shm", "hierarchical_copy"])
def test_shared_arrays_reduce_in_place_and_out_of_place(algorithm):
    comm = WORLD.Dup()
    options = OPTIONS.get(algorithm, {})
    ok, why = True, ""
    for count in (7, 5003, 70_000):
        x = data(count, call=count)
        want = collectives.allreduce(x, algorithm=algorithm, comm=comm, transport="mpi", **options)
        sendbuf = collectives.empty(count, np.float64, comm=comm)
        recvbuf = collectives.zeros(count, np.float64, comm=comm)
        sendbuf[:] = x
        for rep in range(3):  # repeated calls on the same shared arrays: the readers must be done
            collectives.allreduce(sendbuf, recvbuf, algorithm=algorithm, comm=comm, transport="shm", **options)
            if not (np.array_equal(recvbuf, want) and np.array_equal(sendbuf, x)):
                ok, why = False, f"{algorithm} count={count} rep {rep}: shared out of place wrong"
            sendbuf[:] = x * (rep + 2)  # written right after the call returned
            sendbuf[:] = x
        collectives.allreduce(sendbuf, sendbuf, algorithm=algorithm, comm=comm, transport="shm", **options)
        if not np.array_equal(sendbuf, want):
            ok, why = False, f"{algorithm} count={count}: shared in place wrong"
        # one shared and one ordinary buffer
        plain = np.empty(count)
        collectives.allreduce(recvbuf, plain, algorithm=algorithm, comm=comm, transport="shm", **options)
        again = collectives.allreduce(want, algorithm=algorithm, comm=comm, transport="mpi", **options)
        if not np.array_equal(plain, again):
            ok, why = False, f"{algorithm} count={count}: shared sendbuf, plain recvbuf wrong"
    comm.Free()
    agree(ok, why)


def test_shared_arrays_live_in_node_memory_and_go_with_their_users():
    comm = WORLD.Dup()
    ours = collectives.as_comm(comm)
    array = collectives.empty((3, 5), np.int32, comm=comm)
    zeros = collectives.zeros(4, comm=comm)
    ok = array.shape == (3, 5) and array.dtype == np.int32 and zeros.shape == (4,) and not zeros.any()
    if shm_transport.available(ours):
        transport = shm_transport.for_comm(ours)
        held = len(transport.shared.arrays)
        ok = ok and held == 2
        del array
        kept = collectives.empty(1, comm=comm)  # the next allocation frees what every rank dropped
        ok = ok and len(transport.shared.arrays) == 2 and kept.size == 1  # the zeros and the new one
    comm.Free()
    agree(ok, "shared arrays: wrong shape, or a dropped one still held")


def test_auto_without_a_table_prices_the_transport_the_call_will_use(monkeypatch, tmp_path_factory, caplog):
    """From SHM_MIN_BYTES on one node, auto's cost model counts steps over shared memory (the
    direct plan's two against Rabenseifner's 2 log n and the ring's 2(n-1)); asked for MPI, the
    message model decides as before. The log line says which model chose."""
    from collectives import select, tuning

    comm = WORLD.Dup()
    ours = collectives.as_comm(comm)
    where = WORLD.bcast(str(tmp_path_factory.mktemp("notable") / "none.json") if WORLD.rank == 0 else None)
    monkeypatch.setenv("COLLECTIVES_TUNING", where)  # no table: the cost model decides
    monkeypatch.setenv("COLLECTIVES_DEBUG", "INFO")
    tuning.reload()
    select.reset()
    try:
        x = data(SHM_MIN_BYTES // 8)
        with caplog.at_level(logging.INFO, logger="collectives"):
            y = collectives.allreduce(x, comm=comm)
            z = collectives.allreduce(x, comm=comm, transport="mpi")
        lines = [r.getMessage() for r in caplog.records if f"{x.nbytes} bytes of float64 ->" in r.getMessage()]
        single_node = len(ours.hosts()) == 1 and WORLD.size > 1 and shm_transport.available(ours)
        over_shm, _ = select.shm_cost_choice(WORLD.size, x.nbytes, 8,
                                             candidates=[n for n in collectives.algorithm_names() if n != "two_level"])
        over_mpi = select.choose_pair(ours, x.nbytes, x.dtype, "mpi")[0]
        ok = np.allclose(y, z) and identical_everywhere(y) and identical_everywhere(z)
        if single_node:
            ok = ok and any(f"-> {over_shm} (cost model over shared memory" in line for line in lines)
            ok = ok and any(f"-> {over_mpi} (cost model (" in line for line in lines)
            ok = ok and (WORLD.size < 4 or over_shm == "shm")  # two steps beat 2 log n from 4 ranks
    finally:
        tuning.reload()
        select.reset()
        comm.Free()
    agree(ok, f"log {lines}")


def test_auto_uses_shared_memory_from_its_threshold_and_the_environment_overrides(monkeypatch):
    comm = WORLD.Dup()
    ours = collectives.as_comm(comm)
    on_node = shm_transport.available(ours)
    small, large = choose_transport(ours, "ring", SHM_MIN_BYTES - 8), choose_transport(ours, "ring", SHM_MIN_BYTES)
    ok = small == "mpi" and large == ("shm" if on_node else "mpi")
    ok = ok and choose_transport(ours, "shm", 8) == ("shm" if on_node else "mpi")  # shm asks for it
    monkeypatch.setenv("COLLECTIVES_TRANSPORT", "mpi")
    forced = choose_transport(ours, "shm", SHM_MIN_BYTES)
    x = data(20_000)
    y = collectives.allreduce(x, comm=comm, algorithm="shm")  # the direct plan over MPI
    window = collectives.library_memory(comm)["shm_window"]
    monkeypatch.setenv("COLLECTIVES_TRANSPORT", "shm")
    z = collectives.allreduce(x, comm=comm, algorithm="ring")
    monkeypatch.delenv("COLLECTIVES_TRANSPORT")
    want = collectives.allreduce(x, comm=comm, algorithm="ring", transport="mpi")
    ok = ok and forced == "mpi" and window == 0 and np.array_equal(z, want) and identical_everywhere(y)
    comm.Free()
    agree(ok, f"choices {small}/{large}/{forced}, window under COLLECTIVES_TRANSPORT=mpi {window}")


def test_auto_runs_a_tuned_pair_over_the_transport_it_was_measured_over(monkeypatch, tmp_path_factory):
    """A table's shm@mpi (the direct plan measured over MPI) runs over MPI under auto, though shm
    asks for shared memory when a caller names it; an old entry naming no transport runs as it
    was measured (shm: over shared memory)."""
    import json

    from collectives import select, tuning
    from collectives.select import shm_asked as _shm_forced
    from collectives.algorithms import shm as direct

    comm = WORLD.Dup()
    ours = collectives.as_comm(comm)
    on_node = shm_transport.available(ours)
    where = WORLD.bcast(str(tmp_path_factory.mktemp("pairs") / "t.json") if WORLD.rank == 0 else None)
    x, old = data(5_000), data(20_000)  # 40,000 and 160,000 B: entries of their own (by bit length)
    if WORLD.rank == 0:
        entry = {"size": WORLD.size, "dtype": "float64"}
        with open(where, "w") as out:
            json.dump({"format": "collectives-tuning-1", "mpi_library": collectives.mpilib.describe(), "entries": [
                dict(entry, nbytes=x.nbytes, algorithm="shm", transport="mpi"),
                dict(entry, nbytes=old.nbytes, algorithm="shm")]}, out)
    WORLD.Barrier()
    monkeypatch.setenv("COLLECTIVES_TUNING", where)
    tuning.reload()
    select.reset()
    try:
        pair = select.choose_pair(ours, x.nbytes, x.dtype)
        old_pair = select.choose_pair(ours, old.nbytes, old.dtype)
        used = select.transport_choice(ours, "shm", x.nbytes, "auto", pair[1])[0]
        old_used = select.transport_choice(ours, "shm", old.nbytes, "auto", old_pair[1])[0]
        y = collectives.allreduce(x, comm=comm)
        window = collectives.library_memory(comm)["shm_window"]
        ok = pair == ("shm", "mpi") and used == "mpi" and not _shm_forced(direct, "auto", "mpi") and window == 0
        ok = ok and old_pair == ("shm", "shm") and old_used == ("shm" if on_node else "mpi")
        ok = ok and np.array_equal(y, collectives.allreduce(x, comm=comm, algorithm="shm", transport="mpi"))
        ok = ok and identical_everywhere(y) and identical_everywhere(collectives.allreduce(old, comm=comm))
    finally:
        tuning.reload()
        select.reset()
        comm.Free()
    agree(ok, f"pairs {pair} {old_pair}, transports {used} {old_used}, window {window}")


def test_an_unknown_transport_is_refused_on_every_rank_before_any_message(monkeypatch):
    with pytest.raises(ValueError, match="transport"):
        collectives.allreduce(np.ones(4), transport="nvlink")
    monkeypatch.setenv("COLLECTIVES_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="COLLECTIVES_TRANSPORT"):
        collectives.allreduce(np.ones(4))
    monkeypatch.delenv("COLLECTIVES_TRANSPORT")
    agree(np.array_equal(collectives.allreduce(np.ones(4)), np.full(4, float(WORLD.size))), "a later call failed")


def test_without_cross_memory_attach_the_copies_stage(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CMA", "0")
    comm = WORLD.Dup()
    ours = collectives.as_comm(comm)
    x = data(50_000)
    y = collectives.allreduce(x, comm=comm, algorithm="ring", transport="shm")
    uses_cma = shm_transport.for_comm(ours).cma if shm_transport.available(ours) else cma.supported()
    monkeypatch.delenv("COLLECTIVES_CMA")
    want = collectives.allreduce(x, comm=comm, algorithm="ring", transport="mpi")
    ok = uses_cma is False and np.array_equal(y, want) and identical_everywhere(y)
    comm.Free()
    agree(ok, f"COLLECTIVES_CMA=0: cma {uses_cma}, or a wrong result")


def test_debug_names_each_shapes_transport_and_why(monkeypatch, caplog):
    monkeypatch.setenv("COLLECTIVES_DEBUG", "INFO")
    comm = WORLD.Dup()
    with caplog.at_level(logging.INFO, logger="collectives"):
        collectives.allreduce(np.ones(1000, np.float32), comm=comm, algorithm="ring")
        collectives.allreduce(np.ones(SHM_MIN_BYTES // 4, np.float32), comm=comm, algorithm="ring")
    lines = [r.getMessage() for r in caplog.records if "-> transport" in r.getMessage()]
    comm.Free()
    on_node = shm_transport.available(collectives.as_comm(WORLD))
    small = [line for line in lines if "4000 bytes with ring -> transport mpi (4000 B < SHM_MIN_BYTES" in line]
    large = [line for line in lines if f"{SHM_MIN_BYTES} bytes with ring -> transport "
             + ("shm (peers on this node" if on_node else "mpi (") in line]
    agree(len(small) == 1 and len(large) == 1 if WORLD.size > 1 else True, f"transport lines {lines}")


def test_a_silent_rank_times_out_naming_the_step_over_shared_memory(monkeypatch):
    if WORLD.size < 2:
        pytest.skip("a silent peer needs two ranks")
    monkeypatch.setenv("COLLECTIVES_ON_ERROR", "raise")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "1")
    comm = WORLD.Dup()
    x = data(1000)
    collectives.allreduce(x, comm=comm, algorithm="ring", transport="shm")  # every rank: the window exists
    ok, why = True, ""
    if WORLD.rank != 1:  # rank 1 makes no second call
        try:
            collectives.allreduce(x, comm=comm, algorithm="ring", transport="shm")
            ok, why = False, "returned a result without rank 1"
        except collectives.CollectiveTimeout as exc:
            if not re.match(r"allreduce\(ring\) step \d+/\d+: no message from rank \d after 1 s", str(exc)):
                ok, why = False, f"timeout without its step: {exc}"
    comm.Free()
    agree(ok, why)


def test_calls_with_options_take_the_memoised_path_after_the_first(monkeypatch):
    """A call that names its transport or passes an algorithm's options is memoised like a bare
    call (its options are part of the call's shape): only the first call of each shape takes the
    full path (the benchmark names a transport on every row)."""
    from collectives import pipeline

    full = []
    original = pipeline.call

    def counted(*args, **kwargs):
        full.append(args[3])
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "call", counted)
    comm = WORLD.Dup()
    x = data(20_000)
    out = [collectives.allreduce(x, comm=comm, transport="auto") for _ in range(3)]
    out += [collectives.allreduce(x, comm=comm, algorithm="tree", segment_bytes=256) for _ in range(3)]
    out += [collectives.allreduce(x, comm=comm, algorithm="ring", transport="mpi") for _ in range(3)]
    small = data(8)
    out += [collectives.allreduce(small, comm=comm, algorithm="ring", transport="mpi") for _ in range(3)]
    out += [collectives.allreduce(x, comm=comm, algorithm="hierarchical_copy", group_size=1) for _ in range(2)]
    comm.Free()
    ok = all(np.allclose(y, out[0]) for y in out[:9]) and all(identical_everywhere(y) for y in out)
    ok = ok and full == ["auto", "tree", "ring", "ring", "hierarchical_copy"]
    agree(ok, f"full path taken by {full}")
