"""Plan-building cost: seconds to build one rank's plan (``module.build``), best of a few runs.

    python benchmarks/plan_build.py [--repeat 3] [--ranks 1024,4096,16384,65536]

For each algorithm and world size it builds the plans of a sample of ranks (evenly spaced, at
most ``--sample``) and prints the mean time per rank's plan. A measurement: it depends on the
machine and its load."""
import argparse
import gc
import importlib
import time

algorithms = importlib.import_module("collectives.algorithms")  # the name is shadowed by a function

ALGORITHMS = ("ring", "double_binary_tree", "rabenseifner", "tree", "two_level")


def per_plan(name, ranks, count, sample, repeat):
    hosts = (tuple(range(ranks)),)
    if name == "two_level":  # 8 ranks a host
        hosts = tuple(tuple(range(h, min(h + 8, ranks))) for h in range(0, ranks, 8))
    module, params = algorithms.resolve(name, {}, hosts)
    who = range(0, ranks, max(1, ranks // sample))
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        for rank in who:
            module.build(rank, ranks, count, itemsize=4, **params)
        best = min(best, (time.perf_counter() - start) / len(who))
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096,16384,65536")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--bytes", type=int, default=64 << 20)
    parser.add_argument("--sample", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'algorithm':>20}{'ranks':>8}{'ms/plan':>10}")
    for name in args.algorithms.split(","):
        for ranks in (int(r) for r in args.ranks.split(",")):
            t = per_plan(name, ranks, args.bytes // 4, args.sample, args.repeat)
            print(f"{name:>20}{ranks:>8}{t * 1e3:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
