"""MultiWorkerMirroredStrategy across emulated hosts (python -m benchmarks.cluster; root and
network namespaces, else every test skips with the tool's reason): the Keras example trains to
identical weights where host names do not resolve, every worker's address is one every rank
reaches, and a worker whose address is made unreachable is named, in the same CollectiveError on
every rank, within COLLECTIVES_TIMEOUT. A single-process module: it launches the tool as a
subprocess under a hard timeout (TensorFlow's import takes seconds per rank)."""
import importlib.util
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.test_cluster import REASON, finish, leftovers, nothing_left_behind, start  # noqa: E402,F401

EXAMPLE = os.path.join(ROOT, "examples", "keras_multi_worker.py")
REACH = os.path.join(ROOT, "tests", "cluster", "tf_reach.py")
JOB_TIMEOUT = 300  # seconds the tool gets for one job (a loaded machine imports TensorFlow slowly)
NO_TF = None if importlib.util.find_spec("tensorflow") else "TensorFlow not installed (pip install -e .[tf])"
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster here: {REASON}"),
              pytest.mark.skipif(NO_TF is not None, reason=str(NO_TF)),
              pytest.mark.timeout(JOB_TIMEOUT + 60)]
RESULT = re.compile(r"rank (\d+): final loss [\d.]+, weights identical on all ranks: (True|False), "
                    r"collectives calls: (\d+), weights sha256 ([0-9a-f]{16})")
ADDRESSES = re.compile(r"ADDRESSES rank (\d+) host (cl[0-9a-f]+h(\d+)): \[([^\]]*)\]")
# ranks' lines can run together in mpiexec's output: a message ends where the next report begins
ERROR = re.compile(r"REACH-ERROR rank (\d+) after ([\d.]+) s: (\w+): (.*?)(?=REACH-|ADDRESSES |$)", re.M)
ENV = {"COLLECTIVES_TF_ADDRESS": "", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _run(hosts, ranks, program, env=None):
    proc = start(hosts, ranks, program, env={**ENV, **(env or {})}, extra=["--timeout", str(JOB_TIMEOUT)])
    code, out = finish(proc, timeout=JOB_TIMEOUT + 30)
    assert leftovers(f"{proc.pid:x}") == []
    return code, out


@pytest.mark.parametrize("hosts, ranks", [(2, 1), (2, 2)], ids=["2x1", "2x2"])
def test_keras_example_trains_to_identical_weights_across_hosts(hosts, ranks):
    # the emulated hosts' names do not resolve: each worker gets its host's interface address
    code, out = _run(hosts, ranks, [EXAMPLE, "--epochs", "2"])
    assert code == 0, out
    results = RESULT.findall(out)
    assert sorted(int(r[0]) for r in results) == list(range(hosts * ranks)), out
    assert all(same == "True" and int(calls) > 0 for _, same, calls, _ in results), out
    assert len({digest for *_, digest in results}) == 1, out  # the same weights, byte for byte


def _addresses(out, size):
    seen = ADDRESSES.findall(out)
    assert sorted(int(r) for r, *_ in seen) == list(range(size)), out
    workers = {w for *_, w in seen}
    assert len(workers) == 1, f"ranks disagree on the workers' addresses\n{out}"
    return [w.strip().strip("'") for w in workers.pop().split(",")], {int(r): int(h) for r, _, h, _ in seen}


def _reach_errors(out, size, timeout):
    errors = ERROR.findall(out)
    assert sorted(int(r) for r, *_ in errors) == list(range(size)), out
    assert "REACH-NOERROR" not in out, out
    assert {kind for _, _, kind, _ in errors} == {"CollectiveError"}, out
    assert len({text for *_, text in errors}) == 1, f"ranks raised different errors\n{out}"
    assert max(float(after) for _, after, _, _ in errors) < timeout, out
    return errors[0][3]


def test_unreachable_worker_is_named_on_every_rank_within_the_timeout():
    timeout = 10
    code, out = _run(2, 2, [REACH], env={"COLLECTIVES_TIMEOUT": str(timeout)})
    assert code == 0, out
    workers, host_of = _addresses(out, 4)
    # host names do not resolve here: every worker is its host's address on the emulated network
    subnet = workers[0].rsplit(".", 1)[0]
    assert all(re.fullmatch(rf"{re.escape(subnet)}\.{host_of[r] + 1}:\d+", w) for r, w in enumerate(workers)), out
    text = _reach_errors(out, 4, timeout)
    for worker in (2, 3):  # host 1's workers, from host 0's ranks; host 0's workers are reached
        assert re.search(rf"worker {worker} \(rank {worker}, host cl[0-9a-f]+h1\) cannot be reached at "
                         rf"{re.escape(subnet)}\.2:\d+ from ranks 0, 1 \(no connection within 5 s\)", text), text
    assert "worker 0" not in text and "worker 1" not in text, text
    assert "COLLECTIVES_TF_ADDRESS" in text


def test_host_names_are_used_where_they_resolve_and_both_addresses_are_named():
    timeout = 10
    code, out = _run(2, 1, [REACH, "names"], env={"COLLECTIVES_TIMEOUT": str(timeout)})
    assert code == 0, out
    workers, host_of = _addresses(out, 2)
    assert all(re.fullmatch(rf"cl[0-9a-f]+h{host_of[r]}:\d+", w) for r, w in enumerate(workers)), out
    text = _reach_errors(out, 2, timeout)
    # auto offers the host name, then the interface address: neither reached, both named
    assert re.search(r"worker 1 \(rank 1, host (cl[0-9a-f]+h1)\) cannot be reached at \1:(\d+) from rank 0 "
                     r"\(no connection within 5 s\); nor at 198\.18\.\d+\.2:\2 from rank 0", text), text
