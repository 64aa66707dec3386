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
