"""The public building-block calls: reduce_scatter, allgather, broadcast and reduce.

Like allreduce (api.py), each validates its arguments before any communication, finds or builds
the cached plan, and runs it with the call's signature in its tags.
"""
import numpy as np

from . import blocks as _blocks
from .calls import as_array as _as_array, maybe_check, run_plan as _run, signature, ufuncs as _ufuncs, usable as _usable
from .backend import NUMPY, backend_for
from .ops import DTYPES, check_op_dtype
from .plan import block_bounds


def _block_algorithm(table, algorithm, what):
    try:
        return table[algorithm]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} algorithm {algorithm!r}; valid: {', '.join(table)}") from None


def _check_root(root, comm):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise ValueError(f"root must be a rank in 0..{comm.size - 1}, got {root!r}")
    return int(root)


def reduce_scatter(sendbuf, *, op="sum", comm=None, algorithm="ring"):
    """This rank's block (numpy.array_split of the flattened, reduced array)."""
    sendbuf = _as_array(sendbuf, "sendbuf")
    backend = backend_for(sendbuf)
    builder = _block_algorithm(_blocks.REDUCE_SCATTER, algorithm, "reduce_scatter")
    check_op_dtype(op, sendbuf.dtype)
    comm = _usable(comm)
    reduce_fn, final_fn = _ufuncs(op, sendbuf.dtype, backend, comm.size)
    count = sendbuf.size
    plan = comm.session.plan(("reduce_scatter", algorithm, comm.size, comm.rank, count),
                             lambda: builder(comm.rank, comm.size, count))
    maybe_check(comm, "reduce_scatter", algorithm, op, sendbuf.dtype, count, {})
    out = backend.empty(count, sendbuf.dtype)
    _run(plan, comm, backend, backend.flat_contiguous(sendbuf), out, reduce_fn, final_fn,
         f"reduce_scatter({algorithm})", signature=signature("reduce_scatter", algorithm, op, sendbuf.dtype, count))
    next(comm.session.calls)  # a call that returned (RanksLost.completed)
    bounds = block_bounds(count, comm.size)
    return out[bounds[comm.rank]:bounds[comm.rank + 1]].copy()


def _exchange_counts(comm, count):
    """Every rank's element count, through a fixed-size int64 all-gather (no pickling)."""
    counts = np.zeros(comm.size, dtype=np.int64)
    mine = np.array([count], dtype=np.int64)
    plan = comm.session.plan(("allgather", "counts", comm.size, comm.rank),
                             lambda: _blocks.allgather_ring(comm.rank, comm.size, list(range(comm.size + 1))))
    _run(plan, comm, NUMPY, mine, counts, None, None, "allgather(counts)",
         signature=signature("allgather", "counts", "", mine.dtype, comm.size))
    return [int(c) for c in counts]


def allgather(sendbuf, *, comm=None, algorithm="ring"):
    """The flattened blocks of every rank, concatenated in rank order (blocks may differ in size)."""
    sendbuf, backend, builder = _moved_data(sendbuf, "sendbuf", _blocks.ALLGATHER, algorithm, "allgather")
    comm = _usable(comm)
    # blocks may differ in size by design: the check compares call, algorithm and dtype
    # (count 0 on every rank), before the count exchange moves anything
    maybe_check(comm, "allgather", algorithm, "sum", sendbuf.dtype, 0, {})
    counts = _exchange_counts(comm, sendbuf.size)
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    plan = comm.session.plan(("allgather", algorithm, comm.size, comm.rank, tuple(bounds)),
                             lambda: builder(comm.rank, comm.size, bounds))
    out = backend.empty(bounds[-1], sendbuf.dtype)
    _run(plan, comm, backend, backend.flat_contiguous(sendbuf), out, None, None, f"allgather({algorithm})",
         signature=signature("allgather", algorithm, "", sendbuf.dtype, bounds[-1]))
    next(comm.session.calls)
    return out


_DTYPES = frozenset(DTYPES)


def _moved_data(buf, name, table, algorithm, what):
    """(array, backend, plan builder) for a block that only moves data (no op): the dtype must
    be one the library carries, checked before any communication."""
    buf = _as_array(buf, name)
    backend = backend_for(buf)
    builder = _block_algorithm(table, algorithm, what)
    if buf.dtype not in _DTYPES:
        check_op_dtype("sum", buf.dtype)
    return buf, backend, builder


def broadcast(buf, *, root=0, comm=None, algorithm="binomial"):
    """Copy ``buf`` from ``root`` into ``buf`` on every rank; returns ``buf``."""
    buf, backend, builder = _moved_data(buf, "buf", _blocks.BROADCAST, algorithm, "broadcast")
    comm = _usable(comm)
    root = _check_root(root, comm)
    count = buf.size
    sig = signature("broadcast", algorithm, "", buf.dtype, count, {"root": root})
    plan = comm.session.plan(("broadcast", algorithm, comm.size, comm.rank, count, root),
                             lambda: builder(comm.rank, comm.size, count, root=root))
    maybe_check(comm, "broadcast", algorithm, "sum", buf.dtype, count, {"root": root})
    if backend.is_contiguous(buf):
        flat = buf.reshape(-1)
        _run(plan, comm, backend, flat, flat, None, None, f"broadcast({algorithm})", signature=sig)
    else:
        flat = backend.flat_contiguous(buf).copy()
        _run(plan, comm, backend, flat, flat, None, None, f"broadcast({algorithm})", signature=sig)
        backend.copyto(buf, flat.reshape(buf.shape))
    next(comm.session.calls)
    return buf


def reduce(sendbuf, *, root=0, op="sum", comm=None, algorithm="binomial"):
    """The reduction of ``sendbuf`` over all ranks on ``root`` (same shape); None elsewhere."""
    sendbuf = _as_array(sendbuf, "sendbuf")
    backend = backend_for(sendbuf)
    builder = _block_algorithm(_blocks.REDUCE, algorithm, "reduce")
    check_op_dtype(op, sendbuf.dtype)
    comm = _usable(comm)
    root = _check_root(root, comm)
    reduce_fn, final_fn = _ufuncs(op, sendbuf.dtype, backend, comm.size)
    count = sendbuf.size
    plan = comm.session.plan(("reduce", algorithm, comm.size, comm.rank, count, root),
                             lambda: builder(comm.rank, comm.size, count, root=root))
    maybe_check(comm, "reduce", algorithm, op, sendbuf.dtype, count, {"root": root})
    out = backend.empty(count, sendbuf.dtype)
    _run(plan, comm, backend, backend.flat_contiguous(sendbuf), out, reduce_fn, final_fn, f"reduce({algorithm})",
         signature=signature("reduce", algorithm, op, sendbuf.dtype, count, {"root": root}))
    next(comm.session.calls)
    return out.reshape(sendbuf.shape) if comm.rank == root else None
