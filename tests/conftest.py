"""Shared test set-up.

Under mpiexec with more than one rank, a failing test aborts the whole job
(MPI.COMM_WORLD.Abort), because a rank that fails while its peers wait in a
collective would otherwise leave them waiting forever. Every test also runs
under pytest-timeout's thread method (setup.cfg), and tests/run_all.py puts an
outer timeout around each mpiexec.
"""
import os
import sys

import pytest

os.environ.setdefault("COLLECTIVES_TIMEOUT", "60")


def _mpi_world_size():
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _mpi_world_size() > 1:
        mpi = sys.modules["mpi4py.MPI"]
        rank = mpi.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when}); aborting the MPI job\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(1)
