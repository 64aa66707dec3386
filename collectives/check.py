"""COLLECTIVES_CHECK=1: ranks agree on the call before any data moves.

One fixed-size exchange: each rank contributes six int64 fields (call, algorithm,
op, dtype, count, options) through an all-gather plan; every rank compares all
of them and raises the same MismatchError, naming the field and the ranks that
differ from rank 0.
"""
import zlib

import numpy as np

from . import blocks
from .algorithms import names
from .backend import NUMPY
from .errors import MismatchError
from .executor import execute
from .ops import DTYPES, OPS

FIELDS = ("call", "algorithm", "op", "dtype", "count", "options")
_OPS = list(OPS)


def _code(text):
    return zlib.crc32(str(text).encode())


def encode(kind, algorithm, op, dtype, count, params):
    dtype_code = DTYPES.index(dtype) if dtype in DTYPES else -1
    op_code = _OPS.index(op) if op in _OPS else -1
    return np.array([_code(kind), _code(algorithm), op_code, dtype_code, count,
                     _code(sorted(params.items()))], dtype=np.int64)


_CALLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def _names():
    """crc32 -> name for every call and algorithm name, so that messages show names, not codes."""
    known = set(_CALLS) | set(names()) | {"auto"}
    for table in (blocks.REDUCE_SCATTER, blocks.ALLGATHER, blocks.BROADCAST, blocks.REDUCE):
        known |= set(table)
    return {_code(name): name for name in known}


def _show(field, value):
    if field in ("call", "algorithm"):
        name = _names().get(value)
        if name is not None:
            return name
    if field == "dtype":
        return str(DTYPES[value]) if 0 <= value < len(DTYPES) else "?"
    if field == "op":
        return _OPS[value] if 0 <= value < len(_OPS) else "?"
    if field == "count":
        return str(value)
    return f"#{value:08x}"


def agree(comm, kind, algorithm, op, dtype, count, params):
    mine = encode(kind, algorithm, op, dtype, count, params)
    width = len(FIELDS)
    table = np.zeros(comm.size * width, dtype=np.int64)
    bounds = [r * width for r in range(comm.size + 1)]
    plan = comm.session.plan(("allgather", "check", comm.size, comm.rank),
                             lambda: blocks.allgather_ring(comm.rank, comm.size, bounds))
    tmp = comm.session.scratch_buffer(NUMPY, table.dtype, plan.tmp_count)
    execute(plan, comm, mine, table, tmp, None, None, f"{kind}({algorithm}) check", None, "check")
    table = table.reshape(comm.size, width)
    for column, field in enumerate(FIELDS):
        values = table[:, column]
        if (values != values[0]).any():
            groups = {}
            for rank, value in enumerate(values.tolist()):
                groups.setdefault(value, []).append(rank)
            detail = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {_show(field, v)}"
                               for v, r in groups.items())
            differ = [r for r, v in enumerate(values.tolist()) if v != values[0]]
            first = _show("call", int(table[0, 0]))  # rank 0's call: the same text on every rank
            error = MismatchError(f"{first}: ranks disagree on {field} (ranks {', '.join(map(str, differ))} "
                                  f"differ from rank 0): {detail}")
            error.agreed = True  # every rank raises it, after a complete exchange: the communicator stays usable
            raise error
