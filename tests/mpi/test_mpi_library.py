"""Under each MPI library (tests/run_all.py runs these under MPICH, Open MPI and, where installed,
Intel MPI): the library is named right, oversubscription is judged from the node's cores
whatever the launcher pinned, the eager limit is this library's own, and auto does not use a
tuning table measured under another library (and says why under COLLECTIVES_DEBUG=INFO)."""
import json
import logging
import os

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import mpilib, protocol, select, tune, tuning  # noqa: E402
from collectives.comm import mpi as mpi_comm  # noqa: E402
from tests.mpi.test_mpi_allreduce import agree  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


def test_the_library_is_named_from_its_own_version_string():
    name, version = mpilib.library()
    text = MPI.Get_library_version()
    ok = name in ("MPICH", "Open MPI", "Intel MPI") and version and version in text
    agree(ok, f"{name!r} {version!r} from {text.splitlines()[0]!r}")


def test_oversubscription_follows_the_nodes_cores_not_the_ranks_mask():
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=WORLD.rank)
    on_node = node.Get_size()
    masks = node.allgather(sorted(os.sched_getaffinity(0)))
    node.Free()
    cores = mpilib.node_cores()
    used = set().union(*map(set, masks))
    ok = mpilib.local_ranks() == on_node  # the launcher's figure is the node's rank count
    ok = ok and cores >= len(used)  # the node's cores cover every rank's mask
    ok = ok and mpi_comm._OVERSUBSCRIBED == (on_node > cores)
    agree(ok, f"{on_node} ranks on the node, launcher says {mpilib.local_ranks()}, {cores} cores, masks {masks}, "
              f"oversubscribed {mpi_comm._OVERSUBSCRIBED}")


def test_the_eager_limit_is_this_librarys_own(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLECTIVES_TUNING", str(tmp_path / f"absent-{WORLD.rank}.json"))
    monkeypatch.delenv("COLLECTIVES_EAGER_LIMIT", raising=False)
    tuning.reload()
    try:
        expected = mpilib.MEASURED_EAGER_LIMITS.get(mpilib.library(), 0)
        agree(mpilib.eager_limit() == expected, f"{mpilib.eager_limit()} B, measured here for this library: {expected}")
    finally:
        tuning.reload()


@pytest.mark.timeout(120)
def test_the_eager_limit_measurement_agrees_on_every_rank():
    limit = protocol.measure(WORLD)
    limits = WORLD.allgather(limit)
    agree(len(set(limits)) == 1 and 0 <= limit <= protocol.GRID[-1], f"limits {limits}")


def test_a_table_of_another_library_is_not_used_and_info_says_why(monkeypatch, tmp_path_factory, caplog):
    where = WORLD.bcast(str(tmp_path_factory.mktemp("lib") / "tuning.json") if WORLD.rank == 0 else None)
    other = "MPICH 5.0.2" if mpilib.library()[0] != "MPICH" else "Open MPI 5.0.11"
    if WORLD.rank == 0:
        with open(where, "w") as f:
            json.dump({"format": tune.FORMAT, "mpi_library": other, "entries": [
                {"size": WORLD.size, "dtype": "float32", "nbytes": 4096, "algorithm": "reduce_to_one"}]}, f)
    WORLD.Barrier()
    monkeypatch.setenv("COLLECTIVES_TUNING", where)
    monkeypatch.setenv("COLLECTIVES_DEBUG", "INFO")
    tuning.reload()
    select.reset()
    try:
        x = np.ones(1024, np.float32)
        with caplog.at_level(logging.INFO, logger="collectives"):
            y = collectives.allreduce(x, comm=WORLD)
        why = f"tuning table measured under {other}, this is {mpilib.describe()}: not used"
        lines = [r.getMessage() for r in caplog.records if "4096 bytes of float32" in r.getMessage()]
        expected, _ = select.cost_choice(WORLD.size, x.nbytes, alpha=select.ALPHA_NODE_STEP,
                                         candidates=[n for n in collectives.algorithm_names() if n != "shm"])
        ok = (y == WORLD.size).all() and len(lines) == 1 and why in lines[0] and f"-> {expected} (cost model" in lines[0]
        agree(ok, f"log {lines}")
    finally:
        tuning.reload()
        select.reset()
        WORLD.Barrier()
