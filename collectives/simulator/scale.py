"""How the simulator scales: messages per rank from the plans, and ``scale_check``'s wall times."""
import os
import time

import numpy as np

from ..flat import _Flat, _registry, build_plans
from ..model import ALPHA, BETA, GAMMA
from .core import simulate


def messages_per_rank(algorithm, ranks, count=None):
    """The most messages (sent plus received) any rank handles, from the plans."""
    f = _Flat(build_plans(algorithm, ranks, ranks if count is None else count))
    per_step = np.diff(f.ss) + np.diff(f.rs)
    return int(max(f.per_rank(f.step_rank[:-1], per_step[:-1])) if ranks else 0)


def logarithmic(algorithm):
    """True when the busiest rank's message count grows like lg p (measured from the plans
    at 16 and 256 ranks: lg p doubles, p grows 16x; at most 2.5x counts as logarithmic)."""
    return messages_per_rank(algorithm, 256) <= 2.5 * messages_per_rank(algorithm, 16)


def scale_check(names=None, nbytes=1 << 20, alpha=ALPHA, beta=BETA, gamma=GAMMA, small=1024,
                large=65536, limit=60.0):
    """Print the wall time of ``simulate`` (plans, timing model and both symbolic checks) for
    every algorithm at ``small`` ranks and the logarithmic ones at ``large``. A measurement,
    not a test: the time depends on the machine and its load."""
    import gc
    import platform

    names = _registry.names() if names is None else names
    print(f"# scale check: simulate(algorithm, ranks, nbytes={nbytes}) with verification, wall time on "
          f"{platform.node() or 'this machine'} ({os.cpu_count()} cores), limit {limit:g} s")
    print(f"{'algorithm':>20}{'ranks':>8}{'wall(s)':>9}{'predicted(us)':>15}{'steps':>8}{'verified':>10}"
          f"{'check':>13}{'<limit':>8}")
    worst = 0.0
    ok = True
    for ranks in (small, large):
        for name in names:
            if ranks == large and not logarithmic(name):
                continue
            gc.collect()
            start = time.perf_counter()
            r = simulate(name, ranks, nbytes, alpha, beta, gamma)
            wall = time.perf_counter() - start
            worst = max(worst, wall)
            ok = ok and r.verified
            print(f"{name:>20}{ranks:>8}{wall:>9.1f}{r.time * 1e6:>15.1f}{r.steps:>8}"
                  f"{'yes' if r.verified else 'NO':>10}{r.verify_mode:>13}{'yes' if wall < limit else 'NO':>8}",
                  flush=True)
            if r.verify_error:
                print(f"#   verification failed: {r.verify_error}")
            del r
    print(f"# slowest: {worst:.1f} s")
    return 0 if ok else 1
