"""The research loop's speed: every algorithm simulated and verified at 1,024 ranks, the
log-step ones at 65,536, each in a fresh process, wall and CPU time.

    python -m benchmarks.research_loop [--bytes 256M] [--large-bytes 1M] [--json out.json]
                                       [-a ring,tree] [--load FILE.py]

A measurement, not a test: the times depend on the machine and on what else runs on it (the
load average is printed before and after). Each row is one ``collectives.simulate`` call:
every rank's plan built by the algorithm's own ``build``, the timing model, and the
symbolic check out of place and in place.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys, time
import collectives
from collectives.plugins import load_files
load_files(sys.argv[4:])
name, ranks, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
wall, cpu = time.perf_counter(), time.process_time()
r = collectives.simulate(name, ranks=ranks, nbytes=nbytes)
print(json.dumps({"algorithm": name, "ranks": ranks, "nbytes": nbytes, "wall": time.perf_counter() - wall,
                  "cpu": time.process_time() - cpu, "verified": r.verified, "check": r.verify_mode,
                  "steps": r.steps, "predicted": r.time, "error": r.verify_error}))
"""


def measure(name, ranks, nbytes, load, timeout):
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(ranks), str(nbytes)] + list(load),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        return {"algorithm": name, "ranks": ranks, "nbytes": nbytes, "error": proc.stderr.strip()[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    from collectives.plugins import add_load_option, load_files
    from collectives.simulator import _size, logarithmic

    p = argparse.ArgumentParser(prog="python -m benchmarks.research_loop", description=__doc__.splitlines()[0])
    p.add_argument("-a", "--algorithms", default="all")
    p.add_argument("--bytes", default="256M", help="message size at 1,024 ranks (default 256M)")
    p.add_argument("--large-bytes", default="1M", help="message size at 65,536 ranks (default 1M)")
    p.add_argument("--small", type=int, default=1024)
    p.add_argument("--large", type=int, default=65536)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    add_load_option(p)
    args = p.parse_args(argv)
    load_files(args.load)
    import collectives

    names = collectives.algorithm_names() if args.algorithms == "all" else args.algorithms.split(",")
    runs = [(n, args.small, _size(args.bytes)) for n in names]
    runs += [(n, args.large, _size(args.large_bytes)) for n in names if logarithmic(n)]
    print(f"# research loop: simulate + verify per algorithm, fresh process each, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'algorithm':>20}{'ranks':>8}{'bytes':>11}{'wall(s)':>9}{'cpu(s)':>8}{'steps':>7}{'verified':>10}"
          f"{'check':>13}")
    rows = []
    for name, ranks, nbytes in runs:
        row = measure(name, ranks, nbytes, args.load, args.timeout)
        rows.append(row)
        if "wall" in row:
            print(f"{name:>20}{ranks:>8}{nbytes:>11}{row['wall']:>9.1f}{row['cpu']:>8.1f}{row['steps']:>7}"
                  f"{'yes' if row['verified'] else 'NO':>10}{row['check']:>13}", flush=True)
        else:
            print(f"{name:>20}{ranks:>8}{nbytes:>11}  failed: {row['error']}", flush=True)
    print(f"# slowest at {args.small} ranks: "
          f"{max((r['wall'] for r in rows if r.get('ranks') == args.small and 'wall' in r), default=0):.1f} s; "
          f"load average now {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r.get("verified") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
