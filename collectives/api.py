"""The public calls: allreduce and the building blocks.

Every call validates its arguments before any communication (ValueError
listing the valid choices), finds or builds the cached plan for
(algorithm, world, count, dtype size, options), binds the caller's buffers and
the communicator's reusable scratch, and hands them to the executor.
"""

import numpy as np

from . import algorithms as _algorithms
from . import config
from . import session as _session
from .backend import NUMPY, backend_for
from .comm import base as _comm_base
from .comm.base import Communicator
from .errors import CollectiveError
from .executor import BoundProgram, Program, execute
from .plan import NCHANNELS
from .ops import check_op_dtype


def maybe_check(comm, kind, algorithm, op, dtype, count, params):
    if config.check_enabled():
        from .check import agree

        agree(comm, kind, algorithm, op, dtype, count, params)


_op_checks = {}  # (op, dtype, backend) -> ufunc: the same for every communicator


def algorithms():
    """Names of the registered all-reduce algorithms."""
    return _algorithms.names()


def as_comm(comm):
    """A collectives communicator for None (MPI.COMM_WORLD), an mpi4py intracommunicator or one of ours."""
    if isinstance(comm, Communicator):
        return comm
    from .comm import mpi as _mpi  # imports mpi4py only when MPI is asked for

    return _mpi.wrap(comm)


def _usable(comm):
    """as_comm(comm), refused with a CollectiveError when a call failed on it before."""
    ours = as_comm(comm)
    if ours.failed is not None:
        ours.check_usable()
    return ours


def barrier(comm=None):
    """Wait until every rank of ``comm`` calls it, bounded by COLLECTIVES_TIMEOUT (a timeout
    names the ranks not heard from). Tools call it before their first blocking MPI call."""
    ours = _usable(comm)
    try:
        ours.barrier("barrier")
    except CollectiveError as exc:
        _failed(ours, "barrier", exc)
        raise


def signature(kind, name, op, dtype, count, params=()):
    """The text every rank derives from its call: it picks the call's message tags."""
    return f"{kind}|{name}|{op}|{dtype.name}|{count}|{sorted(params.items()) if params else ''}"


def _failed(comm, what, exc):
    """A call failed after messages moved: the communicator is marked failed (later calls
    raise), its cached call shapes dropped, and under MPI the job aborts unless
    COLLECTIVES_ON_ERROR=raise."""
    comm.mark_failed(what, exc)
    _forget(comm)
    comm.on_failure(exc)


def clear_caches():
    """Drop every communicator's cached plans, programs and call shapes (scratch buffers and
    windows live and die with their communicator)."""
    _session.clear_all()
    _recent[:] = [_NO_CALL, None, None]
    _last[:] = [_NO_CALL] * 9


def library_memory(comm=None):
    """Bytes the library holds for ``comm`` on this rank, beyond the caller's buffers:
    ``scratch`` (the executor's, one buffer per dtype shared by every algorithm), ``programs``
    (cached programs' buffers: small messages' work and scratch, mid-size bound calls' scratch
    up to BOUND_BUDGET; ``program_shapes`` of them) and ``shm_window`` (this rank's shm segment)."""
    held = as_comm(comm).session.memory()
    return {**{k: held[k] for k in ("scratch", "programs", "program_shapes")}, "shm_window": held["windows"]}


def _forget(comm):
    """Drop ``comm``'s cached call shapes and programs (it failed, or is being released), and the
    module's memo of the last call where it names ``comm``."""
    comm.session.forget()
    if _last[7] is comm:
        _last[:] = [_NO_CALL] * 9
    if _recent[1] is comm:
        _recent[:] = [_NO_CALL, None, None]


_comm_base.on_release.append(_forget)


def _ufuncs(op, dtype, backend, size):
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


def _as_array(buf, name):
    if isinstance(buf, np.ndarray) or hasattr(buf, "__cuda_array_interface__"):
        return buf
    if buf is None:
        raise TypeError(f"{name} must be an array, got None")
    return np.asarray(buf)


def _run(plan, comm, backend, flat_in, flat_out, reduce_fn, final_fn, what, shm=None, signature=None):
    try:
        tmp = comm.session.scratch_buffer(backend, flat_out.dtype, plan.tmp_count)
        if shm is not None:  # (the shared-memory transport, every rank's plan of this call)
            transport, plans_of = shm
            transport.run(plan, plans_of, flat_in, flat_out, tmp, reduce_fn, final_fn, what, signature,
                          comm.call_tag(signature) * NCHANNELS)
            return
        sync = backend.synchronize if backend.is_device else None
        execute(plan, comm, flat_in, flat_out, tmp, reduce_fn, final_fn, what, sync, signature)
    except CollectiveError as exc:
        _failed(comm, what, exc)
        raise


# Messages up to PROGRAM_MAX_BYTES run as prepared programs where the transport has them (MPI);
# up to BOUND_MAX_BYTES, calls that repeat their buffers run bound to them (BoundProgram), with
# at most BOUND_BUDGET bytes of scratch held for that per communicator.
PROGRAM_MAX_BYTES, BOUND_MAX_BYTES, BOUND_BUDGET = 16 << 10, 256 << 10, 32 << 20


def _program(comm, plan, module, name, op, dtype, count, params, reduce_fn, final_fn, what):
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


def _run_program(program, comm, sendbuf, recvbuf):
    try:
        program(sendbuf, recvbuf)
    except CollectiveError as exc:
        _failed(comm, program.what, exc)
        raise


def _select_pair(name, comm, nbytes, dtype, transport=None, calibrate=None):
    """(the algorithm to run, the transport auto's pick was measured over, or None)."""
    from .select import pair_for

    return pair_for(name, comm, nbytes, dtype, transport, calibrate)


_no_overrides = config.no_overrides
_TRANSPORTS = config.TRANSPORTS
_compression_env = config.is_set
_NO_CALL = object()
_last = [_NO_CALL] * 9  # (sendbuf, recvbuf, comm, algorithm, op, dtype, program, our comm, options) of the last program call
# the comm argument of the last call that took the slow path, our communicator for it, and its
# session's call shapes (which hold no communicator: no reference cycle keeps a dead one alive)
_recent = [_NO_CALL, None, None]


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
    if compression is not None or residual is not None or compression_scope != "across_hosts" \
            or _compression_env("COLLECTIVES_COMPRESSION"):
        from .direct_call import allreduce as _direct

        return _direct(sendbuf, recvbuf, op, algorithm, comm, options, compression, compression_scope, residual,
                       caller_thread=True)
    # the call's options (transport= among them) as part of its shape; None: not hashable, no memo
    shape = ()
    if options:
        try:
            shape = tuple(sorted(options.items()))
            hash(shape)
        except TypeError:
            shape = None
    # the shortest path: the same buffers as the previous call, which ran as a program
    last = _last
    if sendbuf is last[0] and recvbuf is last[1] and comm is last[2] and algorithm == last[3] \
            and op == last[4] and shape == last[8] and sendbuf.dtype is last[5] \
            and _no_overrides():
        try:
            last[6](sendbuf, recvbuf)
        except CollectiveError as exc:
            _failed(last[7], last[6].what, exc)
            raise
        return recvbuf
    # the short path: a call shape seen before, contiguous NumPy buffers
    if shape is not None and comm is _recent[0] and type(sendbuf) is np.ndarray and sendbuf.flags.c_contiguous \
            and _no_overrides():
        hit = _recent[2].get((algorithm, op, sendbuf.dtype, sendbuf.size, shape, recvbuf is sendbuf))
        if hit is not None:
            ours = _recent[1]
            plan, reduce_fn, final_fn, what, shm, program, sig = hit
            if program is not None:  # a prepared program takes the caller's buffers itself
                if recvbuf is None:
                    result = np.empty(sendbuf.shape, sendbuf.dtype)
                elif type(recvbuf) is np.ndarray and recvbuf.shape == sendbuf.shape \
                        and recvbuf.dtype == sendbuf.dtype and recvbuf.flags.c_contiguous:
                    result = recvbuf
                else:
                    result = None
                if result is not None:
                    try:
                        program(sendbuf, result)
                    except CollectiveError as exc:
                        _failed(ours, what, exc)
                        raise
                    if result is recvbuf:  # remember the buffers (held until the next call)
                        _last[:] = (sendbuf, recvbuf, comm, algorithm, op, sendbuf.dtype, program, ours, shape)
                    return result
            else:
                flat_in = sendbuf.reshape(-1)
                if recvbuf is None:
                    result = np.empty(sendbuf.shape, sendbuf.dtype)
                    flat_out = result.reshape(-1)
                elif recvbuf is sendbuf:
                    result, flat_out = sendbuf, flat_in
                elif type(recvbuf) is np.ndarray and recvbuf.flags.c_contiguous \
                        and recvbuf.shape == sendbuf.shape and recvbuf.dtype == sendbuf.dtype \
                        and not np.may_share_memory(recvbuf, sendbuf):
                    result = recvbuf
                    flat_out = recvbuf.reshape(-1)
                else:
                    result = None
                if result is not None:
                    _run(plan, ours, NUMPY, flat_in, flat_out, reduce_fn, final_fn, what, shm, sig)
                    return result
    return _allreduce(sendbuf, recvbuf, op, algorithm, comm, options, shape)


