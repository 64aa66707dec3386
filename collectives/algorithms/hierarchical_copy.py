"""Hierarchical copy all-reduce: reduce inside groups, all-reduce across groups, copy back.

Idea (TensorFlow's HierarchicalCopyAllReduce, generalised): ranks form g groups
(nodes, from the MPI shared-memory split, or consecutive blocks of
``group_size`` ranks to model nodes on one machine). The buffer is cut into g
parts. Inside each group, part j is copied to and reduced at that part's
leader (member j mod group size); the g leaders of part j, one per group,
all-reduce it across groups with a ring; each leader then copies its part back
to the other members of its group. Only leaders cross group boundaries, so the
slow links between nodes carry 2(g-1)/g of a part per leader.

Steps: s + 2(g-1) + 1, where the s = about ceil(g/k)(k-1)/g segments of the first phase keep a
leader's scratch within one message (a single group of k: s = k-1 steps of N/(k-1) bytes from
each member). Bytes sent per rank: (k-1)/k N inside the group for a
group of k (members to leaders), 2(g-1)/g N/g per led part across groups, and
N/g * (k-1) per led part back inside the group.
Cost: 2(alpha + N/g (k-1) beta_intra) + ring over g ranks of N/g bytes
(2(g-1) alpha_inter + 2(g-1)/g N/g beta_inter) + N gamma at the leaders.
Limits: leaders receive from k-1 members at once inside a group (incast), so it suits
small groups with fast links inside and a slower network between them.
Reference: TensorFlow, tensorflow/python/distribute/cross_device_ops.py
(HierarchicalCopyAllReduce), and all_reduce.py's build_shuffle_then_ring.
"""
import numpy as np

from ..columns import Columns, bounds_array
from ..plan import COPY, IN, OUT, REDUCE, TMP, PlanBuilder, block_bounds
from .. import phases as _phases
from ._options import Option, groups_of, optional_positive_int

NAME = "hierarchical_copy"
OPTIONS = {"group_size": Option(None, optional_positive_int("group_size"),
                                "ranks per group; default: one group per shared-memory node")}


def resolve(options, hosts):
    """Turn the user's options into plan parameters: the group of every rank (by default its host,
    from ``hosts``, the ranks of each host)."""
    group_size = options["group_size"]
    if group_size is None:
        return {"groups": groups_of(hosts)}
    return {"groups": groups_for(sum(len(host) for host in hosts), group_size)}


def groups_for(size, group_size):
    return tuple(r // group_size for r in range(size))


def _segments(ngroups, k, width, count):
    """Segments of the first phase and their width, for groups of ``k`` and parts of ``width``."""
    most_led = -(-ngroups // k)  # the same on every member: leaders lead ceil(g/k) parts at most
    nseg = max(1, min(width, -(-most_led * (k - 1) * width // max(count, 1))))
    while nseg < width and most_led * (k - 1) * -(-width // nseg) > count:
        nseg += 1  # rounding up the segment width may overshoot by a few elements
    return nseg, (-(-width // nseg) if width else 0)


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

    # reduce each part to its leader inside the group, in segments: a leader takes one segment
    # of every led part from every member per step, so its scratch stays within the message
    width = max(bounds[p + 1] - bounds[p] for p in range(ngroups))
    k = len(mine)
    nseg, seg_width = _segments(ngroups, k, width, count)
    others = [member for member in mine if member != rank]  # in rank order: a fixed reduction order
    slot0 = b.scratch(len(led) * len(others) * seg_width)  # led part i, member j: slot0 + (i(k-1) + j) seg_width
    # whole steps at once, as arrays over (segment, part[, member]): step s holds segment s of
    # every part, a leader's step a message from every member
    at = bounds_array(bounds)
    seg = np.arange(nseg, dtype=np.int64)[:, None]
    lo = np.minimum(at[1:], at[:-1] + seg * seg_width)  # (nseg, ngroups)
    hi = np.minimum(at[1:], at[:-1] + (seg + 1) * seg_width)
    owner = np.array([leader(part, mine) for part in range(ngroups)], np.int64)
    step = np.broadcast_to(seg, lo.shape)
    live = hi > lo
    sends = [((live & (owner != rank)).ravel(), step.ravel(), np.broadcast_to(owner, lo.shape).ravel(), IN, lo.ravel(),
              hi.ravel(), 0)]
    recvs, local = [], []
    if led:
        mine_lo, mine_hi = lo[:, led][:, :, None], hi[:, led][:, :, None]  # (nseg, led, 1)
        n = mine_hi - mine_lo
        shape = (nseg, len(led), max(len(others), 1))
        grid = lambda values: np.broadcast_to(values, shape).ravel()  # noqa: E731
        keep = grid(n > 0)
        steps = grid(seg[:, :, None])
        if others:
            peer = np.array(others, np.int64)
            slot = slot0 + (np.arange(len(led))[:, None] * len(others) + np.arange(len(others))) * seg_width
            recvs.append((keep, steps, grid(peer), TMP, grid(slot), grid(slot + n), 0))
            first = np.arange(len(others)) == 0
            local.append((keep, steps, REDUCE, OUT, grid(mine_lo), grid(np.where(first, IN, OUT)), grid(mine_lo),
                          TMP, grid(slot), grid(n)))
        else:
            local.append((keep, steps, COPY, OUT, grid(mine_lo), IN, grid(mine_lo), grid(n)))
    b.add_columns(Columns.of(nseg, sends=sends, recvs=recvs, local=local))
    b.release(slot0)

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
