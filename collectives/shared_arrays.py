"""Shared arrays, the registered buffers of the shared-memory transport (as NCCL registers
user buffers): ``collectives.empty`` and ``collectives.zeros``.

An all-reduce whose buffers are such arrays moves nothing it need not within a node: each rank
reduces its part straight from its peers' arrays and copies their finished parts out of them,
with no staging copy. That is the way to the fastest intra-node all-reduce
(docs/performance.md#transports-and-shared-arrays). The arrays live in MPI-3 shared windows of the communicator's node ranks
(collectives/comm/shm_arrays.py).
"""
import numpy as np

from .api import as_comm


def empty(shape, dtype=np.float64, comm=None):
    """A NumPy array in memory shared by the ranks of ``comm`` on this node (a registered
    buffer). Collective: every rank of ``comm`` calls it, with the same shape and dtype. Where no
    peer shares this rank's node (or ``comm`` is not an MPI communicator) it is a plain array.
    Its memory is freed once every rank of the node has dropped its array (the ranks agree on
    that at the next ``empty`` on the communicator, and when the communicator is freed)."""
    ours = as_comm(comm)
    ours.check_usable()
    if getattr(ours, "mpi_comm", None) is None:
        return np.empty(shape, dtype)
    from .comm import shm as _shm

    return _shm.shared_empty(ours, shape, dtype)


def zeros(shape, dtype=np.float64, comm=None):
    """``empty`` filled with zeros."""
    array = empty(shape, dtype, comm)
    array.fill(0)
    return array
