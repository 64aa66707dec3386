"""NCCL as an oracle (and a yardstick) for device all-reduces, through CuPy's NCCL bindings.

Two ways to get NCCL's answer:

- ``NcclAllreduce(comm)``: one NCCL communicator per rank of a multi-process world
  (MPI), made collectively; the NCCL unique id goes from rank 0 to the others
  through this library's own ``broadcast``. Each rank uses its current CUDA device.
- ``single_process_allreduce(arrays, op)``: all ranks' arrays in one process, one per
  GPU (the threaded world's inputs), through ``NcclCommunicator.initAll`` and one
  NCCL group call. (CuPy's NcclCommunicator constructor holds the GIL while NCCL
  waits for its peers, so communicators cannot be made from the threads of one world.)

NCCL refuses two ranks of one communicator on the same GPU: ``unavailable_reason``
says so, as it says when CuPy or NCCL is missing, so that callers skip with that
reason and use a CuPy reference instead.
"""
import zlib

import numpy as np

# op -> name of CuPy's NCCL constant; avg needs NCCL >= 2.10
OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "min": "NCCL_MIN", "max": "NCCL_MAX", "avg": "NCCL_AVG"}
# NCCL has no 16-bit integers; bfloat16 has no CuPy dtype
DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
          "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16",
          "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}
_UNIQUE_ID_BYTES = 128


def module():
    """(cupy.cuda.nccl, None) or (None, why it cannot be used)."""
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        return None, f"no CUDA device ({exc})"
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001 - CuPy built or installed without NCCL
        return None, f"CuPy has no NCCL ({exc})"
    if not getattr(nccl, "available", True):
        return None, "CuPy reports NCCL unavailable (install nvidia-nccl for this CUDA)"
    try:
        nccl.get_version()
    except Exception as exc:  # noqa: BLE001
        return None, f"NCCL library cannot be loaded ({exc})"
    return nccl, None


def supports(op, dtype):
    """Whether NCCL reduces ``dtype`` with ``op`` (and this CuPy exposes the constants)."""
    nccl, _ = module()
    name = np.dtype(dtype).name
    return (nccl is not None and op in OPS and name in DTYPES
            and hasattr(nccl, OPS[op]) and hasattr(nccl, DTYPES[name]))


def _constants(nccl, op, dtype):
    name = np.dtype(dtype).name
    if op not in OPS or not hasattr(nccl, OPS[op]):
        raise ValueError(f"NCCL has no op {op!r} here")
    if name not in DTYPES or not hasattr(nccl, DTYPES[name]):
        raise ValueError(f"NCCL has no dtype {name}; it reduces: {', '.join(DTYPES)}")
    return getattr(nccl, OPS[op]), getattr(nccl, DTYPES[name])


def _device_key():
    import cupy

    device = cupy.cuda.Device()
    try:
        bus = device.pci_bus_id
    except Exception:  # noqa: BLE001 - older CuPy
        bus = str(device.id)
    return zlib.crc32(bus.encode())


def unavailable_reason(comm):
    """None when every rank of ``comm`` can join one NCCL communicator, else why not.

    Collective: every rank must call it (it gathers each rank's node and GPU)."""
    from collectives.comm.threaded import ThreadComm

    nccl, why = module()
    # agree on availability first, so that every rank takes the same branch
    import collectives

    ok = np.array([0 if nccl is not None else 1], dtype=np.int64)
    flags = collectives.allgather(ok, comm=comm)
    if flags.any():
        return why or f"NCCL unavailable on rank(s) {[int(r) for r in np.flatnonzero(flags)]}"
    if isinstance(comm, ThreadComm):
        return ("NCCL communicators cannot be made from the threads of one world "
                "(use single_process_allreduce on the gathered inputs)")
    colors = comm.node_colors()
    mine = np.array([colors[comm.rank], _device_key()], dtype=np.int64)
    everyone = collectives.allgather(mine, comm=comm).reshape(comm.size, 2)
    seen = {}
    for rank, (node, dev) in enumerate(everyone.tolist()):
        seen.setdefault((node, dev), []).append(rank)
    shared = [ranks for ranks in seen.values() if len(ranks) > 1]
    if shared:
        return (f"NCCL refuses two ranks of one communicator on the same GPU: ranks {shared[0]} "
                f"share a device ({comm.size} ranks on {len(seen)} GPU(s))")
    return None


class NcclAllreduce:
    """An NCCL communicator over the ranks of ``comm`` (collective to make), on the current device."""

    def __init__(self, comm):
        import collectives
        from collectives.api import as_comm

        nccl, why = module()
        if nccl is None:
            raise RuntimeError(why)
        self._nccl = nccl
        self.comm = as_comm(comm)
        uid = np.zeros(_UNIQUE_ID_BYTES, dtype=np.int16)
        if self.comm.rank == 0:
            uid = np.array(nccl.get_unique_id(), dtype=np.int16)
        uid = collectives.broadcast(uid, root=0, comm=self.comm)
        self.nccl_comm = nccl.NcclCommunicator(self.comm.size, tuple(int(v) for v in uid), self.comm.rank)

    def __call__(self, sendbuf, recvbuf=None, op="sum", stream=None):
        """All-reduce ``sendbuf`` (a contiguous CuPy array) into ``recvbuf`` (new if None); returns it."""
        import cupy

        nccl_op, nccl_dtype = _constants(self._nccl, op, sendbuf.dtype)
        if recvbuf is None:
            recvbuf = cupy.empty_like(sendbuf)
        stream = cupy.cuda.get_current_stream() if stream is None else stream
        self.nccl_comm.allReduce(sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, nccl_dtype, nccl_op,
                                 stream.ptr)
        return recvbuf

    def close(self):
        comm, self.nccl_comm = self.nccl_comm, None
        if comm is not None and hasattr(comm, "destroy"):
            comm.destroy()


def single_process_allreduce(arrays, op="sum"):
    """NCCL's all-reduce of ``arrays`` (one CuPy array per rank, each on its own GPU) in this process.

    Returns one result per input, each on its input's device. Raises ValueError when two
    arrays share a GPU (NCCL refuses that) and RuntimeError when NCCL is missing."""
    import cupy

    nccl, why = module()
    if nccl is None:
        raise RuntimeError(why)
    devices = [a.device.id for a in arrays]
    if len(set(devices)) != len(devices):
        raise ValueError(f"NCCL refuses two ranks of one communicator on the same GPU (devices {devices})")
    nccl_op, nccl_dtype = _constants(nccl, op, arrays[0].dtype)
    comms = nccl.NcclCommunicator.initAll(devices)
    outs = []
    for device, a in zip(devices, arrays):
        with cupy.cuda.Device(device):
            outs.append(cupy.empty_like(a))
    nccl.groupStart()
    for comm, device, a, out in zip(comms, devices, arrays, outs):
        with cupy.cuda.Device(device):
            comm.allReduce(a.data.ptr, out.data.ptr, a.size, nccl_dtype, nccl_op,
                           cupy.cuda.get_current_stream().ptr)
    nccl.groupEnd()
    for device in devices:
        with cupy.cuda.Device(device):
            cupy.cuda.get_current_stream().synchronize()
    for comm in comms:
        if hasattr(comm, "destroy"):
            comm.destroy()
    return outs
