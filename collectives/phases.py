"""Phases that algorithms compose (public: ``from collectives import phases``); each adds one
rank's steps to a ``PlanBuilder``.

A phase works on ``ranks``, the participating world ranks in the phase's order
(the rank building the plan is ``b.rank``, and must be among them), over chunk
bounds given in elements (``block_bounds(count, parts)``, or any list of offsets). ``src``
names where this rank's contribution lives before the phase (IN, or OUT once an earlier
phase wrote it); results land in OUT. ``chan`` keeps a phase's messages apart from another
phase's between the same pair when the two run side by side (``PlanBuilder.tracks``).

- ``ring_reduce_scatter(b, ranks, bounds, src=IN, final=True, chan=0)``: m-1 steps;
  participant i ends with chunk i reduced (FINAL applied unless ``final=False``).
- ``ring_allgather(b, ranks, bounds, chan=0)``: m-1 steps; chunk i starts at participant i.
- ``recursive_doubling(b, ranks, lo, hi, src=IN, final=True, chan=0)``: lg m steps (+2 when
  m is not a power of two), ``lo:hi`` reduced everywhere.
- ``halving_doubling(b, ranks, bounds, src=IN, reduce_scatter=True, allgather=True,
  final=True, chan=0)``: recursive-halving reduce-scatter and/or recursive-doubling all-gather.
- ``tree_reduce`` / ``tree_broadcast(b, parent, children, segs, depth, max_depth, ...)``:
  pipelined trees in global steps (``segments(lo, hi, segment)`` cuts the range).
- ``binomial_reduce(b, ranks, root, lo, hi, src=IN, final=True, chan=0)`` and
  ``binomial_broadcast(b, ranks, root, lo, hi, chan=0)``: ceil(lg m) rounds, whole ranges;
  ``binomial_children(j, m)`` gives the tree.

docs/writing-an-algorithm.md shows them in use.
"""
import numpy as np

from .columns import Columns, bounds_array
from .plan import FINAL, IN, OUT, REDUCE, TMP, Step, _EMPTY, _new_step as _new, max_width


def _index(b, ranks):
    # ``ranks`` is a range for whole-world phases: O(1) to search
    return ranks.index(b.rank)


# ring ------------------------------------------------------------------------------------
# A ring phase's m-1 steps are computed at once, as arrays over the step number, and added as
# columns (``PlanBuilder.add_columns``): the steps of a 1,024-rank ring cost no Python loop.
def ring_reduce_scatter(b, ranks, bounds, src=IN, final=True, chan=0):
    """m-1 steps; participant i ends with chunk i of ``bounds`` complete in OUT."""
    m = len(ranks)
    i = _index(b, ranks)
    if m == 1:
        b.copy(OUT, bounds[0], src, bounds[0], bounds[1] - bounds[0])
        if final:
            b.final(OUT, bounds[0], bounds[1] - bounds[0])
        return
    left, right = ranks[(i - 1) % m], ranks[(i + 1) % m]
    tmp = b.scratch(max_width(bounds))
    at = bounds_array(bounds)
    step = np.arange(m - 1, dtype=np.int64)
    # step k sends chunk i-k-1 to the right and reduces chunk i-k-2 from the left into OUT
    sent = (i - step - 1) % m
    s_lo, s_hi = at[sent], at[sent + 1]
    got = (i - step - 2) % m
    lo, width = at[got], at[got + 1] - at[got]
    has = width > 0
    source = np.where(step == 0, src, OUT)
    local = [(has, step, REDUCE, OUT, lo, TMP, tmp, src, lo, width)]
    mine = int(at[i + 1] - at[i])
    if final and mine:
        local.append((None, step[-1:], FINAL, OUT, int(at[i]), mine))
    b.add_columns(Columns.of(m - 1, sends=[(s_hi > s_lo, step, right, source, s_lo, s_hi, chan)],
                             recvs=[(has, step, left, TMP, tmp, tmp + width, chan)], local=local))
    b.release(tmp)


