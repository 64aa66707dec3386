"""Two-level all-reduce: reduce-scatter inside each host, all-reduce across hosts by every local
rank at once, all-gather inside each host.

Idea (Horovod's hierarchical all-reduce, with the inter-host step spread over every local rank):
ranks form H hosts (nodes, from the MPI shared-memory split, or ``groups`` given). The buffer is
cut into B blocks, B the fewest ranks any host has. Inside each host a ring reduce-scatter
leaves block j, reduced over the host, at the host's local rank j (local ranks from B on get
empty blocks). Then the H ranks with local index j, one per host, all-reduce block j with a flat
algorithm (``inter``: ``ring``, ``recursive_doubling``, ``rabenseifner`` or
``double_binary_tree``); B such all-reduces run at once, so every local rank carries a share of
the traffic between hosts instead of one leader. Last, a ring all-gather inside each host.
Pipelined (``chunks`` c > 1): the buffer is cut into c chunks that run these three stages c - 1
steps apart, chunk i one step behind chunk i - 1 (each on its own channel), so a host's link
carries chunk i while the host reduces chunk i + 1 and gathers chunk i - 1.

Steps: 2(K-1) inside a host of K ranks, plus the inter algorithm's steps over H ranks
(ring: 2(H-1)), plus c - 1 with c chunks.
Bytes sent per rank: 2(K-1)/K N inside the host (ring reduce-scatter and all-gather), plus the inter
algorithm's bytes for N/B (ring: 2(H-1)/H N/B) across hosts; a host's link carries 2(H-1)/H N in
all, the least any all-reduce can send across it.
Cost (even hosts of K, ring inter): 2(K-1) alpha_intra + 2(K-1)/K N beta_intra
+ 2(H-1) alpha_inter + 2(H-1)/H N/K beta_inter_per_rank + ((K-1)/K + (H-1)/H / K) N gamma,
where the K ranks of a host share its link (K x beta_inter_per_rank = the link's beta); with c
chunks the intra-host bytes term shrinks to 1/c (the rest overlaps the link) and (c - 1)
(alpha_intra + alpha_inter) is added.
Limits: pipelining needs an inter algorithm whose ranks all send and receive in the same steps
(ring; recursive doubling and Rabenseifner over a power of two hosts), else one chunk runs.
Uneven hosts use as many blocks as the smallest host has ranks, so the local ranks past that count only reduce and gather inside their host; with one host it is a ring.
Reference: A. Sergeev and M. Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv:1802.05799 (2018), and Horovod's hierarchical allreduce; NCCL's tree/ring
split between intra- and inter-node steps.
"""
from ..plan import NCHANNELS, OUT, PlanBuilder, block_bounds
from .. import phases as _phases
from . import double_binary_tree as _dbt
from ._options import Option, groups_of, optional_positive_int

NAME = "two_level"
INTER = ("ring", "recursive_doubling", "rabenseifner", "double_binary_tree")
PIPELINE_MIN_BYTES = 4 << 20  # default: messages from 4 MiB run pipelined,
PIPELINE_CHUNK_BYTES = 8 << 20  # in chunks of about 8 MiB, 2 at least, MAX_CHUNKS at most
MAX_CHUNKS = 16


def _check_inter(value):
    if value not in INTER:
        raise ValueError(f"two_level option inter must be one of {', '.join(INTER)}, got {value!r}")
    return value


def _check_groups(value):
    if value is None:
        return None
    try:
        groups = tuple(int(g) for g in value)
    except (TypeError, ValueError):
        raise ValueError(f"two_level option groups must be a sequence of host numbers, got {value!r}") from None
    if not groups or min(groups) < 0:
        raise ValueError(f"two_level option groups must be host numbers >= 0, got {value!r}")
    return groups


