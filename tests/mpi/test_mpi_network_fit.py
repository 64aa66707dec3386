"""auto across hosts learns the network (collectives/network_fit.py) under MPI, on hosts given to a
communicator by its node colours (one node's ranks as 4 x 1, 2,1,2, 2 x 1, ...; messages under
SHM_MIN_BYTES, so every one goes over MPI as between real hosts): the first auto call of a bucket
fits the link once and measures the fitted model's finalists, every rank runs the same pick, rank
0 stores it with the fit, the predictions, the figures and the first call's cost; later calls,
later communicators and later runs reuse it; COLLECTIVES_AUTOTUNE=0 leaves it to the model.
Run by tests/run_all.py at N = 1..4 ranks (and by hand at 5: the 2,1,2 topology)."""
import json

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from collectives import autotune, network_fit, select, tuning  # noqa: E402
from collectives.api import as_comm  # noqa: E402
from tests.helpers import agree_all, bitwise_alike  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
WORLD = MPI.COMM_WORLD
# uneven and one-rank-per-host topologies first (issue 36)
COLORS = {2: [(0, 1)], 3: [(0, 1, 2), (0, 0, 1)], 4: [(0, 1, 2, 3), (0, 0, 1, 2), (0, 0, 1, 1)],
          5: [(0, 0, 1, 2, 2), (0, 1, 2, 3, 4)]}.get(WORLD.size, [tuple(range(WORLD.size))])
COUNT = 16 << 10  # 64 KiB of float32: under SHM_MIN_BYTES, every message over MPI


def agree(ok, message):
    agree_all(WORLD, ok, message)


@pytest.fixture
def calibration(tmp_path_factory, monkeypatch):
    """Calibration on, into a fresh file shared by the ranks; no tuning table; counted measuring."""
    where = WORLD.bcast(str(tmp_path_factory.mktemp("netfit") / "autotune.json") if WORLD.rank == 0 else None)
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "1")
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE_FILE", where)
    monkeypatch.setenv("COLLECTIVES_TUNING", where + ".no-table")
    monkeypatch.delenv("COLLECTIVES_ALGO", raising=False)
    measured = []
    real = autotune.measure

    def counted(*args, **kwargs):
        times = real(*args, **kwargs)
        measured.append(times[0])
        return times
    monkeypatch.setattr(autotune, "measure", counted)
    for reset in (autotune.reset, tuning.reload, select.reset, collectives.clear_caches):
        reset()
    yield where, measured
    for reset in (autotune.reset, tuning.reload, select.reset, collectives.clear_caches):
        reset()
    WORLD.Barrier()


def hosts_of(colors):
    """A communicator whose ranks sit on the hosts ``colors`` names, and its MPI duplicate."""
    dup = WORLD.Dup()
    ours = as_comm(dup)
    ours.node_colors = lambda: colors
    return ours, dup


def release(ours, dup):
    ours.close()
    dup.Free()


def data(seed=0):
    return np.random.default_rng(WORLD.rank + 17 * seed).standard_normal(COUNT).astype(np.float32)


