"""Measure every algorithm over a size sweep and write the tuning table that ``algorithm="auto"`` reads.

Run under mpiexec, on the machine and world size you will use:

    mpiexec -n 4 python -m collectives.tune                 # 8 B .. 64 MiB by factors of 2, float32
    mpiexec -n 4 python -m collectives.tune -b 8 -e 16M -f 4 -d float32,float64 -o tuning.json

Every (message size, algorithm) is timed in ``--rounds`` rounds, interleaved: each round visits
every size and every algorithm. A round times enough calls to last about ``--round-ms`` (the
slowest rank's time counts) and the median round decides. The fastest algorithm becomes that
size's entry. Every size keeps its own buffers for the whole run (about 4x ``-e`` per rank in
all). The table goes to ``-o FILE``, else to ``COLLECTIVES_TUNING``, else to
``~/.cache/collectives/tuning.json``; entries for other world sizes or dtypes already in the
file are kept, so one file can hold tables for several world sizes of one MPI library: the file
records the library and version (``mpi_library``) and its eager limit measured between ranks 0
and 1 (``eager_limit``, collectives.protocol); a file measured under another library is replaced.
Only rank 0 writes (atomically: a temporary file, then a rename).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import collectives
from . import mpilib, protocol, select, tuning
from .api import as_comm, barrier
from .autotune import round_order
from .cli import parse_size
from .algorithms import names as _algorithm_names
from .plugins import add_load_option, load_files
from .select import topology as _hosts

FORMAT = "collectives-tuning-1"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m collectives.tune", description=__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2)
    p.add_argument("-d", "--datatypes", default="float32", help="comma list of dtypes to tune")
    p.add_argument("-a", "--algorithms", default="all", help="comma list, or 'all' (every registered one)")
    p.add_argument("-t", "--transports", default="auto",
                   help="comma list of transports to measure each algorithm over: mpi, shm; auto (default): "
                        "both where ranks share a node, else mpi")
    p.add_argument("-r", "--rounds", type=int, default=None,
                   help="interleaved rounds per size; the median counts (default 5, or 15 with more ranks "
                        "than cores, where batches of the same calls differ more)")
    p.add_argument("--round-ms", type=float, default=20.0, help="target length of one timed round")
    p.add_argument("-o", "--output", help="tuning file to write (default: COLLECTIVES_TUNING or the cache)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    add_load_option(p)
    args = p.parse_args(argv)
    load_files(args.load)  # --load FILE.py: algorithms registered before -a is read
    if args.stepfactor <= 1:
        p.error("-f must be > 1")
    if args.minbytes < 1 or args.maxbytes < args.minbytes:
        p.error("need 1 <= -b <= -e")
    if args.rounds is not None and args.rounds < 1:
        p.error("-r must be >= 1")
    known = _algorithm_names()
    args.algorithms = known if args.algorithms == "all" else [a for a in args.algorithms.split(",") if a]
    unknown = [a for a in args.algorithms if a not in known]
    if unknown:
        p.error(f"unknown algorithm(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not args.transports or any(t not in ("auto", "mpi", "shm") for t in args.transports):
        p.error(f"-t takes auto, mpi, shm; got {args.transports}")
    try:
        args.datatypes = [np.dtype(d) for d in args.datatypes.split(",") if d]
    except TypeError as exc:
        p.error(str(exc))
    return args


def sizes(lo, hi, factor):
    out, n = [], lo
    while n <= hi:
        out.append(int(n))
        n = max(int(n * factor), int(n) + 1)
    return out


def measure(comm, algorithm, sendbuf, recvbuf, iters):
    """Seconds per call on the slowest rank, ``iters`` back-to-back calls after a barrier;
    ``algorithm`` may name its transport (``ring@shm``)."""
    from mpi4py import MPI

    name, _, transport = algorithm.partition("@")
    transport = transport or "auto"
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        collectives.allreduce(sendbuf, recvbuf, algorithm=name, comm=comm, transport=transport)
    elapsed = np.array([(time.perf_counter() - start) / iters])
    comm.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)
    return float(elapsed[0])


def tune(comm, args, log=print):
    """Measure; return the new entries (every rank gets the same list).

    Rounds are interleaved across sizes as well as algorithms: round r visits every size, and
    within it every algorithm, before round r+1 starts. A size's rounds are thus spread over the
    whole run, so a burst of noise from the rest of the machine (seconds long on a shared VM)
    moves one round of many sizes, which the median drops, instead of every round of one size.
    Each round also starts at another size and another algorithm."""
    if args.rounds is None:
        args.rounds = 15 if mpilib.ranks_per_core() > 1 else 5
    entries = []
    root = comm.rank == 0
    ours = as_comm(comm)
    topology = tuning.topology_key(_hosts(ours))  # None on one host
    candidates = _candidates(ours, args)
    if root and topology is not None:
        log(f"# topology: {len(topology.split(','))} hosts with {topology} ranks")
    for dtype in args.datatypes:
        itemsize = dtype.itemsize
        counts = sorted({max(1, nbytes // itemsize)
                         for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor)})
        rng = np.random.default_rng(comm.rank)
        buffers = {}  # each size its own pair, as a caller's distinct arrays would be (about 4x -e in all)
        for count in counts:
            sendbuf = (rng.integers(0, 8, count) if dtype.kind in "iub" else rng.random(count)).astype(dtype)
            buffers[count] = (sendbuf, np.empty_like(sendbuf))
        iters = {}
        for count in counts:
            sendbuf, recvbuf = buffers[count]
            for name in candidates:  # warm up (plans, scratch, programs), and size each round
                once = measure(comm, name, sendbuf, recvbuf, 1)
                iters[count, name] = max(1, min(10000, int(args.round_ms * 1e-3 / max(once, 1e-7))))
        times = {(count, name): [] for count in counts for name in candidates}
        names = list(candidates)
        for round_index in range(args.rounds):
            # each round visits sizes and algorithms in another order (autotune.round_order): the
            # batch that follows the largest size (or comes first after a barrier) ran slow at n=4
            # on 2 cores, and what runs before a batch moves it, so no row keeps one neighbour
            for count in (counts[i] for i in round_order(len(counts), round_index)):
                sendbuf, recvbuf = buffers[count]
                for name in (names[i] for i in round_order(len(names), round_index)):
                    times[count, name].append(measure(comm, name, sendbuf, recvbuf, iters[count, name]))
            if root:
                log(f"# round {round_index + 1} of {args.rounds} done")
        if root:
            log(f"# {mpilib.describe()}, {comm.size} ranks, {dtype}: median of {args.rounds} rounds, interleaved across sizes and "
                f"algorithms; time per call in us")
            log("#" + "".join(f"{name[:20]:>21}" for name in ["bytes"] + list(candidates)) + "  best")
        for count in counts:
            median = {name: float(np.median(times[count, name])) for name in candidates}
            stored = {name: round(seconds * 1e6, 2) for name, seconds in median.items()}
            best = min(stored, key=stored.get)  # decided on the figures the file keeps (ties: the first)
            algorithm, _, transport = best.partition("@")
            entry = {"size": comm.size, "dtype": str(dtype), "nbytes": count * itemsize,
                     "algorithm": algorithm, "times_us": stored}
            if transport:
                entry["transport"] = transport
            if topology is not None:
                entry["topology"] = topology
            entries.append(entry)
            if root:
                log(f" {count * itemsize:>20}" + "".join(f"{median[name] * 1e6:>21.1f}" for name in candidates)
                    + f"  {best}")
    return entries


def _candidates(ours, args):
    """What is measured: each algorithm over each transport (``name@transport``), or the bare
    names where no peer shares this rank's node (MPI point-to-point is all there is)."""
    from .comm import shm

    wanted = ["mpi", "shm"] if "auto" in args.transports else args.transports
    if not shm.available(ours):
        return list(args.algorithms)
    return [f"{name}@{t}" for name in args.algorithms for t in wanted]


