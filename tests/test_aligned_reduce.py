"""ops.aligned_parts: a reduction split at its output's first 64-byte boundary gives the same
bytes as the whole one, and its bulk's stores start on a cache line."""
import numpy as np
import pytest

from collectives.ops import SPLIT_MIN_BYTES, STORE_ALIGN, aligned_parts
from tests.helpers import at, reduction_spy


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
@pytest.mark.parametrize("offset", [8, 16, 48])
@pytest.mark.parametrize("ufunc", [np.add, np.maximum, np.multiply])
def test_a_split_reduction_has_the_whole_ones_bytes(dtype, offset, ufunc):
    count = SPLIT_MIN_BYTES // np.dtype(dtype).itemsize + 13
    rng = np.random.default_rng(offset)
    a = at(offset, count, dtype)
    b = at(0, count, dtype)
    a[...] = rng.standard_normal(count) * 100
    b[...] = rng.standard_normal(count) * 100
    expected = ufunc(a, b)
    out = at(offset, count, dtype)
    parts = aligned_parts(out, a, b)
    assert len(parts) == 2
    head, bulk = parts
    assert bulk[0].ctypes.data % STORE_ALIGN == 0 and 0 < head[0].size < STORE_ALIGN
    for o, x, y in parts:
        ufunc(x, y, out=o)
    assert out.tobytes() == expected.tobytes()
    # in place (out is a): the same bytes again
    for o, x, y in aligned_parts(a, a, b):
        ufunc(x, y, out=o)
    assert a.tobytes() == expected.tobytes()


def whole(out, a, b):
    """Whether aligned_parts gives the reduction back as one part, those very arrays."""
    parts = aligned_parts(out, a, b)
    return len(parts) == 1 and all(got is want for got, want in zip(parts[0], (out, a, b)))


def test_what_stays_whole():
    count = SPLIT_MIN_BYTES // 4
    aligned = at(0, count)
    assert whole(aligned, aligned, aligned)
    small = at(16, 16)
    assert whole(small, small, small)
    # float32 items one byte off their own alignment cannot reach a 64-byte boundary
    raw = np.zeros(SPLIT_MIN_BYTES + 128, np.uint8)
    skewed = np.frombuffer(raw.data, np.float32, count, offset=(-raw.ctypes.data % STORE_ALIGN) + 1)
    assert whole(skewed, skewed, skewed)
    # not a NumPy array (CuPy's arrays go whole)
    view = memoryview(bytearray(SPLIT_MIN_BYTES))
    assert whole(view, None, None)


def test_the_executor_stores_a_reductions_bulk_aligned(monkeypatch):
    """On a buffer 16 bytes past a cache line (as NumPy allocates), every reduction's output but a
    head of under 64 bytes starts on a 64-byte boundary, and the result is the sum."""
    import collectives
    from collectives import api

    outs = reduction_spy(monkeypatch, api)
    count = 4 * SPLIT_MIN_BYTES // 4

    def body(comm):
        x = at(16, count)
        x[...] = comm.rank + 1
        collectives.allreduce(x, x, comm=comm, algorithm="recursive_doubling")
        return x.copy()
    try:
        results = collectives.run_threaded(2, body)
    finally:
        collectives.clear_caches()
    assert all((r == 3).all() for r in results)
    bulk = [(address, nbytes) for address, nbytes in outs if nbytes >= STORE_ALIGN]
    assert bulk and all(address % STORE_ALIGN == 0 for address, _ in bulk), outs