@pytest.mark.skipif(WORLD.size == 1, reason="one rank: nothing to fit")
@pytest.mark.parametrize("colors", COLORS, ids=lambda c: ",".join(map(str, c)))
def test_first_use_fits_measures_the_finalists_and_every_rank_runs_the_stored_pick(calibration, colors,
                                                                                   monkeypatch):
    where, measured = calibration
    ours, dup = hosts_of(colors)
    try:
        hosts = ours.hosts()
        x = data()
        expected = np.empty_like(x)
        WORLD.Allreduce(x, expected)
        y = collectives.allreduce(x, comm=ours)
        agree(np.allclose(y, expected, rtol=1e-5, atol=1e-5) and bitwise_alike(WORLD, y), "wrong or differing result")
        agree(len(measured) == 1, f"measured {len(measured)} times")
        found = autotune.agreed(ours, x.dtype, x.nbytes, False)
        agree(found is not None and found[1] is None, f"no pick across hosts: {found}")
        picks = WORLD.allgather(found[0])
        agree(len(set(picks)) == 1, f"ranks picked {picks}")
        alpha, beta, _ = ours.session.picks[network_fit.SESSION_FIT]
        agree(alpha > 0 and beta > 0 and len(set(WORLD.allgather((alpha, beta)))) == 1,
              f"the fitted line differs between ranks or is not a line: {alpha}, {beta}")
        finalists = network_fit.candidates(hosts, x.nbytes, alpha, beta)[0]
        times = measured[0]
        agree([p[0] for p in times] == [f for f in finalists if (f, "auto") in times] and found[0] in finalists
              and (found[0], "auto") == autotune.fastest(times), f"pick {found[0]} of {times}, finalists {finalists}")
        agree("measured on first use across hosts" in found[2] and "first call" in found[2], found[2])
        # later calls of the bucket: no measuring, the same pick
        collectives.allreduce(data(1), comm=ours)
        collectives.allreduce(np.ones(COUNT + 100, np.float32), comm=ours)
        agree(len(measured) == 1, "measured again within the bucket")
        WORLD.Barrier()
        if WORLD.rank == 0:
            entries = json.load(open(where))["entries"]
            mine = [(k, e) for k, e in entries.items() if k.startswith("hosts|")]
            ok = len(mine) == 1 and mine[0][1]["algorithm"] == found[0] and mine[0][1]["transport"] == "auto"
            k, e = mine[0] if mine else ("", {})
            ok = ok and e.get("first_call_s", 0) > 0 and e.get("fit_s", 0) > 0 and set(e["times_us"]) <= set(
                e["predicted_us"]) and found[0] in e["times_us"] and tuning.topology_key(hosts) in k.split("|")
            message = f"stored {mine}"
        else:
            ok, message = True, ""
        agree(ok, message)
    finally:
        release(ours, dup)
    # a later run (files read again, a new communicator) on the same network: the stored pick, no
    # measuring (one node's "link" is shared memory, whose fitted rate wanders between classes: the
    # network's name is pinned to the first run's here); on another network: measured again
    network = network_fit.rate_class(beta)
    for name, times in ((network, 1), ("another", 2)):
        autotune.reset()
        monkeypatch.setattr(network_fit, "rate_class", lambda _beta: name)
        ours, dup = hosts_of(colors)
        try:
            collectives.allreduce(data(2), comm=ours)
            again = autotune.agreed(ours, np.dtype(np.float32), COUNT * 4, False)
            agree(len(measured) == times and again is not None, f"{name}: measured {len(measured)} times; {again}")
            if times == 1:
                agree(again[0] == found[0] and "stored in" in again[2], f"not the stored pick: {again}")
        finally:
            release(ours, dup)


@pytest.mark.skipif(WORLD.size == 1, reason="one rank: nothing to fit")
def test_the_link_is_fitted_once_per_communicator(calibration, monkeypatch):
    ours, dup = hosts_of(COLORS[0])
    calls = []
    real = network_fit._pingpong
    monkeypatch.setattr(network_fit, "_pingpong", lambda *a: calls.append(a[3]) or real(*a))
    try:
        for count in (COUNT, 4 * COUNT, COUNT // 4):
            collectives.allreduce(np.ones(count, np.float32), comm=ours)
        per_rank = WORLD.allgather(len(calls))
        # only the ping-pong's two ranks exchange: 8 B, then 1 MiB and 4 MiB (the same link, one fit)
        agree(sorted(per_rank, reverse=True)[:2] == [3, 3] and sum(per_rank) == 6, f"ping-pongs per rank {per_rank}")
        agree(len(calibration[1]) == 3, f"measured {len(calibration[1])} buckets")
    finally:
        release(ours, dup)


@pytest.mark.skipif(WORLD.size == 1, reason="one rank: nothing to fit")
def test_with_autotune_off_the_model_decides_and_nothing_is_measured(calibration, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_AUTOTUNE", "0")
    ours, dup = hosts_of(COLORS[0])
    try:
        x = data()
        y = collectives.allreduce(x, comm=ours)
        expected = np.empty_like(x)
        WORLD.Allreduce(x, expected)
        agree(np.allclose(y, expected, rtol=1e-5, atol=1e-5), "wrong result")
        agree(calibration[1] == [] and network_fit.SESSION_FIT not in ours.session.picks, "measured with autotune off")
    finally:
        release(ours, dup)
