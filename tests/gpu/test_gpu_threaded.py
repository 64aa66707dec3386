"""The threaded world on CuPy arrays: every algorithm x dtype x op, ranks sharing one GPU or one GPU
each (rank % number of GPUs), results checked against a CuPy reference."""
import numpy as np
import pytest

import collectives
from tests.gpu.gpu_helpers import DEVICE_DTYPES, OPTIONS, close, cupy_reference, require_gpu
from tests.helpers import integer_valued, ops_for, random_floats

cupy, NGPU = require_gpu()
pytestmark = pytest.mark.gpu
N = 3
COUNTS = (0, 1, N + 1, 1000)


def _sweep(comm, algorithm, options):
    failures = []
    with cupy.cuda.Device(comm.rank % NGPU):
        for dtype in DEVICE_DTYPES:
            for op in ops_for(dtype):
                for count in COUNTS:
                    host = [integer_valued(r, count, dtype, op, seed=count) for r in range(comm.size)]
                    x = cupy.asarray(host[comm.rank])
                    y = collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm, **options)
                    where = f"rank {comm.rank} {dtype} {op} count={count} {options}"
                    if not isinstance(y, cupy.ndarray) or y.device.id != comm.rank % NGPU:
                        failures.append(f"{where}: result not a CuPy array on the rank's device")
                    elif not np.array_equal(cupy.asnumpy(y), cupy_reference(cupy, host, op)):
                        failures.append(f"{where}: wrong result")
                    if not np.array_equal(cupy.asnumpy(x), host[comm.rank]):
                        failures.append(f"{where}: sendbuf modified")
    return failures


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_sweep_exact_on_integer_data(algorithm):
    for options in ({}, OPTIONS.get(algorithm, {})):
        failures = sum(collectives.run_threaded(N, _sweep, algorithm, options), [])
        assert not failures, failures[:10]


@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
@pytest.mark.parametrize("dtype", [d for d in DEVICE_DTYPES if d.kind == "f"], ids=str)
def test_random_floats_within_tolerance_and_identical_on_all_ranks(algorithm, dtype):
    count = 1 << 14

    def body(comm):
        with cupy.cuda.Device(comm.rank % NGPU):
            host = [random_floats(r, count, dtype) for r in range(comm.size)]
            y = collectives.allreduce(cupy.asarray(host[comm.rank]), op="sum", algorithm=algorithm, comm=comm)
            return cupy.asnumpy(y), cupy_reference(cupy, host, "sum")

    results = collectives.run_threaded(N, body)
    for y, ref in results:
        assert close(y, ref, dtype, N)
    assert all(y.tobytes() == results[0][0].tobytes() for y, _ in results)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
def test_in_place_recvbuf_and_strided_buffers(algorithm):
    def body(comm):
        with cupy.cuda.Device(comm.rank % NGPU):
            base = cupy.arange(24, dtype=cupy.float32).reshape(4, 6) * (comm.rank + 1)
            expected = cupy.asnumpy(cupy.arange(24, dtype=cupy.float32).reshape(4, 6)) * (N * (N + 1) / 2)
            inplace = base.copy()
            assert collectives.allreduce(inplace, inplace, algorithm=algorithm, comm=comm) is inplace
            out = cupy.empty_like(base)
            collectives.allreduce(base, out, algorithm=algorithm, comm=comm)
            strided_in = base.T  # not C-contiguous
            strided_out = cupy.empty((6, 8), dtype=cupy.float32)[:, ::2]
            collectives.allreduce(strided_in, strided_out, algorithm=algorithm, comm=comm)
            return [cupy.asnumpy(inplace), cupy.asnumpy(out), cupy.asnumpy(strided_out)], expected

    for (inplace, out, strided), expected in collectives.run_threaded(N, body):
        np.testing.assert_array_equal(inplace, expected)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(strided, expected.T)


def test_building_blocks_on_device():
    count = 10

    def body(comm):
        with cupy.cuda.Device(comm.rank % NGPU):
            x = cupy.arange(count, dtype=cupy.int64) + comm.rank
            rs = collectives.reduce_scatter(x, comm=comm)
            ag = collectives.allgather(x, comm=comm)
            bc = collectives.broadcast(x.copy(), root=1, comm=comm)
            rd = collectives.reduce(x, root=2, comm=comm)
            kinds = {type(a) for a in (rs, ag, bc) + ((rd,) if rd is not None else ())}
            return (cupy.asnumpy(rs), cupy.asnumpy(ag), cupy.asnumpy(bc),
                    None if rd is None else cupy.asnumpy(rd), kinds)

    total = sum(np.arange(count) + r for r in range(N))
    bounds = np.array_split(np.arange(count), N)
    for rank, (rs, ag, bc, rd, kinds) in enumerate(collectives.run_threaded(N, body)):
        assert kinds == {cupy.ndarray}
        np.testing.assert_array_equal(rs, total[bounds[rank]])
        np.testing.assert_array_equal(ag, np.concatenate([np.arange(count) + r for r in range(N)]))
        np.testing.assert_array_equal(bc, np.arange(count) + 1)
        if rank == 2:
            np.testing.assert_array_equal(rd, total)
        else:
            assert rd is None


def test_backend_seam_for_cupy():
    from collectives.backend import backend_for

    with cupy.cuda.Device(0):
        a = cupy.zeros(8, dtype=cupy.float32)
        backend = backend_for(a)
        assert backend.is_device and backend.device_id == 0 and backend is backend_for(a[2:])
        assert backend.is_contiguous(a) and not backend.is_contiguous(a[::2])
        assert backend.xp.may_share_memory(a[:4], a[2:]) and not backend.xp.may_share_memory(a[:4], a[4:])
        scratch = backend.empty(5, np.dtype(np.float64))
        assert isinstance(scratch, cupy.ndarray) and scratch.device.id == 0
        backend.ufunc("add")(a, a, out=a)
        backend.synchronize()
    with pytest.raises(ValueError, match="must both be host"):
        collectives.run_threaded(1, lambda comm: collectives.allreduce(cupy.zeros(3), np.zeros(3), comm=comm))
