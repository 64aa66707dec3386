"""auto's first-use calibration: where no tuning table covers an ``auto`` call of ranks on one
node, the library measures the likeliest (algorithm, transport) pairs the first time it meets
the call's size on this machine, runs the fastest, and stores it for later runs.

Why: which pair is fastest within a node depends on the machine more than any fixed cost model
can say. On this project's 2-core VM the same sizes flip between MPI point-to-point and shared
memory from one hour to the next (docs/performance.md#first-use-calibration).

How:
- A call's *bucket* is (machine, MPI library, world size, dtype, in place or not, shared array
  or not, the power of two at or below its byte count; calls from 32 MiB share one).
- On a communicator's first ``auto`` call of a bucket its ranks agree on rank 0's stored pick
  (one tiny all-reduce; stores on different ranks may differ). Where rank 0 has none, every rank
  measures the same candidates: every algorithm over MPI (but two_level, the ring on one node)
  and the shared-memory cost model's best four over shared memory. They run on the caller's own
  buffers (at most their first 32 MiB; in place, the data is restored afterwards) in batches of
  back-to-back calls (about 5 ms; at least 2 calls where a call is shorter), the slowest rank's
  time counting: after an untimed round (for calls under 5 ms), three rounds (each in its own order) screen every
  pair, and seven more decide between the three fastest. A pair's figure is its median round; the first finalist in candidate order within 3%
  of the fastest wins. Every rank has the same figures, so the same pick.
- Rank 0 stores the winner with its figures in ``~/.cache/collectives/autotune.json``
  (``XDG_CACHE_HOME`` respected; ``COLLECTIVES_AUTOTUNE_FILE`` names another file), written
  atomically. Every later call of the bucket, in this run or the next, runs it with no measuring.
- ``COLLECTIVES_AUTOTUNE=0`` turns this off: the cost model decides, as it does for calls a
  tuning table (``python -m collectives.tune``, which wins wherever it covers a call), the
  threaded world, a named transport, ``iallreduce`` and compression leave to it. Ranks on several
  hosts calibrate too, through collectives/network_fit.py (the link fitted first, the fitted
  model's best few measured), into the same file.

Cost: the first call of a bucket runs every candidate through all its rounds, so it lasts far
longer than a call (what it took here: docs/performance.md#first-use-calibration); in place it
holds a copy of at most 32 MiB of the call's data meanwhile. Limits: a pick holds for the
machine's state when it was measured (delete the file, or run ``collectives.tune``, to measure
again). A call that repeats an earlier call's shape (size, dtype, op, in place or not) on a
communicator takes the short path and runs that call's pick, whether its buffers are shared arrays or not.
"""
import json
import os
import platform
import threading
import time
import warnings

import numpy as np

from . import algorithms as _algorithms
from .config import cache_file
from .model import ALPHA_NODE_STEP
from .mpilib import describe
from .ranking import cost_choice, shm_cost_choice

FORMAT = "collectives-autotune-1"
SHM_CANDIDATES = 4
MEASURE_MAX_BYTES = 32 << 20  # larger calls share one bucket, measured on this much of their data
SCREEN_ROUNDS = 3  # every candidate
FINALISTS = 3  # the fastest of the screening, measured again
FINAL_ROUNDS = 7
BATCH_SECONDS = 5e-3  # a timed batch lasts about this long
MAX_BATCH = 2000  # calls in one timed batch at most (a small message's batch still lasts about 5 ms)

_stores = {}  # path -> {key: entry}
_unwritable = set()  # paths a store failed on (warned once)
_lock = threading.Lock()


def path():
    return cache_file("COLLECTIVES_AUTOTUNE_FILE", "autotune.json")


def bucket(nbytes):
    """The power of two at or below ``nbytes`` (0 for 0), at most MEASURE_MAX_BYTES: calls in
    one bucket share a pick (past a few MiB the copies' bandwidth decides, whatever the size)."""
    return min(1 << (nbytes.bit_length() - 1), MEASURE_MAX_BYTES) if nbytes else 0


