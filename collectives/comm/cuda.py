"""CUDA support for the MPI transport: is the MPI library CUDA-aware, and host staging if not.

``cuda_aware()`` answers whether device buffers may go to MPI as they are.
``COLLECTIVES_CUDA_AWARE=1`` or ``=0`` decides; otherwise the MPI library is
asked: mpi4py's ``MPI.Query_cuda_support`` where it has one, else the
``MPIX_Query_cuda_support`` extension (MPICH, Open MPI) looked up with ctypes in
the libmpi this process has loaded. Without an answer the library is taken to
be host-only, the safe choice: a host-only MPI handed a device pointer crashes.

``Stager`` moves one plan step's messages through page-locked (pinned) host
memory. It keeps two pools of pinned memory and alternates between them from
one step to the next (double buffering): a step's host-to-device copies are
only enqueued on the stream, never waited for, and the next step lands its
messages in the other pool meanwhile; a pool is reused only after the event
recorded behind its last copies. Inside a step, every send's device-to-host
copy is enqueued at once, each with its own event, and a send is posted as
soon as its own copy is done, so later copies overlap earlier transfers; each
received message is copied to the device as soon as it arrives, overlapping the
messages still in flight. The wire format is the host path's (one MPI message
per plan message), so staged, CUDA-aware and NumPy ranks interoperate.

Only this module imports CuPy, and only when a device buffer is seen.
"""
import ctypes
import os

_ENV = "COLLECTIVES_CUDA_AWARE"
_detected = None
_detected_how = None


def is_device_buffer(buf):
    return hasattr(buf, "__cuda_array_interface__")


def _env_override():
    raw = os.environ.get(_ENV, "").strip()
    if raw == "":
        return None
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{_ENV} must be 0 or 1, got {raw!r}")


def _loaded_libmpi():
    """Paths of the libmpi shared objects mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi"))


def detect_cuda_support():
    """(answer, how): what the MPI library says about CUDA, ignoring the environment override."""
    from mpi4py import MPI

    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query()), "mpi4py MPI.Query_cuda_support()"
        except Exception:  # noqa: BLE001 - an MPI without the extension
            pass
    for path in _loaded_libmpi():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = getattr(lib, "MPIX_Query_cuda_support", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            return bool(fn()), f"MPIX_Query_cuda_support() in {os.path.basename(path)}"
    return False, "no CUDA query in this MPI library (taken as host-only)"


def cuda_aware():
    """True when device buffers go straight to MPI; False when they are staged through host memory."""
    forced = _env_override()
    if forced is not None:
        return forced
    global _detected, _detected_how
    if _detected is None:
        _detected, _detected_how = detect_cuda_support()
    return _detected


def describe():
    """One line saying which path device buffers take, and why."""
    forced = _env_override()
    if forced is not None:
        return f"{'CUDA-aware' if forced else 'host staging'} ({_ENV}={os.environ[_ENV]})"
    aware = cuda_aware()
    return f"{'CUDA-aware' if aware else 'host staging'} ({_detected_how})"


def _pointer(buf):
    """Device pointer and byte count of a contiguous buffer carrying __cuda_array_interface__."""
    cai = buf.__cuda_array_interface__
    strides = cai.get("strides")
    if strides is not None:
        itemsize = int(cai["typestr"][2:])
        expected = itemsize
        for extent, stride in zip(reversed(cai["shape"]), reversed(strides)):
            if extent > 1 and stride != expected:
                raise ValueError("device buffers given to MPI must be C-contiguous")
            expected *= extent
    return cai["data"][0], buf.nbytes


class _Pool:
    __slots__ = ("host", "event")

    def __init__(self):
        self.host = None   # pinned numpy uint8 array
        self.event = None  # recorded after the last copies that read or write ``host``


class Stager:
    """Pinned host staging for one communicator: two pools of page-locked memory, used in turn."""

    def __init__(self):
        import cupy
        import cupyx

        self._cupy = cupy
        self._empty_pinned = cupyx.empty_pinned
        runtime = cupy.cuda.runtime
        self._memcpy_async = runtime.memcpyAsync
        self._kind = runtime.memcpyDefault  # unified addressing: the pointers say the direction
        self._pools = (_Pool(), _Pool())
        self._turn = 0

    def _pool(self, nbytes):
        pool = self._pools[self._turn]
        self._turn ^= 1
        if pool.event is not None:
            pool.event.synchronize()  # the copies of two steps ago are done with this memory
            pool.event = None
        if pool.host is None or pool.host.nbytes < nbytes:
            pool.host = None
            pool.host = self._empty_pinned(max(nbytes, 4096), dtype="uint8")
        return pool

    def exchange(self, sends, recvs, tag, post_recv, post_send, wait):
        """Stage one step. ``post_recv(host_view, peer, tag)`` / ``post_send`` post an MPI request
        and return our request object; ``wait(reqs, on_done)`` waits for all, calling
        ``on_done(index)`` as each completes."""
        cupy = self._cupy
        stream = cupy.cuda.get_current_stream()
        sptrs = [_pointer(buf) for _, buf, _ in sends]
        rptrs = [_pointer(buf) for _, buf, _ in recvs]
        soffsets, send_end = _layout(sptrs, 0)
        roffsets, recv_end = _layout(rptrs, send_end)
        pool = self._pool(recv_end)
        host = pool.host
        host_ptr = host.ctypes.data

        # receives first, straight into pinned memory
        reqs = [post_recv(host[off:off + n], peer, tag + chan)
                for (peer, _, chan), (_, n), off in zip(recvs, rptrs, roffsets)]
        # every device-to-host copy at once, one event each
        events = []
        for (ptr, n), off in zip(sptrs, soffsets):
            if n:
                self._memcpy_async(host_ptr + off, ptr, n, self._kind, stream.ptr)
            event = cupy.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
            events.append(event)
        # post each send once its own copy has landed, in plan order (MPI's matching order)
        for (peer, _, chan), (_, n), event, off in zip(sends, sptrs, events, soffsets):
            event.synchronize()
            reqs.append(post_send(host[off:off + n], peer, tag + chan))

        nrecv = len(recvs)

        def on_done(index):
            if index < nrecv:
                ptr, n = rptrs[index]
                if n:
                    self._memcpy_async(ptr, host_ptr + roffsets[index], n, self._kind, stream.ptr)

        try:
            wait(reqs, on_done)
        finally:
            # the host-to-device copies stay in flight on the stream: work queued after them
            # (the step's reductions) is ordered behind them; this pool waits for them before reuse
            event = cupy.cuda.Event(block=False, disable_timing=True)
            event.record(stream)
            pool.event = event


_ALIGN = 256


def _layout(ptrs, start):
    """Offsets of consecutive regions of the given sizes from ``start``, each 256-byte aligned."""
    offsets = []
    offset = start
    for _, n in ptrs:
        offset = -(-offset // _ALIGN) * _ALIGN
        offsets.append(offset)
        offset += n
    return offsets, offset