def _allreduce(sendbuf, recvbuf, op, algorithm, comm, options, shape=None):
    user_comm = comm
    transport = options.pop("transport", "auto") if options else "auto"
    if transport not in _TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(_TRANSPORTS)}, got {transport!r}")
    config.transport()  # a bad COLLECTIVES_TRANSPORT is refused here, on every rank, before any message
    sendbuf = _as_array(sendbuf, "sendbuf")
    backend = backend_for(sendbuf)
    dtype = sendbuf.dtype
    if (op, dtype, backend.name) not in _op_checks:
        check_op_dtype(op, dtype)
    if algorithm != "auto":
        _algorithms.get(algorithm)
    in_place = recvbuf is sendbuf
    if recvbuf is not None and not in_place:
        if getattr(recvbuf, "shape", None) != sendbuf.shape or recvbuf.dtype != dtype:
            raise ValueError(f"recvbuf must match sendbuf: got shape {getattr(recvbuf, 'shape', None)} "
                             f"dtype {getattr(recvbuf, 'dtype', None)}, expected shape {sendbuf.shape} "
                             f"dtype {dtype}")
        if backend_for(recvbuf) is not backend:
            raise ValueError("sendbuf and recvbuf must both be host (NumPy) or both device (CuPy) arrays")
    comm = _usable(comm)
    calibrate = None
    if algorithm == "auto" and backend is NUMPY:  # first-use calibration, where select allows it
        def calibrate():
            from . import autotune
            from .comm import shm as _shm
            from .comm.shm_arrays import is_shared

            shared = backend.is_contiguous(sendbuf) and is_shared(comm, sendbuf)
            return autotune.pick(comm, sendbuf, recvbuf, _shm.available(comm), shared, allreduce, barrier)
    name, preferred = _select_pair(algorithm, comm, sendbuf.nbytes, dtype, transport, calibrate)
    module = _algorithms.get(name)
    if name != algorithm and options:  # forced or chosen: keep only the options it takes
        options = {k: v for k, v in options.items() if k in module.OPTIONS}
    reduce_fn, final_fn = _ufuncs(op, dtype, backend, comm.size)
    params = _algorithms.resolve(module, options, comm.hosts, comm.size)[1]
    count = sendbuf.size
    key = ("allreduce", name, comm.size, comm.rank, count, dtype.itemsize, tuple(sorted(params.items())))
    plan = comm.session.plan(key, lambda: module.build(comm.rank, comm.size, count, itemsize=dtype.itemsize,
                                                       **params))
    maybe_check(comm, "allreduce", name, op, dtype, count, params)
    what = f"allreduce({name})"
    sig = signature("allreduce", name, op, dtype, count, params)
    shm = None
    if backend is NUMPY and _select_transport(comm, module, sendbuf.nbytes, transport, preferred) == "shm":
        shm = _shm_transport(comm, name, count, dtype.itemsize, params, module)
    # a prepared program's tags differ from the plan's: none where another node's ranks may run
    # this call over shared memory (a rank alone on its host meets them through MPI)
    program = _program(comm, plan, module, name, op, dtype, count, params, reduce_fn, final_fn, what) \
        if backend is NUMPY and shm is None and not _shm_forced(module, transport, preferred) else None
    if shape is not None and backend is NUMPY and not config.check_enabled() and config.forced_algorithm() is None:
        shapes = comm.session.shapes
        if len(shapes) > 1024:
            shapes.clear()
        shapes[(algorithm, op, dtype, count, shape, in_place)] = (plan, reduce_fn, final_fn, what, shm, program, sig)
        _recent[:] = [user_comm, comm, shapes]
    if program is not None:
        source = sendbuf if backend.is_contiguous(sendbuf) else backend.flat_contiguous(sendbuf)
        if recvbuf is None:
            result = backend.empty(count, dtype)
            _run_program(program, comm, source, result)
            return result.reshape(sendbuf.shape)
        target = recvbuf if backend.is_contiguous(recvbuf) else backend.empty(count, dtype)
        _run_program(program, comm, source if target is not recvbuf or not in_place else target, target)
        if target is not recvbuf:
            backend.copyto(recvbuf, target.reshape(recvbuf.shape))
        return recvbuf

    if in_place:
        if backend.is_contiguous(sendbuf):
            flat = sendbuf.reshape(-1)
            _run(plan, comm, backend, flat, flat, reduce_fn, final_fn, what, shm, sig)
        else:
            flat = backend.flat_contiguous(sendbuf).copy()
            _run(plan, comm, backend, flat, flat, reduce_fn, final_fn, what, shm, sig)
            backend.copyto(sendbuf, flat.reshape(sendbuf.shape))
        return sendbuf
    flat_in = backend.flat_contiguous(sendbuf)
    if recvbuf is None:
        result = backend.empty(count, dtype)
        _run(plan, comm, backend, flat_in, result, reduce_fn, final_fn, what, shm, sig)
        return result.reshape(sendbuf.shape)
    if backend.is_contiguous(recvbuf) and not backend.xp.may_share_memory(recvbuf, sendbuf):
        _run(plan, comm, backend, flat_in, recvbuf.reshape(-1), reduce_fn, final_fn, what, shm, sig)
    else:  # a strided or overlapping recvbuf: reduce into a fresh buffer, then copy
        result = backend.empty(count, dtype)
        _run(plan, comm, backend, flat_in, result, reduce_fn, final_fn, what, shm, sig)
        backend.copyto(recvbuf, result.reshape(recvbuf.shape))
    return recvbuf


