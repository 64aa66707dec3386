"""Cross-memory attach: one copy straight out of another process's memory (Linux).

``process_vm_readv(2)`` copies from a peer process's address space into ours in the kernel, the
way MPI libraries move large messages between ranks of a node (MPICH's and Open MPI's "CMA"
single-copy paths). The shared-memory transport uses it for a message whose receiver only
copies it: the receiver reads the sender's buffer where it is, so the sender stages nothing.
It needs the right to trace the peer (same user, and YAMA's ptrace_scope allowing it), which
``usable`` finds out by trying; everywhere else the transport stages the message instead.
"""
import ctypes
import os
import sys


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_readv = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _readv = _libc.process_vm_readv
        _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                           ctypes.c_ulong, ctypes.c_ulong]
        _readv.restype = ctypes.c_ssize_t
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        _readv = None


def supported():
    """Whether this platform has process_vm_readv at all."""
    return _readv is not None and os.environ.get("COLLECTIVES_CMA", "1") != "0"


def read(pid, address, dst):
    """Copy ``dst.nbytes`` bytes at ``address`` in process ``pid`` into the contiguous array ``dst``."""
    want = dst.nbytes
    if not want:
        return
    local_base = dst.ctypes.data
    done = 0
    while done < want:
        local = _IOVec(local_base + done, want - done)
        remote = _IOVec(address + done, want - done)
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from process {pid}: {os.strerror(err)}")
        done += got


def usable(pid, address, expected):
    """True when 8 bytes at ``address`` in process ``pid`` read back as the int ``expected``."""
    if not supported():
        return False
    import numpy as np

    probe = np.zeros(1, np.int64)
    try:
        read(pid, address, probe)
    except OSError:
        return False
    return int(probe[0]) == expected
