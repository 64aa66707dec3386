"""The array backend seam: every array operation an executor needs, for NumPy and CuPy.

Algorithms never touch arrays; the executor asks ``backend_for(array)`` for the
module-like object that allocates scratch buffers and runs ufuncs with ``out=``.
"""
import numpy as np


class NumpyBackend:
    name = "numpy"
    xp = np
    is_device = False

    def empty(self, count, dtype):
        return np.empty(count, dtype=dtype)

    def ufunc(self, name):
        return getattr(np, name)

    def synchronize(self):
        pass

    def flat_contiguous(self, array):
        """A 1-D C-contiguous view of ``array`` when possible, else a contiguous copy."""
        return np.ascontiguousarray(array).reshape(-1)

    def is_contiguous(self, array):
        return array.flags.c_contiguous

    def copyto(self, dst, src):
        np.copyto(dst, src)


class CupyBackend(NumpyBackend):  # pragma: no cover - exercised on GPU machines only
    name = "cupy"
    is_device = True

    def __init__(self):
        import cupy

        self.xp = cupy

    def empty(self, count, dtype):
        return self.xp.empty(count, dtype=dtype)

    def ufunc(self, name):
        return getattr(self.xp, name)

    def synchronize(self):
        self.xp.cuda.get_current_stream().synchronize()

    def flat_contiguous(self, array):
        return self.xp.ascontiguousarray(array).reshape(-1)

    def copyto(self, dst, src):
        self.xp.copyto(dst, src)


NUMPY = NumpyBackend()
_cupy_backend = None


def backend_for(array):
    """NumPy for host arrays, CuPy for arrays that carry ``__cuda_array_interface__``."""
    global _cupy_backend
    if isinstance(array, np.ndarray):
        return NUMPY
    if hasattr(array, "__cuda_array_interface__"):
        if _cupy_backend is None:
            _cupy_backend = CupyBackend()
        return _cupy_backend
    raise TypeError(f"expected a NumPy or CuPy array, got {type(array).__name__}")
