"""auto across hosts learns the network it runs on: first-use calibration for ranks on several
hosts, where no tuning table covers the call.

Why: between hosts the link decides, and the two-level cost model's default constants (a
10 Gbit/s link, collectives/model.py) know nothing of it. With them auto once picked
rabenseifner on 4 hosts x 1 rank at 500 Mbit/s, 1.7x the best algorithm's time
(docs/performance.md#auto-across-hosts).

How, on a communicator's first ``auto`` call of a bucket (autotune's buckets: the power of two
at or below the call's bytes, calls from 32 MiB sharing one):
1. The link is fitted once per communicator: the first ranks of the first two hosts ping-pong
   8 B, 1 MiB and 4 MiB messages through the library's own communicator (what a plan step
   costs); beta is the slope from 1 MiB to 4 MiB (a shaped link's burst cancels), alpha what
   the 8 B message leaves. Bounded: where 1 MiB takes longer than FIT_SLOW_SECONDS the 4 MiB
   exchange is skipped. Every rank gets the same line (one all-reduce).
2. The *network* is the fitted link's rate class (its rate rounded to 1, 2 or 5 x 10^k): with
   the topology (ranks per host), the MPI library, the dtype, the bucket and in place or not it
   keys the pick in autotune's file (COLLECTIVES_AUTOTUNE_FILE), so a later job on the same kind
   of hosts and links pays only the fit. Ranks agree on rank 0's stored pick (one all-reduce).
3. Where none is stored, the two-level cost model prices every candidate (all algorithms but
   ``shm``) with the fitted inter-host alpha and beta, and the ones within MODEL_TIE of its best
   (at least MIN_FINALISTS, at most MAX_FINALISTS, in the model's order) run on the caller's
   buffers (autotune.measure's rules: at most 32 MiB of them, data restored in place): one
   untimed call each, then ROUNDS interleaved rounds of batches, the slowest rank's time
   counting, the median deciding, a near tie (autotune.TIE) going to the model's favourite.
   Every rank has the same figures, so the same pick. Rank 0 stores it with the fit, each
   finalist's prediction and measurement, and what the first call cost.

Inside each host the transport is the library's rule (``select.transport_choice``) in the
measurement as in every later call. Cost: the fit and each finalist's 1 + ROUNDS batches; what it
took on the emulated cluster is in docs/performance.md#auto-across-hosts.
"""
import math
import time

import numpy as np

from . import algorithms as _algorithms
from . import autotune
from .model import ALPHA, BETA, GAMMA
from .mpilib import describe
from .plan import NCHANNELS
from .tuning import topology_key
from .ranking import describe_topology, two_level_choice

# the ping-pong: 8 B for alpha; beta from 1 MiB on, where a shaped link's burst is a small part
# (docs/performance.md#auto-across-hosts); the least of a few round trips, as calibrate.py fits
FIT_SMALL = 8
FIT_LARGE = (1 << 20, 4 << 20)
FIT_SMALL_REPS = 10
FIT_LARGE_REPS = 2
# a link slower than 4 MB/s fits on 1 MiB alone: the fit stays under about a second
FIT_SLOW_SECONDS = 0.25
# candidates the fitted model prices within this of its best are measured: its closed forms put
# flat algorithms on one rank per host at the same bandwidth term, which the network does not
# (docs/performance.md#auto-across-hosts)
MODEL_TIE = 0.10
# two at least, so the model alone never decides; four at most (with ROUNDS, the first call of a
# bucket lasts about 16 of its calls: docs/performance.md#auto-across-hosts)
MIN_FINALISTS = 2
MAX_FINALISTS = 4
ROUNDS = 3  # a median of three: one disturbed batch never decides
SESSION_FIT = "network-fit"  # comm.session.picks key of the communicator's fitted link


def fit_line(small, small_seconds, large, large_seconds):
    """(alpha, beta) of a link from ping-pong half round trips: beta the slope through the large
    sizes (two or more; one: the slope from the small one), alpha what the small message leaves."""
    if len(large) >= 2:
        beta = float(np.polyfit(np.array(large, float), np.array(large_seconds, float), 1)[0])
    else:
        beta = (large_seconds[0] - small_seconds) / max(1, large[0] - small)
    beta = max(beta, 1e-13)
    return max(small_seconds - small * beta, 1e-7), beta


