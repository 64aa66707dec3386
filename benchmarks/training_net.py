"""Training over a network, measured: compressed against exact all-reduce, and overlap.

    python -m benchmarks.cluster --hosts 2 --ranks-per-host 2 --rate 500M -- \\
        python -m benchmarks.training_net [--size 16M] [--rounds 7] [--parts compression,overlap] [--json F]

compression: one all-reduce of ``--size`` bytes of float32 per configuration (native
MPI_Allreduce, the topology-aware and flat algorithms exact, the same with bf16/fp16 on the wire),
configurations interleaved round by round, each call timed from a barrier to the slowest rank's
end; medians. Compressed results are checked bitwise identical on every rank and against the
exact sum (the largest error relative to sum |x_i| is printed).

overlap: NumPy work (elementwise passes over a 4 MiB array, which release the GIL) calibrated,
with every rank computing at once, to take about as long as one all-reduce of ``--size``; then,
interleaved, the all-reduce alone, the work alone, both blocking (all-reduce then work) and
overlapped (iallreduce, work, wait). Medians per loop iteration, and the ratios the issue asks
for: overlapped / max(alone), blocking / sum(alone).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.select import topology
from collectives.cli import parse_size

WORLD = MPI.COMM_WORLD


def timed(fn):
    """Seconds from a barrier to the slowest rank's end of ``fn()``."""
    WORLD.Barrier()
    start = time.perf_counter()
    fn()
    return WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)


def say(text):
    if WORLD.rank == 0:
        print(text, flush=True)


def compression_part(count, rounds, algorithms):
    x = np.random.default_rng(WORLD.rank).standard_normal(count).astype(np.float32)
    out = np.empty_like(x)
    configs = [("native", None)] + [(a, None) for a in algorithms] + [(a, "bf16") for a in algorithms] \
        + [(algorithms[0], "fp16")]

    def call(name, fmt):
        if name == "native":
            return lambda: WORLD.Allreduce(x, out, op=MPI.SUM)
        return lambda: collectives.allreduce(x, out, algorithm=name, compression=fmt)

    times = {c: [] for c in configs}
    for c in configs:  # warm-up: plans, scratch, progress of TCP windows
        call(*c)()
    for r in range(rounds):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:
            times[c].append(timed(call(*c)))
    exact = np.empty(count, np.float64)
    WORLD.Allreduce(x.astype(np.float64), exact, op=MPI.SUM)
    scale = np.empty(count, np.float64)
    WORLD.Allreduce(np.abs(x.astype(np.float64)), scale, op=MPI.SUM)
    rows = []
    for c in configs:
        name, fmt = c
        info = {"algorithm": name, "compression": fmt, "median_ms": 1e3 * statistics.median(times[c]),
                "all_ms": [round(1e3 * t, 1) for t in times[c]]}
        if name != "native":
            y = collectives.allreduce(x, algorithm=name, compression=fmt)
            digests = WORLD.allgather(y.tobytes())
            info["identical"] = all(d == digests[0] for d in digests)
            info["max_rel_error"] = float(np.max(np.abs(y - exact) / np.maximum(scale, 1e-30)))
        rows.append(info)
    best_exact = min((r for r in rows if r["compression"] is None), key=lambda r: r["median_ms"])
    say(f"\n{count * 4 / 2**20:g} MiB float32, {WORLD.size} ranks, {len(topology(collectives.as_comm(None)))} hosts, "
        f"medians of {rounds} interleaved rounds (ms); best exact: {best_exact['algorithm']}")
    say(f"{'algorithm':>20} {'wire':>5} {'median':>8} {'/best exact':>11} {'identical':>9} {'max err/sum|x|':>14}  all")
    for r in rows:
        say(f"{r['algorithm']:>20} {r['compression'] or 'exact':>5} {r['median_ms']:8.1f} "
            f"{r['median_ms'] / best_exact['median_ms']:11.2f} {str(r.get('identical', '-')):>9} "
            f"{r.get('max_rel_error', 0):14.2e}  {r['all_ms']}")
    return {"rows": rows, "best_exact": best_exact["algorithm"]}


def overlap_part(count, rounds, algorithm, fmt, iters=None):
    x = np.random.default_rng(WORLD.rank).standard_normal(count).astype(np.float32)
    out = np.empty_like(x)
    a = np.random.default_rng(7).random(1 << 20).astype(np.float32)
    b = np.random.default_rng(8).random(1 << 20).astype(np.float32)

    def work(n):
        for _ in range(n):
            np.multiply(a, 0.999, out=a)
            np.add(a, b, out=a)

    def comm():
        collectives.allreduce(x, out, algorithm=algorithm, compression=fmt)

    comm()
    collectives.iallreduce(x, out, algorithm=algorithm, compression=fmt).wait()
    t_comm = statistics.median(timed(comm) for _ in range(3))
    if iters is None:
        probe = 20
        per_iter = statistics.median(timed(lambda: work(probe)) for _ in range(3)) / probe
        iters = WORLD.allreduce(max(1, int(round(t_comm / per_iter))), op=MPI.MAX)

    def blocking():
        comm()
        work(iters)

    def overlapped():
        request = collectives.iallreduce(x, out, algorithm=algorithm, compression=fmt)
        work(iters)
        request.wait()

    cases = {"all-reduce alone": comm, "work alone": lambda: work(iters), "blocking (sum)": blocking,
             "overlapped (iallreduce)": overlapped}
    times = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        for k in names[r % 4:] + names[:r % 4]:
            times[k].append(timed(cases[k]))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    longer = max(med["all-reduce alone"], med["work alone"])
    total = med["all-reduce alone"] + med["work alone"]
    say(f"\noverlap: {count * 4 / 2**20:g} MiB {algorithm} ({fmt or 'exact'}), work {iters} passes pairs, "
        f"medians of {rounds} interleaved rounds (ms)")
    for k in names:
        say(f"{k:>26} {med[k]:8.1f}   {[round(1e3 * t, 1) for t in times[k]]}")
    say(f"overlapped / max(alone) = {med['overlapped (iallreduce)'] / longer:.2f}   "
        f"blocking / sum(alone) = {med['blocking (sum)'] / total:.2f}   overlapped / blocking = "
        f"{med['overlapped (iallreduce)'] / med['blocking (sum)']:.2f}")
    return {"algorithm": algorithm, "compression": fmt, "iters": iters, "median_ms": med,
            "overlapped_over_longer": med["overlapped (iallreduce)"] / longer,
            "blocking_over_sum": med["blocking (sum)"] / total}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="16M", help="bytes of float32 per all-reduce (16M)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--parts", default="compression,overlap")
    parser.add_argument("--algorithms", default="two_level,hierarchical_copy,ring,auto")
    parser.add_argument("--overlap-algorithm", default=None, help="default: the best exact one measured")
    parser.add_argument("--overlap-compression", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    count = parse_size(args.size) // 4
    collectives.barrier()
    report = {"ranks": WORLD.size, "hosts": [list(h) for h in topology(collectives.as_comm(None))],
              "size": count * 4, "argv": sys.argv}
    parts = args.parts.split(",")
    best = args.overlap_algorithm or "two_level"
    if "compression" in parts:
        report["compression"] = compression_part(count, args.rounds, args.algorithms.split(","))
        best = args.overlap_algorithm or report["compression"]["best_exact"]
        if best == "native":
            best = "two_level"
    if "overlap" in parts:
        report["overlap"] = overlap_part(count, args.rounds, best, args.overlap_compression)
    if args.json and WORLD.rank == 0:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
