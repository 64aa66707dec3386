"""Wire compression across emulated hosts (python -m benchmarks.cluster; root and network
namespaces, else every test skips with the tool's reason): the default scope compresses exactly
the messages between hosts as MPI groups them, and every algorithm still ends bitwise identical.
A single-process module: it launches the tool as a subprocess under a hard timeout."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.test_cluster import REASON, finish, leftovers, nothing_left_behind, start  # noqa: E402,F401

CHECK = os.path.join(ROOT, "tests", "cluster", "check_compression_across_hosts.py")
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster here: {REASON}"),
              pytest.mark.timeout(400)]


@pytest.mark.parametrize("hosts, ranks", [(2, "2"), (3, "2,1,2")])
def test_every_algorithm_compressed_across_hosts(hosts, ranks):
    proc = start(hosts, ranks, [CHECK])
    run_id = f"{proc.pid:x}"
    code, out = finish(proc, timeout=300)
    total = 4 if ranks == "2" else 5
    assert code == 0 and out.count("TRAINING-OK") == total, out
    assert leftovers(run_id) == []
