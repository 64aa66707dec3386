"""Every rank's plan at once, as numpy columns: what the simulator reads (``collectives.flat``),
made without a Plan object per rank.

An algorithm may offer ``build_all(size, count, itemsize, **params)``: the entries of every
rank's plan, exactly those its ``build`` makes, in the same steps and the same order, or None
where it has no such path (small or uneven cases; the simulator then builds every plan). The
plans stay the definition: tests/test_bulk.py checks that ``build_all`` flattens to what the
plans do. Entries are added in chunks over many ranks at once, each row placed at ``(rank, t)``:
``t`` a global step index shared by all ranks (phases one after another, side-by-side tracks at
the same ``t``, as ``PlanBuilder.join`` zips them); within one ``(rank, t)`` entries keep the
order of their chunks. Steps with no entry are dropped, as ``PlanBuilder.build`` drops them.
"""
import numpy as np

from ..plan import FINAL, IN, OUT, REDUCE, TMP

_I = np.int64


class Columns:
    """Collects every rank's entries (see the module docstring); ``finish()`` sorts them into
    step order and counts them per step."""

    def __init__(self, algorithm, p, count):
        self.algorithm, self.p, self.count = algorithm, p, count
        self.in_count = np.full(p, count, _I)
        self.out_count = np.full(p, count, _I)
        self.tmp_count = np.zeros(p, _I)
        self._parts = ([], [], [])  # sends, receives, local operations

    def _add(self, which, fields):
        fields = np.broadcast_arrays(*[np.asarray(x, _I) for x in fields])
        if fields[0].size:
            self._parts[which].append([x.ravel() for x in fields])

    def send(self, rank, t, peer, buf, lo, hi, chan=0):
        self._add(0, (rank, t, peer, buf, lo, hi, chan))

    def recv(self, rank, t, peer, buf, lo, hi, chan=0):
        self._add(1, (rank, t, peer, buf, lo, hi, chan))

    def op(self, rank, t, kind, dst, dlo, a=0, alo=0, b=0, blo=0, n=0):
        """A local operation, decoded: a and b 0 where the kind has no such operand."""
        self._add(2, (rank, t, kind, dst, dlo, a, alo, b, blo, n))

    def finish(self):
        """Sorted columns: ``nsteps`` per rank; per step (ranks in order) the number of sends,
        receives and local operations; then ``sends`` and ``recvs`` (peer, buf, lo, hi, chan) and
        ``local`` (kind, dst, dlo, a, alo, b, blo, n), each a list of arrays."""
        widths = (5, 5, 8)
        T = 1 + max((int(c[1].max()) for part in self._parts for c in part), default=0)
        cells, columns = [], []
        for part, width in zip(self._parts, widths):
            if not part:
                cells.append(np.zeros(0, _I))
                columns.append([np.zeros(0, _I) for _ in range(width)])
                continue
            cell = np.concatenate([c[0] * T + c[1] for c in part])
            order = None if len(cell) < 2 or (cell[1:] >= cell[:-1]).all() else np.argsort(cell, kind="stable")
            cols = []
            for j in range(width):
                col = np.concatenate([c[2 + j] for c in part])
                cols.append(col if order is None else col[order])
            cells.append(cell if order is None else cell[order])
            columns.append(cols)
        self._parts = ([], [], [])
        counts = [np.bincount(cell, minlength=self.p * T) for cell in cells]
        live = (counts[0] + counts[1] + counts[2]) > 0
        self.nsteps = live.reshape(self.p, T).sum(axis=1).astype(_I)
        self.per_step = [c[live].astype(_I) for c in counts]
        self.sends, self.recvs, self.local = columns
        return self


def bounds_array(bounds):
    return np.asarray(bounds.tolist() if hasattr(bounds, "tolist") else list(bounds), _I)


# ring over all ranks (participant i is rank i), every chunk non-empty ----------------------
def ring_reduce_scatter(c, t0, bl, src=IN, final=True, chan=0, tmp=0):
    """``phases.ring_reduce_scatter`` of every rank, ``ranks`` all of them in order: m-1 steps from ``t0``."""
    m = len(bl) - 1
    i = np.arange(m, dtype=_I)[:, None]
    s = np.arange(m - 1, dtype=_I)[None, :]
    t = t0 + s
    send = (i - s - 1) % m
    c.send(i, t, (i + 1) % m, np.where(s == 0, src, OUT), bl[send], bl[send + 1], chan)
    got = (i - s - 2) % m
    lo, n = bl[got], bl[got + 1] - bl[got]
    c.recv(i, t, (i - 1) % m, TMP, tmp, tmp + n, chan)
    c.op(i, t, REDUCE, OUT, lo, TMP, tmp, src, lo, n)
    if final:
        i = i[:, 0]
        c.op(i, t0 + m - 2, FINAL, OUT, bl[i], 0, 0, 0, 0, bl[i + 1] - bl[i])


