"""Bucketer on threaded worlds: arrays marked ready in any order (a different one on each rank)
end reduced exactly as per-array all-reduces, bitwise identical on every rank, round after round."""
import numpy as np
import pytest

import collectives


def _grads(rank, round_, shapes, dtypes):
    rng = np.random.default_rng(100 * round_ + rank)
    return [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]


SHAPES = [(3, 4), (1000,), (7,), (50, 20), (1,), (4096,), (0,), (33, 3)]
DTYPES = [np.float32, np.float32, np.float32, np.float64, np.float64, np.float32, np.float32, np.float32]


@pytest.mark.parametrize("bucket_bytes", [1, 200, 4096, 25 << 20])
@pytest.mark.parametrize("n", [2, 3])
def test_any_readiness_order_gives_the_per_array_result(n, bucket_bytes):
    def body(comm):
        grads = _grads(comm.rank, 0, SHAPES, DTYPES)
        buckets = collectives.Bucketer(grads, bucket_bytes, comm=comm, op="avg", algorithm="ring")
        out = []
        for round_ in range(3):
            fresh = _grads(comm.rank, round_, SHAPES, DTYPES)
            order = np.random.default_rng(comm.rank * 31 + round_).permutation(len(grads))
            for i in order:  # each rank its own order
                grads[i][...] = fresh[i]
                buckets.mark_ready(int(i))
            buckets.wait(timeout=60)
            want = [collectives.allreduce(f, comm=comm, op="avg", algorithm="ring") for f in fresh]
            out.append(([g.copy() for g in grads], want))
        return out, len(buckets.buckets)

    results = collectives.run_threaded(n, body)
    for rounds, nbuckets in results:
        if bucket_bytes == 1:
            assert nbuckets == len(SHAPES)
        if bucket_bytes == 25 << 20:
            assert nbuckets == 3  # dtype runs: f32 x3, f64 x2, f32 x3
        for round_, (got, want) in enumerate(rounds):
            for i, (g, w) in enumerate(zip(got, want)):
                assert g.shape == SHAPES[i] and g.dtype == DTYPES[i]
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
                assert g.tobytes() == results[0][0][round_][0][i].tobytes()  # every rank alike


def test_compression_and_error_feedback_through_buckets():
    def body(comm):
        comm.node_colors = lambda: (0, 1)
        grads = [np.full(100, 1 + 2.0 ** -10, np.float32), np.full(10, 3.0, np.float32)]
        buckets = collectives.Bucketer(grads, comm=comm, compression="bf16", error_feedback=True,
                                       algorithm="ring")
        buckets.reduce(timeout=60)
        first = [g.copy() for g in grads]
        residual = buckets.residuals[0].copy()
        grads[0][...] = 1 + 2.0 ** -10
        grads[1][...] = 3.0
        buckets.reduce(timeout=60)
        return first, residual, [g.copy() for g in grads]

    results = collectives.run_threaded(2, body)
    first, residual, second = results[0]
    assert np.array_equal(first[0], np.full(100, 2.0, np.float32))  # 1 + 2^-10 rounds to 1 in bf16
    assert np.array_equal(residual[:100], np.full(100, 2.0 ** -10, np.float32))
    assert np.array_equal(second[0], np.full(100, 2.0, np.float32))
    assert np.array_equal(first[1], np.full(10, 6.0, np.float32))
    for r in results[1:]:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(r[0] + r[2], first + second))


def test_single_array_bucket_is_reduced_in_place_without_copies():
    def body(comm):
        big = np.ones(5000, np.float32)
        buckets = collectives.Bucketer([big], comm=comm)
        assert np.shares_memory(buckets.buffers[0], big)
        buckets.mark_ready(0)
        buckets.wait()
        return big

    assert all(np.array_equal(b, np.full(5000, 3.0, np.float32)) for b in collectives.run_threaded(3, body))


def test_bad_use_is_a_value_error():
    with pytest.raises(ValueError, match="C-contiguous"):
        collectives.Bucketer([np.ones((4, 4))[:, ::2]])
    with pytest.raises(ValueError, match="bucket_bytes"):
        collectives.Bucketer([np.ones(4)], 0)
    with pytest.raises(ValueError, match="error_feedback=True needs compression"):
        collectives.Bucketer([np.ones(4)], error_feedback=True)

    def body(comm):
        buckets = collectives.Bucketer([np.ones(4), np.ones(4)], comm=comm)
        with pytest.raises(ValueError, match="index must be"):
            buckets.mark_ready(2)
        buckets.mark_ready(0)
        with pytest.raises(ValueError, match="already marked ready"):
            buckets.mark_ready(0)
        with pytest.raises(ValueError, match=r"arrays \[1\] were never marked ready"):
            buckets.wait()
        buckets.mark_ready(1)
        return buckets.wait()[1]

    assert all(np.array_equal(r, np.full(4, 2.0)) for r in collectives.run_threaded(2, body))


def test_compression_leaves_integer_buckets_exact():
    def body(comm):
        comm.node_colors = lambda: (0, 1)
        arrays = [np.full(5, 2 ** 40 + 1, np.int64), np.full(5, 1 + 2.0 ** -10, np.float32)]
        collectives.Bucketer(arrays, comm=comm, compression="bf16", error_feedback=True).reduce(timeout=60)
        return arrays

    for ints, floats in collectives.run_threaded(2, body):
        assert np.array_equal(ints, np.full(5, 2 * (2 ** 40 + 1)))
        assert np.array_equal(floats, np.full(5, 2.0, np.float32))


def test_arrays_marked_from_several_threads_at_once():
    import threading

    def body(comm):
        grads = [np.full(50 + i, float(comm.rank + i), np.float32) for i in range(40)]
        buckets = collectives.Bucketer(grads, 600, comm=comm)
        workers = [threading.Thread(target=lambda k=k: [buckets.mark_ready(i) for i in range(k, 40, 4)])
                   for k in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return buckets.wait(timeout=60)

    for grads in collectives.run_threaded(3, body):
        for i, g in enumerate(grads):
            assert np.array_equal(g, np.full(50 + i, float(3 * i + 3), np.float32))
