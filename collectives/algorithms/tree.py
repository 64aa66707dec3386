"""Binary tree all-reduce: pipelined reduce up a tree, then pipelined broadcast down.

Idea: ranks form a binary heap (parent of i is (i-1)//2). The buffer is cut
into s = ceil(N / segment_bytes) segments of m = N/s bytes; in each step a rank
receives one segment from each child, reduces it into its own and passes the
previous segment up, so the levels of the tree work on different segments at
once. The root's finished segments then flow down the same tree, forwarded one
step behind.

Steps: 2(d + s) for depth d = floor(lg n) and s segments.
Bytes sent per rank: N up and up to 2N down (an interior rank sends to two
children); received: up to 2N up and N down. So an interior rank's link
carries 3N each way at most, and its busier side 2N per phase.
Cost (alpha-beta-gamma; the simulator's flat network, docs/concepts.md#a-ranks-link): every
step an interior rank receives two segments (reduce) or sends two (broadcast),
so each phase is s + D - 1 steps of 2(alpha + m beta), D = floor(lg(n+1)) - 1
the depth of the tree's complete part (a last level of one rank adds no
step):
    T = 4(s + D - 1)(alpha + m beta) + 2 D m gamma        (n >= 3)
    T = 2 s (alpha + m beta) + m gamma                    (n = 2: one child)
exact in the simulator at n = 2^k - 1 and, from 8, 2^k (tests/test_simulate.py);
otherwise between the forms at the sizes 2^j - 1 around n (a fuller last level
adds up to one message per phase). ``cost``, auto's model, is the coarser bound
4(s + d - 1)(alpha + m beta) + 2(s + d - 1) m gamma (a level more, every
reduction on the path): the order it gives the algorithms is what auto's
candidates follow, so it is kept. The reductions of
steady state overlap the children's next messages (only the pipeline fill's
are on the path). Bandwidth term: 4 N beta, twice the ring's; latency in lg n.
Limits: interior ranks move twice what leaves do (the double binary tree
fixes that); the root is the last to finish the reduction.
Reference: Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 35(12), 2009.
"""
from ..plan import PlanBuilder
from .. import phases as _phases
from ._options import Option, positive_int

NAME = "tree"
DEFAULT_SEGMENT_BYTES = 1 << 18
OPTIONS = {"segment_bytes": Option(DEFAULT_SEGMENT_BYTES, positive_int("segment_bytes"),
                                   "bytes per pipelined segment (default 256 KiB)")}


def heap_links(i, m):
    parent = None if i == 0 else (i - 1) // 2
    return parent, [c for c in (2 * i + 1, 2 * i + 2) if c < m]


def build(rank, size, count, itemsize=1, segment_bytes=DEFAULT_SEGMENT_BYTES):
    b = PlanBuilder(NAME, rank, size, count)
    segs = _phases.segments(0, count, max(1, segment_bytes // itemsize))
    parent, children = heap_links(rank, size)
    depth, max_depth = (rank + 1).bit_length() - 1, size.bit_length() - 1
    # reduce up the tree
    _phases.tree_reduce(b, parent, children, segs, depth, max_depth)
    # broadcast down the tree
    _phases.tree_broadcast(b, parent, children, segs, depth, max_depth)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, segment_bytes=DEFAULT_SEGMENT_BYTES):
    if p == 1:
        return 0.0
    depth = (p).bit_length() - 1
    s = max(1, -(-nbytes // segment_bytes))
    seg = nbytes / s
    # each level waits for two children (2 messages per step at a busy rank)
    return (depth + s - 1) * (2 * (alpha + seg * beta) + 2 * seg * gamma) + (depth + s - 1) * 2 * (alpha + seg * beta)
