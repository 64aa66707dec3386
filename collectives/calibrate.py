"""Fit the simulator's alpha, beta, gamma on this machine, then compare predictions with runs.

Run under mpiexec with 2 or more ranks:

    mpiexec -n 2 python -m collectives.simulator --calibrate [-a ring,tree] [-b 8] [-e 16M] [-f 4] [--json F]

alpha and beta come from a weighted least-squares fit (relative error) of ping-pong half
round trips between rank 0 and another rank of its host, 8 B .. 4 MiB, through the library's own communicator
(``exchange``, the call the executor makes once per step, so its Python cost per message is
in alpha); a raw mpi4py ping-pong is printed beside it for reference. gamma comes from
timing ``np.add(a, b, out=c)`` on 8 MiB of float32 (seconds per output byte). Then every
algorithm runs at every size of the sweep (out of place, float32, sum) and the table gives
measured time (median over calls of the slowest rank's time) against the simulator's
prediction with the fitted values, and their ratio.

Across hosts (ranks on several shared-memory nodes, e.g. ``python -m benchmarks.cluster``), a
second ping-pong between rank 0 and the next host's first rank, 8 B .. 16 MiB, gives the
inter-host line: beta the slope from 1 MiB on (a shaped link's burst would otherwise pass for
rate), alpha what the smallest message leaves, and the link's burst (the bytes it passes at
once after it idled) where that line meets the axis. Where every host holds consecutive ranks
the predictions then use ``Topology(ranks per host, or each host's count, intra line, inter
line, shared_nic=True, sharing="fair", burst=..., back_to_back=True)``: every host's link,
outgoing and incoming each on its own, carries the messages that cross it at once at equal shares
of its rate, as TCP streams share a link (a message ends when both links carried it), and starts
each call with the tokens the call before left it (the calls are timed back to back, so a link
regains its burst only where it idles).

The ranks outside a ping-pong sleep until it ends: polling, they would take the cores from the
ping-pong's ranks on a machine with fewer cores than ranks (an emulated cluster), and alpha
would measure the scheduler.
"""
import os
import sys
import time

import numpy as np

import collectives
from . import simulator as sim
from .api import as_comm
from .cli import parse_size
from .config import timeout
from .plan import NCHANNELS
from .select import describe_topology, topology as _hosts

PINGPONG_SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20]
INTER_SIZES = [8, 512, 4 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20]


def _reps(nbytes, small=200, large=10):
    return max(large, min(small, int(small * 4096 / max(nbytes, 4096))))


def _pingpong_mpi(comm, nbytes, reps, peer=1):
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        if comm.rank == 0:
            comm.Send(buf, peer, 7)
            comm.Recv(buf, peer, 7)
        elif comm.rank == peer:
            comm.Recv(buf, 0, 7)
            comm.Send(buf, 0, 7)
    took = (time.perf_counter() - start) / reps / 2
    _idle_wait(comm)
    return took


def _pingpong_lib(comm, lib, nbytes, reps, peer=1):
    """The same ping-pong (rank 0 and ``peer``) through the library's communicator: one
    ``exchange`` per message."""

    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    tag = lib.next_tag() * NCHANNELS
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        if comm.rank == 0:
            lib.exchange([(peer, buf, 0)], [], tag, "ping")
            lib.exchange([], [(peer, buf, 0)], tag, "pong")
        elif comm.rank == peer:
            lib.exchange([], [(0, buf, 0)], tag, "ping")
            lib.exchange([(0, buf, 0)], [], tag, "pong")
    took = (time.perf_counter() - start) / reps / 2
    _idle_wait(comm)
    return took


def _idle_wait(comm, nap=0.0005):
    """Every rank waits here for a ping-pong's end; the ranks outside it sleep in short naps.
    In MPI's barrier they would poll, and even in a yielding wait they stay runnable: on a
    machine with fewer cores than ranks (an emulated cluster's hosts share this machine's
    cores) they would take the cores from the two ranks being timed, and the small messages'
    fit (alpha) would measure the scheduler (milliseconds) instead of the link. Bounded by
    COLLECTIVES_TIMEOUT."""

    request = comm.Ibarrier()
    limit = timeout()
    start = time.monotonic()
    while not request.Test():
        if limit and time.monotonic() - start > limit:
            raise TimeoutError(f"rank {comm.rank}: calibration ping-pong not over after {limit:g} s "
                               f"(COLLECTIVES_TIMEOUT)")
        time.sleep(nap)


def _fit_line(sizes, times):
    """alpha + m beta through (size, time), least squares on relative error."""
    m, t = np.array(sizes, float), np.array(times, float)
    beta, alpha = np.polyfit(m, t, 1, w=1 / t)
    return max(float(alpha), 1e-7), max(float(beta), 1e-13)


