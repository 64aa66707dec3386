"""collectives: all-reduce algorithms in pure Python over MPI, threads, and a simulator.

Quick use::

    import numpy as np, collectives
    result = collectives.allreduce(np.arange(10.0), algorithm="ring")   # under mpiexec

    collectives.run_threaded(4, lambda comm: collectives.allreduce(np.ones(3), comm=comm))

Your own algorithm: ``collectives.register_algorithm(obj)`` (see docs/writing-an-algorithm.md).
"""
from . import algorithms  # the registry; callable as the deprecated name of algorithm_names()
from .api import algorithm_names, algorithm_options, allreduce, as_comm, barrier, clear_caches, library_memory
from .shared_arrays import empty, zeros
from .blocks_api import allgather, broadcast, reduce, reduce_scatter
from .bucket import Bucketer
from .nonblocking import AllreduceRequest, iallreduce, open_requests, waitall
from .comm import Communicator, ThreadComm, run_threaded
from .errors import CollectiveError, CollectiveTimeout, MismatchError, PeerAborted, RanksLost
from .ops import DTYPES, OPS
from .algorithms._options import Option
from .plan import PlanError
from .plugins import register_algorithm, unregister_algorithm, verify
from .simulator import simulate

__version__ = "0.1.0"

__all__ = ["allreduce", "iallreduce", "AllreduceRequest", "waitall", "open_requests", "Bucketer", "empty", "zeros", "algorithm_names", "algorithms", "algorithm_options", "reduce_scatter", "allgather", "broadcast",
           "reduce", "barrier", "run_threaded", "as_comm", "clear_caches", "library_memory", "Communicator", "ThreadComm",
           "MPIComm", "CollectiveError", "CollectiveTimeout", "MismatchError", "PeerAborted", "RanksLost", "OPS", "DTYPES",
           "simulate", "register_algorithm", "unregister_algorithm", "verify", "PlanError", "Option"]


def __getattr__(name):
    if name == "MPIComm":
        from .comm.mpi import MPIComm

        return MPIComm
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")
