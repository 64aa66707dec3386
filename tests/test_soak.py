"""Soak: thousands of mixed-size calls of every algorithm on threaded worlds of 3 and 4 ranks,
every result checked, resident memory flat after warm-up (plans, scratch and call-shape caches
are bounded; nothing grows per call)."""
import os

import numpy as np
import pytest

import collectives
from collectives import blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SIZES = (0, 1, 2, 7, 64, 333, 1024, 4099, 20000)
DTYPES = (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float64))
OPTIONS = {"tree": [{}, {"segment_bytes": 512}], "double_binary_tree": [{}, {"segment_bytes": 1024}],
           "hierarchical_copy": [{}, {"group_size": 2}], "reduce_to_one": [{}, {"root": 1}]}
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _round(comm, rounds, seed):
    """``rounds`` rounds of every algorithm x size (and a building block per round); returns the
    number of wrong results on this rank."""
    rng = np.random.default_rng(seed)  # the same sequence of call shapes on every rank
    wrong = 0
    names = collectives.algorithm_names()
    n = comm.size
    for _ in range(rounds):
        for algorithm in names:
            count = int(rng.choice(SIZES))
            dtype = DTYPES[int(rng.integers(len(DTYPES)))]
            variants = OPTIONS.get(algorithm, [{}])
            options = variants[int(rng.integers(len(variants)))]
            op = ("sum", "max")[int(rng.integers(2))]
            base = int(rng.integers(0, 50))
            x = (np.arange(count) % 13 + base + comm.rank).astype(dtype)
            if op == "sum":
                expected = (np.arange(count) % 13 + base).astype(dtype) * n + n * (n - 1) // 2
            else:
                expected = (np.arange(count) % 13 + base + n - 1).astype(dtype)
            if rng.integers(2):
                y = collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm, **options)
            else:
                y = x.copy()
                collectives.allreduce(y, y, op=op, algorithm=algorithm, comm=comm, **options)
            wrong += not np.array_equal(y, expected)
        count = int(rng.choice(SIZES))
        x = np.full(count, comm.rank + 1, np.int32)
        block = collectives.reduce_scatter(x, comm=comm, algorithm=list(blocks.REDUCE_SCATTER)[count % 2])
        wrong += not (block == n * (n + 1) // 2).all()
        g = collectives.allgather(x[:comm.rank + 1], comm=comm)
        wrong += not np.array_equal(g, np.concatenate([np.full(min(q + 1, count), q + 1, np.int32)
                                                       for q in range(n)]))
    return wrong


@pytest.mark.parametrize("n", [3, 4])
def test_soak_every_algorithm_results_right_and_memory_flat(n):
    os.environ.setdefault("COLLECTIVES_TIMEOUT", "60")
    per_rank = len(collectives.algorithm_names()) + 2
    # warm-up: every plan and scratch buffer of these shapes gets built once
    assert sum(collectives.run_threaded(n, _round, 40, 1)) == 0
    before = resident_bytes()
    wrong = 0
    calls = 0
    peak = before
    for chunk in range(10):
        wrong += sum(collectives.run_threaded(n, _round, 60, 100 + chunk))
        calls += 60 * per_rank * n
        peak = max(peak, resident_bytes())
    after = resident_bytes()
    assert wrong == 0, f"{wrong} wrong results in {calls} calls"
    assert calls >= 10000
    slack = 16 << 20  # allocator noise; a per-call leak of even 1 KiB would be ~10 MiB here, growing
    assert after - before < slack, f"resident memory grew {(after - before) >> 20} MiB over {calls} calls"
    assert peak - before < 2 * slack, f"resident memory peaked {(peak - before) >> 20} MiB above warm-up"
