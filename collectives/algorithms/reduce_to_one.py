"""Reduce-to-one all-reduce: gather and reduce at one root, then broadcast.

Idea: the baseline TensorFlow calls ReductionToOneDevice. Every rank sends its
whole buffer to ``root``, which reduces the contributions one by one in rank
order; the result then goes back out along a binomial tree.

Steps: n-1 at the root (one receive each) + ceil(lg n) for the broadcast.
Bytes sent per rank: N (non-root), the root receives (n-1) N and the broadcast
sends N from each inner tree node per child.
Cost: (n-1)(alpha + N beta + N gamma) at the root + ceil(lg n)(alpha + N beta).
Limits: the root is a bottleneck in bandwidth and in reduction work; useful
as a reference and for tiny worlds.
Reference: TensorFlow, tensorflow/python/distribute/cross_device_ops.py
(ReductionToOneDevice).
"""
from ..plan import IN, OUT, TMP, PlanBuilder
from .. import phases as _phases
from ._options import Option, rank_in_world

NAME = "reduce_to_one"
OPTIONS = {"root": Option(0, rank_in_world("root"), "rank that gathers and reduces (default 0)")}


def check(options, size):
    if options["root"] >= size:
        raise ValueError(f"option root={options['root']} is not a rank of a world of {size}")


def build(rank, size, count, itemsize=1, root=0):
    b = PlanBuilder(NAME, rank, size, count)
    # gather-reduce at the root, one contribution at a time, in rank order
    if rank == root:
        tmp = b.scratch(count)
        have = IN
        contributions = [r for r in range(size) if r != root]
        for peer in contributions:
            b.step()
            b.recv(peer, TMP, tmp, tmp + count)
            if peer < root and have == IN:
                b.reduce(OUT, 0, TMP, tmp, IN, 0, count)
            else:
                b.reduce(OUT, 0, have, 0, TMP, tmp, count)
            have = OUT
        if have == IN:
            b.copy(OUT, 0, IN, 0, count)
        b.final(OUT, 0, count)
        b.release(tmp)
    else:
        b.step()
        b.send(root, IN, 0, count)
    # broadcast
    _phases.binomial_broadcast(b, range(size), root, 0, count)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, root=0):
    if p == 1:
        return 0.0
    lg = (p - 1).bit_length()
    return (p - 1) * (alpha + nbytes * beta + nbytes * gamma) + lg * (alpha + nbytes * beta)