def _shm_forced(module, requested, preferred=None):
    """True when this call asks for the shared-memory transport whatever its size (the same
    answer on every rank: a rank alone on its node must not run a prepared program then)."""
    return "shm" in (requested, config.transport(), getattr(module, "TRANSPORT", None) if preferred is None else preferred)


def _select_transport(comm, module, nbytes, requested, preferred=None):
    from .select import log_transport, transport_choice

    transport, why = transport_choice(comm, module, nbytes, requested, preferred)
    if config.debug_level() in ("INFO", "DEBUG") and getattr(comm, "mpi_comm", None) is not None:
        log_transport(comm, nbytes, module.NAME, transport, why)  # (a threaded world has one transport)
    return transport


def _shm_transport(comm, name, count, itemsize, params, module):
    """(the communicator's shared-memory transport, every rank's plan of this call by rank)."""
    from .comm import shm as _shm

    size = comm.size
    items = tuple(sorted(params.items()))
    session = comm.session

    def plans_of(rank):
        return session.plan(("allreduce", name, size, rank, count, itemsize, items),
                            lambda: module.build(rank, size, count, itemsize=itemsize, **params))
    return _shm.for_comm(comm), plans_of


def algorithm_options(name):
    """The options ``name`` takes, with their defaults and meaning."""
    module = _algorithms.get(name)
    return {k: {"default": o.default, "doc": o.doc} for k, o in module.OPTIONS.items()}

