"""Direct all-reduce: every rank reduces its block straight from every peer's input.

Idea: the one-shot reduce-scatter then all-gather of a shared-memory node, written as a plan.
Block j (numpy.array_split bounds) of every input goes to rank j, which reduces it in rank
order (its own input first, so it also runs in place) and sends the finished block to every
other rank. Over the shared-memory transport (``collectives/comm/shm.py``, chosen for this
algorithm whenever the peers share a node) nothing is sent: each rank reads its peers' memory,
reducing its block straight from their published inputs (or from their arrays, for shared
arrays made by ``collectives.empty``) and copying their finished blocks; elsewhere (another
host, the threaded world) the same plan moves messages.

Steps: 2.
Bytes sent per rank: 2(n-1)/n N sent and received as messages. Over shared memory each rank writes
(n-1)/n N (staging its input's other blocks; nothing for a shared array) and N/n (its finished
block, unless its output is a shared array), and reads (n-1)/n N twice (the peers' blocks of
its own block, then their finished blocks).
Cost: as messages 2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma, every message at once;
over shared memory about 2 alpha_shm + (2N + 2N(n-1)/n) / memory bandwidth + N/n n gamma.
Limits: n-1 messages per rank per step (many ranks: many small messages), and over MPI every
message of a step is in flight at once.
Reference: the "one-shot/two-shot" all-reduce of Jocksch et al., "Optimised all-to-all
communication on multicore architectures applied to FFTs" (2020); NCCL's intra-node LL
protocols work the same way.
"""
from ..plan import IN, OUT, TMP, PlanBuilder, block_bounds

NAME = "shm"
OPTIONS = {}
TRANSPORT = "shm"  # the transport this algorithm asks for where the peers share a node


def build(rank, size, count, itemsize=1):
    b = PlanBuilder(NAME, rank, size, count)
    bounds = block_bounds(count, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    width = hi - lo
    # reduce-scatter: block j of every input goes to rank j, reduced there in rank order
    slots = {peer: b.scratch(width) for peer in range(size) if peer != rank}
    b.step()
    for peer in range(size):
        if peer != rank:
            b.send(peer, IN, bounds[peer], bounds[peer + 1])
            b.recv(peer, TMP, slots[peer], slots[peer] + width)
    # own contribution first (IN may be OUT, in place), then the others in rank order
    others = [peer for peer in range(size) if peer != rank]
    if not others:
        b.copy(OUT, lo, IN, lo, width)
    else:
        b.reduce(OUT, lo, IN, lo, TMP, slots[others[0]], width)
        for peer in others[1:]:
            b.reduce(OUT, lo, OUT, lo, TMP, slots[peer], width)
    b.final(OUT, lo, width)
    # all-gather: the finished block goes to every other rank
    b.step()
    for peer in range(size):
        if peer != rank:
            b.send(peer, OUT, lo, hi)
            b.recv(peer, OUT, bounds[peer], bounds[peer + 1])
    return b.build()


def cost(p, nbytes, alpha, beta, gamma):
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma
