"""One all-reduce call's path, written once: validate -> choose -> plan -> bind -> run.

Every all-reduce goes this way: ``collectives.allreduce``, compressed calls, ``iallreduce``'s
progress thread (``point_to_point=True``: its messages stay on the communicator's own transport)
and first-use calibration (``call``, which never re-enters the public function).

- **validate** (``Call``): every argument is checked before any message; a ValueError lists the
  valid choices.
- **choose** (``select.choose``, the one selector): the algorithm, its options and the transport.
- **plan**: the plan of the call's shape, from the store every session shares.
- **bind** (``Bound``): the plan with its ufuncs, name and signature, and what runs it: the step
  loop (``executor.run``) over the actions the chosen transport binds (``bind_call``: MPI
  point-to-point, threads, shared memory within a node, a compressed wire), once per call or
  once per call shape (a program: the transport prepares its steps).
- **run**: ``Bound.run`` on the caller's buffers; a CollectiveError marks the communicator failed.

The fast path is a cache the communicator's Session holds: ``session.shapes`` maps a repeated
call's shape to its Bound, and ``session.last`` is the last call's buffers with what runs on them:
the program bound to them and that binding, or the runner on the buffers' views (a tuple replaced
whole, held until a later call replaces it); a repeat runs the binding in the step loop while its
holder still holds it. The fast path applies only where no environment variable overrides the
call (``config.no_overrides``). A communicator's collectives run on one thread at a time, as MPI
requires, so threads calling on different communicators (the ranks of ``run_threaded``, user
threads under MPI_THREAD_MULTIPLE) never share a cache entry. Finding our communicator for an
mpi4py one (``calls.resolve``) is remembered per thread, until any communicator is released.
"""

from functools import partial

import numpy as np

from . import compression as _compression
from . import config
from .backend import NUMPY, backend_for
from .comm.base import Communicator
from .errors import CollectiveError
from .executor import run
from .ops import check_op_dtype
from . import select
from .calls import (as_array, execute_plan, failed, maybe_check, program_for, resolve, shm_transport, signature,
                    ufuncs, usable)
from .calls import RELEASES as _releases, resolution as _resolution

from . import algorithms as _algorithms


class Call:
    """A validated all-reduce call (``validate``). ``fmt``: the wire format of a compressed call."""

    __slots__ = ("sendbuf", "recvbuf", "op", "algorithm", "options", "transport", "backend", "dtype",
                 "fmt", "scope", "residual", "point_to_point")

    def __init__(self, sendbuf, recvbuf, op, algorithm, options, compression=None, scope="across_hosts",
                 residual=None, point_to_point=False):
        options = dict(options) if options else {}
        transport = options.pop("transport", "auto")
        if transport not in config.TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(config.TRANSPORTS)}, got {transport!r}")
        config.transport()  # a bad COLLECTIVES_TRANSPORT is refused here, on every rank, before any message
        sendbuf = as_array(sendbuf, "sendbuf")
        self.fmt = _wire_format(compression, scope, residual, sendbuf.dtype)
        if (self.fmt is not None or point_to_point) and transport != "auto":
            raise ValueError(f"transport={transport!r} is not available with compression= or iallreduce "
                             f"(their messages go through the communicator's point-to-point transport)")
        backend = backend_for(sendbuf)
        dtype = sendbuf.dtype
        check_op_dtype(op, dtype)
        if algorithm != "auto":
            _algorithms.get(algorithm)
        if recvbuf is not None and recvbuf is not sendbuf:
            if getattr(recvbuf, "shape", None) != sendbuf.shape or getattr(recvbuf, "dtype", None) != dtype:
                raise ValueError(f"recvbuf must match sendbuf: got shape {getattr(recvbuf, 'shape', None)} "
                                 f"dtype {getattr(recvbuf, 'dtype', None)}, expected shape {sendbuf.shape} "
                                 f"dtype {dtype}")
            if backend_for(recvbuf) is not backend:
                raise ValueError("sendbuf and recvbuf must both be host (NumPy) or both device (CuPy) arrays")
        if self.fmt is not None:
            if backend is not NUMPY:
                raise ValueError("compression= runs on host (NumPy) arrays")
            _compression.check(self.fmt, scope, dtype)
            check_residual(residual, sendbuf, recvbuf)
        if point_to_point and backend is not NUMPY:
            raise ValueError("iallreduce runs on host (NumPy) arrays")
        self.sendbuf, self.recvbuf, self.op, self.algorithm = sendbuf, recvbuf, op, algorithm
        self.options, self.transport, self.backend, self.dtype = options, transport, backend, dtype
        self.scope, self.residual, self.point_to_point = scope, residual, point_to_point


