"""Shared-memory all-reduce: every rank reduces its block straight from its peers' memory.

Idea: on one node, ranks can read each other's memory. Each rank publishes the
blocks of its input that its peers reduce (all but its own) in an MPI-3 shared
window (``Split_type(COMM_TYPE_SHARED)`` + ``Win.Allocate_shared``), then
reduces block i (numpy.array_split bounds) of the result from its own input
and block i of every peer's window, in rank order, publishes
the finished block, and copies the other ranks' finished blocks into its
output. Two barriers a call. A small window (up to 1 MiB of data) has two
halves used in turn, so a fast rank's next call never overwrites memory a slow
rank is still reading; a large one has one region of the message's size, which
is safe while the shape repeats (a rank's next publish never touches its own
block, the only part peers read after the second barrier) and costs one more
barrier on a call whose shape differs from the last.
A fixed-size header before the data (call sequence number, count, dtype, op)
is published with it; after the first barrier every rank compares every
header before reading any peer's data, so mismatched calls raise the same
MismatchError on every rank instead of giving wrong results, and the window
grows only once every rank agrees on the size (Allocate_shared is collective).

The plan (what the simulator, the threaded world and communicators without
shared memory run) moves the same data with messages, in two steps: block j
of every input goes to rank j (n-1 sends), is reduced there in rank order,
and the finished block goes to every other rank (n-1 sends).

Steps: 2 (plus two barriers through shared memory).
Bytes sent per rank: 2(n-1)/n N by messages; through shared memory each rank
writes (n-1)/n N (publish) + N/n (its finished block) and reads (n-1)/n N
(peers' inputs) + (n-1)/n N (peers' finished blocks), with no MPI copies.
Cost: as messages 2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma; on a node,
about 2 barriers + (2N + 2N(n-1)/n) / memory bandwidth + N/n n gamma.
Limits: one node only (the fast path needs every rank in one shared-memory
domain; otherwise the message plan runs); the window holds N bytes for
messages over 1 MiB (2N, at least 128 KiB, below) and a 64-byte header per rank.
Reference: MPI-3.1 standard, section 11.2.3 (Win.Allocate_shared); the
"one-shot/two-shot" all-reduce of Jocksch et al., "Optimised all-to-all
communication on multicore architectures applied to FFTs" (2020) and NCCL's
intra-node LL protocols work the same way.
"""
import zlib

import numpy as np

from ..errors import MismatchError
from ..ops import DTYPES, OPS
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
# Each rank's segment starts with a fixed-size header, written before the data and read by
# every rank after the first barrier, before any peer's data is read: (call sequence number,
# count, dtype code, op code). Every rank reads the same headers, so when they differ every
# rank raises the same MismatchError at the same point and none is left waiting. The window's
# capacity is the same on every rank (a fixed first size, then grown only once the headers
# agree), so every rank decides to reallocate together and Allocate_shared stays collective.
_HEADER = 64  # bytes: 8 int64 slots, keeps the data halves 64-byte aligned
_FIELDS = ("call sequence", "op", "dtype", "count")  # the slots, in the order differences are named
_SEQ, _OP, _DTYPE, _COUNT = range(4)
_FIRST_CAPACITY = 1 << 16  # bytes per half of the first window, whatever the first call's count
_DOUBLE_MAX = 1 << 20  # windows up to this capacity have two halves; larger ones a single region


def available(comm):
    """True when ``comm`` is an MPI communicator whose ranks all share one node."""
    if getattr(comm, "mpi_comm", None) is None or comm.size == 1:
        return False
    colors = comm.node_colors()
    return all(c == colors[0] for c in colors)


class _Window:
    def __init__(self, comm, nbytes, seq=0):
        from mpi4py import MPI

        self.nbytes = nbytes  # capacity of each half, the same on every rank
        self.seq = seq
        self.halves = 2 if nbytes <= _DOUBLE_MAX else 1
        self.shape = None  # (count, itemsize) of the last call that every rank agreed on
        total = _HEADER + self.halves * nbytes
        comm.barrier("allocating the shared window")  # Allocate_shared blocks until every rank calls it
        self.win = MPI.Win.Allocate_shared(total, 1, comm=comm.mpi_comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.segments, self.headers = [], []
        for peer in range(comm.size):
            memory, _ = self.win.Shared_query(peer)
            segment = np.frombuffer(memory, dtype=np.uint8, count=total)
            self.headers.append(memoryview(segment[:_HEADER]).cast("q"))
            self.segments.append(segment[_HEADER:])
        self.header = self.headers[comm.rank]

    def views(self, dtype, count, seq):
        half = (seq & 1) * self.nbytes if self.halves == 2 else 0
        n = count * dtype.itemsize
        return [seg[half:half + n].view(dtype) for seg in self.segments]

    def nbytes_held(self):
        return self.halves * self.nbytes

    def free(self):
        self.segments = self.headers = self.header = None
        self.win.Unlock_all()
        self.win.Free()


def _sync(comm, window):
    window.win.Sync()
    comm.barrier()
    window.win.Sync()


_dtype_codes = {}
_op_codes = {}
_codes = {}  # (dtype, reduce ufunc, no final step) -> (dtype code, op code)


def _dtype_code(dtype):
    code = _dtype_codes.get(dtype)
    if code is None:
        code = _dtype_codes[dtype] = DTYPES.index(dtype) if dtype in DTYPES else 1000 + dtype.num
    return code


def _op_code(reduce_fn, final_fn):
    key = (reduce_fn, final_fn is None)
    code = _op_codes.get(key)
    if code is None:  # the ufunc's name, and whether a final step follows (avg = add, then divide)
        name = getattr(reduce_fn, "__name__", repr(reduce_fn))
        code = _op_codes[key] = zlib.crc32(name.encode()) << 1 | (final_fn is not None)
    return code


def _show(field, value):
    if field == "dtype":
        if 0 <= value < len(DTYPES):
            return str(DTYPES[value])
        return f"dtype #{value - 1000}"
    if field == "op":
        for op, ufunc in OPS.items():
            if zlib.crc32(ufunc.encode()) == value >> 1 and (op == "avg") == bool(value & 1):
                return op
        return f"#{value:08x}"
    return str(value)


def _mismatch(headers):
    """The MismatchError for headers that differ: the same text on every rank."""
    table = [[int(h[slot]) for slot in range(len(_FIELDS))] for h in headers]
    for slot in (_SEQ, _OP, _DTYPE, _COUNT):
        field = _FIELDS[slot]
        values = [row[slot] for row in table]
        if any(v != values[0] for v in values):
            groups = {}
            for rank, v in enumerate(values):
                groups.setdefault(v, []).append(rank)
            detail = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {_show(field, v)}"
                               for v, r in groups.items())
            differ = ", ".join(str(r) for r, v in enumerate(values) if v != values[0])
            return MismatchError(f"allreduce({NAME}): ranks disagree on {field} (ranks {differ} differ from "
                                 f"rank 0): {detail}")
    return MismatchError(f"allreduce({NAME}): ranks disagree on the call")  # pragma: no cover


