"""One all-reduce call without the API's per-call memos: wire compression, error feedback, and the
path the nonblocking progress threads take.

``collectives.allreduce`` keeps module-level memos of its last calls (its shortest paths); a call
made from another thread (``iallreduce``'s progress thread) must never read or write them while
the main thread does, so it comes here. Compressed calls come here too (``compression=``,
``residual=``, or ``COLLECTIVES_COMPRESSION`` for float32/float64 data): the plan runs in place
on the result buffer over a ``compression.CompressedComm``; see collectives/compression.py.
"""
import numpy as np

import importlib

_algorithms = importlib.import_module("collectives.algorithms")
from . import api as _api
from . import compression as _compression
from . import config
from .backend import NUMPY, backend_for
from .errors import CollectiveError
from .executor import execute
from .ops import check_op_dtype

_choices = {}


def _check_recvbuf(sendbuf, recvbuf, backend):
    if recvbuf is not None and recvbuf is not sendbuf:
        if getattr(recvbuf, "shape", None) != sendbuf.shape or getattr(recvbuf, "dtype", None) != sendbuf.dtype:
            raise ValueError(f"recvbuf must match sendbuf: got shape {getattr(recvbuf, 'shape', None)} "
                             f"dtype {getattr(recvbuf, 'dtype', None)}, expected shape {sendbuf.shape} "
                             f"dtype {sendbuf.dtype}")
        if backend_for(recvbuf) is not backend:
            raise ValueError("sendbuf and recvbuf must both be host (NumPy) or both device (CuPy) arrays")


def _plan(comm, name, count, dtype, options):
    module = _algorithms.get(name)
    params = _algorithms.resolve(module, options, comm.hosts, comm.size)[1]
    key = ("allreduce", name, comm.size, comm.rank, count, dtype.itemsize, tuple(sorted(params.items())))
    plan = comm.session.plan(key, lambda: module.build(comm.rank, comm.size, count, itemsize=dtype.itemsize,
                                                       **params))
    return module, params, plan


def _options_for(name, algorithm, options):
    if name != algorithm and options:  # forced or chosen: keep only the options it takes
        return {k: v for k, v in options.items() if k in _algorithms.get(name).OPTIONS}
    return options


def _no_transport(options):
    """The options without ``transport``: these calls move messages through the communicator's own
    point-to-point transport (ValueError for any other request)."""
    if options and "transport" in options:
        options = dict(options)
        requested = options.pop("transport")
        if requested != "auto":
            raise ValueError(f"transport={requested!r} is not available with compression= or iallreduce "
                             f"(their messages go through the communicator's point-to-point transport)")
    return options


def _execute(plan, comm, work, reduce_fn, final_fn, what, sig, inbuf=None):
    tmp = comm.session.scratch_buffer(NUMPY, work.dtype, plan.tmp_count)
    try:
        execute(plan, comm, work if inbuf is None else inbuf, work, tmp, reduce_fn, final_fn, what, None, sig)
    except CollectiveError as exc:
        _api._failed(getattr(comm, "inner", comm), what, exc)
        raise


def plain(sendbuf, recvbuf, op, algorithm, comm, options):
    """``allreduce`` as the API runs it (the plan over the communicator's messages), touching none
    of its module-level memos. Host (NumPy) arrays."""
    options = _no_transport(options)
    sendbuf = _api._as_array(sendbuf, "sendbuf")
    backend = backend_for(sendbuf)
    if backend is not NUMPY:
        raise ValueError("iallreduce runs on host (NumPy) arrays")
    dtype = sendbuf.dtype
    check_op_dtype(op, dtype)
    if algorithm != "auto":
        _algorithms.get(algorithm)
    _check_recvbuf(sendbuf, recvbuf, backend)
    comm = _api._usable(comm)
    name = _api._select_pair(algorithm, comm, sendbuf.nbytes, dtype)[0]
    options = _options_for(name, algorithm, options)
    module, params, plan = _plan(comm, name, sendbuf.size, dtype, options)
    if config.check_enabled():
        from .check import agree
        agree(comm, "allreduce", name, op, dtype, sendbuf.size, params)
    reduce_fn, final_fn = _api._ufuncs(op, dtype, backend, comm.size)
    sig = _api.signature("allreduce", name, op, dtype, sendbuf.size, params)
    out, result, copy_back = _work_buffer(sendbuf, recvbuf, backend, copy_in=False)
    source = out if recvbuf is sendbuf else backend.flat_contiguous(sendbuf)
    _execute(plan, comm, out, reduce_fn, final_fn, f"allreduce({name})", sig, inbuf=source)
    if copy_back is not None:
        backend.copyto(copy_back, out.reshape(copy_back.shape))
    return result


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


