"""Every registered algorithm on threaded worlds: exact on integer data, close on random
floats, bitwise identical across ranks, every op and dtype, in place and out of place."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectives
from tests.helpers import ALL_DTYPES, bitwise_equal, integer_valued, ops_for, random_floats, reference, tolerance

ALGORITHMS = collectives.algorithm_names()
WORLDS = [1, 2, 3, 5, 7, 8, 16]
SMALL_OPTIONS = {"tree": {"segment_bytes": 16}, "double_binary_tree": {"segment_bytes": 16},
                 "hierarchical_copy": {"group_size": 2}}


def _allreduce_all(comm, count, dtype, options, algorithm, seed):
    out = {}
    for op in ops_for(dtype):
        x = integer_valued(comm.rank, count, dtype, op, seed)
        keep = x.copy()
        y = collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm, **options)
        assert bitwise_equal(x, keep), "sendbuf changed"
        out[op] = (keep, y)
    return out


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_op_and_dtype_exact(algorithm, n):
    for options in ({}, SMALL_OPTIONS.get(algorithm, {})):
        for dtype in ALL_DTYPES:
            for count in (0, 1, n - 1, 2 * n + 3):
                if count < 0:
                    continue
                results = collectives.run_threaded(n, _allreduce_all, count, dtype, options, algorithm, count)
                for op in results[0]:
                    expected = reference([r[op][0] for r in results], op)
                    for rank, r in enumerate(results):
                        got = r[op][1]
                        assert got.shape == expected.shape and got.dtype == dtype
                        assert bitwise_equal(got, expected), (algorithm, n, dtype, op, count, rank, options)


def _floats(comm, count, dtype, algorithm, op, options):
    x = random_floats(comm.rank, count, dtype)
    return x, collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm, **options)


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_random_floats_close_and_identical_on_every_rank(algorithm, n):
    for dtype in [d for d in ALL_DTYPES if d.kind == "f" or str(d) == "bfloat16"]:
        for op in ("sum", "avg", "max"):
            for options in ({}, SMALL_OPTIONS.get(algorithm, {})):
                results = collectives.run_threaded(n, _floats, 101, dtype, algorithm, op, options)
                expected = reference([np.asarray(r[0], np.float64) for r in results], op)
                first = results[0][1]
                for _, got in results:
                    assert bitwise_equal(got, first), "ranks differ"
                np.testing.assert_allclose(first.astype(np.float64), expected,
                                           rtol=tolerance(dtype, n), atol=tolerance(dtype, n))


def _shapes(comm, algorithm):
    out = []
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5) * (comm.rank + 1)
    # a non-contiguous view, out of place
    view = base[:, ::2, 1:]
    out.append(collectives.allreduce(view, algorithm=algorithm, comm=comm))
    # into a given recvbuf (strided too)
    target = np.zeros((3, 2, 8))[:, :, ::2]
    got = collectives.allreduce(view, target, algorithm=algorithm, comm=comm)
    assert got is target
    out.append(target.copy())
    # in place, contiguous and strided
    inplace = base.copy()
    assert collectives.allreduce(inplace, inplace, algorithm=algorithm, comm=comm) is inplace
    out.append(inplace)
    strided = base.copy()[::2]
    assert collectives.allreduce(strided, strided, algorithm=algorithm, comm=comm) is strided
    out.append(strided)
    # a 0-d array
    out.append(collectives.allreduce(np.array(comm.rank + 1.0), algorithm=algorithm, comm=comm))
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shapes_views_in_place_and_recvbuf(algorithm):
    n = 3
    results = collectives.run_threaded(n, _shapes, algorithm)
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5) * sum(range(1, n + 1))
    expected = [base[:, ::2, 1:], base[:, ::2, 1:], base, base[::2], np.array(6.0)]
    for per_rank in results:
        for got, want in zip(per_rank, expected):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 9), count=st.integers(0, 70), algorithm=st.sampled_from(ALGORITHMS),
       dtype=st.sampled_from(ALL_DTYPES), data=st.data())
def test_property_any_world_count_dtype_op(n, count, algorithm, dtype, data):
    op = data.draw(st.sampled_from(ops_for(dtype)))
    options = {}
    if algorithm in ("tree", "double_binary_tree"):
        options["segment_bytes"] = data.draw(st.integers(1, 64))
    if algorithm == "hierarchical_copy":
        options["group_size"] = data.draw(st.integers(1, n))
    if algorithm == "reduce_to_one":
        options["root"] = data.draw(st.integers(0, n - 1))
    in_place = data.draw(st.booleans())

    def body(comm):
        x = integer_valued(comm.rank, count, dtype, op, seed=count)
        keep = x.copy()
        y = collectives.allreduce(x, x if in_place else None, op=op, algorithm=algorithm, comm=comm, **options)
        return keep, y

    results = collectives.run_threaded(n, body)
    expected = reference([r[0] for r in results], op)
    for _, got in results:
        assert bitwise_equal(got, expected)
