"""Medians of auto_ab.sh's output per size: auto/native time per tree (out of place | in place),
then auto's own time per tree in us. Native's time moves with the process around it (under one
tree or the other it ran 10-30% apart at n=4), so the absolute columns say what the library did."""
import statistics
import sys

runs = {}  # (n, size, tree) -> [(native oop, native ip, auto oop, auto ip)]
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 12 and f[3] == "native":
        runs.setdefault((f[1], int(f[2]), f[0]), []).append(tuple(float(f[i]) for i in (4, 5, 7, 8)))
trees = sorted({t for _, _, t in runs}, key=lambda t: t != "old")


def median(rows, i):
    return statistics.median(r[i] for r in rows)


for n in sorted({n for n, _, _ in runs}):
    count = len(next(v for (nn, _, _), v in runs.items() if nn == n))
    print(f"{n}, medians of {count} runs: auto/native time (oop | in place), then auto's time in us (oop | in place)")
    print(f"{'size':>10} " + " ".join(f"{t + ' ratio':>15}" for t in trees) + " " + " ".join(f"{t + ' us':>19}" for t in trees))
    for size in sorted({s for nn, s, _ in runs if nn == n}):
        ratio, absolute = [], []
        for t in trees:
            rows = runs.get((n, size, t), [])
            ratio.append(f"{statistics.median(r[2] / r[0] for r in rows):6.2f} | {statistics.median(r[3] / r[1] for r in rows):5.2f}")
            absolute.append(f"{median(rows, 2):8.1f} | {median(rows, 3):8.1f}")
        print(f"{size:>10} " + " ".join(f"{c:>15}" for c in ratio) + " " + " ".join(f"{c:>19}" for c in absolute))
