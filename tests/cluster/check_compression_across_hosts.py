"""Run on an emulated cluster (tests/test_compression_cluster.py): every algorithm with bf16 and
fp16 on the messages between hosts (the default scope, hosts as MPI sees them), blocking and
through iallreduce and a Bucketer, bitwise identical on every rank, within the documented bound of
the exact sum; and a compressed call really is rounded. Prints TRAINING-OK rank R, or
TRAINING-FAIL with why."""
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives  # noqa: E402
from collectives import compression  # noqa: E402
from collectives.select import topology  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
problems = []


def same_everywhere(y):
    digests = WORLD.allgather(np.ascontiguousarray(y).tobytes())
    return all(d == digests[0] for d in digests)


def exact_sum(x):
    out = np.empty(x.shape, np.float64)
    WORLD.Allreduce(x.astype(np.float64), out, op=MPI.SUM)
    return out


hosts = topology(collectives.as_comm(WORLD))
if len(hosts) < 2:
    problems.append(f"the library sees {len(hosts)} host(s)")
for algorithm in collectives.algorithm_names():
    for fmt in compression.FORMATS:
        for count in (1, 1001, 300001):
            x = np.random.default_rng(count + RANK).standard_normal(count).astype(np.float32)
            y = collectives.allreduce(x, algorithm=algorithm, compression=fmt)
            z = collectives.iallreduce(x, algorithm=algorithm, compression=fmt).wait(120)
            bound = (SIZE + 2) * (compression.UNIT_ROUNDOFF[fmt] * exact_sum(np.abs(x))
                                  + (2.0 ** -24 if fmt == "fp16" else 0.0))
            if not same_everywhere(y) or y.tobytes() != z.tobytes():
                problems.append(f"{algorithm} {fmt} count={count}: ranks differ")
            elif not (np.abs(y - exact_sum(x)) <= bound).all():
                problems.append(f"{algorithm} {fmt} count={count}: past the bound")
odd = np.full(1000, 1 + 2.0 ** -12, np.float32)
if np.array_equal(collectives.allreduce(odd, compression="bf16"), collectives.allreduce(odd)):
    problems.append("bf16 across hosts did not round")
grads = [np.full(s, float(RANK + 1), np.float32) for s in (10, 5000, 3)]
collectives.Bucketer(grads, 4096, compression="bf16").reduce(timeout=120)
want = SIZE * (SIZE + 1) / 2
if not all(np.array_equal(g, np.full(g.shape, want, np.float32)) and same_everywhere(g) for g in grads):
    problems.append("Bucketer with bf16")
verdicts = WORLD.allgather(problems)
if any(verdicts):
    print(f"TRAINING-FAIL rank {RANK}: {verdicts}", flush=True)
    sys.exit(1)
print(f"TRAINING-OK rank {RANK} hosts {hosts}", flush=True)
