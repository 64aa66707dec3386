"""Reduction ops and supported dtypes, by name.

Every reduction goes through a NumPy-style ufunc called with ``out=``, so the
same table serves NumPy and CuPy arrays (CuPy mirrors the ufunc names).
"""
import numpy as np

# name -> ufunc name; "avg" reduces with add and divides once by the world size.
OPS = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "avg": "add"}

_DTYPE_NAMES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64"]
DTYPES = [np.dtype(name) for name in _DTYPE_NAMES]
try:  # bfloat16 where ml_dtypes is installed
    import ml_dtypes as _ml_dtypes

    DTYPES.append(np.dtype(_ml_dtypes.bfloat16))
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

_DTYPE_SET = frozenset(DTYPES)


def dtype_names():
    return [str(d) for d in DTYPES]


def is_floating(dtype):
    return dtype.kind == "f" or (_ml_dtypes is not None and dtype == np.dtype(_ml_dtypes.bfloat16))


def check_op_dtype(op, dtype):
    """Return the ufunc name for ``op`` on ``dtype``; ValueError listing the choices otherwise."""
    try:
        ufunc_name = OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}") from None
    if dtype not in _DTYPE_SET:
        raise ValueError(f"unsupported dtype {dtype}; supported dtypes: {', '.join(dtype_names())}")
    if op == "avg" and not is_floating(dtype):
        raise ValueError(f"op 'avg' needs a floating dtype, got {dtype}; "
                         f"use 'sum' for integers or one of: "
                         f"{', '.join(str(d) for d in DTYPES if is_floating(d))}")
    return ufunc_name


# A reduction writes its output with vector stores. NumPy's allocations start 16 bytes past a cache
# line and its loops do not align their stores, so every 64-byte store straddles two lines; a peer
# that reads that output next (the next step's message, or in place the next call's, through MPI's
# single-copy path or shared memory) then reads slower than after aligned stores. Splitting the
# reduction at the output's first 64-byte boundary keeps its bulk aligned
# (docs/performance.md#aligned-reductions).
STORE_ALIGN = 64
SPLIT_MIN_BYTES = 8 << 10  # smaller outputs stay whole (one more ufunc call would cost more than it saves)


def aligned_parts(out, a, b):
    """The reduction ``out = a op b`` of flat arrays as ``(out, a, b)`` parts to run in turn: two
    for a NumPy output that straddles a 64-byte boundary (a head of a few elements, then the bulk,
    whose output starts on the boundary), else the whole as one part (small, already aligned, not
    NumPy, or not alignable at its item size)."""
    if out.nbytes < SPLIT_MIN_BYTES or out.__class__ is not np.ndarray:
        return ((out, a, b),)
    skew = -out.__array_interface__["data"][0] % STORE_ALIGN
    if not skew or skew % out.itemsize:
        return ((out, a, b),)
    k = skew // out.itemsize
    return (out[:k], a[:k], b[:k]), (out[k:], a[k:], b[k:])
