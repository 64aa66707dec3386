"""``python -m collectives.simulator``: a table of predicted times per algorithm and size (``--plot``,
``--timeline``), ``--scale-check``, and ``--calibrate`` under mpiexec (``collectives.calibrate``)."""
import sys
import time

from ..cli import parse_size
from ..calibrate import main as calibrate_main
from ..flat import _registry
from ..model import ALPHA, BETA, GAMMA
from ..plugins import add_load_option, load_files
from ..simulator.core import simulate
from ..simulator.plots import _plot, timeline
from ..simulator.scale import scale_check
from ..simulator.topology import Topology


def _size(text):
    return parse_size(text)  # one parser for every tool


def _parse(argv):
    import argparse

    p = argparse.ArgumentParser(prog="python -m collectives.simulator", description="Predict all-reduce times.")
    p.add_argument("-a", "--algorithms", default="all")
    p.add_argument("-p", "--ranks", type=int, default=64)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size (default 64M; 16M with --calibrate)")
    p.add_argument("-f", "--stepfactor", type=float, default=4)
    p.add_argument("--alpha", type=float, default=ALPHA)
    p.add_argument("--beta", type=float, default=BETA)
    p.add_argument("--gamma", type=float, default=GAMMA)
    p.add_argument("--topology", default=None,
                   help="nodes=COUNTxK,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared[,links=fair,burst=BYTES[,calls=back-to-back]]]")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--plot")
    p.add_argument("--timeline", help="draw the schedule of the first algorithm at the smallest size")
    p.add_argument("--calibrate", action="store_true", help="under mpiexec: fit alpha, beta, gamma here")
    p.add_argument("--scale-check", action="store_true",
                   help="time simulate() for every algorithm at 1024 ranks and the logarithmic ones at 65536")
    p.add_argument("--scale-bytes", default="1M", help="message size for --scale-check (default 1M)")
    p.add_argument("--json")
    add_load_option(p)
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    load_files(args.load)  # --load FILE.py: algorithms registered before -a is read
    if args.calibrate:
        return calibrate_main(args)
    names = _registry.names() if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
    for name in names:
        _registry.get(name)
    if args.scale_check:
        return scale_check(names, _size(args.scale_bytes), args.alpha, args.beta, args.gamma)
    topology, ranks = None, args.ranks
    if args.topology:
        topology, ranks = Topology.parse(args.topology, args.alpha, args.beta)
    lo, hi = _size(args.minbytes), _size(args.maxbytes or "64M")
    sizes = []
    size = max(4, lo)
    while size <= hi:
        sizes.append(size)
        size = max(size + 4, int(size * args.stepfactor))
    print(f"# simulated all-reduce: {ranks} ranks, alpha {args.alpha:g} s, beta {args.beta:g} s/B, "
          f"gamma {args.gamma:g} s/B" + (f", topology {args.topology}" if args.topology else ""))
    print(f"{'size(B)':>12}{'algorithm':>20}{'time(us)':>14}{'algbw(GB/s)':>13}{'busbw(GB/s)':>13}"
          f"{'steps':>8}{'verified':>10}{'wall(s)':>9}")
    rows = []
    for nbytes in sizes:
        for name in names:
            start = time.perf_counter()
            r = simulate(name, ranks, nbytes, args.alpha, args.beta, args.gamma, topology=topology,
                         verify_data=not args.no_verify)
            wall = time.perf_counter() - start
            verified = "-" if args.no_verify else ("yes" if r.verified else "NO")
            print(f"{nbytes:>12}{name:>20}{r.time * 1e6:>14.1f}{r.algbw:>13.3f}{r.busbw:>13.3f}{r.steps:>8}"
                  f"{verified:>10}{wall:>9.1f}", flush=True)
            if r.verify_error:
                print(f"#   verification failed: {r.verify_error}")
            rows.append({"size": nbytes, "algorithm": name, "time": r.time, "busbw": r.busbw,
                         "steps": r.steps, "verified": r.verified})
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"ranks": ranks, "rows": rows}, f, indent=1)
    if args.plot:
        _plot(rows, args.plot, ranks)
    if args.timeline:
        timeline(names[0], min(ranks, 16), sizes[0], args.timeline, args.alpha, args.beta, args.gamma)
    return 0 if all(r["verified"] for r in rows) or args.no_verify else 1