def rate_class(beta):
    """The network's name in keys: the link's rate in bit/s rounded, on a log scale, to the nearest
    of 1, 2, 5 x 10^k (the rates links are sold at: a fit of a 500 Mbit/s link, a few percent under
    it, is "500Mbit/s"; a link half as fast or twice as fast is another network)."""
    rate = 8 / beta
    series = [m * 10.0 ** e for e in range(3, 15) for m in (1, 2, 5)]
    nearest = min(series, key=lambda r: abs(math.log(rate / r)))
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if nearest >= scale:
            return f"{nearest / scale:g}{unit}bit/s"
    return f"{nearest:g}bit/s"


def _pingpong(comm, first, peer, nbytes, reps, tag):
    buf = np.zeros(max(nbytes, 1), np.uint8)[:nbytes]
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        if first:
            comm.exchange([(peer, buf, 0)], [], tag, "network fit: ping")
            comm.exchange([], [(peer, buf, 0)], tag, "network fit: pong")
        else:
            comm.exchange([], [(peer, buf, 0)], tag, "network fit: ping")
            comm.exchange([(peer, buf, 0)], [], tag, "network fit: pong")
        best = min(best, (time.perf_counter() - start) / 2)
    return best


def fit_link(comm, hosts, allreduce):
    """(alpha, beta, seconds the fit took) of the inter-host link, the same on every rank (the
    session keeps it for the communicator's later buckets)."""
    kept = comm.session.picks.get(SESSION_FIT)
    if kept is not None:
        return kept

    start = time.perf_counter()
    a, b = hosts[0][0], hosts[1][0]
    tag = comm.next_tag() * NCHANNELS  # every rank draws it: the tags stay in step
    line = np.zeros(2)
    if comm.rank in (a, b):
        peer = b if comm.rank == a else a
        small = _pingpong(comm, comm.rank == a, peer, FIT_SMALL, FIT_SMALL_REPS, tag)
        sizes, seconds = [], []
        for nbytes in FIT_LARGE:
            sizes.append(nbytes)
            seconds.append(_pingpong(comm, comm.rank == a, peer, nbytes, FIT_LARGE_REPS, tag))
            slow = np.array([seconds[-1] > FIT_SLOW_SECONDS], np.int64)
            # both ranks of the ping-pong decide alike: the first's time rules
            comm.exchange([(peer, slow, 1)] if comm.rank == a else [], [] if comm.rank == a else [(peer, slow, 1)],
                          tag, "network fit: bound")
            if slow[0]:
                break
        if comm.rank == a:
            line[:] = fit_line(FIT_SMALL, small, sizes, seconds)
    allreduce(line, line, op="max", algorithm="recursive_doubling", comm=comm)
    fitted = comm.session.picks[SESSION_FIT] = (float(line[0]), float(line[1]), time.perf_counter() - start)
    return fitted


def candidates(hosts, nbytes, alpha_inter, beta_inter, names=None):
    """(finalists, {name: predicted seconds}): every algorithm but ``shm`` priced by the two-level
    model with the fitted link; the finalists those within MODEL_TIE of the cheapest, cheapest
    first (at least MIN_FINALISTS, at most MAX_FINALISTS)."""
    names = [n for n in (names or _algorithms.names()) if n != "shm"]
    costs = two_level_choice(hosts, nbytes, ALPHA, BETA, GAMMA, alpha_inter, beta_inter, candidates=names)[1]
    order = sorted(costs, key=costs.get)  # stable: a tie keeps the model's order (two_level first)
    least = costs[order[0]]
    close = [n for n in order if costs[n] <= least * (1 + MODEL_TIE)]
    return order[:max(MIN_FINALISTS, min(MAX_FINALISTS, len(close)))], costs


def key(library, hosts, network, dtype, nbytes, in_place):

    return "|".join(("hosts", network, library, topology_key(hosts), np.dtype(dtype).name,
                     str(autotune.bucket(nbytes)), "in_place" if in_place else "out_of_place"))


