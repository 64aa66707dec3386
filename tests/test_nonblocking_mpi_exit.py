"""MPI jobs that exit with iallreduce requests still open end, and never hang: each test launches
``mpiexec -n 2`` on a small script under a hard timeout (a single-process test, in the plain
pytest layer, like tests/test_faults_mpi.py)."""
import itertools
import os
import sys
import textwrap
import time

import pytest

from tests.helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
HARD_TIMEOUT = 90
_jobs = itertools.count()

pytestmark = [pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec next to {sys.executable}"),
              pytest.mark.timeout(HARD_TIMEOUT + 30)]

HEAD = f"""
import atexit, os, sys
import numpy as np
sys.path.insert(0, {ROOT!r})
held = []
# one write per line: the ranks' lines must not interleave in mpiexec's output
atexit.register(lambda: os.write(1, f"rank {{MPI.COMM_WORLD.rank}} done: {{[r.test() for r in held]}}\\n".encode()))
from mpi4py import MPI
import collectives
"""


def launch(body, env=None):
    script = textwrap.dedent(HEAD) + textwrap.dedent(body)
    job = f"{os.getpid()}-exit-{next(_jobs)}"
    full_env = dict(os.environ, COLLECTIVES_TIMEOUT="2", PYTHONUNBUFFERED="1", **(env or {}))
    full_env.pop("COLLECTIVES_CHECK", None)
    start = time.monotonic()
    code, out = run_job([MPIEXEC, "-n", "2", sys.executable, "-c", script], full_env, job, HARD_TIMEOUT, "the job")
    return code, out, time.monotonic() - start


def test_open_requests_are_finished_before_mpi_is_finalized():
    code, out, seconds = launch("""
        for i in range(8):
            held.append(collectives.iallreduce(np.full(300000, MPI.COMM_WORLD.rank + 1.0), algorithm="ring"))
        print("posted", flush=True)
    """)
    assert code == 0, out
    assert out.count("done: [True, True, True, True, True, True, True, True]") == 2, out
    assert seconds < 60, out


def test_a_request_no_peer_matches_ends_the_job_after_the_timeout():
    code, out, seconds = launch("""
        collectives.iallreduce(np.ones(4)).wait()
        if MPI.COMM_WORLD.rank == 0:
            held.append(collectives.iallreduce(np.ones(4), algorithm="ring"))
    """)
    assert seconds < 60, out  # bounded by COLLECTIVES_TIMEOUT (2 s), not a hang
    assert code != 0 and "CollectiveTimeout" in out and "no message from rank 1" in out, out


def test_with_on_error_raise_the_job_exits_cleanly():
    code, out, seconds = launch("""
        collectives.iallreduce(np.ones(4)).wait()
        if MPI.COMM_WORLD.rank == 0:
            held.append(collectives.iallreduce(np.ones(4), algorithm="ring"))
    """, env={"COLLECTIVES_ON_ERROR": "raise"})
    assert seconds < 60, out
    assert code == 0 and "rank 0 done: [True]" in out, out
