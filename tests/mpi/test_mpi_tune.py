"""python -m collectives.tune under mpiexec: it measures every algorithm, writes a table that
tuning.lookup reads, keeps other world sizes' entries, and algorithm="auto" then follows it."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import mpilib, select, tune, tuning  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


def agree(ok, message):
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {WORLD.rank}: {message}" if not ok else "another rank failed"


@pytest.fixture
def table_path(tmp_path_factory, monkeypatch):
    where = WORLD.bcast(str(tmp_path_factory.mktemp("tune") / "tuning.json") if WORLD.rank == 0 else None)
    monkeypatch.setenv("COLLECTIVES_TUNING", where)
    tuning.reload()
    select.reset()
    yield where
    tuning.reload()
    select.reset()
    WORLD.Barrier()


@pytest.mark.timeout(120)
def test_tune_writes_a_table_that_auto_follows(table_path):
    if WORLD.rank == 0:  # another world size's entry, which tuning must keep
        with open(table_path, "w") as f:
            json.dump({"format": tune.FORMAT, "mpi_library": mpilib.describe(), "entries": [
                {"size": WORLD.size + 100, "dtype": "float32", "nbytes": 8, "algorithm": "ring"}]}, f)
    WORLD.Barrier()
    code = tune.main(["-b", "8", "-e", "4K", "-f", "8", "-r", "1", "--round-ms", "1",
                      "-a", "ring,recursive_doubling,tree"])
    agree(code == 0, f"tune exited {code}")
    with open(table_path) as f:
        table = json.load(f)
    mine = [e for e in table["entries"] if e["size"] == WORLD.size]
    ok = table["format"] == tune.FORMAT and sorted(e["nbytes"] for e in mine) == [8, 64, 512, 4096]
    ok = ok and all(e["algorithm"] in ("ring", "recursive_doubling", "tree") for e in mine)
    # each algorithm measured over each transport where ranks share a node: the pair that won
    best = [min(e["times_us"], key=e["times_us"].get) for e in mine]
    on_node = WORLD.size > 1
    ok = ok and all(b == (f"{e['algorithm']}@{e['transport']}" if on_node else e["algorithm"])
                    for b, e in zip(best, mine))
    ok = ok and all(len(e["times_us"]) == (6 if on_node else 3) for e in mine)
    ok = ok and any(e["size"] == WORLD.size + 100 for e in table["entries"])
    ok = ok and table["mpi_library"] == mpilib.describe()  # the table names the library it was measured under
    agree(ok, f"unexpected table {table}")
    # auto follows the table, whatever the cost model would say: plant a choice and check it is used
    if WORLD.rank == 0:
        for e in table["entries"]:
            if e["size"] == WORLD.size:
                e["algorithm"], e["transport"] = "tree", "shm"
        with open(table_path, "w") as f:
            json.dump(table, f)
    WORLD.Barrier()
    tuning.reload()
    select.reset()
    x = np.arange(16, dtype=np.float32) + WORLD.rank
    chosen = select.choose_pair(collectives.api.as_comm(WORLD), x.nbytes, x.dtype)
    fresh = WORLD.Dup()
    y = collectives.allreduce(x, comm=fresh)
    window = collectives.library_memory(fresh)["shm_window"]  # the pair's transport ran the call
    fresh.Free()
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    agree(chosen == ("tree", "shm") and np.array_equal(y, expected) and (window > 0) == on_node,
          f"auto chose {chosen}, shm window {window}")


def test_tune_rejects_a_forced_algorithm(table_path, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "ring")
    code = tune.main(["-b", "8", "-e", "8", "-r", "1"])
    agree(code == 2 and not os.path.exists(table_path), f"tune exited {code} with COLLECTIVES_ALGO set")
