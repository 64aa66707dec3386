"""nccl-tests-style all-reduce sweep, side by side with the MPI library's own MPI_Allreduce.

Run under mpiexec:

    mpiexec -n 4 python -m benchmarks.allreduce_perf -b 8 -e 8M -f 8 -a all -c 1

Per size and algorithm it prints out-of-place and in-place time, algbw, busbw
(algbw x 2(n-1)/n), the number of wrong elements against native MPI_Allreduce on
the same data (with -c 1), and "vs native": native time / our time, measured in
the same run with the algorithms interleaved round by round. Rows print as they
are measured; the last lines give average busbw per algorithm, peak memory per
rank and the library's scratch memory.
"""
import argparse
import json
import numbers
import os
import resource
import sys
import time

import numpy as np

import collectives
from collectives.cli import parse_size
from collectives import mpilib
from collectives.ops import DTYPES

MPI = mpilib.load()  # one clear error naming both ways to an MPI library where none loads

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.allreduce_perf", description=__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, help="check results against native (0/1)")
    p.add_argument("-d", "--datatype", default="float32", help=", ".join(str(d) for d in DTYPES))
    p.add_argument("-o", "--op", default="sum", help=", ".join(collectives.OPS))
    p.add_argument("-a", "--algorithms", default="all",
                   help="comma list of algorithms, 'all', 'auto', 'native' (native is always measured); "
                        "NAME@mpi or NAME@shm names the transport too")
    p.add_argument("-t", "--transports", default="auto",
                   help="comma list of transports for every algorithm row: auto (the library's choice, "
                        "shown as NAME@transport), mpi, shm")
    p.add_argument("--shared", action="store_true",
                   help="our rows run on shared arrays (collectives.empty): peers read them in place")
    p.add_argument("--floor", action="store_true",
                   help="add the memory floors (zero-copy, one-copy: what moving the bytes through "
                        "memory alone takes) timed in the same run; always at n=2; CPU, op sum")
    p.add_argument("-r", "--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--check-cost", action="store_true", help="add an 'auto+check' row (COLLECTIVES_CHECK=1)")
    p.add_argument("--guard-cost", action="store_true",
                   help="add an 'auto-unguarded' row: auto on a communicator wrapped with COLLECTIVES_GUARD=0 "
                        "(calls without their signature in the tags), to measure what the mismatch guard costs")
    p.add_argument("--json", help="write every measurement to this file")
    p.add_argument("--plot", help="draw busbw against size to this PNG")
    from collectives.plugins import add_load_option, load_files
    add_load_option(p)
    args = p.parse_args(argv)
    load_files(args.load)  # --load FILE.py: algorithms registered before -a is read
    if args.op not in collectives.OPS:
        p.error(f"unknown op {args.op!r}; valid: {', '.join(collectives.OPS)}")
    names = [str(d) for d in DTYPES]
    if args.datatype not in names:
        p.error(f"unknown datatype {args.datatype!r}; valid: {', '.join(names)}")
    if args.stepfactor <= 1:
        p.error("-f must be > 1")
    return args


def algorithm_list(spec, transports="auto"):
    known = collectives.algorithm_names()
    chosen = ["auto"] + known if spec == "all" else []
    for name in ([] if spec == "all" else spec.split(",")):
        name = name.strip()
        if name == "native":
            continue
        base, _, transport = name.partition("@")
        if base != "auto" and base not in known:
            raise SystemExit(f"unknown algorithm {base!r}; valid: all, auto, native, {', '.join(known)}")
        if transport and transport not in ("mpi", "shm"):
            raise SystemExit(f"unknown transport {transport!r} in {name!r}; valid: mpi, shm")
        chosen.append(name)
    wanted = [t.strip() for t in transports.split(",")]
    for t in wanted:
        if t not in ("auto", "mpi", "shm"):
            raise SystemExit(f"unknown transport {t!r}; valid: auto, mpi, shm")
    if wanted == ["auto"]:
        return chosen
    return [name if "@" in name else f"{name}@{t}" if t != "auto" else name for name in chosen for t in wanted]


def sizes(lo, hi, factor, itemsize):
    out, size = [], max(lo, itemsize)
    while size <= hi:
        count = size // itemsize
        if not out or out[-1] != count:
            out.append(count)
        size = int(size * factor) if int(size * factor) > size else size + itemsize
    return out


