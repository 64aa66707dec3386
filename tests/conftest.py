"""Shared test set-up.

Under mpiexec with more than one rank, a failing test aborts the whole job
(MPI.COMM_WORLD.Abort), because a rank that fails while its peers wait in a
collective would otherwise leave them waiting forever. Every test also runs
under pytest-timeout's thread method (setup.cfg), and tests/run_all.py puts an
outer timeout around each mpiexec.

Outside mpiexec (a plain ``pytest`` from the checkout), the multi-process tests of tests/mpi
and tests/tf_mpi are collected without importing them (no MPI start-up, no TensorFlow set-up)
and each file skips with the reason.
"""
import os
import sys

import pytest

from tests.helpers import under_mpiexec

os.environ.setdefault("COLLECTIVES_TIMEOUT", "60")
# auto's first-use calibration off: tests pick by the cost model (as they assert) and store nothing
# in the home directory; tests/mpi/test_mpi_autotune.py turns it on with files of its own
os.environ.setdefault("COLLECTIVES_AUTOTUNE", "0")
HERE = os.path.dirname(os.path.abspath(__file__))
MULTI_PROCESS = {os.path.join(HERE, "mpi"), os.path.join(HERE, "tf_mpi")}
NOT_UNDER_MPIEXEC = ("multi-process test, collected outside mpiexec: run it as mpiexec -n 2 python -m mpi4py "
                     "-m pytest {dir} (tests/run_all.py runs them under each MPI library)")


class _MultiProcessFile(pytest.File):
    """A multi-process test file seen outside mpiexec: one item that skips with the reason."""

    def collect(self):
        yield _SkippedOutsideMpiexec.from_parent(self, name=self.path.name)


class _SkippedOutsideMpiexec(pytest.Item):
    def setup(self):
        pytest.skip(NOT_UNDER_MPIEXEC.format(dir=os.path.relpath(self.path.parent, os.path.dirname(HERE))))

    def runtest(self):  # pragma: no cover - setup always skips
        pass

    def reportinfo(self):
        return self.path, None, self.name


def pytest_pycollect_makemodule(module_path, parent):
    if str(module_path.parent) in MULTI_PROCESS and not under_mpiexec():
        return _MultiProcessFile.from_parent(parent, path=module_path)
    return None


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