def window_bytes(comm):
    """Bytes of this rank's window segment for ``comm`` (0 before its first shm call)."""
    window = comm.session.windows.get(NAME)
    return window.nbytes_held() if window is not None else 0


def _publish(segment, inbuf, lo, hi):
    """Copy the blocks the peers will read: all but my own, which only I reduce."""
    if lo:
        np.copyto(segment[:lo], inbuf[:lo])
    if hi < inbuf.size:
        np.copyto(segment[hi:], inbuf[hi:])


def run(comm, inbuf, outbuf, reduce_fn, final_fn):
    """All-reduce through shared memory; ``outbuf`` may be ``inbuf``. Returns False when the
    fast path does not apply (the caller then runs the plan). Ranks that disagree on count,
    dtype, op or call sequence all raise the same MismatchError before any peer data is read."""
    if not available(comm) or not isinstance(inbuf, np.ndarray):
        return False
    count, dtype = inbuf.size, inbuf.dtype
    nbytes = count * dtype.itemsize
    windows = comm.session.windows  # the session frees it with the communicator
    window = windows.get(NAME)
    if window is None:  # every rank's first call: the same fixed size everywhere, so collective
        window = windows[NAME] = _Window(comm, _FIRST_CAPACITY)
    seq = window.seq = window.seq + 1
    codes = _codes.get((dtype, reduce_fn, final_fn is None))
    if codes is None:
        codes = _codes[(dtype, reduce_fn, final_fn is None)] = (_dtype_code(dtype), _op_code(reduce_fn, final_fn))
    dtype_code, op_code = codes
    header = window.header
    header[_SEQ], header[_OP], header[_DTYPE], header[_COUNT] = seq, op_code, dtype_code, count
    rank = comm.rank
    bounds = block_bounds(count, comm.size)
    lo, hi = bounds[rank], bounds[rank + 1]
    shape = (count, dtype.itemsize)
    # publish the data with the header (one barrier covers both) when it fits and, in a
    # single-region window, the shape repeats; otherwise once the headers agree
    early = nbytes <= window.nbytes and (window.halves == 2 or shape == window.shape)
    if early:
        views = window.views(dtype, count, seq)
        _publish(views[rank], inbuf, lo, hi)
    _sync(comm, window)
    for h in window.headers:  # every rank checks every header before reading any peer's data
        if h[_COUNT] != count or h[_DTYPE] != dtype_code or h[_SEQ] != seq or h[_OP] != op_code:
            error = _mismatch(window.headers)
            error.comm_usable = True  # every rank raises it at the same point: nothing is in flight
            _sync(comm, window)  # no rank leaves (and writes its next header) before all have read
            raise error
    if not early:  # the headers agree, so every rank takes this branch, and grows together
        if nbytes > window.nbytes:
            window.free()
            grown = max(nbytes, 2 * window.nbytes) if nbytes <= _DOUBLE_MAX else nbytes
            window = windows[NAME] = _Window(comm, grown, seq)
        # (a single-region window: every rank is past the last call's reads, so publish now)
        views = window.views(dtype, count, seq)
        _publish(views[rank], inbuf, lo, hi)
        _sync(comm, window)
    window.shape = shape
    mine = views[rank]
    # reduce-scatter: my block, from my own input and every peer's window, in rank order
    block = outbuf[lo:hi]
    others = [peer for peer in range(comm.size) if peer != rank]
    reduce_fn(inbuf[lo:hi], views[others[0]][lo:hi], out=block)  # same order as the plan
    for peer in others[1:]:
        reduce_fn(block, views[peer][lo:hi], out=block)
    if final_fn is not None:
        final_fn(block)
    mine[lo:hi] = block
    _sync(comm, window)
    # all-gather: the other ranks' finished blocks
    for peer in range(comm.size):
        if peer != rank:
            outbuf[bounds[peer]:bounds[peer + 1]] = views[peer][bounds[peer]:bounds[peer + 1]]
    return True