def merge(path, entries, library=None, eager_limit=None):
    """The file's entries for other (world size, dtype) pairs, plus ``entries``, as measured under
    ``library`` (default: this process's MPI library); a file of another library is replaced."""
    library = library or mpilib.describe()
    replaced = {(e["size"], e["dtype"], e.get("topology")) for e in entries}
    kept = []
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
            if (isinstance(old, dict) and old.get("format") == FORMAT and isinstance(old.get("entries"), list)
                    and old.get("mpi_library") == library):
                kept = [e for e in old["entries"]
                        if isinstance(e, dict) and (e.get("size"), e.get("dtype"), e.get("topology")) not in replaced]
        except (OSError, ValueError):
            kept = []  # a corrupt file is replaced
        if eager_limit is None and kept and isinstance(old.get("eager_limit"), int):
            eager_limit = old["eager_limit"]
    table = {"format": FORMAT, "mpi_library": library, "entries": kept + entries}
    if eager_limit is not None:
        table["eager_limit"] = eager_limit
    return table


def write(path, table):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    MPI = mpilib.load()  # one clear error naming both ways to an MPI library where none loads

    comm = MPI.COMM_WORLD
    if os.environ.get("COLLECTIVES_ALGO"):
        if comm.rank == 0:
            print("collectives.tune: COLLECTIVES_ALGO is set, so every algorithm would run as "
                  f"{os.environ['COLLECTIVES_ALGO']!r}; unset it to tune", file=sys.stderr)
        return 2
    if comm.size == 1 and comm.rank == 0:
        print("# one rank: every algorithm is a local copy; run under mpiexec -n N to tune N ranks")
    barrier(comm)  # every rank is here (bounded by COLLECTIVES_TIMEOUT) before any blocking MPI call
    if comm.rank == 0:
        print(f"# collectives.tune under {mpilib.describe()}, {comm.size} ranks")
    eager = None
    if comm.size > 1 and not args.dry_run:  # recorded in the table: nothing to measure for a dry run
        eager = protocol.measure(comm)
        if comm.rank == 0:
            print(f"# eager limit between ranks 0 and 1: {eager or 'unknown (no step in time)'} bytes")
    entries = tune(comm, args)
    if comm.rank == 0:
        if args.dry_run:
            print("# --dry-run: nothing written")
        else:
            path = args.output or tuning.path()
            write(path, merge(path, entries, eager_limit=eager or None))
            print(f"# wrote {len(entries)} entries for {comm.size} ranks to {path}")
    tuning.reload()
    select.reset()
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