def input_data(rank, count, dtype, op):
    """Integer-valued data, so every algorithm and native agree exactly."""
    base = np.arange(count, dtype=np.int64) + rank
    values = (base % 2) + 1 if op == "prod" else (base % 4)
    return values.astype(dtype)


_user_ops = {}


def native_allreduce_args(op, dtype):
    """(MPI op, buffer wrapper) for native MPI_Allreduce on ``dtype``. MPI has no bfloat16: there
    native runs MPI_Allreduce on the 16-bit words with a user-defined op, a Python callback that
    reduces them as bfloat16 (what a user of plain mpi4py would have to write)."""
    if dtype.name != "bfloat16":
        return MPI_OPS[op], lambda buf: buf
    if op not in _user_ops:
        ufunc = getattr(np, collectives.OPS[op])  # avg: add here, the division comes after

        def reduce_words(inbuf, inoutbuf, datatype):
            acc = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(acc, np.frombuffer(inbuf, dtype=dtype), out=acc)

        _user_ops[op] = MPI.Op.Create(reduce_words, commute=True)
    return _user_ops[op], lambda buf: buf if buf is MPI.IN_PLACE else [buf.view(np.uint16), MPI.UINT16_T]


def make_runner(name, comm, op, backend_arrays):
    sendbuf, recvbuf = backend_arrays
    if name == "native":
        mpi_op, as_msg = native_allreduce_args(op, sendbuf.dtype)
        sendbuf_msg, recvbuf_msg = as_msg(sendbuf), as_msg(recvbuf)
        if op == "avg":
            scale = sendbuf.dtype.type(comm.size)

            def oop():
                comm.Allreduce(sendbuf_msg, recvbuf_msg, op=mpi_op)
                np.divide(recvbuf, scale, out=recvbuf)

            def ip():
                comm.Allreduce(MPI.IN_PLACE, recvbuf_msg, op=mpi_op)
                np.divide(recvbuf, scale, out=recvbuf)
        else:
            def oop():
                comm.Allreduce(sendbuf_msg, recvbuf_msg, op=mpi_op)

            def ip():
                comm.Allreduce(MPI.IN_PLACE, recvbuf_msg, op=mpi_op)
        return oop, ip
    algorithm = "auto" if name in ("auto+check", "auto-unguarded") else name
    algorithm, _, transport = algorithm.partition("@")
    if transport:
        def oop():
            collectives.allreduce(sendbuf, recvbuf, op=op, algorithm=algorithm, comm=comm, transport=transport)

        def ip():
            collectives.allreduce(recvbuf, recvbuf, op=op, algorithm=algorithm, comm=comm, transport=transport)
        return oop, ip

    # as a caller who names no transport calls it (even a `**{}` at the call site costs measurable time)
    def oop():
        collectives.allreduce(sendbuf, recvbuf, op=op, algorithm=algorithm, comm=comm)

    def ip():
        collectives.allreduce(recvbuf, recvbuf, op=op, algorithm=algorithm, comm=comm)
    return oop, ip


def row_label(name, ours, nbytes, dtype, shared=False):
    """The row's name with what ran: auto's choice, and the transport where the library chose it."""
    from collectives.autotune import agreed
    from collectives.select import choose_pair, transport_choice

    base, _, transport = name.partition("@")
    if base not in ("auto",) + tuple(collectives.algorithm_names()):
        return name
    ran = []
    for in_place in (False, True):  # auto calibrated on first use may pick apart in place and out of place
        picked = agreed(ours, dtype, nbytes, in_place, shared) if base == "auto" and not transport else None
        algorithm, preferred = picked[:2] if picked else \
            choose_pair(ours, nbytes, dtype, transport or "auto") if base == "auto" else (base, None)
        pair = f"{algorithm}@{transport_choice(ours, algorithm, nbytes, transport or 'auto', preferred)[0]}"
        if pair not in ran:
            ran.append(pair)
    return f"auto({'/'.join(ran)})" if base == "auto" else ran[0]


def _count(wrong):
    """The JSON's #wrong: a number, or None where nothing was checked (a floor, -c 0)."""
    return int(wrong) if isinstance(wrong, numbers.Integral) else None


