"""tf_bridge's multi-worker start-up on one node: the workers' addresses as chosen, an address no
worker reaches named on every rank, and TensorFlow's own start-up bounded (a worker that never
registers ends the job with a message naming what it waited for, on every rank, within
COLLECTIVES_TIMEOUT). The jobs are ``mpiexec -n 2 python tests/faults/tf_startup.py CASE`` under a
hard timeout; the address rules are also tested directly (tf_bridge._addresses)."""
import itertools
import os
import re
import sys
import time

import pytest

from tests.helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "faults", "tf_startup.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
HARD_TIMEOUT = 240  # seconds: two ranks importing TensorFlow on a loaded machine, then the case
_jobs = itertools.count()
pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")
from tf_bridge import _addresses  # noqa: E402

needs_mpiexec = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason=f"no mpiexec next to {sys.executable}")
pytestmark = pytest.mark.timeout(HARD_TIMEOUT + 60)


def launch(case, env):
    """(exit code, output, time.time() at the end) of the job; what it left is removed."""
    job = f"{os.getpid()}-tf-{next(_jobs)}"
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    for key in ("COLLECTIVES_ON_ERROR", _addresses.ENV, "TF_CONFIG"):
        full_env.pop(key, None)
    full_env.update(env)
    code, out = run_job([MPIEXEC, "-n", "2", sys.executable, JOB, case], full_env, job, HARD_TIMEOUT, case)
    return code, out, time.time()


@needs_mpiexec
def test_the_chosen_interface_address_is_used_and_training_starts():
    code, out, _ = launch("ok", {_addresses.ENV: "interface", "COLLECTIVES_TIMEOUT": "60"})
    assert code == 0, out
    workers = re.findall(r"STARTUP-OK rank \d workers \[([^\]]*)\]", out)
    assert len(workers) == 2 and workers[0] == workers[1], out
    own = [address for _, address, _ in _addresses.interfaces()]
    if not own:
        pytest.skip("this machine has no IPv4 interface but loopback")
    hosts = [w.strip().strip("'").rsplit(":", 1)[0] for w in workers[0].split(",")]
    assert hosts == [own[0]] * 2, out  # one node: its first interface, not 127.0.0.1


@needs_mpiexec
def test_an_address_no_rank_reaches_is_named_on_every_rank():
    code, out, _ = launch("refused", {"COLLECTIVES_TIMEOUT": "20"})
    assert code != 0, out
    errors = re.findall(r"STARTUP-ERROR rank (\d) after ([\d.]+) s: CollectiveError: (.*)", out)
    assert sorted(r for r, _, _ in errors) == ["0", "1"], out
    assert errors[0][2] == errors[1][2], "the ranks raised different errors"
    assert re.match(r"tf_config_from_mpi: worker 1 \(rank 1, host \S+\) cannot be reached at \[::1\]:\d+ from "
                    r"ranks 0, 1 \(", errors[0][2]), out
    assert "worker 0" not in errors[0][2]
    assert all(float(after) < 20 for _, after, _ in errors), out


@needs_mpiexec
def test_tensorflow_start_up_that_never_finishes_ends_the_job_naming_it():
    timeout = 8
    code, out, ended = launch("stuck", {"COLLECTIVES_TIMEOUT": str(timeout)})
    assert code != 0, out
    assert "STARTUP-OK" not in out, out
    begun = [float(t) for t in re.findall(r"STARTUP-BEGIN rank \d at ([\d.]+)", out)]
    assert len(begun) == 2, out
    said = re.findall(r"collectives: rank (\d) of 2: CollectiveTimeout: multi_worker_strategy: TensorFlow's "
                      r"start-up \(every worker's gRPC server, and all 2 workers registering with the coordination "
                      rf"service of worker 0 at 127\.0\.0\.1:\d+\) did not finish on every worker within {timeout} s",
                      out)
    assert sorted(said) == ["0", "1"], out  # on every rank
    # the watchdog's bound and its grace, and MPI's teardown
    assert ended - min(begun) < timeout + _watchdog_grace() + 10, out


def _watchdog_grace():
    from tf_bridge import _watchdog

    return _watchdog.GRACE


def test_address_choice_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(_addresses.ENV, raising=False)
    assert _addresses.requested() == ("auto", None)
    monkeypatch.setenv(_addresses.ENV, " Interface ")
    assert _addresses.requested() == ("interface", None)
    assert _addresses.requested("hostname") == ("hostname", None)  # the argument wins
    assert _addresses.requested("lo") == ("device", "lo")  # an interface's name
    assert _addresses.requested("10.1.2.3") == ("given", "10.1.2.3")
    assert _addresses.requested("node7.example") == ("given", "node7.example")
    with pytest.raises(TypeError, match="address must be a string"):
        _addresses.requested(7)


def test_the_interface_on_the_peers_subnet_is_chosen():
    mine = [("docker0", "172.17.0.1", "255.255.0.0"), ("ib0", "10.1.0.5", "255.255.255.0"),
            ("eth0", "192.168.1.5", "255.255.255.0")]
    peers = [[("eth0", "192.168.1.6", "255.255.255.0"), ("ib0", "10.1.0.6", "255.255.255.0")],
             [("eth0", "192.168.1.7", "255.255.255.0")]]
    assert _addresses.interface_address(mine, peers) == "192.168.1.5"  # reaches both other nodes
    tie = peers[:1]
    assert _addresses.interface_address(mine, tie) == "10.1.0.5"  # a tie: the kernel's order
    assert _addresses.interface_address(mine, tie, preferred={"eth0"}) == "192.168.1.5"  # UCX_NET_DEVICES
    assert _addresses.interface_address([], peers) is None
    lone = [("eth0", "203.0.113.9", "255.255.255.0")]
    assert _addresses.interface_address(lone, [[("eth0", "198.51.100.7", "255.255.255.0")]]) == "203.0.113.9"


def test_a_listener_and_the_check():
    listener = _addresses.Listener(4)
    try:
        port = listener.port
        outcome = _addresses.probe([("127.0.0.1", port), ("localhost", port), ("::1", port)], 2.0)
    finally:
        listener.close()
    assert outcome[0] is None and outcome[1] is None, outcome
    assert outcome[2] is not None, outcome  # the check listens on IPv4 only
    assert _addresses.host_port("::1", 5) == "[::1]:5" and _addresses.host_port("h", 5) == "h:5"
