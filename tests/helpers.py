"""Data and references shared by the threaded and MPI tests."""
import functools
import os
import subprocess

import numpy as np
import pytest

import collectives
from collectives import cleanup
from collectives.ops import DTYPES, is_floating

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "avg": np.add}


def ops_for(dtype):
    return [op for op in collectives.OPS if op != "avg" or is_floating(dtype)]


def integer_valued(rank, count, dtype, op, seed=0):
    """Data whose reduction is exact in every dtype: products of 1s and 2s, small sums."""
    rng = np.random.default_rng(seed * 1009 + rank)
    if op == "prod":
        values = rng.integers(1, 3, count)
    elif dtype.kind == "u":
        values = rng.integers(0, 4, count)
    else:
        values = rng.integers(-3, 4, count)
    return values.astype(dtype)


def random_floats(rank, count, dtype, seed=0):
    rng = np.random.default_rng(seed * 7919 + rank)
    return rng.standard_normal(count).astype(dtype)


def reference(arrays, op):
    """The reduction of ``arrays`` computed sequentially by NumPy, in their dtype."""
    result = functools.reduce(lambda a, b: UFUNCS[op](a, b), arrays)
    if op == "avg":
        result = result / arrays[0].dtype.type(len(arrays))
    return np.asarray(result, dtype=arrays[0].dtype)


def tolerance(dtype, n):
    eps = float(np.finfo(np.float32).eps) if dtype.itemsize >= 4 else 1e-2
    if dtype == np.float64:
        eps = 1e-13
    if str(dtype) == "bfloat16":
        eps = 5e-2
    return eps * max(4, n) * 4


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


ALL_DTYPES = list(DTYPES)


# set by the launchers for every rank: Hydra (MPICH, Intel MPI), Open MPI, PMIx, Slurm's PMI
LAUNCHER_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def under_mpiexec():
    """Whether this process was started by an MPI launcher (mpiexec, srun)."""
    return any(os.environ.get(name) for name in LAUNCHER_VARIABLES)


def agree_all(world, ok, message):
    """Under MPI: every rank of ``world`` fails together, or none (an assertion on one rank alone
    would leave the others waiting in the next collective)."""
    from mpi4py import MPI

    everyone = world.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {world.rank}: {message}" if not ok else "another rank failed"


def bitwise_alike(world, y):
    """Under MPI: whether every rank of ``world`` holds the same bytes in ``y``."""
    digests = world.allgather(np.ascontiguousarray(y).tobytes())
    return all(d == digests[0] for d in digests)


def at(offset, count, dtype=np.float32):
    """``count`` items starting ``offset`` bytes past a 64-byte boundary (NumPy's own arrays here
    start 16 or 48 bytes past one)."""
    align = 64
    raw = np.empty(count * np.dtype(dtype).itemsize + 2 * align, np.uint8)
    start = -raw.ctypes.data % align + offset
    return raw[start:start + count * np.dtype(dtype).itemsize].view(dtype)


def reduction_spy(monkeypatch, api):
    """Every reduction the library runs from here on, as (output address, bytes): ``calls.ufuncs``
    wrapped for the test (``monkeypatch`` undoes it; call ``collectives.clear_caches()`` after, so
    that no memo keeps the wrapper)."""
    from collectives import calls, pipeline

    real, outs = calls.ufuncs, []

    def spied(*args):
        fn, final = real(*args)

        def reduce_fn(a, b, out):
            outs.append((out.__array_interface__["data"][0], out.nbytes))
            return fn(a, b, out=out)
        return reduce_fn, final
    monkeypatch.setattr(calls, "ufuncs", spied)
    monkeypatch.setattr(pipeline, "ufuncs", spied)
    collectives.clear_caches()  # no memo holds the unspied ufunc
    return outs


JOB_VARIABLE = "COLLECTIVES_TEST_JOB"  # tags a test's MPI job, so that its processes can be found and ended


def run_job(cmd, env, job, hard_timeout, what):
    """Run the MPI job ``cmd`` (its environment ``env`` gains JOB_VARIABLE=``job``) under a hard
    timeout: (exit code, output). A job past the timeout fails the test; whatever happens, the
    job's processes are ended and what it left in /dev/shm and /tmp is removed."""
    env = dict(env, **{JOB_VARIABLE: job})
    before = set(cleanup.candidates())
    proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=hard_timeout)
    except subprocess.TimeoutExpired:
        cleanup.end_tagged(JOB_VARIABLE, job, grace=0)
        out, _ = proc.communicate()
        pytest.fail(f"{what} hung: killed after {hard_timeout} s\n{out}")
    finally:
        cleanup.end_tagged(JOB_VARIABLE, job)
        cleanup.remove_stale(set(cleanup.candidates()) - before, settle=3.0)
    return proc.returncode, out