OPTIONS = {"inter": Option("ring", _check_inter, "the flat all-reduce across hosts: " + ", ".join(INTER)),
           "chunks": Option(None, optional_positive_int("chunks"), "pieces of the pipeline (default on even hosts: "
                            "1 below 4 MiB, else one per 8 MiB, 2 to 16); ring inter, or recursive doubling and halving over "
                            "2^k hosts"),
           "groups": Option(None, _check_groups, "the host of every rank (a sequence of ints); default: "
                                                 "the communicator's shared-memory nodes")}


def resolve(options, hosts):
    """The host of every rank, from ``hosts`` (the ranks of each host) unless given."""
    groups = options.get("groups")
    if groups is None:
        groups = groups_of(hosts)
    else:
        groups = tuple(int(g) for g in groups)
        size = sum(len(host) for host in hosts)
        if len(groups) != size:
            raise ValueError(f"two_level option groups needs one entry per rank ({size}), got {len(groups)}")
    return {"inter": options.get("inter", "ring"), "groups": groups, "chunks": options.get("chunks")}


def hosts_of(groups):
    """The ranks of every host, hosts in order of their first rank."""
    members = {}
    for rank, group in enumerate(groups):
        members.setdefault(group, []).append(rank)
    return list(members.values())


def pipelined(inter, hosts):
    """True when every rank of the inter algorithm over ``hosts`` hosts sends and receives in the
    same steps (ring; recursive doubling and halving without folding), so chunks can overlap."""
    return inter == "ring" or (inter in ("recursive_doubling", "rabenseifner") and hosts & (hosts - 1) == 0)


def inter_steps(inter, hosts):
    """Steps of the inter algorithm over ``hosts`` ranks, where ``pipelined`` holds."""
    rounds = (hosts - 1).bit_length()
    return 2 * (hosts - 1) if inter == "ring" else rounds * (1 if inter == "recursive_doubling" else 2)


