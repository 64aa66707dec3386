"""Faulty MPI jobs end, nonzero and loudly, and never report success.

Each test launches ``mpiexec -n N python tests/faults/scenario.py CASE`` (see that file)
with COLLECTIVES_TIMEOUT=2 under a hard timeout, and checks that the job ended well
within it, exited nonzero, printed the documented error text and that no rank printed
its success marker. A single-process test: it runs in the normal pytest layer.
"""
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import time

import pytest

import collectives
from collectives import cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "tests", "faults", "scenario.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
HARD_TIMEOUT = 60  # the job is killed after this: a hang fails the test, never the suite
BOUND = 30  # generous: the scenarios end in about TIMEOUT + start-up
TIMEOUT = "2"

pytestmark = [pytest.mark.skipif(not os.path.exists(MPIEXEC),
                                 reason=f"no mpiexec next to {sys.executable} (pip install -e . brings MPICH)"),
              pytest.mark.timeout(HARD_TIMEOUT + 30)]

ABORT = "collectives: aborting the MPI job"
# a failing rank that does not reach the library's abort: MPICH reports the dead process
KILLED = re.compile(r"signal 9|Killed|KILLED BY SIGNAL")


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    """The jobs here abort or are killed, which leaves MPI's segments in /dev/shm and Hydra's
    topology file in /tmp; launch() removes what each job left. Counted over the module:
    nothing stale is left that was not there before."""
    before = set(cleanup.stale())
    shm_before = len(os.listdir(cleanup.SHM_DIR)) if os.path.isdir(cleanup.SHM_DIR) else 0
    yield
    # what appeared while these jobs ran and is stale now (other jobs on the machine aside)
    left = sorted((set(cleanup.stale()) - before) & _made)
    shm_after = len(os.listdir(cleanup.SHM_DIR)) if os.path.isdir(cleanup.SHM_DIR) else 0
    assert not left, f"the fault jobs left {left} (/dev/shm entries: {shm_before} before, {shm_after} after)"


