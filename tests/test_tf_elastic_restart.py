"""Recipe 1 of docs/reliability.md ("Elastic", TensorFlow), run for real: examples/elastic_keras_restart.py
under ``mpiexec -n 3`` loses rank 2 mid-run (it exits before step 8) and the job ends, under the
default COLLECTIVES_ON_ERROR=abort, well within COLLECTIVES_TIMEOUT; ``mpiexec -n 2`` on the same
checkpoint directory restores rank 0's last checkpoint (step 6), trains on to the end with the loss
still falling, and ends with bitwise-identical weights on both ranks. Each job runs under a hard
timeout (tests.helpers.run_job ends it and what it left)."""
import itertools
import os
import re
import shutil
import sys
import time

import pytest

from tests.helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_keras_restart.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
HARD_TIMEOUT = 180  # seconds per job: three ranks importing TensorFlow on a loaded 2-core machine
ENDS_WITHIN = 20  # seconds from the rank's death to the end of its job (measured: under 1 s)
_jobs = itertools.count()

pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")
pytestmark = [pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec next to {sys.executable}"),
              pytest.mark.timeout(2 * HARD_TIMEOUT + 60)]
NUMBER = r"([\d.]+)"


def launch(ranks, checkpoints, *options):
    """(exit code, output, time.time() at the end) of the example under mpiexec -n ``ranks``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", COLLECTIVES_TIMEOUT="60")
    for key in ("COLLECTIVES_ON_ERROR", "TF_CONFIG"):
        env.pop(key, None)
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, EXAMPLE, checkpoints, *options]
    code, out = run_job(cmd, env, f"{os.getpid()}-tf-restart-{next(_jobs)}", HARD_TIMEOUT, f"mpiexec -n {ranks}")
    return code, out, time.time()


def test_a_lost_rank_ends_the_job_and_the_survivors_restart_from_the_checkpoint(tmp_path):
    checkpoints = str(tmp_path / "checkpoints")
    try:
        start = time.time()
        code, out, ended = launch(3, checkpoints, "--die-at", "8", "--die-rank", "2")
        assert code != 0, out
        died = re.findall(rf"rank 2: DYING before step 8 at {NUMBER}", out)
        assert len(died) == 1, out
        assert "DONE" not in out, out
        took = ended - float(died[0])
        assert took < ENDS_WITHIN, f"the job ended {took:.1f} s after rank 2 died\n{out}"
        print(f"first job: {ended - start:.1f} s, ended {took:.2f} s after rank 2 died")

        start = time.time()
        code, out, ended = launch(2, checkpoints)
        print(f"second job: {ended - start:.1f} s")
        assert code == 0, out
        restored = re.findall(rf"rank (\d): RESTORED step (\d+) loss {NUMBER}", out)
        done = re.findall(rf"rank (\d): DONE step (\d+) loss {NUMBER} sha256 (\w+) identical (\w+)", out)
        assert sorted(r[0] for r in restored) == ["0", "1"] and sorted(d[0] for d in done) == ["0", "1"], out
        assert {r[1] for r in restored} == {"6"}, out  # rank 0's last checkpoint before the loss, not step 0
        assert {d[1] for d in done} == {"18"}, out  # 6 epochs of 3 steps
        assert float(done[0][2]) < float(restored[0][2]), out  # the loss went on falling
        assert done[0][3] == done[1][3] and {d[4] for d in done} == {"True"}, out  # bitwise identical
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