def _fit_link(sizes, times, large=1 << 20):
    """alpha + m beta of a link between hosts: beta the least-squares slope through the sizes from
    ``large`` on, alpha what the smallest message leaves over m beta. A shaped link (tbf) passes a
    burst at line rate before its rate holds, so a line through every size, weighted by relative
    error, fits the burst, not the rate (74 MB/s on a 62.5 MB/s link)."""
    m, t = np.array(sizes, float), np.array(times, float)
    big = m >= large
    if big.sum() < 2:
        return _fit_line(sizes, times)
    beta = max(float(np.polyfit(m[big], t[big], 1)[0]), 1e-13)
    first = int(np.argmin(m))
    return max(float(t[first] - m[first] * beta), 1e-7), beta


def _link_burst(sizes, times, alpha, beta, large=1 << 20):
    """Bytes a shaped link passes at once after it idled (tbf's burst): the line through the
    sizes from ``large`` on meets the axis at alpha less the burst's time at the rate. In a
    ping-pong each direction's link idles while the other carries the reply, long enough from
    ``large`` on to fill its bucket again."""
    m, t = np.array(sizes, float), np.array(times, float)
    big = m >= large
    if big.sum() < 2:
        return 0.0
    intercept = float(np.mean(t[big] - m[big] * beta))
    return max(0.0, (alpha - intercept) / beta)


def _gamma(comm):
    a = np.ones(1 << 21, np.float32)
    b = np.ones_like(a)
    c = np.empty_like(a)
    reps = []
    for _ in range(9):
        start = time.perf_counter()
        np.add(a, b, out=c)
        reps.append(time.perf_counter() - start)
    gamma = float(np.median(reps[2:])) / c.nbytes
    return comm.allreduce(gamma) / comm.size


def fit(comm, lib=None, peer=1, sizes=PINGPONG_SIZES, line=_fit_line):
    """(alpha, beta, gamma, details): the library-path fit (``line``) of rank 0's ping-pong with
    ``peer``, and the raw MPI numbers."""
    raw = [min(_pingpong_mpi(comm, s, _reps(s), peer) for _ in range(3)) for s in sizes]
    via = [min(_pingpong_lib(comm, lib, s, _reps(s), peer) for _ in range(3)) for s in sizes] if lib else raw
    raw, via = comm.bcast((raw, via), root=0)
    alpha, beta = line(sizes, via)
    raw_alpha, raw_beta = line(sizes, raw)
    gamma = _gamma(comm)
    return alpha, beta, gamma, {"pingpong_sizes": list(sizes), "pingpong_library": via, "pingpong_mpi": raw,
                                "mpi_alpha": raw_alpha, "mpi_beta": raw_beta}


def _sizes(lo, hi, factor):
    sizes, size = [], max(4, lo)
    while size <= hi:
        sizes.append(size)
        size = max(size + 4, int(size * factor))
    if sizes and sizes[-1] != hi and hi >= 4:
        sizes.append(hi)
    return sizes


def measure(comm, name, nbytes, reps):
    """Median over ``reps`` calls of the slowest rank's time for one out-of-place all-reduce."""
    from mpi4py import MPI

    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(2):
        collectives.allreduce(x, out, algorithm=name)
    runs = []
    for _ in range(reps):
        comm.Barrier()
        start = time.perf_counter()
        collectives.allreduce(x, out, algorithm=name)
        runs.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(runs))


