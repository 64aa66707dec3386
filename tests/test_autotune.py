"""auto's first-use calibration, the parts that need no MPI: buckets and keys, the candidates, the
file (round trip, merging, a corrupt or unwritable file), and where it applies (never in a
threaded world, nor with COLLECTIVES_AUTOTUNE=0). The calibration itself runs under mpiexec in
tests/mpi/test_mpi_autotune.py."""
import json
import os
import stat

import numpy as np
import pytest

import collectives
from collectives import autotune, config, select


@pytest.fixture
def calibration_file(tmp_path, monkeypatch):
    where = str(tmp_path / "autotune.json")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    autotune.reset()
    yield where
    autotune.reset()


def test_buckets_are_powers_of_two_and_keys_name_everything_that_decides():
    assert [autotune.bucket(n) for n in (0, 1, 2, 3, 4, 1000, 1024, 1025, 2047)] == [0, 1, 2, 2, 4, 512, 1024, 1024, 1024]
    big = autotune.MEASURE_MAX_BYTES
    assert autotune.bucket(big - 1) == big // 2 and autotune.bucket(big) == autotune.bucket(8 * big + 3) == big
    a = autotune.key("MPICH 5.0.2", 2, np.float32, 1000, False)
    assert a == autotune.key("MPICH 5.0.2", 2, np.dtype("float32"), 600, False)  # one bucket
    others = [autotune.key("Open MPI 5.0.11", 2, np.float32, 1000, False), autotune.key("MPICH 5.0.2", 4, np.float32, 1000, False),
              autotune.key("MPICH 5.0.2", 2, np.float64, 1000, False), autotune.key("MPICH 5.0.2", 2, np.float32, 1000, True),
              autotune.key("MPICH 5.0.2", 2, np.float32, 1024, False)]
    assert len({a, *others}) == 6


def test_candidates_are_every_algorithm_over_mpi_and_the_models_best_over_shm():
    names = collectives.algorithm_names()
    for size, nbytes in ((2, 8), (2, 1 << 20), (4, 64 << 20)):
        found = autotune.candidates(size, nbytes, 4, shm=True)
        assert found == autotune.candidates(size, nbytes, 4, shm=True)
        over_mpi = [a for a, t in found if t == "mpi"]
        over_shm = [a for a, t in found if t == "shm"]
        assert sorted(over_mpi) == sorted(n for n in names if n != "two_level")
        assert len(over_shm) == autotune.SHM_CANDIDATES and "two_level" not in over_shm
        costs = select.shm_cost_choice(size, nbytes, 4, candidates=[n for n in names if n != "two_level"])[1]
        assert max(costs[a] for a in over_shm) <= min(c for a, c in costs.items() if a not in over_shm)
    assert all(t == "mpi" for _, t in autotune.candidates(2, 8, 4, shm=False))


def test_recursive_doubling_is_screened_over_shared_memory_at_n2_from_512_kib():
    """At n=2 ring, rabenseifner and shm price alike over shared memory from 512 KiB; with three
    candidates they filled the list, and recursive_doubling@shm, measured fastest in place at 512
    KiB (docs/performance.md#calibration-details), was never screened."""
    for nbytes in (512 << 10, 2 << 20):
        assert ("recursive_doubling", "shm") in autotune.candidates(2, nbytes, 4, shm=True)


def test_every_timed_round_visits_every_row_once_and_rows_change_neighbours():
    """A rotation kept each row's predecessor in every round, and the row after native's batch
    ran slow (docs/performance.md#calibration-details)."""
    for count in (2, 5, 16):
        orders = [autotune.round_order(count, r) for r in range(7)]
        assert orders[0] == list(range(count)) and all(sorted(o) == list(range(count)) for o in orders)
        assert orders == [autotune.round_order(count, r) for r in range(7)]  # every rank alike
        if count > 2:
            before = {(o[i - 1], o[i]) for o in orders for i in range(1, count)}
            assert all(len({a for a, b in before if b == row}) > 1 for row in range(count) if row != 0)


def test_the_fastest_pair_wins_and_near_ties_go_to_the_first_in_candidate_order():
    assert autotune.fastest({("a", "mpi"): 2.0, ("b", "mpi"): 1.0, ("c", "shm"): 1.5}) == ("b", "mpi")
    assert autotune.fastest({("a", "mpi"): 1.02, ("b", "mpi"): 1.0}) == ("a", "mpi")
    assert autotune.fastest({("a", "mpi"): 1.04, ("b", "mpi"): 1.0}) == ("b", "mpi")


def test_pairs_travel_as_one_number_every_rank_reads_alike():
    for name in collectives.algorithm_names():
        for transport in ("mpi", "shm"):
            assert autotune._pair(autotune._code((name, transport))) == (name, transport)
    assert autotune._code(None) == 0 and autotune._pair(0) is None
    assert autotune._code(("no-such-algorithm", "mpi")) == 0


