"""auto's first-use calibration under MPI (collectives/autotune.py): the first auto call of a size
measures the candidate pairs once, every rank runs the same pick, rank 0 stores it, later calls
and later communicators (and runs) reuse it; rank 0's stored pick wins over other ranks' files;
a tuning table, COLLECTIVES_AUTOTUNE=0 and a named transport leave it out. Run by
tests/run_all.py at N = 1..4 ranks (the suite itself runs with COLLECTIVES_AUTOTUNE=0, see
tests/conftest.py; these tests turn it on)."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import autotune, select, tuning  # noqa: E402
from collectives.api import as_comm  # noqa: E402
from collectives.mpilib import describe  # noqa: E402
from tests.helpers import agree_all, bitwise_alike  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
WORLD = MPI.COMM_WORLD
ONE_NODE = len(set(WORLD.allgather(MPI.Get_processor_name()))) == 1


def agree(ok, message):
    agree_all(WORLD, ok, message)


def identical_everywhere(y):
    return bitwise_alike(WORLD, y)


@pytest.fixture
def calibration(tmp_path_factory, monkeypatch):
    """Calibration on, into a fresh file shared by the ranks; no tuning table; counted measuring."""
    where = WORLD.bcast(str(tmp_path_factory.mktemp("autotune") / "autotune.json") if WORLD.rank == 0 else None)
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    monkeypatch.setenv("COLLECTIVES_TUNING", where + ".no-table")
    measured = []
    real = autotune.measure

    def counted(*args, **kwargs):
        times = real(*args, **kwargs)
        measured.append(times)
        return times
    monkeypatch.setattr(autotune, "measure", counted)
    for reset in (autotune.reset, tuning.reload, select.reset, collectives.clear_caches):
        reset()
    yield where, measured
    for reset in (autotune.reset, tuning.reload, select.reset, collectives.clear_caches):
        reset()
    WORLD.Barrier()


def picked(comm, x, in_place=False):
    found = autotune.agreed(as_comm(comm), x.dtype, x.nbytes, in_place)
    return None if found is None else found[:2]


def test_first_use_measures_once_every_rank_runs_the_pick_and_rank0_stores_it(calibration):
    where, measured = calibration
    x = np.random.default_rng(WORLD.rank).standard_normal(3000)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    y = collectives.allreduce(x, comm=WORLD)
    calibrates = WORLD.size > 1 and ONE_NODE
    agree(np.allclose(y, expected) and identical_everywhere(y), "wrong or differing result")
    # across hosts collectives/network_fit.py measures (tests/mpi/test_mpi_network_fit.py)
    agree(len(measured) == (1 if WORLD.size > 1 else 0), f"measured {len(measured)} times")
    if not calibrates:
        return
    pair = picked(WORLD, x)
    agree(pair is not None and len(set(WORLD.allgather(pair))) == 1, f"ranks picked {WORLD.allgather(pair)}")
    times, screened = measured[0]
    agree(set(times) <= set(screened) and len(times) == min(autotune.FINALISTS, len(screened))
          and sorted(screened, key=screened.get)[0] in times, f"finalists {times} of {screened}")
    # the pick is the fastest pair measured (ties: the first), the figures the same on every rank
    agree(pair == autotune.fastest(times) and len({str(t) for t in WORLD.allgather(times)}) == 1,
          f"pick {pair} against {times}")
    agree({t for _, t in screened} == {"mpi", "shm"}, f"candidates {list(screened)}")
    WORLD.Barrier()
    if WORLD.rank == 0:
        with open(where) as f:
            stored = json.load(f)
        entry = stored["entries"][autotune.key(describe(), WORLD.size, x.dtype, x.nbytes, False)]
        ok = stored["format"] == autotune.FORMAT and (entry["algorithm"], entry["transport"]) == pair \
            and len(entry["times_us"]) == len(times) and len(entry["screened_us"]) == len(screened)
    else:
        ok = not os.path.exists(where + f".tmp.{os.getpid()}")  # only rank 0 writes
    agree(ok, "the stored entry")
    # the same bucket again, another size in it, another communicator: no measuring, same pick
    z = np.random.default_rng(WORLD.rank).standard_normal(3500)
    collectives.allreduce(x, comm=WORLD)
    collectives.allreduce(z, comm=WORLD)
    dup = WORLD.Dup()
    try:
        w = collectives.allreduce(x, comm=dup)
        agree(np.array_equal(w, y) and picked(dup, x) == pair, "a new communicator's pick")
    finally:
        dup.Free()
    agree(len(measured) == 1, f"measured again: {len(measured)}")
    # a later run: the file read afresh, nothing measured
    autotune.reset()
    collectives.clear_caches()
    collectives.allreduce(x, comm=WORLD)
    agree(len(measured) == 1 and picked(WORLD, x) == pair, "the stored pick in a later run")


def test_in_place_and_out_of_place_are_calibrated_apart(calibration):
    _, measured = calibration
    if WORLD.size == 1 or not ONE_NODE:
        pytest.skip("calibration needs ranks on one node")
    x = np.random.default_rng(WORLD.rank).standard_normal(700).astype(np.float32)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    y = collectives.allreduce(x, comm=WORLD)
    inplace = x.copy()
    collectives.allreduce(inplace, inplace, comm=WORLD)
    agree(len(measured) == 2, f"measured {len(measured)} times")
    agree(np.allclose(inplace, expected, atol=1e-4) and identical_everywhere(inplace)
          and np.allclose(y, expected, atol=1e-4), "in-place result")
    agree(picked(WORLD, x, True) is not None and picked(WORLD, x, False) is not None, "both picks")
    # the benchmark labels auto's row with what ran in each column
    from benchmarks.allreduce_perf import row_label

    label = row_label("auto", as_comm(WORLD), x.nbytes, x.dtype)
    ran = [f"{a}@{t}" for a, t in (picked(WORLD, x, False), picked(WORLD, x, True))]
    agree(label == f"auto({'/'.join(dict.fromkeys(ran))})", f"label {label} for {ran}")


def test_shared_arrays_are_calibrated_apart_on_the_arrays_themselves(calibration):
    _, measured = calibration
    if WORLD.size == 1 or not ONE_NODE:
        pytest.skip("calibration needs ranks on one node")
    # (one call shape per kind of array: a repeated call's short path reuses its shape's first pick)
    x = np.random.default_rng(WORLD.rank).standard_normal(5000)
    shared = collectives.empty(x.shape, x.dtype, comm=WORLD)
    shared[...] = x
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    y = collectives.allreduce(x[:4999], comm=WORLD)
    z = collectives.allreduce(shared, comm=WORLD)
    collectives.allreduce(shared, shared, comm=WORLD)  # in place: the calibration restores the data first
    agree(len(measured) == 3, f"measured {len(measured)} times")
    # (each pick may be another algorithm, with its own order of additions: close, and the same bits on every rank)
    agree(all(np.allclose(r, expected[:r.size]) and identical_everywhere(r) for r in (y, z, shared)),
          "results on shared arrays")
    found = [autotune.agreed(as_comm(WORLD), x.dtype, x.nbytes, in_place, kind)
             for in_place, kind in ((False, False), (False, True), (True, True))]
    agree(all(found), f"picks {found}")


def test_rank0s_stored_pick_wins_where_the_ranks_files_differ(calibration):
    _, measured = calibration
    if WORLD.size == 1 or not ONE_NODE:
        pytest.skip("calibration needs ranks on one node")
    x = np.random.default_rng(WORLD.rank).standard_normal(1234)
    name = autotune.key(describe(), WORLD.size, x.dtype, x.nbytes, False)
    # as if each rank had read another file: rank 0 stored ring over MPI, the others tree over
    # shared memory, or nothing (the last rank)
    store = autotune.stored()
    if WORLD.rank == 0:
        store[name] = {"algorithm": "ring", "transport": "mpi"}
    elif WORLD.rank < WORLD.size - 1:
        store[name] = {"algorithm": "tree", "transport": "shm"}
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    y = collectives.allreduce(x, comm=WORLD)
    agree(np.allclose(y, expected) and identical_everywhere(y), "result")
    agree(not measured and picked(WORLD, x) == ("ring", "mpi"), f"pick {picked(WORLD, x)}, measured {len(measured)}")


def test_a_tuning_table_the_switch_and_a_named_transport_leave_calibration_out(calibration, monkeypatch):
    where, measured = calibration
    x = np.random.default_rng(WORLD.rank).standard_normal(2000)
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "0")
    collectives.allreduce(x, comm=WORLD)
    collectives.allreduce(x, comm=WORLD, transport="mpi")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    collectives.allreduce(x, comm=WORLD, transport="mpi")
    collectives.allreduce(x, comm=WORLD, transport="shm")
    table = where + ".table"
    if WORLD.rank == 0:
        with open(table, "w") as f:
            json.dump({"format": "collectives-tuning-1", "mpi_library": describe(), "entries": [
                {"size": WORLD.size, "dtype": "float64", "nbytes": x.nbytes, "algorithm": "tree", "transport": "mpi"}]}, f)
    WORLD.Barrier()
    monkeypatch.setenv("COLLECTIVES_TUNING", table)
    tuning.reload()
    select.reset()
    collectives.allreduce(x, comm=WORLD)
    agree(not measured and picked(WORLD, x) is None, f"measured {len(measured)} times")
    agree(select.choose_pair(as_comm(WORLD), x.nbytes, x.dtype)[0] == "tree",
          "the table's pick")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "yes")
    if WORLD.size > 1 and ONE_NODE:
        with pytest.raises(ValueError, match="COLLECTIVES_AUTOTUNE must be 0 or 1"):
            collectives.allreduce(x[:7], comm=WORLD)
