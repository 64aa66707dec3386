"""Plans of the building blocks: reduce-scatter, all-gather, broadcast, reduce.

Each block has more than one algorithm; like the all-reduce algorithms they are
plans built from the shared phases, so they run on every communicator and in
the simulator. Blocks follow ``numpy.array_split`` bounds of the flattened array.
"""
from .plan import IN, OUT, TMP, PlanBuilder, block_bounds
from . import phases as _phases


def reduce_scatter_ring(rank, size, count, itemsize=1):
    b = PlanBuilder("reduce_scatter(ring)", rank, size, count)
    _phases.ring_reduce_scatter(b, range(size), block_bounds(count, size))
    return b.build()


def reduce_scatter_recursive_halving(rank, size, count, itemsize=1):
    b = PlanBuilder("reduce_scatter(recursive_halving)", rank, size, count)
    _phases.halving_doubling(b, range(size), block_bounds(count, size), allgather=False)
    return b.build()


def _gather_start(b, bounds, rank):
    b.copy(OUT, bounds[rank], IN, 0, bounds[rank + 1] - bounds[rank])


def allgather_ring(rank, size, bounds, itemsize=1):
    b = PlanBuilder("allgather(ring)", rank, size, bounds[-1])
    _gather_start(b, bounds, rank)
    _phases.ring_allgather(b, range(size), list(bounds))
    return b.build(in_count=bounds[rank + 1] - bounds[rank])


def allgather_recursive_doubling(rank, size, bounds, itemsize=1):
    b = PlanBuilder("allgather(recursive_doubling)", rank, size, bounds[-1])
    _gather_start(b, bounds, rank)
    _phases.halving_doubling(b, range(size), list(bounds), reduce_scatter=False)
    return b.build(in_count=bounds[rank + 1] - bounds[rank])


def broadcast_binomial(rank, size, count, root=0, itemsize=1):
    """Binomial tree from the root, then a one-element acknowledgement from the root's first
    child (rank root + 1) into the root's scratch, so that the root too waits for a message:
    ranks that disagree on the root (each its own root) then meet each other's foreign
    messages instead of all returning."""
    b = PlanBuilder("broadcast(binomial)", rank, size, count)
    _phases.binomial_broadcast(b, range(size), root, 0, count)
    if size > 1 and count:
        child = (root + 1) % size
        b.step()
        if rank == child:
            b.send(root, OUT, 0, 1)
        elif rank == root:
            b.recv(child, TMP, b.scratch(1), 1)
    return b.build()


def broadcast_scatter_allgather(rank, size, count, root=0, itemsize=1):
    """Root sends block i to rank i, then a ring all-gather: bandwidth-optimal for large buffers."""
    b = PlanBuilder("broadcast(scatter_allgather)", rank, size, count)
    bounds = block_bounds(count, size)
    b.step()
    if rank == root:
        for peer in range(size):
            if peer != root:
                b.send(peer, OUT, bounds[peer], bounds[peer + 1])
    else:
        b.recv(root, OUT, bounds[rank], bounds[rank + 1])
    _phases.ring_allgather(b, range(size), bounds)
    return b.build()


def reduce_binomial(rank, size, count, root=0, itemsize=1):
    """Binomial tree to the root, then a one-element token back down the tree (into scratch):
    the leaves, which only send, also wait for a message, so that ranks that disagree on the
    call all end in an error or a timeout instead of returning."""
    b = PlanBuilder("reduce(binomial)", rank, size, count)
    _phases.binomial_reduce(b, range(size), root, 0, count)
    if size > 1 and count:
        parent, children = _phases.binomial_children((rank - root) % size, size)
        token = b.scratch(1)
        if parent is not None:
            b.step()
            b.recv((parent + root) % size, TMP, token, token + 1)
        for child in children:
            b.step()
            if rank == root:
                b.send((child + root) % size, OUT, 0, 1)
            else:
                b.send((child + root) % size, TMP, token, token + 1)
    return b.build()


def reduce_ring(rank, size, count, root=0, itemsize=1):
    """Ring reduce-scatter, then every rank sends its finished block to the root."""
    b = PlanBuilder("reduce(ring)", rank, size, count)
    bounds = block_bounds(count, size)
    _phases.ring_reduce_scatter(b, range(size), bounds)
    b.step()
    if rank == root:
        for peer in range(size):
            if peer != root:
                b.recv(peer, OUT, bounds[peer], bounds[peer + 1])
    else:
        b.send(root, OUT, bounds[rank], bounds[rank + 1])
    return b.build()


REDUCE_SCATTER = {"ring": reduce_scatter_ring, "recursive_halving": reduce_scatter_recursive_halving}
ALLGATHER = {"ring": allgather_ring, "recursive_doubling": allgather_recursive_doubling}
BROADCAST = {"binomial": broadcast_binomial, "scatter_allgather": broadcast_scatter_allgather}
REDUCE = {"binomial": reduce_binomial, "ring": reduce_ring}
