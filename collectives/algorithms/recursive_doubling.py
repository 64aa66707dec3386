"""Recursive doubling all-reduce: lg n exchanges of the whole buffer.

Idea: in round k each rank swaps its whole partial result with the rank whose
number differs in bit k and reduces; after lg n rounds every rank holds the
full reduction. Each reduction puts the lower group's value on the left, so
partners compute the same expression and all ranks end bitwise identical.
A world that is not a power of two folds in first: of the first 2r ranks
(r = n - 2^floor(lg n)), each even rank hands its buffer to its odd
neighbour, which stands for both, and gets the result back at the end.

Steps: lg n (+2 when folded). Bytes sent per rank: N lg n (+N when folded).
Cost: lg n (alpha + N beta + N gamma) for a power of two n.
Limits: moves lg n times the data of the ring, so it wins only where latency
dominates (small messages); the best choice for a few bytes.
Reference: Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 19(1), 2005.
"""
from ..plan import PlanBuilder
from .. import phases as _phases

NAME = "recursive_doubling"
OPTIONS = {}


def build(rank, size, count, itemsize=1):
    b = PlanBuilder(NAME, rank, size, count)
    # fold in, exchange at distances 1, 2, 4..., fold out
    _phases.recursive_doubling(b, range(size), 0, count)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma):
    if p == 1:
        return 0.0
    lg = p.bit_length() - 1
    extra = p - (1 << lg)
    folded = 2 * (alpha + nbytes * beta) + nbytes * gamma if extra else 0.0
    return lg * (alpha + nbytes * beta + nbytes * gamma) + folded
