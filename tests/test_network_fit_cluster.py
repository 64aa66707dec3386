"""auto learns the network across emulated hosts (python -m benchmarks.cluster, links shaped to
500 Mbit/s; root and network namespaces, else every test skips with the tool's reason): with no
tuning table and a fresh calibration file, one rank per host and uneven hosts, every rank runs the
same pick, the fitted link is the shaped one and the fitted model predicts the pick within 25%.
A single-process module: it launches the tool as a subprocess under a hard timeout."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.test_cluster import REASON, finish, leftovers, nothing_left_behind, start  # noqa: E402,F401 - the fixture

CHECK = os.path.join(ROOT, "tests", "cluster", "check_network_fit.py")
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster here: {REASON}"),
              pytest.mark.timeout(400)]


@pytest.mark.parametrize("hosts, ranks", [(4, "1"), (3, "2,1,2")])
def test_auto_learns_a_500_mbit_network_on_first_use(hosts, ranks, tmp_path):
    env = {"COLLECTIVES_AUTOTUNE": "1", "COLLECTIVES_AUTOTUNE_FILE": str(tmp_path / "autotune.json"),
           "COLLECTIVES_TUNING": str(tmp_path / "no-table.json")}
    proc = start(hosts, ranks, [CHECK, str(500e6 / 8), str(1 << 20), str(4 << 20)], rate="500M", env=env)
    run_id = f"{proc.pid:x}"
    code, out = finish(proc, timeout=300)
    total = hosts * int(ranks) if "," not in ranks else sum(int(r) for r in ranks.split(","))
    assert code == 0 and out.count("NETFIT-OK") == total, out
    assert out.count("NETFIT ") == 2, out
    assert leftovers(run_id) == []