def key(library, size, dtype, nbytes, in_place, shared=False):
    return "|".join((platform.node(), library, str(size), np.dtype(dtype).name, str(bucket(nbytes)),
                     "in_place" if in_place else "out_of_place") + (("shared",) if shared else ()))


def candidates(size, nbytes, itemsize, shm):
    """[(algorithm, transport)]: every algorithm over MPI (but two_level, which on one node is the
    ring), in the cost model's order; then its best SHM_CANDIDATES over shared memory where
    ``shm``. The same list on every rank. Every algorithm over MPI, because the model ranks the
    trees and reduce_to_one last at every size while measured they win some sizes
    (docs/performance.md#calibration-details)."""

    names = _algorithms.names()
    over_mpi = cost_choice(size, nbytes, alpha=ALPHA_NODE_STEP,
                           candidates=[n for n in names if n != "two_level"])[1]
    found = [(n, "mpi") for n in sorted(over_mpi, key=over_mpi.get)]
    if shm:
        over_shm = shm_cost_choice(size, nbytes, itemsize, candidates=[n for n in names if n != "two_level"])[1]
        found += [(n, "shm") for n in sorted(over_shm, key=over_shm.get)[:SHM_CANDIDATES]]
    return found


def _code(pair):
    """A pair as a number every rank reads alike (0: none): 1 + 2 x registry index + shm."""
    if pair is None or pair[0] not in _algorithms.names():
        return 0
    return 1 + 2 * _algorithms.names().index(pair[0]) + (pair[1] == "shm")


