"""The example algorithms (examples/algorithms/), loaded from their files through the public API,
against the MPI library's own comm.Allreduce like the built-in ones (tests/run_all.py runs this
under mpiexec -n 1..4). Registered for this module only, so the other modules' sweeps stay the
built-ins."""
import os

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import plugins  # noqa: E402
from tests.helpers import integer_valued, random_floats, tolerance  # noqa: E402
from tests.mpi.test_mpi_allreduce import MPI_DTYPES, agree, identical_everywhere, native  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = [os.path.join(ROOT, "examples", "algorithms", name) for name in ("direct.py", "torus.py")]
CASES = [("direct", {}), ("direct", {"fanout": 1}), ("torus", {}),
         ("torus", {"rows": 2 if WORLD.size % 2 == 0 else 1})]


@pytest.fixture(scope="module", autouse=True)
def examples():
    names = plugins.load_files(FILES)
    assert {"direct", "torus"} <= set(collectives.algorithm_names()), names
    yield
    for name in ("direct", "torus"):
        collectives.unregister_algorithm(name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, options", CASES)
def test_examples_match_native_exactly_on_integer_data(name, options):
    ok, why = True, ""
    for dtype in MPI_DTYPES:
        for op in [o for o in collectives.OPS if o != "avg" or dtype.kind == "f"]:
            for count in (0, 1, WORLD.size + 1, 1000):
                x = integer_valued(WORLD.rank, count, dtype, op, seed=count)
                keep = x.copy()
                y = collectives.allreduce(x, op=op, algorithm=name, **options)
                z = x.copy()
                collectives.allreduce(z, z, op=op, algorithm=name, **options)
                ref = native(x, op)
                if not (np.array_equal(y, ref) and np.array_equal(z, ref) and np.array_equal(x, keep)
                        and identical_everywhere(y)):
                    ok, why = False, f"{name} {options} {dtype} {op} count={count}"
    agree(ok, why)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, options", CASES)
def test_examples_close_to_native_on_floats_and_bitwise_identical(name, options):
    ok, why = True, ""
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        for op in ("sum", "avg"):
            for count in (3001, 40000):  # 40,000 floats: past the small-message programs
                x = random_floats(WORLD.rank, count, dtype)
                y = collectives.allreduce(x, op=op, algorithm=name, **options)
                if not np.allclose(y, native(x, op), rtol=tolerance(dtype, WORLD.size), atol=tolerance(dtype, 4)):
                    ok, why = False, f"{name} {dtype} {op} {count} not close"
                if not identical_everywhere(y):
                    ok, why = False, f"{name} {dtype} {op} {count} differs across ranks"
    agree(ok, why)


@pytest.mark.timeout(60)
def test_forced_by_environment_under_mpi(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "torus")
    x = np.full(17, WORLD.rank + 1, np.int64)
    y = collectives.allreduce(x)
    agree((y == WORLD.size * (WORLD.size + 1) // 2).all(), "COLLECTIVES_ALGO=torus result wrong")
