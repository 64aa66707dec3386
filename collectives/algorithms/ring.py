"""Ring all-reduce: reduce-scatter then all-gather around a ring of n ranks.

Idea: cut the buffer into n chunks (numpy.array_split bounds). In the
reduce-scatter, each of n-1 steps sends one chunk to the right neighbour and
reduces the chunk arriving from the left into it, so after n-1 steps rank i
holds chunk i fully reduced. The all-gather passes the finished chunks around
the ring for n-1 more steps. The first reduction reads the send buffer
directly (no initial copy); scratch is one chunk, reused across calls.

Steps: 2(n-1). Bytes sent per rank: 2(n-1)/n * N for an N-byte buffer.
Cost (alpha-beta-gamma): 2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma.
Limits: latency grows linearly in n, so small messages on large worlds are
better served by recursive doubling; bandwidth-optimal for large messages.
Every chunk is reduced at one rank and copied to the others, so all ranks end
bitwise identical.
Reference: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 69(2), 2009.
"""
from ..plan import PlanBuilder, block_bounds
from .. import phases as _phases

NAME = "ring"
OPTIONS = {}


def build(rank, size, count, itemsize=1):
    b = PlanBuilder(NAME, rank, size, count)
    ranks = range(size)
    bounds = block_bounds(count, size)
    # reduce-scatter
    _phases.ring_reduce_scatter(b, ranks, bounds)
    # all-gather
    _phases.ring_allgather(b, ranks, bounds)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma):
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma
