"""Several GPUs in one process: a threaded world with one device per rank, so every message is a
copy between GPUs (peer access where the devices have it), and the NCCL comparison on the
gathered inputs; with more ranks than GPUs, ranks share devices and a CuPy reference decides."""
import numpy as np
import pytest

import collectives
from benchmarks import nccl
from tests.gpu.gpu_helpers import DEVICE_DTYPES, OPTIONS, SMALL, close, cupy_reference, require_gpu
from tests.helpers import integer_valued, ops_for, random_floats

cupy, NGPU = require_gpu()
pytestmark = pytest.mark.gpu
needs_two = pytest.mark.skipif(NGPU < 2, reason=f"needs at least 2 GPUs, found {NGPU}")


def _run(n, algorithm, dtype, op, count, data, options=None):
    host = [data(r) for r in range(n)]

    def body(comm):
        with cupy.cuda.Device(comm.rank % NGPU):
            y = collectives.allreduce(cupy.asarray(host[comm.rank]), op=op, algorithm=algorithm, comm=comm,
                                      **(options or {}))
            assert y.device.id == comm.rank % NGPU
            return cupy.asnumpy(y)

    return host, collectives.run_threaded(n, body)


@needs_two
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_one_gpu_per_rank_exact(algorithm):
    n = min(NGPU, 4)
    for options in ({}, OPTIONS.get(algorithm, {})):
        for dtype in DEVICE_DTYPES:
            for op in ops_for(dtype):
                for count in (1, n + 1, 100_003):
                    if options and count > SMALL:  # 64-byte segments: thousands of steps
                        continue
                    host, results = _run(n, algorithm, dtype, op, count,
                                         lambda r: integer_valued(r, count, dtype, op, seed=count), options)
                    with cupy.cuda.Device(0):
                        ref = cupy_reference(cupy, host, op)
                    for rank, y in enumerate(results):
                        assert np.array_equal(y, ref), f"rank {rank} {dtype} {op} count={count} {options}"


@needs_two
def test_hierarchical_copy_across_gpus_large():
    n = min(NGPU, 4)
    count = 1 << 22
    host, results = _run(n, "hierarchical_copy", np.dtype(np.float32), "sum", count,
                         lambda r: integer_valued(r, count, np.dtype(np.float32), "sum"), {"group_size": 2})
    ref = cupy_reference(cupy, host, "sum")
    for y in results:
        np.testing.assert_array_equal(y, ref)


@needs_two
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_matches_nccl(algorithm):
    n = min(NGPU, 8)
    why = nccl.module()[1]
    if why:
        pytest.skip(why)
    for dtype in DEVICE_DTYPES:
        for op in ops_for(dtype):
            if not nccl.supports(op, dtype):
                continue
            integer = op != "avg"
            count = 4099
            make = ((lambda r: integer_valued(r, count, dtype, op, seed=3)) if integer
                    else (lambda r: random_floats(r, count, dtype, seed=3)))
            host, results = _run(n, algorithm, dtype, op, count, make)
            inputs = []
            for r in range(n):
                with cupy.cuda.Device(r):
                    inputs.append(cupy.asarray(host[r]))
            refs = [cupy.asnumpy(o) for o in nccl.single_process_allreduce(inputs, op)]
            for rank, (y, ref) in enumerate(zip(results, refs)):
                ok = np.array_equal(y, ref) if integer else close(y, ref, dtype, n)
                assert ok, f"rank {rank} {dtype} {op}: differs from NCCL"


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical_copy", "double_binary_tree"])
def test_more_ranks_than_gpus_against_cupy(algorithm):
    n = 2 * NGPU + 1
    if nccl.module()[0] is not None:
        with pytest.raises(ValueError, match="same GPU"):
            nccl.single_process_allreduce([cupy.zeros(1)] * 2)
    dtype = np.dtype(np.float32)
    options = {"group_size": 2} if algorithm == "hierarchical_copy" else None
    host, results = _run(n, algorithm, dtype, "sum", 5000, lambda r: random_floats(r, 5000, dtype), options)
    ref = cupy_reference(cupy, host, "sum")
    for y in results:
        assert close(y, ref, dtype, n)
