"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, recursive-doubling all-gather.

Idea: in the reduce-scatter, round k pairs ranks differing in one bit (from
the highest down); each keeps half its current range, sends the other half
and reduces what it receives, so the data halves every round and after lg n
rounds each rank owns 1/n of the result. The all-gather retraces the rounds
in reverse, doubling the range each time. Non-power-of-two worlds fold the
first 2r ranks in pairs as in recursive doubling.

Steps: 2 lg n (+2 when folded). Bytes sent per rank: 2(n-1)/n * N.
Cost: 2 lg n alpha + 2(n-1)/n N beta + (n-1)/n N gamma for a power of two n.
Limits: bandwidth of the ring with logarithmic latency; folding doubles the
traffic of the folded ranks, so worlds just above a power of two pay extra.
Reference: Rabenseifner, "Optimization of collective reduction operations",
ICCS 2004; Thakur, Rabenseifner and Gropp, IJHPCA 19(1), 2005.
"""
from ..plan import PlanBuilder, block_bounds
from .. import phases as _phases

NAME = "rabenseifner"
OPTIONS = {}


def build(rank, size, count, itemsize=1):
    b = PlanBuilder(NAME, rank, size, count)
    # reduce-scatter by recursive halving, then all-gather by recursive doubling
    _phases.halving_doubling(b, range(size), block_bounds(count, size))
    return b.build()


def cost(p, nbytes, alpha, beta, gamma):
    if p == 1:
        return 0.0
    lg = p.bit_length() - 1
    extra = p - (1 << lg)
    q = 1 << lg
    folded = 2 * (alpha + nbytes * beta) + nbytes * gamma if extra else 0.0
    return 2 * lg * alpha + 2 * (q - 1) / q * nbytes * beta + (q - 1) / q * nbytes * gamma + folded