def _wire_format(compression, scope, residual, dtype):
    """The call's wire format (None: uncompressed): ``compression=``, else COLLECTIVES_COMPRESSION
    for float32/float64 data (any data where a ``residual`` asks for error feedback)."""
    if compression is not None and compression != "none":
        return compression
    fmt = None if compression == "none" else _compression.env_default()
    if fmt is None:
        if residual is not None or scope != "across_hosts":
            raise ValueError(f"{'residual' if residual is not None else 'compression_scope'} needs compression= "
                             f"(bf16 or fp16) or COLLECTIVES_COMPRESSION")
        return None
    if dtype not in (np.float32, np.float64) and residual is None:  # the default covers float data only
        return None
    return fmt


def check_residual(residual, sendbuf, recvbuf):
    """ValueError unless ``residual`` (or None) fits ``sendbuf`` and shares memory with neither buffer."""
    if residual is None:
        return
    if not isinstance(residual, np.ndarray) or residual.shape != sendbuf.shape or residual.dtype != sendbuf.dtype \
            or not residual.flags.c_contiguous or not residual.flags.writeable:
        raise ValueError(f"residual must be a writeable C-contiguous array of shape {sendbuf.shape} and dtype "
                         f"{sendbuf.dtype}, got {type(residual).__name__} {getattr(residual, 'shape', '')} "
                         f"{getattr(residual, 'dtype', '')}")
    if np.may_share_memory(residual, sendbuf) or (recvbuf is not None and np.may_share_memory(residual, recvbuf)):
        raise ValueError("residual must not share memory with sendbuf or recvbuf")


class Bound:
    """A call bound for running: ``runner(source, out)`` runs the plan from ``source`` into ``out``
    (contiguous 1-D buffers, ``source is out`` in place), raising CollectiveError."""

    __slots__ = ("comm", "runner", "what", "wire", "rounding", "shaped")

    def __init__(self, comm, runner, what, wire=None, rounding=False, shaped=False):
        self.comm, self.runner, self.what, self.wire, self.rounding = comm, runner, what, wire, rounding
        # ``shaped``: the runner is a prepared program, which takes the caller's own contiguous
        # arrays (any shape, overlap checked) and binds to them when a pair repeats: it must see
        # the same array objects call after call, never fresh views of them
        self.shaped = shaped

    def run(self, call):
        """Run on the call's buffers (any layout): the result, in ``recvbuf`` where one was given."""
        return self.run_on(call.sendbuf, call.recvbuf, call.backend, call.residual)

    def run_on(self, sendbuf, recvbuf, backend=NUMPY, residual=None):
        in_place = recvbuf is sendbuf
        if self.shaped:
            return self._run_shaped(sendbuf, recvbuf, backend, in_place)
        out, result, copy_back = _work_buffer(sendbuf, recvbuf, backend, copy_in=self.wire is not None)
        source = out if in_place or self.wire is not None else backend.flat_contiguous(sendbuf)
        if residual is not None:
            flat_residual = residual.reshape(-1)
            out += flat_residual  # the input plus what earlier calls dropped ...
            flat_residual[...] = out
            self.wire.round(out)
            flat_residual -= out  # ... and what this call's rounding drops
        try:
            self.runner(source, out)
        except CollectiveError as exc:
            failed(self.comm, self.what, exc)
            raise
        if self.rounding:  # ranks may hold x or round(x) of a value some rank rounded as it sent it: all take round(x)
            self.wire.round(out)
        if copy_back is not None:
            backend.copyto(copy_back, out.reshape(copy_back.shape))
        return result


    def _run_shaped(self, sendbuf, recvbuf, backend, in_place):
        source = sendbuf if backend.is_contiguous(sendbuf) else backend.flat_contiguous(sendbuf)
        if recvbuf is None:
            target = backend.empty(sendbuf.size, sendbuf.dtype)
        else:
            target = recvbuf if backend.is_contiguous(recvbuf) else backend.empty(sendbuf.size, sendbuf.dtype)
            if in_place and target is recvbuf:
                source = target
        try:
            self.runner(source, target)
        except CollectiveError as exc:
            failed(self.comm, self.what, exc)
            raise
        if recvbuf is None:
            return target.reshape(sendbuf.shape)
        if target is not recvbuf:
            backend.copyto(recvbuf, target.reshape(recvbuf.shape))
        return recvbuf


def _work_buffer(sendbuf, recvbuf, backend, copy_in):
    """(contiguous 1-D result buffer, what the call returns, the caller's buffer to copy into
    afterwards or None). ``copy_in``: the send data is copied into the buffer first."""
    count, dtype = sendbuf.size, sendbuf.dtype
    if recvbuf is None:
        out = backend.empty(count, dtype)
        result, copy_back = out.reshape(sendbuf.shape), None
    elif backend.is_contiguous(recvbuf) and (recvbuf is sendbuf
                                             or not backend.xp.may_share_memory(recvbuf, sendbuf)):
        out, result, copy_back = recvbuf.reshape(-1), recvbuf, None
    else:  # strided or overlapping: a fresh buffer, copied back at the end
        out, result, copy_back = backend.empty(count, dtype), recvbuf, recvbuf
    if recvbuf is sendbuf and copy_back is not None:
        backend.copyto(out, backend.flat_contiguous(sendbuf))
    elif copy_in and recvbuf is not sendbuf:
        backend.copyto(out, backend.flat_contiguous(sendbuf))
    return out, result, copy_back


