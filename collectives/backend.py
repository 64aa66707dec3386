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
    """CuPy arrays on one device: one backend per device, so that scratch buffers (cached per
    communicator under ``name``) are allocated where the call's arrays live.

    Reductions are CuPy ufuncs called with ``out=`` on the current stream; CuPy requires the
    current device to be the arrays' device (``with cupy.cuda.Device(d):``), as for any CuPy
    kernel. ``synchronize`` waits for that stream, which the executor does before every
    step's messages so that no transport reads memory a kernel is still writing.
    """

    is_device = True

    def __init__(self, device_id=0):
        import cupy

        self.xp = cupy
        self.device_id = device_id
        self.name = f"cupy:{device_id}"
        self._device = cupy.cuda.Device(device_id)

    def __repr__(self):
        return f"CupyBackend(device={self.device_id})"

    def empty(self, count, dtype):
        with self._device:
            return self.xp.empty(count, dtype=dtype)

    def ufunc(self, name):
        return getattr(self.xp, name)

    def synchronize(self):
        with self._device:
            self.xp.cuda.get_current_stream().synchronize()

    def flat_contiguous(self, array):
        with self._device:
            return self.xp.ascontiguousarray(array).reshape(-1)

    def is_contiguous(self, array):
        return array.flags.c_contiguous

    def copyto(self, dst, src):
        with self._device:
            self.xp.copyto(dst, src)


NUMPY = NumpyBackend()
_cupy_backends = {}


_cupy = None


def _cupy_backend(array):
    global _cupy
    if _cupy is None:
        import cupy as _cupy_module

        _cupy = _cupy_module
    if not isinstance(array, _cupy.ndarray):
        raise TypeError(f"device arrays must be CuPy arrays, got {type(array).__name__} "
                        f"(cupy.asarray wraps any __cuda_array_interface__ array without a copy)")
    device_id = array.device.id
    backend = _cupy_backends.get(device_id)
    if backend is None:
        backend = _cupy_backends[device_id] = CupyBackend(device_id)
    return backend


def backend_for(array):
    """NumPy for host arrays; for CuPy arrays (``__cuda_array_interface__``), the backend of their device."""
    if isinstance(array, np.ndarray):
        return NUMPY
    if hasattr(array, "__cuda_array_interface__"):
        return _cupy_backend(array)
    raise TypeError(f"expected a NumPy or CuPy array, got {type(array).__name__}")