def _pair(code):
    return None if code <= 0 else (_algorithms.names()[(code - 1) // 2], "shm" if (code - 1) % 2 else "mpi")


def stored(where=None):
    """{key: entry} of the calibration file (read once per path; a corrupt or foreign file gives
    one warning and counts as empty: it is rewritten at the next calibration)."""
    where = where or path()
    with _lock:
        found = _stores.get(where)
        if found is None:
            found = _stores[where] = _read(where)
        return found


def _read(where, quiet=False):
    if not os.path.exists(where):
        return {}
    try:
        with open(where) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not a collectives calibration file (no \"format\": \"{FORMAT}\")")
        entries = {}
        for name, entry in data["entries"].items():
            # "auto": a pick across hosts, whose transport inside each host is the library's rule
            if not isinstance(entry, dict) or entry.get("transport") not in ("mpi", "shm", "auto") \
                    or not isinstance(entry.get("algorithm"), str):
                raise ValueError(f"entry {name!r} is malformed")
            entries[name] = entry
        return entries
    except Exception as exc:  # noqa: BLE001 - any bad file counts as empty
        if quiet:
            return {}
        warnings.warn(f"collectives: ignoring calibration file {where}: {exc}; auto measures again",
                      RuntimeWarning, stacklevel=5)
        return {}


def _store(where, name, entry):
    """Add ``entry`` under ``name`` to the file (merged with what another run wrote meanwhile;
    atomic: a temporary file, then a rename). A file that cannot be written gives one warning."""
    with _lock:
        entries = _stores.setdefault(where, {})
        entries[name] = entry
        try:
            on_disk = _read(where, quiet=True)
            on_disk.update(entries)
            os.makedirs(os.path.dirname(os.path.abspath(where)), exist_ok=True)
            tmp = f"{where}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"format": FORMAT, "entries": on_disk}, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, where)
        except OSError as exc:
            if where not in _unwritable:
                _unwritable.add(where)
                warnings.warn(f"collectives: cannot store the calibration in {where}: {exc}; it lasts this run",
                              RuntimeWarning, stacklevel=5)


def pick(comm, sendbuf, recvbuf, shm, shared, allreduce, barrier):
    """(algorithm, transport, why) for an ``auto`` call of ``sendbuf`` into ``recvbuf`` (None: a
    new array; ``sendbuf``: in place) on ``comm`` (``shm``: shared memory can carry it;
    ``shared``: ``sendbuf`` is a shared array, which the shared-memory transport reads where it
    lies, so it is keyed apart): the pick the ranks agreed on for this bucket, else rank 0's
    stored one, else measured now. ``allreduce`` (the call pipeline's own path, never the public
    function) and ``barrier`` are handed in: this module sits below the pipeline."""
    dtype, nbytes, in_place = sendbuf.dtype, sendbuf.nbytes, recvbuf is sendbuf
    name = _comm_key(comm, dtype, nbytes, in_place, shared)
    agreed = comm.session.picks.get(name)
    if agreed is not None:
        return agreed
    where = path()
    mine = stored(where).get(name)
    code = np.array([_code((mine["algorithm"], mine["transport"])) if comm.rank == 0 and mine else 0], np.int64)
    allreduce(code, code, op="max", algorithm="recursive_doubling", comm=comm)  # rank 0's pick, to every rank
    found = _pair(int(code[0]))
    if found is not None:
        why = f"calibrated on first use on this machine (stored in {where})"
    else:
        pairs = candidates(comm.size, nbytes, dtype.itemsize, shm)
        times, screened = measure(comm, sendbuf, recvbuf, pairs, allreduce, barrier)
        found = fastest(times)
        figures = ", ".join(f"{a}@{t} {s * 1e6:.1f} us" for (a, t), s in times.items())
        why = f"measured on first use: {figures} (of {len(screened)} pairs screened)"
        if comm.rank == 0:
            _store(where, name, {"algorithm": found[0], "transport": found[1], "bytes": nbytes,
                                 "times_us": {f"{a}@{t}": round(s * 1e6, 2) for (a, t), s in times.items()},
                                 "screened_us": {f"{a}@{t}": round(s * 1e6, 2) for (a, t), s in screened.items()},
                                 "measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
    agreed = comm.session.picks[name] = (found[0], found[1], why)
    return agreed


TIE = 0.03  # pairs within 3% of the fastest count as tied: the first in candidate order wins


def fastest(times):
    """The first pair (in candidate order: over MPI in the cost model's order, then shared
    memory) within TIE of the fastest time. Small messages differ by fractions of a microsecond
    between pairs, and a batch's noise would otherwise pick among them by chance
    (docs/performance.md#calibration-details)."""
    least = min(times.values())
    return next(pair for pair, seconds in times.items() if seconds <= least * (1 + TIE))


def agreed(comm, dtype, nbytes, in_place, shared=False):
    """The (algorithm, transport, why) ``comm``'s ranks agreed on for such a call, or None (the
    benchmark's label for its auto row)."""
    return comm.session.picks.get(_comm_key(comm, dtype, nbytes, in_place, shared))


def _comm_key(comm, dtype, nbytes, in_place, shared):

    return key(describe(), comm.size, dtype, nbytes, in_place, shared)


def measure(comm, sendbuf, recvbuf, pairs, allreduce, barrier, how=None):
    """({finalist: seconds per call}, {pair: seconds per call, screening}), the same figures on
    every rank. Screening: every pair in SCREEN_ROUNDS rounds, each in its own order; final: the FINALISTS
    fastest of them in FINAL_ROUNDS more. A round is one batch of back-to-back calls per pair,
    timed after a barrier, the slowest rank's time counting; a pair's figure is its median round.
    Runs on the caller's own buffers where they are contiguous (at most MEASURE_MAX_BYTES of
    them: where the data lies, a shared array for one, changes what is fastest), into
    ``recvbuf`` (overwritten by the call anyway) or, in place, on ``sendbuf`` whose data is
    restored afterwards; else on copies. A pair refused for this call (ValueError on every rank
    alike) is left out. ``how``: the rounds to run (``_measure_pairs`` unless given; across
    hosts collectives/network_fit.py's shorter ones)."""
    limit = max(1, MEASURE_MAX_BYTES // sendbuf.itemsize)
    contiguous = sendbuf.flags.c_contiguous
    source = (sendbuf if contiguous else np.ascontiguousarray(sendbuf)).reshape(-1)[:limit]
    in_place = recvbuf is sendbuf
    if in_place:
        work, saved = source, source.copy()
    elif recvbuf is not None and recvbuf.flags.c_contiguous and not np.may_share_memory(recvbuf, sendbuf):
        work, saved = recvbuf.reshape(-1)[:limit], None
    else:
        work, saved = np.empty_like(source), None

    def run(pair):
        if in_place:
            allreduce(work, work, algorithm=pair[0], comm=comm, transport=pair[1])
        else:
            allreduce(source, work, algorithm=pair[0], comm=comm, transport=pair[1])

    try:
        return (how or _measure_pairs)(comm, pairs, run, allreduce, barrier)
    finally:
        if saved is not None:
            source[...] = saved


def _measure_pairs(comm, pairs, run, allreduce, barrier):
    with np.errstate(all="ignore"):  # calls in place overflow the data (restored afterwards), harmlessly
        first = {}
        for pair in pairs:  # the first call builds plans, programs and windows, untimed; the second sizes batches
            try:
                run(pair)
            except ValueError:
                continue
            barrier(comm)
            start = time.perf_counter()
            run(pair)
            first[pair] = time.perf_counter() - start
        pairs = list(first)
        once = np.array([first[p] for p in pairs])
        allreduce(once, once, op="max", algorithm="recursive_doubling", comm=comm)
        calls = _batches(pairs, once)
        if once.max() < BATCH_SECONDS:
            # one untimed round first: the first calibration of a job runs while its ranks are still
            # settling; then batches sized again from it, since one call after a barrier times mostly
            # the ranks' skew, which short batches carry unevenly (docs/performance.md#calibration-details)
            settled = _rounds(comm, pairs, calls, 1, run, allreduce, barrier)
            calls = _batches(pairs, [settled[pair] for pair in pairs])
        screened = _rounds(comm, pairs, calls, SCREEN_ROUNDS, run, allreduce, barrier)
        finalists = [p for p in pairs if p in sorted(pairs, key=screened.get)[:FINALISTS]]  # in candidate order
        final = _rounds(comm, finalists, calls, FINAL_ROUNDS, run, allreduce, barrier)
    return final, screened


def _batches(pairs, seconds):
    """{pair: calls per batch} for about BATCH_SECONDS, at least 2 calls where one lasts less (no batch
    is one cold call), one where it lasts more. Every
    rank gets the same figures (the slowest rank's), so every rank makes the same calls."""
    return {pair: max(1 if t >= BATCH_SECONDS else 2, min(MAX_BATCH, int(BATCH_SECONDS / max(t, 1e-7))))
            for pair, t in zip(pairs, seconds)}


def round_order(count, round_index):
    """The order of ``count`` rows in timed round ``round_index``: as given in round 0, then a
    shuffle seeded by the round (the same on every rank). A rotation keeps each row's predecessor
    in every round, and what ran before a batch moves its time (docs/performance.md#calibration-details),
    so every round gives each row another neighbour."""
    if round_index == 0:
        return list(range(count))
    return [int(i) for i in np.random.default_rng(round_index).permutation(count)]


def _rounds(comm, pairs, calls, rounds, run, allreduce, barrier):
    """{pair: median over ``rounds`` rounds, each in its own order, of the slowest rank's seconds per call}."""
    times = np.zeros((rounds, len(pairs)))
    for round_index in range(rounds):
        for index in round_order(len(pairs), round_index):
            barrier(comm)
            start = time.perf_counter()
            for _ in range(calls[pairs[index]]):
                run(pairs[index])
            times[round_index, index] = (time.perf_counter() - start) / calls[pairs[index]]
    allreduce(times, times, op="max", algorithm="recursive_doubling", comm=comm)
    return {pair: float(t) for pair, t in zip(pairs, np.median(times, axis=0))}


def reset():
    """Forget the files read (the next call reads them again)."""
    with _lock:
        _stores.clear()
        _unwritable.clear()