def ring_allgather(c, t0, bl, chan=0):
    """``phases.ring_allgather`` of every rank over all of them: m-1 steps from ``t0``."""
    m = len(bl) - 1
    i = np.arange(m, dtype=_I)[:, None]
    s = np.arange(m - 1, dtype=_I)[None, :]
    send, got = (i - s) % m, (i - s - 1) % m
    c.send(i, t0 + s, (i + 1) % m, OUT, bl[send], bl[send + 1], chan)
    c.recv(i, t0 + s, (i - 1) % m, OUT, bl[got], bl[got + 1], chan)


def ring(name, size, count):
    """A ring all-reduce over every rank (ring.py's plans), or None where a chunk is empty."""
    if size < 2 or count < size:
        return None
    from ..plan import block_bounds

    bl = bounds_array(block_bounds(count, size))
    c = Columns(name, size, count)
    ring_reduce_scatter(c, 0, bl)
    ring_allgather(c, size - 1, bl)
    c.tmp_count[:] = int((bl[1:] - bl[:-1]).max())
    return c.finish()


# pipelined trees ---------------------------------------------------------------------------
def segments(lo, hi, segment):
    """``phases.segments`` as two arrays."""
    seg_lo = np.arange(lo, hi, max(1, segment), dtype=_I)
    return seg_lo, np.minimum(seg_lo + segment, hi)


def tree_reduce(c, t0, parent, children, depth, max_depth, segs, tmp, src=IN, final=True, chan=0):
    """``phases.tree_reduce`` of every rank (no tree of one): ``parent`` per rank (-1 at the
    root), ``children`` (ranks x 2, -1 where none), ``depth``, ``segs`` from ``segments``,
    ``tmp`` where each rank's scratch starts (one number or one per rank). Returns the phase's length in steps."""
    seg_lo, seg_hi = segs
    nseg = len(seg_lo)
    k = np.arange(nseg, dtype=_I)[None, :]
    lo, n = seg_lo[None, :], (seg_hi - seg_lo)[None, :]
    width = int(n.max())
    ranks = np.arange(len(parent), dtype=_I)
    tmp = np.broadcast_to(np.asarray(tmp, _I), ranks.shape)
    has = children[:, 0] >= 0
    for j in range(children.shape[1]):
        r = ranks[children[:, j] >= 0][:, None]
        slot = tmp[r] + j * width
        c.recv(r, t0 + k + (max_depth - depth[r] - 1), children[r, j], TMP, slot, slot + n, chan)
    for j in range(children.shape[1]):
        r = ranks[children[:, j] >= 0][:, None]
        c.op(r, t0 + k + (max_depth - depth[r] - 1), REDUCE, OUT, lo, src if j == 0 else OUT, lo, TMP,
             tmp[r] + j * width, n)
    if final:
        r = ranks[parent < 0][:, None]
        c.op(r, t0 + k + (max_depth - depth[r] - 1), FINAL, OUT, lo, 0, 0, 0, 0, n)
    r = ranks[parent >= 0][:, None]
    c.send(r, t0 + k + (max_depth - depth[r]), parent[r], np.where(has[r], OUT, src), lo, lo + n, chan)
    return nseg + max_depth + 1


def tree_broadcast(c, t0, parent, children, depth, max_depth, segs, chan=0):
    """``phases.tree_broadcast`` of every rank; returns the phase's length in steps."""
    seg_lo, seg_hi = segs
    nseg = len(seg_lo)
    k = np.arange(nseg, dtype=_I)[None, :]
    lo, hi = seg_lo[None, :], seg_hi[None, :]
    ranks = np.arange(len(parent), dtype=_I)
    r = ranks[parent >= 0][:, None]
    c.recv(r, t0 + k + depth[r] - 1, parent[r], OUT, lo, hi, chan)
    for j in range(children.shape[1]):
        r = ranks[children[:, j] >= 0][:, None]
        c.send(r, t0 + k + depth[r], children[r, j], OUT, lo, hi, chan)
    return nseg + max_depth + 1


def links(parents, kids):
    """(parent, children, depth) arrays from every rank's parent (None at the root) and children."""
    p = len(parents)
    parent = np.array([-1 if x is None else x for x in parents], _I)
    children = np.full((p, 2), -1, _I)
    for r, ch in enumerate(kids):
        children[r, :len(ch)] = ch
    depth = np.zeros(p, _I)
    up = parent.copy()
    while (up >= 0).any():
        depth += up >= 0
        up = np.where(up >= 0, parent[np.maximum(up, 0)], -1)
    return parent, children, depth