def _choose(comm, nbytes, dtype, fmt, scope, algorithm):
    """The algorithm of a compressed call: forced, named, or by the cost model with the wire's bytes
    (the tuning table measured uncompressed messages, so it is not asked)."""
    if algorithm != "auto" or config.forced_algorithm() is not None:
        return _api._select_pair(algorithm, comm, nbytes, dtype)[0]
    from . import select
    from .model import BETA, BETA_INTER

    hosts = select.topology(comm) if comm.size > 1 else (tuple(range(comm.size)),)
    key = (comm.size, nbytes, dtype, hosts, fmt, scope)
    hit = _choices.get(key)
    if hit is None:
        ratio = _compression.wire_ratio(fmt, dtype.itemsize)
        beta = BETA * ratio if scope == "all" else BETA
        if len(hosts) > 1:
            candidates = [n for n in _algorithms.names() if n != "shm"]
            name, costs = select.two_level_choice(hosts, nbytes, beta=beta, beta_inter=BETA_INTER * ratio,
                                                  candidates=candidates)
            why = f"two-level cost model with {fmt} on the wire, {select.describe_topology(hosts)}"
        else:
            candidates = [n for n in _algorithms.names() if n not in ("shm", "two_level")]
            name, costs = select.cost_choice(comm.size, nbytes, beta=beta, candidates=candidates)
            why = f"cost model with {fmt} on the wire ({scope})"
        hit = _choices[key] = (name, f"{why} ({costs[name] * 1e6:.1f} us predicted)")
        if len(_choices) > 4096:
            _choices.clear()
    select.log_choice(comm, nbytes, dtype, *hit)
    return hit[0]


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


def allreduce(sendbuf, recvbuf, op, algorithm, comm, options, compression, scope, residual, caller_thread=False):
    """``collectives.allreduce`` with ``compression`` (or COLLECTIVES_COMPRESSION) and ``residual``.
    ``caller_thread``: called by ``collectives.allreduce`` itself, so a call that turns out not to be
    compressed (integer data under COLLECTIVES_COMPRESSION) takes the API's own path, memos included."""
    uncompressed = _api._allreduce if caller_thread else plain
    options = _no_transport(options)
    sendbuf = _api._as_array(sendbuf, "sendbuf")
    explicit = compression is not None and compression != "none"
    fmt = compression if explicit else (None if compression == "none" else _compression.env_default())
    dtype = sendbuf.dtype
    if fmt is None and residual is None and scope == "across_hosts":
        return uncompressed(sendbuf, recvbuf, op, algorithm, comm, options)
    if not explicit:
        if fmt is None:
            raise ValueError(f"{'residual' if residual is not None else 'compression_scope'} needs compression= "
                             f"(bf16 or fp16) or COLLECTIVES_COMPRESSION")
        if dtype not in (np.float32, np.float64) and residual is None:  # the default covers float data only
            return uncompressed(sendbuf, recvbuf, op, algorithm, comm, options)
    backend = backend_for(sendbuf)
    if backend is not NUMPY:
        raise ValueError("compression= runs on host (NumPy) arrays")
    _compression.check(fmt, scope, dtype)
    check_op_dtype(op, dtype)
    if algorithm != "auto":
        _algorithms.get(algorithm)
    _check_recvbuf(sendbuf, recvbuf, backend)
    check_residual(residual, sendbuf, recvbuf)
    comm = _api._usable(comm)
    wrapper, rounding = _compression.compressed(comm, fmt, scope)
    name = _choose(comm, sendbuf.nbytes, dtype, fmt, scope, algorithm)
    options = _options_for(name, algorithm, options)
    module, params, plan = _plan(comm, name, sendbuf.size, dtype, options)
    if config.check_enabled():
        from .check import agree
        agree(comm, "allreduce", name, op, dtype, sendbuf.size, dict(params, compression=fmt, scope=scope))
    reduce_fn, final_fn = _api._ufuncs(op, dtype, backend, comm.size)
    what = f"allreduce({name}, {fmt})"
    sig = _api.signature("allreduce", name, op, dtype, sendbuf.size, params) + f"|{fmt}|{scope}"
    out, result, copy_back = _work_buffer(sendbuf, recvbuf, backend, copy_in=True)
    if residual is not None:
        flat_residual = residual.reshape(-1)
        out += flat_residual  # the input plus what earlier calls dropped ...
        flat_residual[...] = out
        wrapper.round(out)
        flat_residual -= out  # ... and what this call's rounding drops
    _execute(plan, wrapper, out, reduce_fn, final_fn, what, sig)
    if rounding:  # ranks may hold x or round(x) of a value some rank rounded as it sent it: all take round(x)
        wrapper.round(out)
    if copy_back is not None:
        backend.copyto(copy_back, out.reshape(copy_back.shape))
    return result
