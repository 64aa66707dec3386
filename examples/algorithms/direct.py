"""Direct all-reduce: an all-to-all reduce-scatter, then an all-to-all all-gather, two steps.

Idea: cut the buffer into n blocks (numpy.array_split bounds). In step 1 every rank sends
block j of its input straight to rank j and receives its own block from every other rank;
it reduces the n contributions in rank order (0, 1, ..., n-1, so the result does not depend
on arrival order) and marks its block FINAL. In step 2 it sends its finished block to every
other rank and receives theirs into place. ``fanout`` caps the messages a rank posts at
once: with fanout f each phase takes ceil((n-1)/f) steps, peers at distance 1..f first.

Steps: 2 (2 ceil((n-1)/f) with fanout f). Bytes sent per rank: 2(n-1)/n N.
Cost (alpha-beta-gamma, one send and one receive port per rank, as the simulator models):
2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma; in a network that overlaps messages the
latency term falls to 2 ceil((n-1)/f) alpha.
Limits: n-1 messages in flight per rank and N of scratch (one block per rank); many small messages on
large worlds, so it suits few ranks or networks with full bisection and cheap messages.
Reference: the "direct" (pairwise) reduce-scatter and all-gather of Thakur, Rabenseifner and
Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005.

Written only with the public API: ``python -m collectives.simulator --load
examples/algorithms/direct.py -a direct -p 1024``.
"""
import sys

import collectives
from collectives.plan import IN, OUT, TMP, PlanBuilder, block_bounds

NAME = "direct"


def _fanout(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option fanout must be a positive integer or None, got {value!r}")
    return value


OPTIONS = {"fanout": collectives.Option(default=None, check=_fanout,
                                        doc="messages a rank posts at once (None: all n-1 in one step)")}


def build(rank, size, count, itemsize=1, fanout=None):
    b = PlanBuilder(NAME, rank, size, count)
    bounds = block_bounds(count, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    width = hi - lo
    per_step = size - 1 if fanout is None else min(fanout, size - 1)
    rounds = [range(k, min(k + per_step, size)) for k in range(1, size, max(per_step, 1))]
    # scratch: one slot per peer, indexed by the peer's rank (my own slot stays unused)
    tmp = b.scratch(size * width)
    # reduce-scatter: block j of my input goes to rank j
    for distances in rounds:
        b.step()
        for d in distances:
            to, frm = (rank + d) % size, (rank - d) % size
            b.send(to, IN, bounds[to], bounds[to + 1])
            b.recv(frm, TMP, tmp + frm * width, tmp + (frm + 1) * width)
    # the n contributions of my block, folded in rank order; mine is copied to its slot first,
    # since in place OUT is IN and the fold writes OUT before it reaches my position
    b.copy(TMP, tmp + rank * width, IN, lo, width)
    b.copy(OUT, lo, TMP, tmp, width)
    for r in range(1, size):
        b.reduce(OUT, lo, OUT, lo, TMP, tmp + r * width, width)
    b.final(OUT, lo, width)
    b.release(tmp)
    # all-gather: my finished block to every rank, theirs into place
    for distances in rounds:
        b.step()
        for d in distances:
            to, frm = (rank + d) % size, (rank - d) % size
            b.send(to, OUT, lo, hi)
            b.recv(frm, OUT, bounds[frm], bounds[frm + 1])
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, fanout=None):
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma


collectives.register_algorithm(sys.modules[__name__])