# choose, plan, bind --------------------------------------------------------------------------------
def _bind(comm, call):
    choice = select.choose(comm, call, _measured_call)
    name, module, params = choice.algorithm, choice.module, choice.params
    dtype, count, op, backend = call.dtype, call.sendbuf.size, call.op, call.backend
    key = ("allreduce", name, comm.size, comm.rank, count, dtype.itemsize, tuple(sorted(params.items())))
    plan = comm.session.plan(key, lambda: module.build(comm.rank, comm.size, count, itemsize=dtype.itemsize,
                                                       **params))
    extra = dict(params, compression=call.fmt, scope=call.scope) if call.fmt is not None else params
    maybe_check(comm, "allreduce", name, op, dtype, count, extra)
    reduce_fn, final_fn = ufuncs(op, dtype, backend, comm.size)
    sig = signature("allreduce", name, op, dtype, count, params)
    if call.fmt is not None:
        what = f"allreduce({name}, {call.fmt})"
        wire, rounding = _compression.compressed(comm, call.fmt, call.scope)
        sig += f"|{call.fmt}|{call.scope}"
        return Bound(comm, _plan_runner(plan, wire, backend, reduce_fn, final_fn, what, None, sig), what,
                     wire, rounding)
    what = f"allreduce({name})"
    route = shm_transport(comm, name, count, dtype.itemsize, params, module, sig) if choice.transport == "shm" else None
    # a prepared program's tags differ from the plan's: none where another node's ranks may run
    # this call over shared memory (a rank alone on its host meets them through MPI)
    if choice.prepared:
        program = program_for(comm, plan, name, op, dtype, count, params, reduce_fn, final_fn, what)
        if program is not None:
            return Bound(comm, program, what, shaped=True)
    return Bound(comm, _plan_runner(plan, comm, backend, reduce_fn, final_fn, what, route, sig), what)


class _Held:
    """A runner's call on fixed buffers, held as a program holds its binding: ``bound`` is
    (sendbuf, recvbuf, actions), which the fast path reruns while its holder still holds it."""

    __slots__ = ("bound",)

    def __init__(self, bound):
        self.bound = bound


def _plan_runner(plan, comm, backend, reduce_fn, final_fn, what, route, sig):
    """The Bound's runner: the plan in the step loop, its messages over ``route`` (a
    transport's ``bind_call``: the communicator's own where None)."""
    def runner(source, out):
        execute_plan(plan, comm, backend, source, out, reduce_fn, final_fn, what, route, sig)
    return runner


# the whole path ----------------------------------------------------------------------------------
_compression_env = config.is_set
_no_overrides = config.no_overrides
_get_resolution = _resolution.get


def allreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None, compression=None,
              compression_scope="across_hosts", residual=None, **options):
    """Reduce ``sendbuf`` over every rank of ``comm`` with ``op``; every rank gets the result.

    ``recvbuf=None`` returns a new array; ``recvbuf is sendbuf`` works in place;
    otherwise the result goes into ``recvbuf`` (same shape and dtype) and
    ``sendbuf`` is left unchanged. ``options`` are the algorithm's own
    (``collectives.algorithm_options(name)`` lists them). ``compression`` (``"bf16"``,
    ``"fp16"``; default COLLECTIVES_COMPRESSION, else none) sends float32/float64 data as 16-bit
    values across hosts (every message with ``compression_scope="all"``); ``residual`` keeps what
    the rounding dropped, for the next call (error feedback). See collectives/compression.py.
    """
    uncompressed = compression is None and residual is None and compression_scope == "across_hosts"
    if not uncompressed or not _no_overrides():  # no fast path: compression, or an environment override
        if uncompressed and not _compression_env("COLLECTIVES_COMPRESSION"):
            return call(sendbuf, recvbuf, op, algorithm, comm, options, shape=options_key(options))
        return call(sendbuf, recvbuf, op, algorithm, comm, options, compression, compression_scope, residual)
    memo = _get_resolution()  # this thread's last communicator argument not ours: (it, ours, session, releases)
    if memo[0] is comm and memo[3] == _releases[0]:
        ours, session = memo[1], memo[2]
    else:
        ours = comm if isinstance(comm, Communicator) else resolve(comm)
        session = ours.session
    shape = options_key(options) if options else ()
    if shape is not None:
        last = session.last
        # the shortest path: the same buffers as the previous call, still bound to its program
        if last is not None and sendbuf is last[0] and recvbuf is last[1] and algorithm == last[2] \
                and op == last[3] and shape == last[4] and sendbuf.dtype is last[5] and last[6].bound is last[7]:
            try:
                run(last[7][2])
            except CollectiveError as exc:
                failed(ours, last[8], exc)
                raise
            next(session.calls)  # RanksLost.completed counts the caller's calls that returned
            return recvbuf
        # the short path: a call shape seen before, contiguous NumPy buffers
        if type(sendbuf) is np.ndarray and sendbuf.flags.c_contiguous:
            bound = session.shapes.get((algorithm, op, sendbuf.dtype, sendbuf.size, shape, recvbuf is sendbuf))
            if bound is not None and bound.shaped:  # a prepared program takes the caller's arrays
                source = sendbuf
                if recvbuf is None:
                    result = out = np.empty(sendbuf.shape, sendbuf.dtype)
                elif recvbuf is sendbuf or (type(recvbuf) is np.ndarray and recvbuf.flags.c_contiguous
                                            and recvbuf.shape == sendbuf.shape and recvbuf.dtype == sendbuf.dtype):
                    result = out = recvbuf
                else:
                    result = None
            elif bound is not None:
                source = sendbuf.reshape(-1)
                if recvbuf is None:
                    result = np.empty(sendbuf.shape, sendbuf.dtype)
                    out = result.reshape(-1)
                elif recvbuf is sendbuf:
                    result, out = sendbuf, source
                elif type(recvbuf) is np.ndarray and recvbuf.flags.c_contiguous \
                        and recvbuf.shape == sendbuf.shape and recvbuf.dtype == sendbuf.dtype \
                        and not np.may_share_memory(recvbuf, sendbuf):
                    result, out = recvbuf, recvbuf.reshape(-1)
                else:
                    result = None
            if bound is not None and result is not None:
                try:
                    bound.runner(source, out)
                except CollectiveError as exc:
                    failed(ours, bound.what, exc)
                    raise
                if result is recvbuf:  # remember the buffers and what runs on them
                    if bound.shaped:  # a program: its binding, (sendbuf, recvbuf, actions), once a pair repeats
                        holder = bound.runner
                    else:  # the runner on these views, as one action
                        holder = _Held((sendbuf, recvbuf, (partial(bound.runner, source, out),)))
                    binding = holder.bound
                    if binding is not None and binding[0] is sendbuf and binding[1] is recvbuf:
                        session.last = (sendbuf, recvbuf, algorithm, op, shape, sendbuf.dtype, holder, binding,
                                        bound.what)
                next(session.calls)
                return result
    return call(sendbuf, recvbuf, op, algorithm, ours, options, shape=shape)


def call(sendbuf, recvbuf, op, algorithm, comm, options, compression=None, scope="across_hosts", residual=None,
         point_to_point=False, shape=None, counted=True):
    """One all-reduce along the whole path; ``shape``: the call's options as a hashable key, or
    None (the Bound is then not kept for the fast path); ``counted``: a caller's call (not a
    measurement), counted in the session's ``calls``."""
    request = Call(sendbuf, recvbuf, op, algorithm, options, compression, scope, residual, point_to_point)
    ours = usable(comm)
    bound = _bind(ours, request)
    if shape is not None and request.fmt is None and not point_to_point and request.backend is NUMPY \
            and not config.check_enabled() and config.forced_algorithm() is None:
        shapes = ours.session.shapes
        if len(shapes) > 1024:
            shapes.clear()
        shapes[(algorithm, op, request.dtype, request.sendbuf.size, shape, recvbuf is sendbuf)] = bound
    result = bound.run(request)
    if counted:
        next(ours.session.calls)
    return result


def _measured_call(sendbuf, recvbuf, *, op="sum", algorithm, comm, transport="auto"):
    """What first-use calibration times, never the public function: the first call of a pair
    takes the whole path, and later ones run its Bound on the buffers (what a repeated call
    runs, less the fast path's lookups, which every pair pays alike)."""
    ours = resolve(comm)
    shape = (("transport", transport),)
    bound = ours.session.shapes.get((algorithm, op, sendbuf.dtype, sendbuf.size, shape, recvbuf is sendbuf))
    if bound is None or config.check_enabled():
        return call(sendbuf, recvbuf, op, algorithm, ours, {"transport": transport}, shape=shape, counted=False)
    return bound.run_on(sendbuf, recvbuf)


def options_key(options):
    """The call's options (transport= among them) as part of its shape; None: not hashable."""
    if not options:
        return ()
    try:
        shape = tuple(sorted(options.items()))
        hash(shape)
    except TypeError:
        return None
    return shape
