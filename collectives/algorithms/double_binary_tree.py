"""Double binary tree all-reduce: two complementary trees, each carrying half the data.

Idea: tree A is the in-order binary tree on positions 1..n (the node at x has
height trailing_zeros(x)), in which every even rank is a leaf. Tree B is tree A
shifted by one rank, in which every odd rank (and the last) is a leaf, so each
rank is interior in at most one tree. The first half of the buffer reduces
and broadcasts over tree A, the second over tree B, both pipelined over
segments of ``segment_bytes`` and in the same steps; the two trees talk on
separate channels. This is the layout NCCL uses across nodes.

Steps: 2(d + s) for depth d = ceil(lg n) and s segments per half.
Bytes sent per rank: about N (N/2 up and down in the tree where it is
interior, N/2 up and nothing down where it is a leaf, plus the second child).
Cost: about 2(d + s - 1)(alpha + N/(2s) beta) + N gamma per rank, i.e. full
bandwidth with latency logarithmic in n.
Limits: deeper than the heap tree by one level; shines where latency in n
matters (many ranks) and messages are large enough to fill the pipeline.
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
