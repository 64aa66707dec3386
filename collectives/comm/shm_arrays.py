"""Shared arrays (``collectives.empty``): NumPy arrays in memory the ranks of one node share.

Each allocation is one MPI-3 shared window over the node's ranks (``Win.Allocate_shared``):
every rank owns one part and maps its peers' parts, so the shared-memory transport can reduce
straight from a peer's array with no staging copy. A rank holds its own part weakly (the
caller's array keeps it alive) and its peers' parts strongly, for reading. An allocation is
freed once no rank of the node uses it any more: the ranks agree on that (an Allreduce of
their liveness) at the next allocation and when the communicator is released; what some rank
still uses then stays mapped until MPI_Finalize.
"""
import weakref

import numpy as np

from .. import mpilib

MPI = mpilib.load()


class _SharedArray:
    """One ``collectives.empty`` allocation: a shared window over the node. This rank's part is
    held weakly (the caller's array keeps it alive); the peers' parts strongly, for reading."""

    def __init__(self, node, ident, nbytes):
        self.ident, self.nbytes = ident, nbytes
        self.win = MPI.Win.Allocate_shared(max(nbytes, 1), 1, comm=node)
        self.me = node.Get_rank()
        self.parts = []
        for peer in range(node.Get_size()):
            memory, _ = self.win.Shared_query(peer)
            self.parts.append(np.frombuffer(memory, dtype=np.uint8, count=max(nbytes, 1)))
        mine, self.parts[self.me] = self.parts[self.me], None
        self.address = mine.ctypes.data
        self.mine = weakref.ref(mine)
        self.handed_out = mine  # until allocate() hands it out

    def alive(self):
        return self.mine() is not None

    def free(self):
        self.parts = None
        self.win.Free()


_kept = []  # shared arrays still in use when their communicator was released: MPI_Finalize frees them


class SharedArrays:
    """The shared arrays made over one node communicator (``node``: an MPIComm)."""

    def __init__(self, node):
        self.node = node
        self.arrays = {}  # ident -> _SharedArray

    def nbytes(self):
        return sum(a.nbytes for a in self.arrays.values())

    def release(self):
        """Free what no rank uses any more (collective over the node); keep the rest mapped."""
        _kept.extend(self.free_unused().values())
        self.arrays = {}

    def free_unused(self):
        """Free the shared arrays that no rank of the node uses any more (collective over the
        node); returns the others."""
        if not self.arrays:
            return {}
        idents = sorted(self.arrays)
        alive = np.array([self.arrays[i].alive() for i in idents], dtype=np.int32)
        anywhere = np.empty_like(alive)
        self.node.mpi_comm.Allreduce(alive, anywhere, op=MPI.MAX)
        for ident, used in zip(idents, anywhere):
            if not used:
                self.arrays.pop(ident).free()
        return self.arrays

    def allocate(self, nbytes):
        """A uint8 array of ``nbytes`` in node-shared memory (collective over the node)."""
        self.node.barrier("allocating a shared array")
        self.free_unused()  # the arrays every rank has dropped since the last allocation
        ident = len(self.arrays) + 1
        while ident in self.arrays:
            ident += 1
        shared = self.arrays[ident] = _SharedArray(self.node.mpi_comm, ident, nbytes)
        mine, shared.handed_out = shared.handed_out, None
        return mine[:nbytes]

    def locate(self, flat):
        """(array id, byte offset) of a contiguous buffer inside a shared array, else None."""
        if not self.arrays:
            return None
        address = flat.ctypes.data
        for ident, shared in self.arrays.items():
            if shared.address <= address and address + flat.nbytes <= shared.address + shared.nbytes \
                    and shared.alive():
                return ident, address - shared.address
        return None


def is_shared(comm, array):
    """Whether ``array`` (contiguous) lies in one of ``comm``'s shared arrays (collectives.empty):
    none exist before the communicator's shared-memory transport does."""
    transport = comm.session.windows.get("shm")
    return transport is not None and transport.shared.locate(array.reshape(-1)) is not None