def _code(name):
    return 1 + _algorithms.names().index(name) if name in _algorithms.names() else 0


def pick(comm, hosts, sendbuf, recvbuf, allreduce, barrier):
    """(algorithm, None, why) for an ``auto`` call across hosts with no tuning table: the pick the
    ranks agreed on for this bucket, else rank 0's stored one for this network, else measured now
    (module docstring). ``allreduce``: the call pipeline's own path; ``barrier``: the comm's."""

    dtype, nbytes, in_place = sendbuf.dtype, sendbuf.nbytes, recvbuf is sendbuf
    session_key = autotune._comm_key(comm, dtype, nbytes, in_place, False)
    agreed = comm.session.picks.get(session_key)
    if agreed is not None:
        return agreed
    start = time.perf_counter()
    alpha_inter, beta_inter, fit_seconds = fit_link(comm, hosts, allreduce)
    network = rate_class(beta_inter)
    name = key(describe(), hosts, network, dtype, nbytes, in_place)
    where = autotune.path()
    mine = autotune.stored(where).get(name)
    code = np.array([_code(mine["algorithm"]) if comm.rank == 0 and mine else 0], np.int64)
    allreduce(code, code, op="max", algorithm="recursive_doubling", comm=comm)
    link = f"link fitted alpha {alpha_inter * 1e6:.1f} us, {1 / beta_inter / 1e6:.1f} MB/s"
    if code[0] > 0:
        found = _algorithms.names()[int(code[0]) - 1]
        why = f"calibrated on first use across hosts, {describe_topology(hosts)}, {network} (stored in {where})"
    else:
        # priced at the bytes measured (autotune.measure: at most MEASURE_MAX_BYTES of the call's)
        measured_bytes = min(sendbuf.size, max(1, autotune.MEASURE_MAX_BYTES // sendbuf.itemsize)) * sendbuf.itemsize
        finalists, predicted = candidates(hosts, measured_bytes, alpha_inter, beta_inter)
        times = autotune.measure(comm, sendbuf, recvbuf, [(n, "auto") for n in finalists], allreduce, barrier,
                                 how=_measure_finalists)[0]
        found = autotune.fastest(times)[0]
        took = time.perf_counter() - start
        figures = ", ".join(f"{n} {s * 1e6:.0f} us (predicted {predicted[n] * 1e6:.0f})" for (n, _), s in times.items())
        why = (f"measured on first use across hosts, {describe_topology(hosts)}, {link}: {figures}; "
               f"first call {took:.2f} s")
        if comm.rank == 0:
            autotune._store(where, name, {
                "algorithm": found, "transport": "auto", "bytes": nbytes, "measured_bytes": measured_bytes,
                "alpha_inter_us": round(alpha_inter * 1e6, 3),
                "beta_inter_ns": round(beta_inter * 1e9, 5), "network": network,
                "predicted_us": {n: round(predicted[n] * 1e6, 1) for n in finalists},
                "times_us": {n: round(s * 1e6, 1) for (n, _), s in times.items()},
                "fit_s": round(fit_seconds, 3), "first_call_s": round(took, 3),
                "measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
    agreed = comm.session.picks[session_key] = (found, None, why)
    return agreed


def _measure_finalists(comm, pairs, run, allreduce, barrier):
    """({pair: seconds per call}, the same): one untimed call per pair (plans and windows built;
    a pair refused with ValueError on every rank is left out), then ROUNDS rounds in batches
    sized from it (one call where a call lasts autotune.BATCH_SECONDS or more)."""
    with np.errstate(all="ignore"):
        once = {}
        for pair in pairs:
            try:
                barrier(comm)
                begin = time.perf_counter()
                run(pair)
                once[pair] = time.perf_counter() - begin
            except ValueError:
                continue
        pairs = list(once)
        seconds = np.array([once[p] for p in pairs])
        allreduce(seconds, seconds, op="max", algorithm="recursive_doubling", comm=comm)
        times = autotune._rounds(comm, pairs, autotune._batches(pairs, seconds), ROUNDS, run, allreduce, barrier)
    return times, times
