"""Shared-memory all-reduce: every rank reduces its block straight from its peers' memory.

Idea: on one node, ranks can read each other's memory. Each rank publishes its
input in an MPI-3 shared window (``Split_type(COMM_TYPE_SHARED)`` +
``Win.Allocate_shared``), then reduces block i (numpy.array_split bounds) of
the result by reading block i of every rank's window in rank order, publishes
the finished block, and copies the other ranks' finished blocks into its
output. Two barriers a call; the window has two halves used in turn, so a
fast rank's next call never overwrites memory a slow rank is still reading.

The plan (what the simulator, the threaded world and communicators without
shared memory run) moves the same data with messages, in two steps: block j
of every input goes to rank j (n-1 sends), is reduced there in rank order,
and the finished block goes to every other rank (n-1 sends).

Steps: 2 (plus two barriers through shared memory).
Bytes sent per rank: 2(n-1)/n N by messages; through shared memory each rank
writes N (publish) + N/n and reads N + (n-1)/n N, with no MPI copies.
Cost: as messages 2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma; on a node,
about 2 barriers + (2N + 2N(n-1)/n) / memory bandwidth + N/n n gamma.
Limits: one node only (the fast path needs every rank in one shared-memory
domain; otherwise the message plan runs); the window holds 2N bytes per rank.
Reference: MPI-3.1 standard, section 11.2.3 (Win.Allocate_shared); the
"one-shot/two-shot" all-reduce of Jocksch et al., "Optimised all-to-all
communication on multicore architectures applied to FFTs" (2020) and NCCL's
intra-node LL protocols work the same way.
"""
import numpy as np

from ..plan import IN, OUT, TMP, PlanBuilder, block_bounds

NAME = "shm"
OPTIONS = {}


def build(rank, size, count, itemsize=1):
    b = PlanBuilder(NAME, rank, size, count)
    bounds = block_bounds(count, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    width = hi - lo
    # reduce-scatter: block j of every input goes to rank j, reduced there in rank order
    slots = {peer: b.scratch(width) for peer in range(size) if peer != rank}
    b.step()
    for peer in range(size):
        if peer != rank:
            b.send(peer, IN, bounds[peer], bounds[peer + 1])
            b.recv(peer, TMP, slots[peer], slots[peer] + width)
    # own contribution first (IN may be OUT, in place), then the others in rank order
    others = [peer for peer in range(size) if peer != rank]
    if not others:
        b.copy(OUT, lo, IN, lo, width)
    else:
        b.reduce(OUT, lo, IN, lo, TMP, slots[others[0]], width)
        for peer in others[1:]:
            b.reduce(OUT, lo, OUT, lo, TMP, slots[peer], width)
    b.final(OUT, lo, width)
    # all-gather: the finished block goes to every other rank
    b.step()
    for peer in range(size):
        if peer != rank:
            b.send(peer, OUT, lo, hi)
            b.recv(peer, OUT, bounds[peer], bounds[peer + 1])
    return b.build()


def cost(p, nbytes, alpha, beta, gamma):
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma


def shared_cost(p, nbytes, alpha, beta_mem, gamma):
    """Cost of the shared-memory path: two barriers and memory traffic, no messages."""
    if p == 1:
        return 0.0
    lg = (p - 1).bit_length()
    return 2 * lg * alpha + (2 * nbytes + 2 * nbytes * (p - 1) / p) * beta_mem + nbytes * gamma


# the shared-memory fast path ----------------------------------------------------------------
def available(comm):
    """True when ``comm`` is an MPI communicator whose ranks all share one node."""
    if getattr(comm, "mpi_comm", None) is None or comm.size == 1:
        return False
    colors = comm.node_colors()
    return all(c == colors[0] for c in colors)


class _Window:
    def __init__(self, comm, nbytes):
        from mpi4py import MPI

        self.nbytes = nbytes
        self.win = MPI.Win.Allocate_shared(2 * nbytes, 1, comm=comm.mpi_comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.segments = []
        for peer in range(comm.size):
            memory, _ = self.win.Shared_query(peer)
            self.segments.append(np.frombuffer(memory, dtype=np.uint8, count=2 * nbytes))
        self.parity = 0

    def views(self, dtype, count):
        half = self.parity * self.nbytes
        self.parity ^= 1
        n = count * dtype.itemsize
        return [seg[half:half + n].view(dtype) for seg in self.segments]

    def free(self):
        self.win.Unlock_all()
        self.win.Free()


def _sync(comm, window):
    window.win.Sync()
    comm.barrier()
    window.win.Sync()


def run(comm, inbuf, outbuf, reduce_fn, final_fn):
    """All-reduce through shared memory; ``outbuf`` may be ``inbuf``. Returns False when the
    fast path does not apply (the caller then runs the plan)."""
    if not available(comm) or not isinstance(inbuf, np.ndarray):
        return False
    count, dtype = inbuf.size, inbuf.dtype
    nbytes = max(count * dtype.itemsize, 1)
    window = comm.__dict__.get("_shm_window")
    if window is None or window.nbytes < nbytes:  # every rank calls with the same size: collective
        if window is not None:
            window.free()
        window = comm._shm_window = _Window(comm, max(nbytes, 1 << 16))
    views = window.views(dtype, count)
    mine = views[comm.rank]
    bounds = block_bounds(count, comm.size)
    lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
    # publish
    np.copyto(mine, inbuf)
    _sync(comm, window)
    # reduce-scatter: my block from every rank's window, in rank order
    block = outbuf[lo:hi]
    others = [peer for peer in range(comm.size) if peer != comm.rank]
    reduce_fn(views[comm.rank][lo:hi], views[others[0]][lo:hi], out=block)  # same order as the plan
    for peer in others[1:]:
        reduce_fn(block, views[peer][lo:hi], out=block)
    if final_fn is not None:
        final_fn(block)
    mine[lo:hi] = block
    _sync(comm, window)
    # all-gather: the other ranks' finished blocks
    for peer in range(comm.size):
        if peer != comm.rank:
            outbuf[bounds[peer]:bounds[peer + 1]] = views[peer][bounds[peer]:bounds[peer + 1]]
    return True