def test_the_file_round_trips_and_merges_with_what_another_run_wrote(calibration_file):
    autotune._store(calibration_file, "a", {"algorithm": "ring", "transport": "mpi"})
    with open(calibration_file) as f:
        data = json.load(f)
    data["entries"]["b"] = {"algorithm": "tree", "transport": "shm"}  # another run's entry meanwhile
    with open(calibration_file, "w") as f:
        json.dump(data, f)
    autotune._store(calibration_file, "c", {"algorithm": "shm", "transport": "shm"})
    autotune.reset()
    assert {k: (v["algorithm"], v["transport"]) for k, v in autotune.stored().items()} == {
        "a": ("ring", "mpi"), "b": ("tree", "shm"), "c": ("shm", "shm")}
    assert not [n for n in os.listdir(os.path.dirname(calibration_file)) if ".tmp." in n]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other", "entries": {}}),
                                     json.dumps({"format": autotune.FORMAT, "entries": {"k": {"algorithm": "ring"}}})])
def test_a_corrupt_file_warns_once_and_counts_as_empty(calibration_file, content):
    with open(calibration_file, "w") as f:
        f.write(content)
    with pytest.warns(RuntimeWarning, match="ignoring calibration file"):
        assert autotune.stored() == {}
    assert autotune.stored() == {}  # read once
    autotune._store(calibration_file, "k", {"algorithm": "ring", "transport": "mpi"})  # replaced at the next store
    autotune.reset()
    assert autotune.stored()["k"]["algorithm"] == "ring"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_unwritable_file_warns_once_and_keeps_the_pick_for_the_run(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    where = str(folder / "autotune.json")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    autotune.reset()
    try:
        with pytest.warns(RuntimeWarning, match="cannot store the calibration"):
            autotune._store(where, "k", {"algorithm": "ring", "transport": "mpi"})
        autotune._store(where, "j", {"algorithm": "tree", "transport": "mpi"})  # no second warning
        assert set(autotune.stored()) == {"k", "j"}
    finally:
        folder.chmod(stat.S_IRWXU)
        autotune.reset()


def test_an_unwritable_path_warns_once_and_keeps_the_pick_for_the_run(tmp_path, monkeypatch, recwarn):
    blocker = tmp_path / "file"
    blocker.write_text("")
    where = str(blocker / "autotune.json")  # a folder that is a file: no one can write there
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    autotune.reset()
    try:
        autotune._store(where, "k", {"algorithm": "ring", "transport": "mpi"})
        autotune._store(where, "j", {"algorithm": "tree", "transport": "mpi"})
        assert len([w for w in recwarn if "cannot store the calibration" in str(w.message)]) == 1
        assert set(autotune.stored()) == {"k", "j"}
    finally:
        autotune.reset()


def test_the_default_file_lives_in_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("COLLECTIVES_AUTOTUNE_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert autotune.path() == os.path.join(str(tmp_path), "collectives", "autotune.json")


def test_a_threaded_world_never_calibrates(calibration_file):
    def never():
        raise AssertionError("calibrated in a threaded world")

    def body(comm):
        assert not select.calibrates(comm, "auto")
        return select.pair_for("auto", comm, 1 << 20, np.dtype(np.float32), "auto", never)

    picks = collectives.run_threaded(2, body)
    assert picks[0] == picks[1] and picks[0][0] in collectives.algorithm_names()
    out = collectives.run_threaded(2, lambda comm: collectives.allreduce(np.ones(300_000, np.float32), comm=comm))
    assert (out[0] == 2).all() and not os.path.exists(calibration_file)


def test_the_switch_takes_0_or_1(monkeypatch):
    for value, on in (("0", False), ("1", True), ("", True), (" 1 ", True)):
        monkeypatch.setenv("COLLECTIVES_AUTOTUNE", value)
        assert config.autotune() is on
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "on")
    with pytest.raises(ValueError, match="COLLECTIVES_AUTOTUNE must be 0 or 1"):
        config.autotune()


def test_batches_are_sized_from_a_round_of_batches_not_from_one_call_after_a_barrier(monkeypatch):
    """Each pair's first timed call is slow (as one call after a barrier is, with ranks skewed on an
    oversubscribed node); the screening and final batches must be sized from the settling round's
    steady per-call time, so that they last about BATCH_SECONDS and a fixed skew weighs little."""
    import time

    steady = 100e-6
    seen = {}

    def run(pair):
        seen[pair] = seen.get(pair, 0) + 1
        end = time.perf_counter() + (3e-3 if seen[pair] == 2 else steady)  # the timed first call: 3 ms
        while time.perf_counter() < end:
            pass

    sized = []
    real_rounds = autotune._rounds

    def rounds(comm, pairs, calls, count, *rest):
        sized.append((count, dict(calls)))
        return real_rounds(comm, pairs, calls, count, *rest)

    monkeypatch.setattr(autotune, "_rounds", rounds)
    pairs = [("ring", "mpi"), ("tree", "mpi")]
    final, screened = autotune._measure_pairs(None, pairs, run, lambda *a, **k: None, lambda comm: None)
    settling, screening = sized[0][1], sized[1][1]
    assert all(calls <= 3 for calls in settling.values())  # from the 3 ms call
    want = autotune.BATCH_SECONDS / steady
    assert all(0.4 * want <= calls <= 1.1 * want for calls in screening.values()), screening
    assert all(0.8 * steady <= t <= 3 * steady for t in final.values()), final
