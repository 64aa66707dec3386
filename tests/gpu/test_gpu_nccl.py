"""The NCCL oracle helpers (benchmarks/nccl.py) on what one process can do: a one-rank NCCL
communicator on each GPU, every op and dtype NCCL reduces; the reasons given when NCCL cannot
serve a world (threads; ranks sharing a GPU)."""
import numpy as np
import pytest

import collectives
from benchmarks import nccl
from tests.gpu.gpu_helpers import DEVICE_DTYPES, require_gpu
from tests.helpers import integer_valued, ops_for

cupy, NGPU = require_gpu()
pytestmark = pytest.mark.gpu
NCCL, WHY = nccl.module()
needs_nccl = pytest.mark.skipif(NCCL is None, reason=f"NCCL unavailable: {WHY}")


@needs_nccl
def test_every_nccl_op_and_dtype_one_rank_per_gpu():
    checked = 0
    for dtype in DEVICE_DTYPES:
        for op in ops_for(dtype):
            if not nccl.supports(op, dtype):
                assert str(dtype) in ("int16", "uint16") or op == "avg", (op, dtype)
                continue
            host = [integer_valued(r, 257, dtype, op) for r in range(NGPU)]
            inputs = []
            for r in range(NGPU):
                with cupy.cuda.Device(r):
                    inputs.append(cupy.asarray(host[r]))
            outs = nccl.single_process_allreduce(inputs, op)
            ours = collectives.run_threaded(NGPU, lambda comm: _ours(comm, host, op))
            for out, y in zip(outs, ours):
                if op == "avg":
                    np.testing.assert_allclose(cupy.asnumpy(out).astype(np.float64), y.astype(np.float64),
                                               rtol=1e-2)
                else:
                    np.testing.assert_array_equal(cupy.asnumpy(out), y)
            checked += 1
    assert checked >= 30


def _ours(comm, host, op):
    with cupy.cuda.Device(comm.rank):
        return cupy.asnumpy(collectives.allreduce(cupy.asarray(host[comm.rank]), op=op, comm=comm))


@needs_nccl
def test_reasons_name_the_limit():
    reasons = collectives.run_threaded(2, nccl.unavailable_reason)
    assert reasons[0] == reasons[1] and "threads" in reasons[0]
    with pytest.raises(ValueError, match="same GPU"):
        nccl.single_process_allreduce([cupy.zeros(4), cupy.zeros(4)])
    with pytest.raises(ValueError, match="no dtype int16"):
        nccl.single_process_allreduce([cupy.zeros(4, dtype=cupy.int16)])