def default_chunks(nbytes):
    """Chunks of the pipeline by default: one below PIPELINE_MIN_BYTES, else one per
    PIPELINE_CHUNK_BYTES (2 to MAX_CHUNKS): the choice measured best on even emulated hosts
    (docs/performance.md#two-level-chunks). Even hosts only: on uneven ones the simulator has
    more chunks slower than one."""
    if nbytes < PIPELINE_MIN_BYTES:
        return 1
    return max(2, min(MAX_CHUNKS, nbytes // PIPELINE_CHUNK_BYTES))


def build(rank, size, count, itemsize=1, groups=None, inter="ring", chunks=None):
    groups = (0,) * size if groups is None else tuple(groups)
    hosts = hosts_of(groups)
    mine = next(h for h in hosts if rank in h)
    local = mine.index(rank)
    b = PlanBuilder(NAME, rank, size, count)
    if len(hosts) == 1:  # one host: a ring all-reduce
        bounds = block_bounds(count, size)
        _phases.ring_reduce_scatter(b, mine, bounds)
        _phases.ring_allgather(b, mine, bounds)
        return b.build()
    blocks = min(len(h) for h in hosts)
    if chunks is None:  # measured on even hosts; on uneven ones the model has it slower (default_chunks)
        chunks = default_chunks(count * itemsize) if len({len(h) for h in hosts}) == 1 else 1
    chunks = max(1, min(chunks, count // max(1, blocks))) if pipelined(inter, len(hosts)) else 1
    edges = block_bounds(count, chunks).tolist()
    tracks = b.tracks(chunks) if chunks > 1 else [b]
    for c, track in enumerate(tracks):
        for _ in range(c):  # chunk c runs c steps behind chunk 0: its own stages overlap the others'
            track.step()
        chan = c % NCHANNELS
        lo, hi = edges[c], edges[c + 1]
        bounds = [lo + x for x in block_bounds(hi - lo, blocks).tolist()]
        host_bounds = bounds + [hi] * (len(mine) - blocks)  # local ranks past `blocks` get no block
        # reduce-scatter inside the host
        _phases.ring_reduce_scatter(track, mine, host_bounds, final=False, chan=chan)
        # all-reduce across hosts: local rank j with its counterparts, block j
        if local < blocks:
            peers = [h[local] for h in hosts]
            _across(track, inter, peers, bounds[local], bounds[local + 1], itemsize, chan)
        elif chunks > 1:  # idle while the others cross: the chunks stay aligned step for step
            for _ in range(inter_steps(inter, len(hosts))):
                track.step()
        # all-gather inside the host
        _phases.ring_allgather(track, mine, host_bounds, chan=chan)
    if chunks > 1:
        b.join(tracks)
    return b.build()


def _across(b, inter, peers, lo, hi, itemsize, chan=0):
    """Flat all-reduce of OUT[lo:hi] over ``peers`` (this rank among them), FINAL applied."""
    m = len(peers)
    parts = [lo + x for x in block_bounds(hi - lo, m).tolist()]
    if inter == "ring":
        _phases.ring_reduce_scatter(b, peers, parts, src=OUT, chan=chan)
        _phases.ring_allgather(b, peers, parts, chan=chan)
    elif inter == "recursive_doubling":
        _phases.recursive_doubling(b, peers, lo, hi, src=OUT, chan=chan)
    elif inter == "rabenseifner":
        _phases.halving_doubling(b, peers, parts, src=OUT, chan=chan)
    else:  # double binary tree over positions 0..m-1 of ``peers``
        position = peers.index(b.rank)
        half = lo + (hi - lo + 1) // 2
        segment = max(1, _dbt.DEFAULT_SEGMENT_BYTES // itemsize)
        max_depth = m.bit_length()
        links = [_dbt.tree_links(tree, position, m) for tree in (0, 1)]
        depths = [_dbt.tree_depth(tree, position, m) for tree in (0, 1)]

        def peer(p):
            return None if p is None else peers[p]

        for phase in (_phases.tree_reduce, _phases.tree_broadcast):
            tracks = b.tracks(2)
            for tree, (track, (a, z)) in enumerate(zip(tracks, [(lo, half), (half, hi)])):
                parent, children = links[tree]
                extra = {"src": OUT} if phase is _phases.tree_reduce else {}
                phase(track, peer(parent), [peers[c] for c in children], _phases.segments(a, z, segment),
                      depths[tree], max_depth, chan=tree, **extra)
            b.join(tracks)


def cost(p, nbytes, alpha, beta, gamma, groups=None, inter="ring", alpha_inter=None, beta_inter=None, chunks=None):
    """Seconds for ``nbytes`` on ``p`` ranks; with ``groups`` and inter-host parameters (beta_inter:
    seconds per byte of one host's link, shared by its ranks) the two-level model, else one level.
    With c chunks the link stays busy while the hosts work: only one chunk's reduce-scatter and
    all-gather inside the hosts show, and each extra chunk adds a step of latency on both levels."""
    hosts = hosts_of(groups) if groups is not None else [list(range(p))]
    if len(hosts) == 1 or alpha_inter is None:
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma
    k = min(len(h) for h in hosts)
    kmax = max(len(h) for h in hosts)
    h = len(hosts)
    default = default_chunks(nbytes) if k == kmax else 1
    c = (default if chunks is None else chunks) if pipelined(inter, h) else 1
    intra = 2 * (kmax - 1) * alpha + 2 * (kmax - 1) / kmax * nbytes / c * beta
    share = nbytes / k
    steps = {"ring": 2 * (h - 1), "recursive_doubling": max(1, (h - 1).bit_length()),
             "rabenseifner": 2 * max(1, (h - 1).bit_length()), "double_binary_tree": 2 * max(1, (h - 1).bit_length())}
    volume = {"recursive_doubling": max(1, (h - 1).bit_length()) * share}.get(inter, 2 * (h - 1) / h * share)
    across = steps[inter] * alpha_inter + volume * k * beta_inter  # k ranks share the host's link
    reduce = ((kmax - 1) / kmax / c + (h - 1) / h / k) * nbytes * gamma
    return intra + across + (c - 1) * (alpha + alpha_inter) + reduce
