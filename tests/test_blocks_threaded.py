"""The building blocks on threaded worlds, for each of their algorithms."""
import numpy as np
import pytest

import collectives
from collectives import blocks
from tests.helpers import bitwise_equal, integer_valued, reference

WORLDS = [1, 2, 3, 5, 8]
COUNTS = [0, 1, 4, 13]


@pytest.mark.parametrize("algorithm", list(blocks.REDUCE_SCATTER))
@pytest.mark.parametrize("n", WORLDS)
def test_reduce_scatter(algorithm, n):
    for count in COUNTS:
        for op in ("sum", "max", "avg"):
            dtype = np.dtype(np.float32)

            def body(comm):
                x = integer_valued(comm.rank, count, dtype, op).reshape(-1)
                return x, collectives.reduce_scatter(x, op=op, comm=comm, algorithm=algorithm)

            results = collectives.run_threaded(n, body)
            full = reference([r[0] for r in results], op)
            for rank, (_, block) in enumerate(results):
                assert bitwise_equal(block, np.array_split(full, n)[rank]), (n, count, op, rank)


@pytest.mark.parametrize("algorithm", list(blocks.ALLGATHER))
@pytest.mark.parametrize("n", WORLDS)
def test_allgather_blocks_of_any_size(algorithm, n):
    for sizes in ([3] * n, [r % 3 for r in range(n)], [0] * n):
        def body(comm):
            x = np.arange(sizes[comm.rank], dtype=np.int32) + 100 * comm.rank
            return collectives.allgather(x.reshape(-1, 1) if x.size else x, comm=comm, algorithm=algorithm)

        results = collectives.run_threaded(n, body)
        expected = np.concatenate([np.arange(s, dtype=np.int32) + 100 * r for r, s in enumerate(sizes)])
        for got in results:
            assert bitwise_equal(got, expected)


@pytest.mark.parametrize("algorithm", list(blocks.BROADCAST))
@pytest.mark.parametrize("n", WORLDS)
def test_broadcast_from_every_root(algorithm, n):
    for root in range(n):
        for count in COUNTS:
            def body(comm):
                buf = np.full((count,), comm.rank, np.float64)
                view = np.zeros((count, 2))[:, 0]  # a strided buffer too
                view[...] = comm.rank
                a = collectives.broadcast(buf, root=root, comm=comm, algorithm=algorithm)
                b = collectives.broadcast(view, root=root, comm=comm, algorithm=algorithm)
                return a is buf and b is view, buf, view

            for same, buf, view in collectives.run_threaded(n, body):
                assert same
                assert (buf == root).all() and (view == root).all()


@pytest.mark.parametrize("algorithm", list(blocks.REDUCE))
@pytest.mark.parametrize("n", WORLDS)
def test_reduce_to_root(algorithm, n):
    for root in sorted({0, n - 1, n // 2}):
        for op in ("sum", "prod", "min"):
            def body(comm):
                x = integer_valued(comm.rank, 11, np.dtype(np.int64), op).reshape(11, 1)
                return x, collectives.reduce(x, root=root, op=op, comm=comm, algorithm=algorithm)

            results = collectives.run_threaded(n, body)
            expected = reference([r[0] for r in results], op)
            for rank, (_, got) in enumerate(results):
                if rank == root:
                    assert bitwise_equal(got, expected)
                else:
                    assert got is None