def ring_allgather(b, ranks, bounds, chan=0):
    """m-1 steps; participant i starts with chunk i in OUT and ends with every chunk."""
    m = len(ranks)
    i = _index(b, ranks)
    if m == 1:
        return
    left, right = ranks[(i - 1) % m], ranks[(i + 1) % m]
    at = bounds_array(bounds)
    step = np.arange(m - 1, dtype=np.int64)
    # step k passes chunk i-k to the right and takes chunk i-k-1 from the left
    sent, got = (i - step) % m, (i - step - 1) % m
    s_lo, s_hi, r_lo, r_hi = at[sent], at[sent + 1], at[got], at[got + 1]
    b.add_columns(Columns.of(m - 1, sends=[(s_hi > s_lo, step, right, OUT, s_lo, s_hi, chan)],
                             recvs=[(r_hi > r_lo, step, left, OUT, r_lo, r_hi, chan)]))


# recursive halving / doubling -------------------------------------------------------------
class _Fold:
    """Non-power-of-two worlds: the first 2*extra participants pair up (2v, 2v+1) and the odd
    one of each pair stands for both in a power-of-two world of ``pof2`` virtual ranks."""

    def __init__(self, m, i):
        self.m = m
        pof2 = 1
        while pof2 * 2 <= m:
            pof2 *= 2
        self.pof2 = pof2
        self.extra = m - pof2
        self.folded_out = i < 2 * self.extra and i % 2 == 0
        self.survivor = i < 2 * self.extra and i % 2 == 1
        self.vrank = None if self.folded_out else (i // 2 if i < 2 * self.extra else i - self.extra)

    def participant(self, vrank):
        return 2 * vrank + 1 if vrank < self.extra else vrank + self.extra

    def first(self, vrank):
        """The lowest participant a virtual rank stands for."""
        return 2 * vrank if vrank < self.extra else vrank + self.extra


class _VirtualBounds:
    """Offsets of the virtual ranks' blocks, computed on demand (O(1) per lookup)."""

    def __init__(self, bounds, fold, hi):
        self.bounds, self.fold, self.hi = bounds, fold, hi
        self.pof2, self.extra = fold.pof2, fold.extra

    def __getitem__(self, v):  # fold.first(v), inlined: this runs for every step of every rank
        if v == self.pof2:
            return self.hi
        return self.bounds[2 * v if v < self.extra else v + self.extra]


def recursive_doubling(b, ranks, lo, hi, src=IN, final=True, chan=0):
    """Full-buffer exchanges with partners at distance 1, 2, 4...: lg m steps (+2 when folded)."""
    m = len(ranks)
    i = _index(b, ranks)
    n = hi - lo
    fold = _Fold(m, i)
    tmp = b.scratch(n)
    have = src
    if fold.folded_out:
        b.step()
        b.send(ranks[i + 1], src, lo, hi, chan)
        b.step()
        b.recv(ranks[i + 1], OUT, lo, hi, chan)
        b.release(tmp)
        return
    if fold.survivor:
        b.step()
        b.recv(ranks[i - 1], TMP, tmp, tmp + n, chan)
        b.reduce(OUT, lo, TMP, tmp, src, lo, n)  # the lower rank's data on the left
        have = OUT
    distance = 1
    while distance < fold.pof2:
        partner_v = fold.vrank ^ distance
        peer = ranks[fold.participant(partner_v)]
        b.step()
        b.send(peer, have, lo, hi, chan)
        b.recv(peer, TMP, tmp, tmp + n, chan)
        if fold.vrank < partner_v:
            b.reduce(OUT, lo, have, lo, TMP, tmp, n)
        else:
            b.reduce(OUT, lo, TMP, tmp, have, lo, n)
        have = OUT
        distance *= 2
    if have == src:
        b.copy(OUT, lo, src, lo, n)
    if final:
        b.final(OUT, lo, n)
    if fold.survivor:
        b.step()
        b.send(ranks[i - 1], OUT, lo, hi, chan)
    b.release(tmp)


def halving_doubling(b, ranks, bounds, src=IN, reduce_scatter=True, allgather=True, final=True, chan=0):
    """Recursive-halving reduce-scatter and/or recursive-doubling all-gather over ``bounds``
    (participant i's block is ``bounds[i]:bounds[i+1]``; blocks follow the participants even
    when the world is folded to a power of two)."""
    m = len(ranks)
    i = _index(b, ranks)
    lo, hi = bounds[0], bounds[m]
    fold = _Fold(m, i)
    if fold.folded_out:  # hand everything (or my block) to my partner, get the result back
        partner = ranks[i + 1]
        b.step()
        if reduce_scatter:
            b.send(partner, src, lo, hi, chan)
        else:
            b.send(partner, OUT, bounds[i], bounds[i + 1], chan)
        b.step()
        if allgather:
            b.recv(partner, OUT, lo, hi, chan)
        else:
            b.recv(partner, OUT, bounds[i], bounds[i + 1], chan)
        return
    # virtual rank v owns the elements of every participant it stands for
    vb = _VirtualBounds(bounds, fold, hi)
    v = fold.vrank
    have = src
    if reduce_scatter:
        tmp = b.scratch(hi - lo)
        if fold.survivor:
            b.step()
            b.recv(ranks[i - 1], TMP, tmp, tmp + hi - lo, chan)
            b.reduce(OUT, lo, TMP, tmp, src, lo, hi - lo)
            have = OUT
        # recursive halving: keep half the current range, send the other half
        first, last = 0, fold.pof2
        distance = fold.pof2 // 2
        while distance >= 1:
            partner_v = v ^ distance
            peer = ranks[fold.participant(partner_v)]
            mid = first + distance
            if v < partner_v:
                keep, give = (first, mid), (mid, last)
            else:
                keep, give = (mid, last), (first, mid)
            klo, khi = vb[keep[0]], vb[keep[1]]
            b.step()
            b.send(peer, have, vb[give[0]], vb[give[1]], chan)
            b.recv(peer, TMP, tmp, tmp + khi - klo, chan)
            if v < partner_v:
                b.reduce(OUT, klo, have, klo, TMP, tmp, khi - klo)
            else:
                b.reduce(OUT, klo, TMP, tmp, have, klo, khi - klo)
            first, last = keep
            have = OUT
            distance //= 2
        if have == src:  # a world of one
            b.copy(OUT, lo, src, lo, hi - lo)
        have = OUT
        if final:
            b.final(OUT, vb[v], vb[v + 1] - vb[v])
        b.release(tmp)
        if not allgather and fold.survivor:  # the folded partner's block goes home
            b.step()
            b.send(ranks[i - 1], OUT, bounds[i - 1], bounds[i], chan)
    else:
        if fold.survivor:
            b.step()
            b.recv(ranks[i - 1], OUT, bounds[i - 1], bounds[i], chan)
    if allgather:
        # recursive doubling: exchange the range held so far with partners at 1, 2, 4...
        first, last = v, v + 1
        distance = 1
        while distance < fold.pof2:
            partner_v = v ^ distance
            peer = ranks[fold.participant(partner_v)]
            pfirst = partner_v - (partner_v % distance)
            b.step()
            b.send(peer, OUT, vb[first], vb[last], chan)
            b.recv(peer, OUT, vb[pfirst], vb[pfirst + distance], chan)
            first, last = min(first, pfirst), max(last, pfirst + distance)
            distance *= 2
        if fold.survivor:
            b.step()
            b.send(ranks[i - 1], OUT, lo, hi, chan)


# trees -------------------------------------------------------------------------------------
def segments(lo, hi, segment):
    """Split ``lo:hi`` into segments of at most ``segment`` elements (none when empty)."""
    return [(s, min(s + segment, hi)) for s in range(lo, hi, max(1, segment))]


def tree_reduce(b, parent, children, segs, depth, max_depth, src=IN, final=True, chan=0):
    """Pipelined reduction up a tree, in global steps: a rank at ``depth`` passes segment k
    to its parent in step k + max_depth - depth, and receives segment k from its children
    one step earlier, so every message is sent and received in the same step (no rank ever
    waits on a later step of another; two trees side by side cannot deadlock). The root
    (parent None) ends with the reduced segments in OUT. ``max_depth`` must be the same on
    every rank and at least the tree's depth."""
    nseg = len(segs)
    if not nseg:
        return
    if parent is None and not children:  # a tree of one
        for lo, hi in segs:
            b.copy(OUT, lo, src, lo, hi - lo)
            if final:
                b.final(OUT, lo, hi - lo)
        return
    width = max(hi - lo for lo, hi in segs)
    tmp = [b.scratch(width) for _ in children]
    up = OUT if children else src
    root_final = parent is None and final
    pairs = list(zip(children, tmp))
    rest = tmp[1:]
    steps = []  # built here and added at once (b.add_steps): tens of thousands per plan at scale
    append = steps.append
    for t in range(nseg + max_depth + 1):
        recvs = local = sends = ()
        k = t - (max_depth - depth - 1)  # the segment arriving from the children
        if 0 <= k < nseg:
            lo, hi = segs[k]
            n = hi - lo
            if children:
                recvs = tuple([(child, TMP, slot, slot + n, chan) for child, slot in pairs])
                local = ((REDUCE, OUT, lo, src, lo, TMP, tmp[0], n),)
                if rest:
                    local += tuple([(REDUCE, OUT, lo, OUT, lo, TMP, slot, n) for slot in rest])
            if root_final:
                local += ((FINAL, OUT, lo, n),)
        k = t - (max_depth - depth)  # the segment going up
        if parent is not None and 0 <= k < nseg:
            sends = ((parent, up, segs[k][0], segs[k][1], chan),)
        append(_new(Step, (sends, recvs, local)) if sends or recvs or local else _EMPTY)
    b.add_steps(steps)
    if tmp:
        b.release(tmp[0])


def tree_broadcast(b, parent, children, segs, depth, max_depth, chan=0):
    """Pipelined broadcast down a tree from OUT at the root, in global steps: a rank at
    ``depth`` receives segment k in step k + depth - 1 and forwards it in step k + depth."""
    nseg = len(segs)
    steps = []
    append = steps.append
    for t in range(nseg + max_depth + 1):
        recvs = sends = ()
        k = t - depth + 1
        if parent is not None and 0 <= k < nseg:
            recvs = ((parent, OUT, segs[k][0], segs[k][1], chan),)
        k = t - depth
        if children and 0 <= k < nseg:
            lo, hi = segs[k]
            sends = tuple([(child, OUT, lo, hi, chan) for child in children])
        append(_new(Step, (sends, recvs, ())) if sends or recvs else _EMPTY)
    b.add_steps(steps)


def binomial_children(j, m):
    """Parent and children of relative index j in a binomial tree of m rooted at 0."""
    parent = None
    mask = 1
    while mask < m:
        if j & mask:
            parent = j - mask
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if j + mask < m:
            children.append(j + mask)
        mask >>= 1
    return parent, children


def binomial_broadcast(b, ranks, root, lo, hi, chan=0):
    """Broadcast OUT[lo:hi] from participant ``root``: ceil(lg m) rounds."""
    m = len(ranks)
    j = (_index(b, ranks) - root) % m
    parent, children = binomial_children(j, m)
    if parent is not None:
        b.step()
        b.recv(ranks[(parent + root) % m], OUT, lo, hi, chan)
    for child in children:
        b.step()
        b.send(ranks[(child + root) % m], OUT, lo, hi, chan)


def binomial_reduce(b, ranks, root, lo, hi, src=IN, final=True, chan=0):
    """Reduce to participant ``root`` along a binomial tree: ceil(lg m) rounds, full buffers."""
    m = len(ranks)
    j = (_index(b, ranks) - root) % m
    parent, children = binomial_children(j, m)
    n = hi - lo
    tmp = b.scratch(n)
    have = src
    for child in reversed(children):  # nearest child first: it finishes first
        b.step()
        b.recv(ranks[(child + root) % m], TMP, tmp, tmp + n, chan)
        b.reduce(OUT, lo, have, lo, TMP, tmp, n)
        have = OUT
    if parent is not None:
        b.step()
        b.send(ranks[(parent + root) % m], have, lo, hi, chan)
    else:
        if have == src:
            b.copy(OUT, lo, src, lo, n)
        if final:
            b.final(OUT, lo, n)
    b.release(tmp)
