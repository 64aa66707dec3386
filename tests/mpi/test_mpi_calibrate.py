"""``python -m collectives.simulator --calibrate`` under mpiexec: the fit and the table of measured
against predicted times, and the ranks outside a ping-pong asleep while it runs (on a machine
with fewer cores than ranks they took the cores from the ranks being timed). Run by
tests/run_all.py at N = 1..4 ranks."""
import json
import time
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

from collectives import calibrate  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
WORLD = MPI.COMM_WORLD


def test_calibration_fits_and_predicts(tmp_path, capsys):
    if WORLD.size < 2:
        pytest.skip("calibration needs 2 ranks")
    path = tmp_path / "calibrate.json"
    args = types.SimpleNamespace(algorithms="ring,recursive_doubling", minbytes="1K", maxbytes="16K",
                                 stepfactor=4, json=str(path) if WORLD.rank == 0 else None)
    assert calibrate.main(args) == 0
    if WORLD.rank == 0:
        out = capsys.readouterr().out
        assert "fitted (library path, used below): alpha" in out
        data = json.loads(path.read_text())
        assert data["ranks"] == WORLD.size and data["alpha"] > 0 and data["beta"] > 0 and data["gamma"] > 0
        rows = {(r["algorithm"], r["size"]) for r in data["rows"]}
        assert rows == {(a, s) for a in ("ring", "recursive_doubling") for s in (1024, 4096, 16384)}
        assert all(r["measured"] > 0 and r["predicted"] > 0 for r in data["rows"])
        assert len(data["details"]["pingpong_library"]) == len(calibrate.PINGPONG_SIZES)


def test_ranks_outside_a_pingpong_sleep_until_it_ends():
    if WORLD.size < 3:
        pytest.skip("needs a rank outside the ping-pong")
    WORLD.Barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    took = calibrate._pingpong_mpi(WORLD, 256 << 10, 600)  # ranks 0 and 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    pingpong = WORLD.bcast(took * 2 * 600, root=0)
    if WORLD.rank >= 2:
        assert wall >= 0.9 * pingpong, (wall, pingpong)  # it waited for the ping-pong's end
        assert cpu <= 0.3 * wall, (cpu, wall)  # asleep, not polling
    assert np.isfinite(took)
