"""Run on an emulated cluster with shaped links (tests/test_network_fit_cluster.py): auto with no
tuning table and a fresh calibration file learns the network on first use (collectives/
network_fit.py). For each size given: the result is right and bitwise identical everywhere, every
rank runs the same pick, the fitted link's rate is within 25% of the shaped rate (argv[1], bytes/s),
and the fitted model's prediction for the pick is within 25% of its measured time (median of 3
calls, the slowest rank's). Prints NETFIT size pick predicted measured first-call on rank 0, then
NETFIT-OK rank R, or NETFIT-FAIL with why."""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives  # noqa: E402
from collectives import autotune, network_fit, select  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
rate = float(sys.argv[1])
sizes = [int(s) for s in sys.argv[2:]] or [1 << 20]
problems = []
ours = collectives.as_comm(WORLD)
hosts = select.topology(ours)
if len(hosts) < 2:
    problems.append(f"the library sees {len(hosts)} host(s)")
for nbytes in sizes:
    x = np.random.default_rng(RANK + nbytes).standard_normal(nbytes // 4).astype(np.float32)
    exact = np.empty(x.shape, np.float64)
    WORLD.Allreduce(x.astype(np.float64), exact)
    WORLD.Barrier()
    start = time.perf_counter()
    y = collectives.allreduce(x)
    first = WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)
    if not np.allclose(y, exact, rtol=1e-4, atol=1e-3 * np.abs(exact).max()):
        problems.append(f"{nbytes} B: wrong result")
    if len(set(WORLD.allgather(y.tobytes()))) != 1:
        problems.append(f"{nbytes} B: ranks hold different results")
    found = autotune.agreed(ours, x.dtype, x.nbytes, False)
    picks = WORLD.allgather(found and found[0])
    if found is None or len(set(picks)) != 1:
        problems.append(f"{nbytes} B: ranks picked {picks}")
        continue
    alpha, beta, _ = ours.session.picks[network_fit.SESSION_FIT]
    if not 0.75 <= (1 / beta) / rate <= 1.25:
        problems.append(f"fitted {1 / beta / 1e6:.1f} MB/s on a {rate / 1e6:.1f} MB/s link")
    out = np.empty_like(x)
    runs = []
    for _ in range(3):
        WORLD.Barrier()
        start = time.perf_counter()
        collectives.allreduce(x, out)
        runs.append(WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX))
    measured = float(np.median(runs))
    predicted = network_fit.candidates(hosts, nbytes, alpha, beta)[1][found[0]]
    if RANK == 0:
        print(f"NETFIT {nbytes} {found[0]} predicted {predicted * 1e3:.1f} ms measured {measured * 1e3:.1f} ms "
              f"first call {first:.2f} s fit {alpha * 1e6:.1f} us {1 / beta / 1e6:.1f} MB/s; {found[2]}", flush=True)
    if abs(predicted - measured) > 0.25 * measured:
        problems.append(f"{nbytes} B: {found[0]} predicted {predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms")
WORLD.Barrier()
print(f"NETFIT-FAIL rank {RANK}: {'; '.join(problems)}" if problems else f"NETFIT-OK rank {RANK}", flush=True)
sys.exit(1 if problems else 0)
