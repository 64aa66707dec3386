"""Hierarchical copy all-reduce: reduce inside groups, all-reduce across groups, copy back.

Idea (TensorFlow's HierarchicalCopyAllReduce, generalised): ranks form g groups
(nodes, from the MPI shared-memory split, or consecutive blocks of
``group_size`` ranks to model nodes on one machine). The buffer is cut into g
parts. Inside each group, part j is copied to and reduced at that part's
leader (member j mod group size); the g leaders of part j, one per group,
all-reduce it across groups with a ring; each leader then copies its part back
to the other members of its group. Only leaders cross group boundaries, so the
slow links between nodes carry 2(g-1)/g of a part per leader.

Steps: 1 + 2(g-1) + 1. Bytes sent per rank: (k-1)/k N inside the group for a
group of k (members to leaders), 2(g-1)/g N/g per led part across groups, and
N/g * (k-1) per led part back inside the group.
Cost: 2(alpha + N/g (k-1) beta_intra) + ring over g ranks of N/g bytes
(2(g-1) alpha_inter + 2(g-1)/g N/g beta_inter) + N gamma at the leaders.
Limits: leaders receive k-1 parts at once inside a group (incast), so it suits
small groups with fast links inside and a slower network between them.
Reference: TensorFlow, tensorflow/python/distribute/cross_device_ops.py
(HierarchicalCopyAllReduce), and all_reduce.py's build_shuffle_then_ring.
"""
from ..plan import IN, OUT, TMP, PlanBuilder, block_bounds
from . import _phases
from ._options import Option, optional_positive_int

NAME = "hierarchical_copy"
OPTIONS = {"group_size": Option(None, optional_positive_int("group_size"),
                                "ranks per group; default: one group per shared-memory node")}


def resolve(options, comm):
    """Turn the user's options into plan parameters: the group of every rank."""
    group_size = options["group_size"]
    if group_size is None:
        colors = comm.node_colors()
        order = {c: k for k, c in enumerate(dict.fromkeys(colors))}
        groups = tuple(order[c] for c in colors)
    else:
        groups = tuple(r // group_size for r in range(comm.size))
    return {"groups": groups}


def groups_for(size, group_size):
    return tuple(r // group_size for r in range(size))


def build(rank, size, count, itemsize=1, groups=None):
    groups = groups_for(size, size) if groups is None else groups
    members = {}
    for r, g in enumerate(groups):
        members.setdefault(g, []).append(r)
    group_list = [members[g] for g in sorted(members)]
    ngroups = len(group_list)
    bounds = block_bounds(count, ngroups)
    mine = members[groups[rank]]
    leader = lambda part, group: group[part % len(group)]  # noqa: E731
    led = [part for part in range(ngroups) if leader(part, mine) == rank]
    b = PlanBuilder(NAME, rank, size, count)

    # reduce each part to its leader inside the group
    b.step()
    width = max(bounds[p + 1] - bounds[p] for p in range(ngroups))
    slots = {}
    for part in range(ngroups):
        lo, hi = bounds[part], bounds[part + 1]
        owner = leader(part, mine)
        if owner != rank:
            b.send(owner, IN, lo, hi)
        else:
            for member in mine:
                if member != rank:
                    slot = b.scratch(width)
                    slots[part, member] = slot
                    b.recv(member, TMP, slot, slot + hi - lo)
    for part in led:
        lo, hi = bounds[part], bounds[part + 1]
        have = IN
        for member in mine:  # members in rank order: a fixed reduction order
            if member != rank:
                b.reduce(OUT, lo, have, lo, TMP, slots[part, member], hi - lo)
                have = OUT
        if have == IN:
            b.copy(OUT, lo, IN, lo, hi - lo)
    if slots:
        b.release(min(slots.values()))

    # all-reduce each part across groups: one ring per part, over that part's leaders
    tracks = b.tracks(len(led))
    for track, part in zip(tracks, led):
        lo, hi = bounds[part], bounds[part + 1]
        ring = [leader(part, group) for group in group_list]
        ring_bounds = [lo + x for x in block_bounds(hi - lo, ngroups)]
        _phases.ring_reduce_scatter(track, ring, ring_bounds, src=OUT, chan=1 + part % 7)
    b.join(tracks)
    tracks = b.tracks(len(led))
    for track, part in zip(tracks, led):
        lo, hi = bounds[part], bounds[part + 1]
        ring = [leader(part, group) for group in group_list]
        ring_bounds = [lo + x for x in block_bounds(hi - lo, ngroups)]
        _phases.ring_allgather(track, ring, ring_bounds, chan=1 + part % 7)
    b.join(tracks)

    # copy each part back from its leader to the rest of the group
    b.step()
    for part in range(ngroups):
        lo, hi = bounds[part], bounds[part + 1]
        owner = leader(part, mine)
        if owner == rank:
            for member in mine:
                if member != rank:
                    b.send(member, OUT, lo, hi)
        else:
            b.recv(owner, OUT, lo, hi)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, group_size=None, alpha_inter=None, beta_inter=None):
    k = p if group_size is None else min(group_size, p)
    g = -(-p // k)
    alpha_inter = alpha if alpha_inter is None else alpha_inter
    beta_inter = beta if beta_inter is None else beta_inter
    part = nbytes / g
    inside = 2 * (alpha + (k - 1) * part * beta) if k > 1 else 0.0
    across = 2 * (g - 1) * alpha_inter + 2 * (g - 1) / g * part * beta_inter if g > 1 else 0.0
    return inside + across + (k - 1) * part * gamma + (g - 1) / g * part * gamma
