"""COLLECTIVES_DEBUG=INFO logs each distinct call shape once (with the algorithm and why), and
COLLECTIVES_ALGO forces one algorithm; each case runs in a fresh interpreter, as a user's job
would, so that nothing configured logging beforehand."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = r"""
import numpy as np, collectives
from collectives import run_threaded
def body(comm):
    out = []
    for count, algorithm in ((4, "auto"), (4, "auto"), (300000, "auto"), (4, "auto"), (64, "tree")):
        x = np.full(count, comm.rank + 1, np.float32)
        out.append(float(collectives.allreduce(x, algorithm=algorithm, comm=comm)[0]))
    return out
results = run_threaded(2, body)
assert all(r == [3.0] * 5 for r in results), results
print("ok")
"""


def run(**env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("COLLECTIVES_")}
    full.update(env, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, timeout=120)


def log_lines(proc, transport=False):
    """The choice lines: of the algorithm, or (``transport=True``) of the transport."""
    return [line for line in proc.stderr.splitlines()
            if line.startswith("collectives: allreduce") and ("-> transport " in line) == transport]


@pytest.mark.timeout(150)
def test_debug_logs_every_distinct_shape_once_from_the_first_call():
    proc = run(COLLECTIVES_DEBUG="INFO", COLLECTIVES_TUNING=os.devnull)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    lines = log_lines(proc)
    for rank in (0, 1):
        mine = [line for line in lines if f"rank {rank} of 2:" in line]
        # three shapes: 16 B auto, 1.2 MB auto, 256 B tree; repeats of a shape are not logged again
        assert len(mine) == 3, lines
        assert sum("16 bytes of float32 ->" in line and "cost model" in line for line in mine) == 1, mine
        assert sum("1200000 bytes of float32 ->" in line for line in mine) == 1, mine
        assert sum("256 bytes of float32 -> tree (named by the caller)" in line for line in mine) == 1, mine
    # a threaded world has one transport: no transport lines (tests/mpi/test_mpi_transport.py
    # checks them under MPI)
    assert log_lines(proc, transport=True) == [], proc.stderr


@pytest.mark.timeout(150)
def test_no_log_without_debug():
    proc = run(COLLECTIVES_TUNING=os.devnull)
    assert proc.returncode == 0, proc.stderr
    assert log_lines(proc) == []


@pytest.mark.timeout(150)
def test_forced_algorithm_runs_for_every_call_and_says_so():
    proc = run(COLLECTIVES_DEBUG="INFO", COLLECTIVES_ALGO="reduce_to_one")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    lines = log_lines(proc)
    assert len(lines) == 6 and all("-> reduce_to_one (forced by COLLECTIVES_ALGO)" in line for line in lines), lines


@pytest.mark.timeout(150)
def test_forcing_an_unknown_algorithm_is_a_clear_error():
    proc = run(COLLECTIVES_ALGO="no_such_algorithm")
    assert proc.returncode != 0
    assert "no_such_algorithm" in proc.stderr, proc.stderr