def launch(case, n, *, env=None, mpi4py_runner=False, algorithm="ring"):
    """(exit code, combined output, seconds) of one scenario job; what the job left behind
    (an aborted job's shared-memory segments) is removed once it has ended."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable]
    if mpi4py_runner:
        cmd += ["-m", "mpi4py"]
    cmd += [SCENARIO, case]
    full_env = dict(os.environ, COLLECTIVES_TIMEOUT=TIMEOUT, SCENARIO_ALGO=algorithm, PYTHONUNBUFFERED="1")
    for key in ("COLLECTIVES_CHECK", "COLLECTIVES_ON_ERROR", "COLLECTIVES_ALGO"):
        full_env.pop(key, None)
    full_env.update(env or {})
    before = set(cleanup.candidates())
    job = f"{os.getpid()}-{next(_jobs)}"
    full_env[JOB_VARIABLE] = job  # inherited by the launcher, its proxies and every rank
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=HARD_TIMEOUT)
    except subprocess.TimeoutExpired:
        cleanup.end_tagged(JOB_VARIABLE, job, grace=0)
        out, _ = proc.communicate()
        pytest.fail(f"{case} on {n} ranks hung: killed after {HARD_TIMEOUT} s\n{out}")
    finally:
        # the ranks live in sessions of their own and may outlive the launcher by a moment
        cleanup.end_tagged(JOB_VARIABLE, job)
        made = set(cleanup.candidates()) - before
        _made.update(made)
        cleanup.remove_stale(made, settle=3.0)
    return proc.returncode, out, time.monotonic() - start


JOB_VARIABLE = "COLLECTIVES_TEST_JOB"
_jobs = itertools.count()
_made = set()  # every entry that appeared in /dev/shm or /tmp while one of these jobs ran


def assert_failed_loudly(code, out, seconds, *patterns):
    assert code != 0, f"the job exited 0\n{out}"
    assert seconds < BOUND, f"the job took {seconds:.0f} s (bound {BOUND} s)\n{out}"
    assert "SCENARIO-OK" not in out, f"a rank reported success\n{out}"
    assert "SCENARIO-WRONG" not in out, f"a rank got a wrong result and carried on\n{out}"
    for pattern in patterns:
        assert re.search(pattern, out), f"no {pattern!r} in the output\n{out}"


def test_control_case_succeeds_on_every_rank():
    code, out, _ = launch("ok", 2)
    assert code == 0, out
    assert out.count("SCENARIO-OK") == 2, out


# mismatched count/dtype, no COLLECTIVES_CHECK: the message-size check catches it mid-call,
# the detecting rank prints the error and aborts the job; shm's shared-memory path compares
# the headers every rank publishes before its data and names the field instead
def _mismatch_pattern(algorithm, field="count"):
    if algorithm == "shm":
        return rf"MismatchError: allreduce\(shm\)( step \d+/\d+)?: ranks disagree on {field} \((rank \d|ranks \d(, \d)*): "
    return rf"MismatchError: allreduce\({algorithm}\) step \d+/\d+: ((a )?message from rank|rank \d sent a message of another call)"


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_mismatched_count_without_check_aborts(algorithm, n):
    code, out, seconds = launch("count", n, algorithm=algorithm)
    assert_failed_loudly(code, out, seconds, ABORT, _mismatch_pattern(algorithm))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
def test_mismatched_count_in_split_messages_aborts(algorithm, n):
    # 2,400 float32 (9,600 B): a small-message program whose messages are just past MPICH's eager
    # limit travel as two pieces; rank 1's extra element makes its pieces differ, and the size
    # check still catches it
    code, out, seconds = launch("count", n, algorithm=algorithm, env={"SCENARIO_COUNT": "2400"})
    assert_failed_loudly(code, out, seconds, ABORT, _mismatch_pattern(algorithm))


@pytest.mark.skipif("shm" not in collectives.algorithm_names(), reason="no shm algorithm registered")
@pytest.mark.parametrize("case, n, field, detail", [
    ("count", 2, "count", "rank 1: 1001"),
    ("count", 3, "count", "rank 1: 1001"),
    ("dtype", 2, "dtype", "rank 1: float64"),
    ("dtype_same", 3, "dtype", "rank 1: int32"),
])
def test_shm_mismatch_raises_the_same_error_on_every_rank_without_check(case, n, field, detail):
    # no COLLECTIVES_CHECK: the shared-memory transport's headers carry each call's fields, so
    # even a same-size dtype mismatch is caught, and every rank raises a MismatchError naming
    # the field and rank 1's value (COLLECTIVES_ON_ERROR=raise)
    code, out, seconds = launch(case, n, algorithm="shm", env={"COLLECTIVES_ON_ERROR": "raise"})
    assert_failed_loudly(code, out, seconds)
    for rank in range(n):
        line = re.search(rf"SCENARIO-ERROR rank {rank}: MismatchError: allreduce\(shm\)( step \d+/\d+)?: "
                         rf"ranks disagree on {field} \([^\n]*{detail}", out)
        assert line, f"rank {rank} did not name {field} and {detail!r}\n{out}"
    assert "SCENARIO-BARRIER-TIMEOUT" not in out, out


def test_mismatched_dtype_without_check_aborts():
    code, out, seconds = launch("dtype", 2)
    assert_failed_loudly(code, out, seconds, ABORT, r"MismatchError: allreduce\(ring\) step 1/2: .*message")


def test_mismatch_with_raise_ends_with_an_error_on_every_rank():
    # COLLECTIVES_ON_ERROR=raise: no abort; the detecting rank raises MismatchError and its
    # peers, left waiting, raise CollectiveTimeout: every rank gets an error, none hangs
    code, out, seconds = launch("count", 3, env={"COLLECTIVES_ON_ERROR": "raise"})
    assert_failed_loudly(code, out, seconds, r"SCENARIO-ERROR rank \d: MismatchError")
    assert ABORT not in out, out
    for rank in range(3):
        assert re.search(rf"SCENARIO-ERROR rank {rank}: (MismatchError|CollectiveTimeout)", out), out


# COLLECTIVES_CHECK=1: the same MismatchError, naming the field, on every rank, before data moves
@pytest.mark.parametrize("case, n, field, detail", [
    ("count", 2, "count", "rank 0: 1000; rank 1: 1001"),
    ("count", 3, "count", "ranks 0, 2: 1000; rank 1: 1001"),
    ("dtype", 2, "dtype", "rank 0: float32; rank 1: float64"),
    ("dtype_same", 3, "dtype", "ranks 0, 2: float32; rank 1: int32"),
])
def test_check_raises_the_same_mismatch_on_every_rank(case, n, field, detail):
    code, out, seconds = launch(case, n, env={"COLLECTIVES_CHECK": "1"})
    assert_failed_loudly(code, out, seconds)
    for rank in range(n):
        line = (f"SCENARIO-ERROR rank {rank}: MismatchError: allreduce: ranks disagree on {field} "
                f"(ranks 1 differ from rank 0): {detail}")
        assert line in out, f"rank {rank} did not report {line!r}\n{out}"
    assert ABORT not in out, "the check fails before any data moves: no abort needed"


@pytest.mark.parametrize("n", [2, 3])
def test_rank_that_never_calls_times_out_naming_it(n):
    code, out, seconds = launch("never_calls", n)
    assert_failed_loudly(code, out, seconds, ABORT,
                         r"CollectiveTimeout: allreduce\(ring\) step \d+/\d+: no message from rank 1 after 2 s")
    assert seconds >= float(TIMEOUT), "ended before the timeout could have expired"


@pytest.mark.parametrize("n", [2, 3])
def test_rank_raising_between_calls_aborts_the_job(n):
    code, out, seconds = launch("raises", n, mpi4py_runner=True)
    # mpi4py's runner calls MPI_Abort; MPICH's line reporting it can be lost when the launcher
    # ends the job first (seen on a loaded machine): the job ending nonzero, in time, is the point
    assert_failed_loudly(code, out, seconds, r"RuntimeError: scenario: rank 1 failed on purpose")


def test_rank_raising_without_the_mpi4py_runner_still_ends_the_job():
    # the raising rank just exits; the others time out waiting for it and abort
    code, out, seconds = launch("raises", 2)
    assert_failed_loudly(code, out, seconds, r"RuntimeError: scenario: rank 1 failed on purpose", ABORT,
                         r"CollectiveTimeout: allreduce\(ring\) step 1/2: no message from rank 1")


@pytest.mark.parametrize("n", [2, 3])
def test_rank_killed_midway_ends_the_job(n):
    code, out, seconds = launch("sigkill", n)
    assert_failed_loudly(code, out, seconds)
    timed_out = re.search(r"CollectiveTimeout: .*no message from rank 1", out) and ABORT in out
    assert KILLED.search(out) or timed_out, f"neither MPICH's report of the killed rank nor a timeout\n{out}"


@pytest.mark.skipif("shm" not in collectives.algorithm_names(), reason="no shm algorithm registered")
def test_rank_that_never_calls_shm_times_out_in_the_barrier_naming_it():
    # the shared-memory path synchronises through barriers: their timeout names the rank too
    code, out, seconds = launch("never_calls", 3, algorithm="shm")
    assert_failed_loudly(code, out, seconds, ABORT, r"CollectiveTimeout: .*no message from rank 1 after 2 s")


# --- the first call, with a rank that makes no call at all: creating the library's communicator
# (MPI_Comm_idup, polled to the deadline) times out and names the absent rank

CALLS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier"]
ABSENT = r"CollectiveTimeout: creating the communicator: no message from rank 1 after 2 s"


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("call", CALLS)
def test_absent_rank_first_call_times_out_naming_it(call, n):
    code, out, seconds = launch("absent", n, env={"SCENARIO_CALL": call})
    assert_failed_loudly(code, out, seconds, ABORT, ABSENT)
    assert seconds >= float(TIMEOUT), "ended before the timeout could have expired"


@pytest.mark.parametrize("check", ["0", "1"])
def test_absent_rank_with_raise_every_present_rank_names_it(check):
    code, out, seconds = launch("absent", 3, env={"COLLECTIVES_ON_ERROR": "raise", "COLLECTIVES_CHECK": check})
    assert_failed_loudly(code, out, seconds)
    for rank in (0, 2):
        assert f"SCENARIO-ERROR rank {rank}: {ABSENT}" in out, out


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed (.[tf])")
@pytest.mark.parametrize("n", [2, 3])
def test_absent_rank_at_multi_worker_strategy_start_up_is_named(n):
    code, out, seconds = launch("absent", n, env={"SCENARIO_CALL": "multi_worker_strategy",
                                                  "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert_failed_loudly(code, out, seconds, ABORT, ABSENT)


# --- mismatches that keep message sizes equal, without COLLECTIVES_CHECK: calls carry their
# signature in their tags, so the ranks never match each other's messages; a waiting rank finds
# the foreign message and raises MismatchError (or times out): never a result

@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["dtype_same", "op"])
@pytest.mark.parametrize("algorithm", collectives.algorithm_names())
def test_same_size_mismatch_without_check_aborts(algorithm, case, n):
    code, out, seconds = launch(case, n, algorithm=algorithm)
    field = "dtype" if case == "dtype_same" else "op"
    assert_failed_loudly(code, out, seconds, ABORT, _mismatch_pattern(algorithm, field))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case, call", [
    ("root", "broadcast"), ("root", "reduce"), ("op", "reduce"), ("op", "reduce_scatter"), ("op", "allreduce"),
    ("dtype_same", "allgather"), ("dtype_same", "broadcast"), ("dtype_same", "reduce_scatter"),
    ("count", "reduce"), ("count", "broadcast"),
])
def test_mismatch_with_raise_is_an_error_on_every_rank(case, call, n):
    code, out, seconds = launch(case, n, env={"COLLECTIVES_ON_ERROR": "raise", "SCENARIO_CALL": call})
    assert_failed_loudly(code, out, seconds)
    for rank in range(n):
        assert re.search(rf"SCENARIO-ERROR rank {rank}: (MismatchError|CollectiveTimeout)", out), \
            f"rank {rank} did not end with an error\n{out}"


# --- a communicator on which a call failed refuses later calls

@pytest.mark.parametrize("n", [2, 3])
def test_reuse_after_a_failed_call_is_refused(n):
    code, out, seconds = launch("reuse", n, env={"COLLECTIVES_ON_ERROR": "raise"})
    assert_failed_loudly(code, out, seconds)
    for rank in range(n):
        assert re.search(rf"SCENARIO-REUSE rank {rank}: CollectiveError: this communicator cannot be used: "
                         r"allreduce\(ring\) failed on it \((MismatchError|CollectiveTimeout): .*new communicator",
                         out), f"rank {rank}\n{out}"
