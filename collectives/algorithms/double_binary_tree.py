"""Double binary tree all-reduce: two complementary trees, each carrying half the data.

Idea: tree A is the in-order binary tree on positions 1..n (the node at x has
height trailing_zeros(x)), in which every even rank is a leaf. Tree B is tree A
shifted by one rank, in which every odd rank (and the last) is a leaf, so each
rank is interior in at most one tree. The first half of the buffer reduces
and broadcasts over tree A, the second over tree B, both pipelined over
s = ceil(N / 2 / segment_bytes) segments of m = N/(2s) bytes and in the same
steps; the two trees talk on separate channels. This is the layout NCCL uses
across nodes.

Steps: 2(d + s) for depth d = ceil(lg n) and s segments per half.
Bytes sent per rank: a rank with two children in its tree sends N/2 to each parent
(reduce) and N/2 to each child (broadcast), and receives as much: 2N each way;
ranks with one child or none move less. The ring moves 2(n-1)/n N each way.
Cost (alpha-beta-gamma; the simulator's flat network, a rank's link full
duplex, docs/concepts.md#a-ranks-link): in every step of either phase a rank sends at most
two segments and receives at most two (one per tree), so a step takes
2(alpha + m beta) on its busier port, then m gamma per segment reduced:
    T = (2(s + k) - 3)(2 alpha + 2 m beta + m gamma)    (n = 2^k >= 4)
    T = 2(s + k - 2)(2 alpha + 2 m beta + m gamma)      (n = 2^k - 1 >= 7)
    T = s (2 alpha + 2 m beta + m gamma)                (n = 2)
exact in the simulator (tests/test_simulate.py); between 2^k and 2^(k+1) - 1
ranks it lies between the two forms, one step apart. ``cost``, auto's model, is
the coarser 2(s + d - 1)(2 alpha + 2 m beta + m gamma), d = ceil(lg n): one step
over the forms, and twice the time at n = 2: the order it gives the algorithms
is what auto's candidates follow, so it is kept.
Bandwidth term: 2 N beta, the two-tree algorithms' (reduce N beta, then
broadcast N beta), as the ring's 2(n-1)/n N beta for large n; latency 2 lg n
steps, not 2(n-1).
Overlapping the reduce and the broadcast would put four messages on each port
per step in half the steps: the same bandwidth term, one pipeline fill saved.
Where the simulator once put it at 1.9x the ring (issue 38): its port model,
not this schedule. A message then held its sender's send port and its
receiver's receive port at once, so a rank's second send waited on a peer's
busy receive port while its own port idled, and such waits chained through both
trees: a step took well over two message times. With each side of a link its
own queue, as on the emulated hosts, the same plans meet the form above
(docs/performance.md#double-binary-tree).
Limits: the busiest ranks' 2N against the ring's 2(n-1)/n N makes it slower than
the ring on few ranks (4/3 of the ring's link time at n = 4, whatever the
segment size); it wins where the ring's 2(n-1) latencies dominate. The
reduction is not overlapped with the step's messages (gamma per segment adds).
Reference: Sanders, Speck and Träff, Parallel Computing 35(12), 2009; NCCL 2.4
("Massively scale your deep learning training with NCCL 2.4", NVIDIA, 2019).
"""
from ..plan import PlanBuilder
from .. import phases as _phases
from ._options import Option, positive_int

NAME = "double_binary_tree"
DEFAULT_SEGMENT_BYTES = 1 << 18
OPTIONS = {"segment_bytes": Option(DEFAULT_SEGMENT_BYTES, positive_int("segment_bytes"),
                                   "bytes per pipelined segment of each tree (default 256 KiB)")}


def inorder_links(position, m):
    """Parent and children (ranks 0..m-1) of the rank at ``position`` in tree A."""
    def parent_of(x):
        low = x & -x
        return (x | (low << 1)) & ~low

    x = position + 1
    root = 1 << (m.bit_length() - 1)
    parent = None
    if x != root:
        parent = parent_of(x)
        while parent > m:
            parent = parent_of(parent)
    children = []
    low = x & -x
    step = low >> 1
    if step:
        children.append(x - step)  # left child always exists (x - step >= 1)
        right = x + step
        while right > m and step > 1:  # missing right subtree: descend its left spine
            step >>= 1
            right = x + step
        if right <= m and right != x:
            children.append(right)
    return (None if parent is None else parent - 1), [c - 1 for c in children]


def tree_links(tree, rank, m):
    if tree == 0:
        return inorder_links(rank, m)
    position = (rank + 1) % m  # tree B: tree A with every rank moved one place
    parent, children = inorder_links(position, m)
    unshift = lambda p: (p - 1) % m  # noqa: E731
    return (None if parent is None else unshift(parent)), [unshift(c) for c in children]


def tree_depth(tree, rank, m):
    depth = 0
    parent = tree_links(tree, rank, m)[0]
    while parent is not None:
        depth += 1
        parent = tree_links(tree, parent, m)[0]
    return depth


def build(rank, size, count, itemsize=1, segment_bytes=DEFAULT_SEGMENT_BYTES):
    b = PlanBuilder(NAME, rank, size, count)
    half = (count + 1) // 2
    segment = max(1, segment_bytes // itemsize)
    halves = [(0, half), (half, count)]
    max_depth = size.bit_length()  # at least the depth of either tree, the same on every rank
    depths = [tree_depth(tree, rank, size) for tree in (0, 1)]
    # reduce up both trees, side by side
    tracks = b.tracks(2)
    for tree, (track, (lo, hi)) in enumerate(zip(tracks, halves)):
        parent, children = tree_links(tree, rank, size)
        _phases.tree_reduce(track, parent, children, _phases.segments(lo, hi, segment),
                            depths[tree], max_depth, chan=tree)
    b.join(tracks)
    # broadcast down both trees, side by side
    tracks = b.tracks(2)
    for tree, (track, (lo, hi)) in enumerate(zip(tracks, halves)):
        parent, children = tree_links(tree, rank, size)
        _phases.tree_broadcast(track, parent, children, _phases.segments(lo, hi, segment),
                               depths[tree], max_depth, chan=tree)
    b.join(tracks)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, segment_bytes=DEFAULT_SEGMENT_BYTES):
    if p == 1:
        return 0.0
    depth = max(1, (p - 1).bit_length())
    half = nbytes / 2
    s = max(1, -(-int(half) // segment_bytes))
    seg = half / s
    return (depth + s - 1) * 2 * (2 * (alpha + seg * beta) + seg * gamma)