def main(args=None):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("calibration needs at least 2 ranks: mpiexec -n 2 python -m collectives.simulator --calibrate")
        return 2
    spec = getattr(args, "algorithms", "all") or "all"
    names = collectives.algorithm_names() if spec == "all" else [a.strip() for a in spec.split(",")]
    lo = parse_size(getattr(args, "minbytes", None) or "8")
    hi = parse_size(getattr(args, "maxbytes", None) or "16M")
    sizes = _sizes(lo, hi, getattr(args, "stepfactor", None) or 4)
    collectives.barrier(comm)  # every rank is here (bounded by COLLECTIVES_TIMEOUT) before blocking MPI calls
    lib = as_comm(comm)

    hosts = _hosts(lib)
    alpha, beta, gamma, details = fit(comm, lib, peer=hosts[0][1] if len(hosts[0]) > 1 else hosts[1][0])
    two_level = None
    if len(hosts) > 1:  # across hosts: rank 0 with a rank of the next host gives the inter-host line,
        # its beta from 1 to 16 MiB (a shaped link passes its first burst faster than its rate)
        inter_alpha, inter_beta, _, inter = fit(comm, lib, peer=hosts[1][0], sizes=INTER_SIZES, line=_fit_link)
        burst = _link_burst(INTER_SIZES, inter["pingpong_library"], inter_alpha, inter_beta)
        counts = [len(h) for h in hosts]
        if [r for h in hosts for r in h] == list(range(comm.size)):  # hosts of consecutive ranks
            per_node = counts[0] if len(set(counts)) == 1 else tuple(counts)
            # calls back to back, as measure() times them: a link starts with what the call before left
            two_level = sim.Topology(per_node, (alpha, beta), (inter_alpha, inter_beta), True, "fair", burst,
                                     burst > 0)
        if comm.rank == 0:
            print(f"# {describe_topology(hosts)}: inter-host ping-pong fit alpha {inter_alpha * 1e6:.2f} us, beta "
                  f"{inter_beta * 1e9:.4f} ns/B ({1 / inter_beta / 1e6:.1f} MB/s), burst {burst / 1e3:.0f} kB"
                  + ("" if two_level else "; hosts of interleaved ranks: predicted with the intra-host line only"))
        details["inter"] = {"alpha": inter_alpha, "beta": inter_beta, "burst": burst, "sharing": "fair",
                            "back_to_back": burst > 0,
                            "pingpong": inter["pingpong_library"], "pingpong_mpi": inter["pingpong_mpi"],
                            "mpi_alpha": inter["mpi_alpha"]}
    rows = []
    if comm.rank == 0:
        print(f"# calibration on {comm.size} ranks, {os.cpu_count()} cores")
        print("# ping-pong half round trip (us):  size  library-exchange  raw-mpi4py")
        for s, t_lib, t_mpi in zip(details["pingpong_sizes"], details["pingpong_library"], details["pingpong_mpi"]):
            fitted = alpha + s * beta
            print(f"#   {s:>9}  {t_lib * 1e6:>10.2f}  {t_mpi * 1e6:>10.2f}   (fit {fitted * 1e6:.2f})")
        print(f"# fitted (library path, used below): alpha {alpha * 1e6:.2f} us, beta {beta * 1e9:.4f} ns/B "
              f"({1 / beta / 1e9:.2f} GB/s), gamma {gamma * 1e9:.4f} ns/B ({1 / gamma / 1e9:.2f} GB/s)")
        print(f"# raw mpi4py ping-pong fit, for reference: alpha {details['mpi_alpha'] * 1e6:.2f} us, "
              f"beta {details['mpi_beta'] * 1e9:.4f} ns/B ({1 / details['mpi_beta'] / 1e9:.2f} GB/s)")
        if "inter" in details:
            link = details["inter"]
            print("# inter-host ping-pong half round trip (us):  size  library-exchange  raw-mpi4py")
            for s, t_lib, t_mpi in zip(INTER_SIZES, link["pingpong"], link["pingpong_mpi"]):
                print(f"#   {s:>9}  {t_lib * 1e6:>12.1f}  {t_mpi * 1e6:>12.1f}   "
                      f"(fit {(link['alpha'] + s * link['beta']) * 1e6:.1f})")
        print(f"{'algorithm':>20}{'size(B)':>10}{'measured(us)':>14}{'predicted(us)':>15}{'ratio':>8}")
    for name in names:
        for nbytes in sizes:
            predicted = sim.simulate(name, ranks=comm.size, nbytes=nbytes, alpha=alpha, beta=beta, gamma=gamma,
                                     topology=two_level, verify_data=False).time
            measured = measure(comm, name, nbytes, reps=_reps(nbytes, small=31, large=5))
            ratio = measured / predicted if predicted else float("nan")
            rows.append({"algorithm": name, "size": nbytes, "measured": measured, "predicted": predicted,
                         "ratio": ratio})
            if comm.rank == 0:
                print(f"{name:>20}{nbytes:>10}{measured * 1e6:>14.1f}{predicted * 1e6:>15.1f}{ratio:>8.2f}",
                      flush=True)
    if comm.rank == 0:
        print("# measured/predicted per algorithm: median at <= 32 KiB, at 32 KiB .. 1 MiB, at >= 1 MiB")
        for name in names:
            mine = [r for r in rows if r["algorithm"] == name]
            bands = [[r["ratio"] for r in mine if r["size"] <= 32 << 10],
                     [r["ratio"] for r in mine if 32 << 10 < r["size"] < 1 << 20],
                     [r["ratio"] for r in mine if r["size"] >= 1 << 20]]
            cells = [f"{np.median(b):6.2f}" if b else "     -" for b in bands]
            print(f"#   {name:>20}  {'  '.join(cells)}")
        path = getattr(args, "json", None)
        if path:
            import json
            with open(path, "w") as fh:
                json.dump({"ranks": comm.size, "alpha": alpha, "beta": beta, "gamma": gamma, "details": details,
                           "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
