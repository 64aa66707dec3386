"""What every call binds and runs with: its communicator, ufuncs and signature, a plan run on
buffers, the transports a call may take, and what a failure does to the communicator.

The all-reduce path (collectives/pipeline.py) and the building blocks (blocks_api.py) share
these; nothing here keeps state of a call (a communicator's caches are its Session's).
"""
from contextvars import ContextVar

import numpy as np

from . import config
from .backend import NUMPY
from .comm import base as _comm_base
from .comm.base import Communicator
from .comm.shm_call import ShmRoute
from .check import agree
from .errors import CollectiveError
from .executor import BoundProgram, Program, execute
from .ops import check_op_dtype

_op_checks = {}  # (op, dtype, backend) -> ufunc: the same for every communicator and thread


def as_comm(comm):
    """A collectives communicator for None (MPI.COMM_WORLD), an mpi4py intracommunicator or one of ours."""
    if isinstance(comm, Communicator):
        return comm
    from .comm import mpi as _mpi  # imports mpi4py only when MPI is asked for

    return _mpi.wrap(comm)


# this thread's last communicator argument that was not ours: (it, our communicator for it, its
# session, RELEASES[0] then), replaced whole. A context variable: each thread has its own (a new
# thread starts with an empty context), and reading it is cheaper than a threading.local's attribute
resolution = ContextVar("collectives_resolution", default=(object(), None, None, -1))
# communicators released so far: a resolution made before a release is not used (a freed
# communicator's wrapper must not be handed out, on any thread)
RELEASES = [0]


def resolve(comm):
    """Our communicator for ``comm`` (as ``usable``), without an MPI attribute lookup per call."""
    if isinstance(comm, Communicator):
        return comm
    memo = resolution.get()
    if memo[0] is comm and memo[3] == RELEASES[0]:
        return memo[1]
    releases = RELEASES[0]
    ours = usable(comm)
    resolution.set((comm, ours, ours.session, releases))
    return ours


def forget_resolved(comm):
    """A communicator is being released: no thread's resolution made before now is used again."""
    RELEASES[0] += 1


def usable(comm):
    """as_comm(comm), refused with a CollectiveError when a call failed on it before."""
    ours = as_comm(comm)
    if ours.failed is not None:
        ours.check_usable()
    return ours


def signature(kind, name, op, dtype, count, params=()):
    """The text every rank derives from its call: it picks the call's message tags."""
    return f"{kind}|{name}|{op}|{dtype.name}|{count}|{sorted(params.items()) if params else ''}"


def maybe_check(comm, kind, algorithm, op, dtype, count, params):
    """Under COLLECTIVES_CHECK=1: every rank raises the same MismatchError where the ranks'
    calls differ (collectives/check.py); a failed exchange marks the communicator failed."""
    if config.check_enabled():
        try:
            agree(comm, kind, algorithm, op, dtype, count, params)
        except CollectiveError as exc:
            if not getattr(exc, "agreed", False):  # the exchange itself failed
                failed(comm, f"{kind}({algorithm}) check", exc)
            raise


def failed(comm, what, exc):
    """A call failed after messages moved: the communicator is marked failed (later calls
    raise), its session's cached calls dropped, and under MPI the job aborts unless
    COLLECTIVES_ON_ERROR=raise."""
    comm.mark_failed(what, exc)
    comm.session.forget()
    comm.on_failure(exc)


def ufuncs(op, dtype, backend, size):
    """(the reduction's ufunc, the final step or None: ``avg`` divides by the world size)."""
    key = (op, dtype, backend.name)
    hit = _op_checks.get(key)
    if hit is None:
        hit = _op_checks[key] = backend.ufunc(check_op_dtype(op, dtype))
    final = None
    if op == "avg":
        divide = backend.ufunc("divide")
        divisor = dtype.type(size)

        def final(region):
            divide(region, divisor, out=region)
    return hit, final


def as_array(buf, name):
    if isinstance(buf, np.ndarray) or hasattr(buf, "__cuda_array_interface__"):
        return buf
    if buf is None:
        raise TypeError(f"{name} must be an array, got None")
    return np.asarray(buf)


def run_plan(plan, comm, backend, flat_in, flat_out, reduce_fn, final_fn, what, transport=None, signature=None):
    """``execute_plan``, a CollectiveError marking ``comm`` failed (``failed``)."""
    try:
        execute_plan(plan, comm, backend, flat_in, flat_out, reduce_fn, final_fn, what, transport, signature)
    except CollectiveError as exc:
        failed(comm, what, exc)
        raise


def execute_plan(plan, comm, backend, flat_in, flat_out, reduce_fn, final_fn, what, transport=None, signature=None):
    """Run ``plan`` on contiguous 1-D buffers in the step loop, its messages carried by
    ``transport`` (a ``bind_call``: ``comm`` itself where None; a ShmRoute over shared memory)."""
    tmp = comm.session.scratch_buffer(backend, flat_out.dtype, plan.tmp_count)
    sync = backend.synchronize if backend.is_device else None
    execute(plan, comm, flat_in, flat_out, tmp, reduce_fn, final_fn, what, sync, signature, transport)


# Messages up to PROGRAM_MAX_BYTES run as prepared programs where the transport has them (MPI);
# up to BOUND_MAX_BYTES, calls run bound to fixed scratch (BoundProgram), with at most
# BOUND_BUDGET bytes of scratch held for that per communicator (docs/performance.md#bound-plans).
PROGRAM_MAX_BYTES, BOUND_MAX_BYTES, BOUND_BUDGET = 16 << 10, 256 << 10, 32 << 20


def program_for(comm, plan, name, op, dtype, count, params, reduce_fn, final_fn, what):
    """The session's prepared program of this call shape where the transport prepares steps and
    the message is small enough, else None."""
    nbytes = count * dtype.itemsize
    if not comm.prepares_steps or nbytes > (BOUND_MAX_BYTES if comm.signed else PROGRAM_MAX_BYTES):
        return None
    sig = signature("allreduce", name, op, dtype, count, params)
    tag_key = sig if comm.signed else f"allreduce|{name}|{op}"

    def make():
        if nbytes > PROGRAM_MAX_BYTES:
            return BoundProgram(plan, comm, dtype, count, reduce_fn, final_fn, what, sig, BOUND_BUDGET)
        return Program(plan, comm, NUMPY, dtype, count, reduce_fn, final_fn, what, tag_key)
    return comm.session.program((name, op, dtype, count, tuple(sorted(params.items()))), make)


def shm_transport(comm, name, count, itemsize, params, module, sig):
    """The route of this call shape over the communicator's shared-memory transport."""
    from .comm import shm as _shm

    size = comm.size
    items = tuple(sorted(params.items()))
    session = comm.session

    def plans_of(rank):
        return session.plan(("allreduce", name, size, rank, count, itemsize, items),
                            lambda: module.build(rank, size, count, itemsize=itemsize, **params))
    return ShmRoute(_shm.for_comm(comm), plans_of, sig)


def _forget(comm):
    """``comm`` is being released: its session drops its cached calls."""
    comm.session.forget()


_comm_base.on_release.append(_forget)
