"""The public calls beside the building blocks: allreduce (collectives/pipeline.py runs it),
barrier, the registry's names and options, the caches and the memory a communicator holds.

Every call validates its arguments before any communication (ValueError listing the valid
choices); see collectives/pipeline.py for the path a call takes.
"""
from . import algorithms as _algorithms
from . import session as _session
from .calls import as_comm, failed, forget_resolved, usable  # noqa: F401 - as_comm: collectives.as_comm
from .comm import base as _comm_base
from .errors import CollectiveError
from .pipeline import allreduce  # noqa: F401 - collectives.allreduce



def algorithm_names():
    """Names of the registered all-reduce algorithms."""
    return _algorithms.names()


def barrier(comm=None):
    """Wait until every rank of ``comm`` calls it, bounded by COLLECTIVES_TIMEOUT (a timeout
    names the ranks not heard from). Tools call it before their first blocking MPI call."""
    ours = usable(comm)
    try:
        ours.barrier("barrier")
    except CollectiveError as exc:
        failed(ours, "barrier", exc)
        raise
    next(ours.session.calls)  # a call that returned (RanksLost.completed)


def clear_caches():
    """Drop every communicator's cached plans, programs and call shapes (scratch buffers and
    windows live and die with their communicator)."""
    _session.clear_all()


def library_memory(comm=None):
    """Bytes the library holds for ``comm`` on this rank, beyond the caller's buffers:
    ``scratch`` (the executor's, one buffer per dtype shared by every algorithm), ``programs``
    (cached programs' buffers: small messages' work and scratch, mid-size bound calls' scratch
    up to BOUND_BUDGET; ``program_shapes`` of them) and ``shm_window`` (this rank's shm segment)."""
    held = as_comm(comm).session.memory()
    return {**{k: held[k] for k in ("scratch", "programs", "program_shapes")}, "shm_window": held["windows"]}


def algorithm_options(name):
    """The options ``name`` takes, with their defaults and meaning."""
    module = _algorithms.get(name)
    return {k: {"default": o.default, "doc": o.doc} for k, o in module.OPTIONS.items()}


_comm_base.on_release.append(forget_resolved)