def time_batch(comm, fn, iters):
    """Seconds per call of ``iters`` back-to-back calls after a barrier, on the slowest rank
    (as nccl-tests: the loop is timed, so the barrier's exit skew is spread over the batch)."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)


def timed_rounds(args, runners, times, per_round, comm):
    """Every round visits every algorithm (interleaved), out of place then in place, each round in
    another order (``autotune.round_order``: the same on every rank), so that no row always runs
    right after the same one: what ran before a batch moves its time, the batch after
    MPI_Allreduce's busy-polling most (docs/performance.md#calibration-details). Each batch
    follows one untimed call of its own: with many rows and few calls a batch, a batch would
    start on buffers the other rows had pushed out of the caches."""
    from collectives.autotune import round_order

    names = list(runners)
    for round_index in range(max(1, args.rounds)):
        for name in (names[i] for i in round_order(len(names), round_index)):
            oop, ip = runners[name]
            if name == "auto+check":
                os.environ["COLLECTIVES_CHECK"] = "1"
            oop()  # one untimed call first: the row's buffers back in the caches the other rows used
            times[name][0].append(time_batch(comm, oop, per_round))
            ip()
            times[name][1].append(time_batch(comm, ip, per_round))
            if name == "auto+check":
                os.environ.pop("COLLECTIVES_CHECK", None)


MIN_BATCH_SECONDS = 2e-3  # small messages: enough calls per batch that one batch lasts this long


def fmt_row(cells, widths):
    return "".join(str(c).rjust(w) for c, w in zip(cells, widths))


WIDTHS = [12, 11, 9, 7, 32, 11, 9, 9, 7, 8, 11, 9, 9, 7, 8]
LABEL = 4  # the algorithm column


def label_width(rows, algorithms):
    """The algorithm column's width: every row's label (its name, with ``@mpi`` or ``@shm`` where
    the library chose the transport) and auto's longest (two pairs, one out of place and one in
    place: ``auto(ALGO@mpi/ALGO@shm)``) fit whole, two spaces to spare; never cut."""
    longest = max((len(a) for a in algorithms), default=0)
    auto = len("auto(@mpi/@shm)") + 2 * longest if "auto" in rows else 0
    return max([WIDTHS[LABEL], auto + 2] + [len(r) + len("@mpi") + 2 for r in rows])


def table_widths(rows, algorithms):
    """WIDTHS with the algorithm column wide enough for every label (``label_width``)."""
    widths = list(WIDTHS)
    widths[LABEL] = label_width(rows, algorithms)
    return widths


HEADER = ["size", "count", "type", "redop", "algorithm",
          "time(us)", "algbw", "busbw", "#wrong", "vs_nat",
          "time(us)", "algbw", "busbw", "#wrong", "vs_nat"]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    dtype = next(d for d in DTYPES if str(d) == args.datatype)
    names = algorithm_list(args.algorithms, args.transports)
    if args.check_cost:
        names.append("auto+check")
    if args.guard_cost:
        names.append("auto-unguarded")
    rows = ["native"] + names
    gpu = None
    if args.device == "gpu":
        from benchmarks import gpu as gpu_support  # noqa: F401 - supplies device buffers and the nccl row
        available, why = gpu_support.gpu_available()
        if not available:
            raise SystemExit(f"--device gpu: {why}")
        gpu = gpu_support
    collectives.barrier(comm)  # every rank is here (bounded by COLLECTIVES_TIMEOUT) before blocking MPI calls
    ours = collectives.as_comm(comm)
    unguarded = None
    if args.guard_cost:
        unguarded = comm.Dup()
        os.environ["COLLECTIVES_GUARD"] = "0"
        try:
            collectives.as_comm(unguarded)  # wrapped now, unguarded for its lifetime
        finally:
            del os.environ["COLLECTIVES_GUARD"]
    widths = table_widths(rows + ["floor:zero-copy", "nccl"], collectives.algorithm_names())
    if rank == 0:
        print(f"# collectives {collectives.__version__} allreduce_perf: {n} ranks, MPI library {mpilib.describe()} "
              f"(native = its MPI_Allreduce), "
              f"{mpilib.local_ranks() or '?'} ranks on {mpilib.node_cores()} cores of this node")
        print(f"# iters {args.iters} warmup {args.warmup_iters} rounds {args.rounds} (median; a round times a loop of "
              f"iters/rounds calls, more for small messages so that it lasts >= {MIN_BATCH_SECONDS * 1e3:g} ms), "
              f"check {args.check}, "
              f"device {args.device}; vs_nat = native time / our time (>1: faster than MPI_Allreduce)")
        if dtype.name == "bfloat16":
            print("# native: MPI has no bfloat16, so MPI_Allreduce runs on the 16-bit words with a "
                  "user-defined op (a Python callback reducing them as bfloat16)")
        print(f"#{'':>11}{'':>11}{'':>9}{'':>7}{'':>{widths[LABEL]}}{'out-of-place':>44}{'in-place':>44}")
        print(fmt_row(HEADER, widths))
        print(fmt_row(["(B)", "(elements)", "", "", "", "", "(GB/s)", "(GB/s)", "", "", "", "(GB/s)", "(GB/s)", "", ""],
                      widths), flush=True)
    records = []
    busbw_by_algo = {}
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    for count in sizes(args.minbytes, args.maxbytes, args.stepfactor, dtype.itemsize):
        nbytes = count * dtype.itemsize
        data = input_data(rank, count, dtype, args.op)
        expected = np.empty_like(data)
        mpi_op, as_msg = native_allreduce_args(args.op, dtype)
        comm.Allreduce(as_msg(data), as_msg(expected), op=mpi_op)
        if args.op == "avg":
            expected = (expected / dtype.type(n)).astype(dtype)
        sendbuf = data.copy()
        recvbuf = np.empty_like(data)
        if args.shared:  # shared arrays for our rows (native keeps ordinary ones: MPI copies anyway)
            shared_send, shared_recv = collectives.empty(count, dtype, comm), collectives.empty(count, dtype, comm)
            shared_send[...] = data
        if gpu is not None:
            sendbuf, recvbuf = gpu.make_buffers(data), gpu.make_buffers(np.empty_like(data))
        runners = {name: make_runner(name, unguarded if name == "auto-unguarded" else comm, args.op,
                                     (shared_send, shared_recv) if args.shared and name != "native"
                                     else (sendbuf, recvbuf)) for name in rows}
        if (args.floor or n == 2) and gpu is None and args.op == "sum":
            from benchmarks.floors import floor_runners

            runners.update(floor_runners(sendbuf, recvbuf, n, rank))
        if gpu is not None:
            nccl = gpu.nccl_allreduce_timer(comm, sendbuf, recvbuf, args.op)
            if nccl is not None:
                runners["nccl"] = nccl
        wrong = {}
        for name, (oop, ip) in runners.items():  # warm-up, and the correctness check
            env_check = os.environ.pop("COLLECTIVES_CHECK", None)
            if name == "auto+check":
                os.environ["COLLECTIVES_CHECK"] = "1"
            for _ in range(max(1, args.warmup_iters)):
                oop()
            out = shared_recv if args.shared and name != "native" else recvbuf
            result_oop = _host(out).copy()
            out[...] = data if args.shared and name != "native" else sendbuf
            ip()
            result_ip = _host(out).copy()
            if env_check is not None:
                os.environ["COLLECTIVES_CHECK"] = env_check
            elif name == "auto+check":
                del os.environ["COLLECTIVES_CHECK"]
            if name.startswith("floor:"):
                wrong[name] = ("-", "-")
            elif args.check:
                bad_oop = int(np.count_nonzero(result_oop != expected))
                bad_ip = int(np.count_nonzero(result_ip != expected))
                wrong[name] = (comm.allreduce(bad_oop), comm.allreduce(bad_ip))
            else:
                wrong[name] = ("N/A", "N/A")
        times = {name: ([], []) for name in runners}
        per_round = max(1, args.iters // max(1, args.rounds))
        warm = min(time_batch(comm, oop, 1) for oop, _ in runners.values())  # the same on every rank
        per_round = max(per_round, min(10000, int(MIN_BATCH_SECONDS / max(warm, 1e-7))))
        # in place reduces the previous result again, so sums grow to inf over a long batch: harmless
        # for timing, but NumPy's overflow warning costs microseconds a call, so it is silenced here
        with np.errstate(over="ignore", invalid="ignore"):
            timed_rounds(args, runners, times, per_round, comm)
        native_t = [float(np.median(times["native"][k])) for k in (0, 1)]
        for name in runners:
            t = [float(np.median(times[name][k])) for k in (0, 1)]
            algbw = [nbytes / x / 1e9 if x > 0 else 0.0 for x in t]
            busbw = [a * factor for a in algbw]
            ratio = [native_t[k] / t[k] if t[k] > 0 else 0.0 for k in (0, 1)]
            label = row_label(name, ours, nbytes, dtype, args.shared)
            records.append({"size": nbytes, "count": count, "type": str(dtype), "redop": args.op, "algorithm": name,
                            "label": label, "ranks": n, "calls_per_batch": per_round,
                            "oop": {"time_us": t[0] * 1e6, "algbw": algbw[0], "busbw": busbw[0],
                                    "wrong": _count(wrong[name][0]), "vs_native": ratio[0]},
                            "ip": {"time_us": t[1] * 1e6, "algbw": algbw[1], "busbw": busbw[1],
                                   "wrong": _count(wrong[name][1]), "vs_native": ratio[1]}})
            busbw_by_algo.setdefault(name, []).append(busbw[0])
            if rank == 0:
                print(fmt_row([nbytes, count, str(dtype), args.op, label,
                               f"{t[0] * 1e6:.1f}", f"{algbw[0]:.3f}", f"{busbw[0]:.3f}", wrong[name][0],
                               f"{ratio[0]:.2f}",
                               f"{t[1] * 1e6:.1f}", f"{algbw[1]:.3f}", f"{busbw[1]:.3f}", wrong[name][1],
                               f"{ratio[1]:.2f}"], widths), flush=True)
    total_wrong = sum(int(r["oop"]["wrong"]) + int(r["ip"]["wrong"]) for r in records
                      if args.check and not r["algorithm"].startswith("floor:"))
    # the library's own memory: the executor's scratch (one buffer per dtype, shared by every
    # algorithm), cached programs (small messages, mid-size bound calls) and the shm window (this rank's segment)
    held = collectives.library_memory(ours)
    scratch, window, programs = held["scratch"], held["shm_window"], held["programs"]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = comm.gather(peak_kib, root=0)
    scratches = comm.gather(scratch, root=0)
    windows = comm.gather(window, root=0)
    program_bytes = comm.gather((programs, held["program_shapes"]), root=0)
    if rank == 0:
        print("# Avg bus bandwidth (out-of-place, GB/s): " +
              ", ".join(f"{name} {np.mean(v):.3f}" for name, v in busbw_by_algo.items()))
        print(f"# Peak memory per rank (max RSS): {max(peaks) / 1024:.1f} MiB; library memory per rank: plan "
              f"scratch {max(scratches) / 2**20:.2f} MiB, shm window {max(windows) / 2**20:.2f} MiB "
              f"(largest message {max((r['size'] for r in records), default=0) / 2**20:.2f} MiB); "
              f"programs {max(b for b, _ in program_bytes) / 2**20:.2f} MiB over "
              f"{max(k for _, k in program_bytes)} cached call shapes, each within its message")
        if args.guard_cost:
            by_size = {}
            for r in records:
                by_size.setdefault(r["size"], {})[r["algorithm"]] = r
            ratios = [f"{size} B {pair['auto']['oop']['time_us'] / pair['auto-unguarded']['oop']['time_us']:.3f}"
                      for size, pair in by_size.items()
                      if "auto" in pair and "auto-unguarded" in pair and pair["auto-unguarded"]["oop"]["time_us"] > 0]
            print("# Mismatch guard cost (auto time / auto-unguarded time, out of place): " + ", ".join(ratios))
        print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}", flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": n, "mpi_library": mpilib.describe(), "args": vars(args), "records": records,
                       "peak_rss_mib": [p / 1024 for p in peaks],
                       "scratch_mib": [x / 2**20 for x in scratches], "shm_window_mib": [w / 2**20 for w in windows],
                       "programs_mib": [b / 2**20 for b, _ in program_bytes]}, f, indent=1)
    if args.plot and rank == 0:
        plot(records, args.plot, n)
    if unguarded is not None:
        unguarded.Free()
    return 1 if total_wrong else 0


def _host(array):
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array


def plot(records, path, n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(r["algorithm"] for r in records):
        xs = [r["size"] for r in records if r["algorithm"] == name]
        ys = [max(r["oop"]["busbw"], 1e-6) for r in records if r["algorithm"] == name]
        style = {"color": "black", "linewidth": 2.5, "linestyle": "--"} if name == "native" else {}
        ax.plot(xs, ys, marker="o", markersize=3, label="native MPI_Allreduce" if name == "native" else name, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce busbw, {n} ranks (out of place)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
