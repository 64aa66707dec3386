"""Shared set-up of the GPU tests: skip (naming what is missing) unless CuPy sees a CUDA device."""
import functools

import numpy as np
import pytest

from collectives.ops import DTYPES

OPTIONS = {"tree": {"segment_bytes": 64}, "double_binary_tree": {"segment_bytes": 64},
           "hierarchical_copy": {"group_size": 2}}
SMALL = 1000  # the options above (tiny segments) only on counts up to this: each segment is a step
# every dtype the library reduces that CuPy has (bfloat16 has no CuPy dtype)
DEVICE_DTYPES = [d for d in DTYPES if str(d) != "bfloat16"]
CUPY_UFUNCS = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "avg": "add"}


def require_gpu():
    """(cupy, number of devices); skips the calling module when either is missing."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        pytest.skip(f"CuPy is installed but finds no CUDA device ({exc})", allow_module_level=True)
    if count < 1:
        pytest.skip("CuPy is installed but finds no CUDA device", allow_module_level=True)
    return cupy, count


def cupy_reference(cupy, host_arrays, op):
    """The sequential reduction of ``host_arrays`` (rank order) by CuPy on the current device, to host."""
    ufunc = getattr(cupy, CUPY_UFUNCS[op])
    arrays = [cupy.asarray(a) for a in host_arrays]
    result = functools.reduce(lambda a, b: ufunc(a, b), arrays)
    if op == "avg":
        result = result / arrays[0].dtype.type(len(arrays))
    return cupy.asnumpy(result.astype(arrays[0].dtype, copy=False))


def close(a, b, dtype, n):
    from tests.helpers import tolerance

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.allclose(a, b, rtol=tolerance(dtype, n), atol=tolerance(dtype, n))
