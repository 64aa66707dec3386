"""benchmarks/gpu.py: the helpers benchmarks/allreduce_perf.py calls, on a real device."""
import numpy as np
import pytest

from tests.gpu.gpu_helpers import require_gpu

cupy, NGPU = require_gpu()
pytestmark = pytest.mark.gpu

import collectives  # noqa: E402
from benchmarks import gpu  # noqa: E402


def test_gpu_available():
    assert gpu.gpu_available() == (True, None)


def test_make_buffers_both_forms():
    send, recv = gpu.make_buffers(1000, "int32", 0)
    assert isinstance(send, cupy.ndarray) and send.dtype == np.int32 and send.size == 1000
    assert send.device.id == 0 and int(recv.sum()) == 0
    host = np.arange(5, dtype=np.float64)
    dev = gpu.make_buffers(host)
    assert isinstance(dev, cupy.ndarray) and np.array_equal(cupy.asnumpy(dev), host)


def test_bandwidths_are_positive_and_plausible():
    copy = gpu.device_copy_bandwidth(1 << 26, repeat=5)
    reduce_ = gpu.device_reduce_bandwidth(1 << 26, "float32", "sum", repeat=5)
    assert 1e9 < copy < 1e14 and 1e9 < reduce_ < 1e14


def test_nccl_timer_gives_a_reason_in_a_threaded_world():
    results = collectives.run_threaded(2, lambda comm: gpu.nccl_allreduce_timer(comm, 100, "float32"))
    for timer, reason in results:
        assert timer is None and reason


def test_nccl_timer_on_one_mpi_rank():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    from mpi4py import MPI

    if MPI.COMM_WORLD.size != 1:
        pytest.skip("one-rank check; the MPI sweep in gpu_check.sh covers larger worlds")
    timer, reason = gpu.nccl_allreduce_timer(MPI.COMM_SELF, 1 << 16, "float32")
    if timer is None:
        assert reason
        pytest.skip(reason)
    assert 0 < timer() < 10
    send, recv = gpu.make_buffers(1 << 10, "float32")
    pair = gpu.nccl_allreduce_timer(MPI.COMM_SELF, send, recv, "sum")
    assert pair is not None
    pair[0]()
    np.testing.assert_array_equal(cupy.asnumpy(recv), cupy.asnumpy(send))


def test_short_sweep_threaded(tmp_path):
    out = tmp_path / "sweep.json"
    assert gpu.main(["--threads", "2", "--quick", "--out", str(out)]) == 0
    assert out.exists()
