"""Device buffers over MPI: the host-staging path (pinned host memory) and, where the MPI library
is CUDA-aware, the direct path; NCCL as the oracle where every rank has its own GPU.

Runs under plain pytest (one rank) and under mpiexec, e.g.
``mpiexec -n 4 python -m mpi4py -m pytest -q tests/gpu/test_gpu_mpi.py`` (benchmarks/gpu_check.sh
does both). Each rank uses GPU (node-local rank % GPUs); results are compared with the MPI
library's own Allreduce on host copies of the same data, and verdicts agreed across ranks."""
import os

import numpy as np
import pytest

from tests.gpu.gpu_helpers import OPTIONS, SMALL, require_gpu

cupy, NGPU = require_gpu()
pytest.importorskip("mpi4py", reason="mpi4py is not installed")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from benchmarks import nccl  # noqa: E402
from collectives.comm import cuda  # noqa: E402
from tests.helpers import integer_valued, random_floats, tolerance  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]
WORLD = MPI.COMM_WORLD
_node = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=WORLD.rank)
LOCAL_RANK = _node.Get_rank()
_node.Free()
DEVICE = LOCAL_RANK % NGPU
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}
MPI_DTYPES = [np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                    "uint64", "float32", "float64")]
FORCED = os.environ.get("COLLECTIVES_CUDA_AWARE")
DETECTED, HOW = cuda.detect_cuda_support()
AWARE_OK = FORCED == "1" or (FORCED is None and DETECTED)


def agree(ok, message):
    everyone = WORLD.allreduce(bool(ok), op=MPI.LAND)
    assert everyone, f"rank {WORLD.rank}: {message}" if not ok else "another rank failed"


def native(x, op):
    ref = np.empty_like(x)
    WORLD.Allreduce(x, ref, op=MPI_OPS[op])
    if op == "avg":
        ref = (ref / x.dtype.type(WORLD.size)).astype(x.dtype)
    return ref


def _sweep(algorithm, counts=(0, WORLD.size + 1, 1 << 17)):
    ok, why = True, ""
    with cupy.cuda.Device(DEVICE):
        for options in ({}, OPTIONS.get(algorithm, {})):
            for dtype in MPI_DTYPES:
                for op in [o for o in collectives.OPS if o != "avg" or dtype.kind == "f"]:
                    for count in counts:
                        if options and count > SMALL:  # 64-byte segments: thousands of steps
                            continue
                        host = integer_valued(WORLD.rank, count, dtype, op, seed=count)
                        x = cupy.asarray(host)
                        y = collectives.allreduce(x, op=op, algorithm=algorithm, **options)
                        inplace = x.copy()
                        collectives.allreduce(inplace, inplace, op=op, algorithm=algorithm, **options)
                        ref = native(host, op)
                        if not (isinstance(y, cupy.ndarray) and np.array_equal(cupy.asnumpy(y), ref)
                                and np.array_equal(cupy.asnumpy(inplace), ref)
                                and np.array_equal(cupy.asnumpy(x), host)):
                            ok, why = False, f"{dtype} {op} count={count} {options}"
    return ok, why


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_host_staging_matches_native(algorithm, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "0")
    assert not cuda.cuda_aware() and "host staging" in cuda.describe()
    agree(*_sweep(algorithm))


@pytest.mark.skipif(not AWARE_OK, reason=f"the MPI library is not CUDA-aware ({HOW}); "
                                         f"COLLECTIVES_CUDA_AWARE={FORCED}")
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_cuda_aware_path_matches_native(algorithm, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "1")
    assert cuda.cuda_aware()
    agree(*_sweep(algorithm, counts=(1, 1000, 1 << 17)))


def test_staging_pools_grow_shrink_and_alternate(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "0")
    ok, why = True, ""
    with cupy.cuda.Device(DEVICE):
        for count in (10, 1 << 20, 3, 1 << 16, 1 << 21, 7, 0, 1 << 20):
            dtype = np.dtype(np.float32)
            host = random_floats(WORLD.rank, count, dtype, seed=count)
            y = collectives.allreduce(cupy.asarray(host), algorithm="ring")
            ref = native(host, "sum")
            if not np.allclose(cupy.asnumpy(y), ref, rtol=tolerance(dtype, WORLD.size), atol=1e-4):
                ok, why = False, f"count={count}"
    agree(ok, why)


def test_detection_and_override(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "1")
    assert cuda.cuda_aware() and "COLLECTIVES_CUDA_AWARE=1" in cuda.describe()
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "0")
    assert not cuda.cuda_aware()
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="COLLECTIVES_CUDA_AWARE"):
        cuda.cuda_aware()
    monkeypatch.delenv("COLLECTIVES_CUDA_AWARE")
    assert cuda.cuda_aware() == DETECTED and isinstance(HOW, str) and HOW


def test_matches_nccl():
    comm = collectives.as_comm(WORLD)
    with cupy.cuda.Device(DEVICE):
        why = nccl.unavailable_reason(comm)  # collective: the same answer on every rank
        if why:
            pytest.skip(why)
        oracle = nccl.NcclAllreduce(comm)
        ok, msg = True, ""
        for algorithm in collectives.algorithm_names():
            for dtype in MPI_DTYPES:
                for op in [o for o in collectives.OPS if o != "avg" or dtype.kind == "f"]:
                    if not nccl.supports(op, dtype):
                        continue
                    exact = op != "avg"
                    host = (integer_valued(WORLD.rank, 5000, dtype, op, seed=7) if exact
                            else random_floats(WORLD.rank, 5000, dtype, seed=7))
                    x = cupy.asarray(host)
                    y = cupy.asnumpy(collectives.allreduce(x, op=op, algorithm=algorithm))
                    ref = cupy.asnumpy(oracle(x, op=op))
                    cupy.cuda.get_current_stream().synchronize()
                    good = np.array_equal(y, ref) if exact else np.allclose(
                        y, ref, rtol=tolerance(dtype, WORLD.size), atol=tolerance(dtype, WORLD.size))
                    if not good:
                        ok, msg = False, f"{algorithm} {dtype} {op}"
        oracle.close()
    agree(ok, msg)
