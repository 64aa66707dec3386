"""Memory floors of an intra-node all-reduce, timed by every rank at once with plain NumPy.

On one node an all-reduce is memory traffic. Per rank, at the least, it reduces its 1/n block
from all n inputs (n-1 adds over N/n bytes, reading its own input and its peers') and copies the
peers' finished blocks, (n-1)/n N, into its output: the *zero-copy* floor, reached only when
peers read each other's arrays in place (shared arrays, ``collectives.empty``). With ordinary
arrays each rank must also copy the part of its input its peers reduce, (n-1)/n N, into memory
they can read: the *one-copy* floor. Both are timed here as the same NumPy calls on local arrays
of the same sizes, every rank at once (so the memory bus is as shared as in the real call).
"""
import numpy as np


def floor_runners(sendbuf, recvbuf, n, rank):
    """{"floor:zero-copy": (fn, fn), "floor:one-copy": (fn, fn)}: out-of-place and in-place
    timers (the same work) of the two floors for ``sendbuf``'s size."""
    count = sendbuf.size
    bounds = [count * i // n for i in range(n + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    peers = [np.ones_like(sendbuf[lo:hi]) for _ in range(n - 1)]  # stand-ins for the peers' blocks
    finished = np.ones_like(sendbuf)  # stand-in for the peers' finished blocks
    staging = np.empty_like(sendbuf)
    add = np.add

    def zero_copy():
        block = recvbuf[lo:hi]
        if peers:
            add(sendbuf[lo:hi], peers[0], block)
            for more in peers[1:]:
                add(block, more, block)
        if lo:
            np.copyto(recvbuf[:lo], finished[:lo])
        if hi < count:
            np.copyto(recvbuf[hi:], finished[hi:])

    def one_copy():
        if lo:
            np.copyto(staging[:lo], sendbuf[:lo])
        if hi < count:
            np.copyto(staging[hi:], sendbuf[hi:])
        zero_copy()
    return {"floor:zero-copy": (zero_copy, zero_copy), "floor:one-copy": (one_copy, one_copy)}
