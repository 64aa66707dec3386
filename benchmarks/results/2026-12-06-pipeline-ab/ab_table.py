"""The A/B table from ab.txt: per library, world size and message size, the median over rounds of
auto's time over native's time measured in the same run (out of place / in place) in each tree, and
new over old (<1: the new tree is faster). Native's time in the same run normalises the load the
machine had while each run ran.

    python benchmarks/results/2026-12-06-pipeline-ab/ab_table.py benchmarks/results/2026-12-06-pipeline-ab/ab.txt
"""
import re
import statistics
import sys

rows, library = {}, None
for line in open(sys.argv[1]):
    head = re.match(r"== (mpich|openmpi) (\w+) n=(\d)", line)
    if head:
        library = head.group(1)
        continue
    m = re.match(r"(\w+) n=(\d)\s+(\d+) native\s+([\d.]+)\s+([\d.]+)\s+auto\s+([\d.]+)\s+([\d.]+)", line)
    if m and library:
        tree, n, size = m.group(1), int(m.group(2)), int(m.group(3))
        ratios = (float(m.group(6)) / float(m.group(4)), float(m.group(7)) / float(m.group(5)))
        rows.setdefault((library, n, size), {}).setdefault(tree, []).append(ratios)
print("auto / native in the same run; new/old: the new tree's over the old tree's")
print(f"{'library':8} {'n':>2} {'bytes':>9} {'old oop':>9} {'new oop':>9} {'new/old':>7} {'old ip':>9} {'new ip':>9} {'new/old':>7} rounds")
for (library, n, size), trees in sorted(rows.items()):
    if "old" not in trees or len(trees) < 2:
        continue
    new = next(t for t in trees if t != "old")
    o = [statistics.median(v[k] for v in trees["old"]) for k in (0, 1)]
    w = [statistics.median(v[k] for v in trees[new]) for k in (0, 1)]
    print(f"{library:8} {n:>2} {size:>9} {o[0]:9.2f} {w[0]:9.2f} {w[0] / o[0]:7.2f} {o[1]:9.2f} {w[1]:9.2f} {w[1] / o[1]:7.2f} "
          f"{len(trees['old'])}/{len(trees[new])}")
