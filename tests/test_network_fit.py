"""auto across hosts learns the network (collectives/network_fit.py), the parts that need no MPI:
the link's fit, the network's name, the finalists the fitted model hands to the measurement on
even, uneven and one-rank-per-host topologies, the keys, the file, and where it applies. The
calibration itself runs under mpiexec in tests/mpi/test_mpi_network_fit.py and across emulated
hosts in tests/test_network_fit_cluster.py."""
import numpy as np
import pytest

import collectives
from collectives import autotune, network_fit, select

LINK_500M = (12e-6, 1 / 62.5e6)  # alpha, beta of a 500 Mbit/s link: the shape of what the fit gives
TOPOLOGIES = {
    "2x2": ((0, 1), (2, 3)),
    "3x2": ((0, 1), (2, 3), (4, 5)),
    "4x1": ((0,), (1,), (2,), (3,)),
    "2,1,2": ((0, 1), (2,), (3, 4)),
    "1,2": ((0,), (1, 2)),
}


@pytest.fixture
def calibration_file(tmp_path, monkeypatch):
    where = str(tmp_path / "autotune.json")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    autotune.reset()
    yield where
    autotune.reset()


def test_the_fit_recovers_a_links_line_and_a_shaped_links_burst_cancels():
    alpha, beta = 40e-6, 1 / 62.5e6
    sizes = list(network_fit.FIT_LARGE)
    burst = 256 << 10  # passes at once after the link idled: every large message gains the same time
    times = [alpha + (m - burst) * beta for m in sizes]
    fit_alpha, fit_beta = network_fit.fit_line(8, alpha + 8 * beta, sizes, times)
    assert fit_beta == pytest.approx(beta, rel=1e-9) and fit_alpha == pytest.approx(alpha, rel=1e-6)
    # one large size (a slow link, the 4 MiB exchange skipped): the slope from the small message
    one = network_fit.fit_line(8, alpha + 8 * beta, sizes[:1], [alpha + sizes[0] * beta])
    assert one == pytest.approx((alpha, beta), rel=1e-6)
    # noise never gives a negative or zero line
    assert min(network_fit.fit_line(8, 1e-3, sizes, [2e-3, 1e-3])) > 0


@pytest.mark.parametrize("bits, name", [(480e6, "500Mbit/s"), (440e6, "500Mbit/s"), (2.1e9, "2Gbit/s"),
                                        (0.95e9, "1Gbit/s"), (9.4e9, "10Gbit/s"), (180e6, "200Mbit/s")])
def test_the_network_is_named_by_its_links_rate_class(bits, name):
    assert network_fit.rate_class(8 / bits) == name


def test_the_finalists_are_the_fitted_models_best_on_every_topology():
    for label, hosts in TOPOLOGIES.items():
        for nbytes in (1 << 20, 4 << 20, 16 << 20, 64 << 20):
            finalists, costs = network_fit.candidates(hosts, nbytes, *LINK_500M)
            assert "shm" not in costs, label
            assert network_fit.MIN_FINALISTS <= len(finalists) <= network_fit.MAX_FINALISTS, (label, finalists)
            best = min(costs.values())
            assert finalists[0] in costs and costs[finalists[0]] == best, (label, nbytes, costs)
            others = [n for n in costs if n not in finalists]
            assert all(costs[n] >= costs[f] for n in others for f in finalists), (label, nbytes, costs)
            if len(finalists) > network_fit.MIN_FINALISTS:
                assert all(costs[f] <= best * (1 + network_fit.MODEL_TIE) for f in finalists), (label, costs)


def test_on_one_rank_per_host_every_algorithm_at_the_link_floor_is_measured():
    # four algorithms share the bandwidth term on H x 1 in the closed forms; the network tells them
    # apart (rabenseifner 1.4x the ring on 4 x 1: docs/performance.md#auto-across-hosts)
    finalists, _ = network_fit.candidates(TOPOLOGIES["4x1"], 16 << 20, *LINK_500M)
    assert set(finalists) == {"ring", "rabenseifner", "hierarchical_copy", "two_level"}
    # with ranks sharing a host's link the topology-aware pair is ahead
    for label in ("2x2", "3x2", "2,1,2", "1,2"):
        assert network_fit.candidates(TOPOLOGIES[label], 16 << 20, *LINK_500M)[0] == ["two_level",
                                                                                      "hierarchical_copy"]


def test_keys_name_the_network_topology_library_and_bucket():
    args = ("MPICH 5.0.2", TOPOLOGIES["2,1,2"], "500Mbit/s", np.float32, 5 << 20, False)
    base = network_fit.key(*args)
    assert base.startswith("hosts|") and "|2,1,2|" in base and "500Mbit/s" in base
    assert network_fit.key(*args[:5], True) != base
    assert network_fit.key(*args[:4], 4 << 20, False) == base  # one bucket
    for changed in (("Open MPI 5",) + args[1:], args[:1] + (TOPOLOGIES["2x2"],) + args[2:],
                    args[:2] + ("2Gbit/s",) + args[3:], args[:3] + (np.float64,) + args[4:]):
        assert network_fit.key(*changed) != base
    assert network_fit.key(*args[:4], 64 << 20, False) == network_fit.key(*args[:4], 32 << 20, False)


def test_picks_across_hosts_round_trip_in_the_file(calibration_file):
    entry = {"algorithm": "ring", "transport": "auto", "bytes": 1 << 20, "first_call_s": 0.5}
    autotune._store(calibration_file, "hosts|k", entry)
    autotune.reset()
    assert autotune.stored(calibration_file)["hosts|k"] == entry


def test_calibration_applies_across_hosts_but_never_in_a_threaded_world(monkeypatch):
    class Fake:
        mpi_comm = object()
        size = 4

        def node_colors(self):
            return (0, 1, 2, 3)

    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    assert select.calibrates(Fake(), "auto")
    assert not select.calibrates(Fake(), "mpi")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "0")
    assert not select.calibrates(Fake(), "auto")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    collectives.run_threaded(2, lambda comm: None if not select.calibrates(comm, "auto") else 1 / 0)


@pytest.mark.parametrize("label", ["4x1", "2,1,2", "2x2"])
def test_auto_across_hosts_asks_the_network_where_no_table_covers_the_call(label, monkeypatch, tmp_path):
    hosts = TOPOLOGIES[label]
    colors = tuple(i for i, h in enumerate(hosts) for _ in h)

    class Fake:
        mpi_comm = object()
        size = len(colors)
        rank = 0

        def node_colors(self):
            return colors

        def hosts(self):
            return hosts

    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    monkeypatch.setenv("COLLECTIVES_TUNING", str(tmp_path / "none.json"))
    monkeypatch.delenv("COLLECTIVES_ALGO", raising=False)
    from collectives import tuning
    tuning.reload()
    select.reset()
    asked = []

    def measured():
        asked.append(1)
        return "ring", None, "measured"
    assert select.pair_for("auto", Fake(), 16 << 20, np.dtype(np.float32), "auto", measured) == ("ring", None)
    assert asked == [1]
    # named algorithms and a named transport leave the network out
    assert select.pair_for("tree", Fake(), 16 << 20, np.dtype(np.float32), "auto", measured)[0] == "tree"
    assert select.pair_for("auto", Fake(), 16 << 20, np.dtype(np.float32), "mpi", measured)[0] != "" and asked == [1]
    tuning.reload()
    select.reset()
