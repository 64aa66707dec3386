"""The A/B table from ab.txt: per library, world size and message size, the median over rounds of
auto's time over native's time measured in the same run (out of place / in place) in each tree, and
new over old (<1: the new tree is faster). Native's time in the same run normalises the load the
machine had while each run ran.

    python benchmarks/results/2026-12-06-pipeline-ab/ab_table.py benchmarks/results/2026-12-06-pipeline-ab/ab.txt
"""
import re
import statistics
import sys

# one pass: "== LIB TREE n=N round R" heads auto_ab.py's rows, "== floor LIB TREE round R" heads
# small_floor's line (the library's own work per call at 8 B: allreduce auto minus the raw
# persistent exchange, minimum of the run's batches)
rows, paired, floors, library, round_, floor_tree = {}, {}, {}, None, None, None
for line in open(sys.argv[1]):
    head = re.match(r"== (floor )?(mpich|openmpi) (\w+)(?: n=\d)?(?: round (\d+))?", line)
    if head:
        library, round_ = head.group(2), head.group(4)
        floor_tree = head.group(3) if head.group(1) else None
        continue
    m = re.match(r"(\w+) n=(\d)\s+(\d+) native\s+([\d.]+)\s+([\d.]+)\s+auto\s+([\d.]+)\s+([\d.]+)", line)
    if m and library:
        tree, n, size = m.group(1), int(m.group(2)), int(m.group(3))
        ratios = (float(m.group(6)) / float(m.group(4)), float(m.group(7)) / float(m.group(5)))
        rows.setdefault((library, n, size), {}).setdefault(tree, []).append(ratios)
        paired.setdefault((library, n, size), {}).setdefault(round_, {})[tree] = ratios
    m = re.match(r"8 B: native .*persistent exchange ([\d.]+) / [\d.]+, allreduce auto ([\d.]+) /", line)
    if m and floor_tree:
        floors.setdefault((library, floor_tree), []).append(float(m.group(2)) - float(m.group(1)))
        floor_tree = None
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

# paired: new over old within each round (the two runs of a round sit side by side in time, so a
# machine state that holds for minutes touches both), median over rounds
if any(len(v) > 1 for v in paired.values()):
    print("\npaired: median over rounds of (new auto/native) / (old auto/native) within the round")
    print(f"{'library':8} {'n':>2} {'bytes':>9} {'oop':>6} {'ip':>6}  rounds (oop)")
    for (library, n, size), by_round in sorted(paired.items()):
        pairs = [(v["old"], next(r for t, r in v.items() if t != "old")) for v in by_round.values() if len(v) == 2]
        if not pairs:
            continue
        oop = [new[0] / old[0] for old, new in pairs]
        ip = [new[1] / old[1] for old, new in pairs]
        print(f"{library:8} {n:>2} {size:>9} {statistics.median(oop):6.2f} {statistics.median(ip):6.2f}  "
              + " ".join(f"{x:.2f}" for x in oop))

if floors:
    print("\nsmall_floor 8 B, n=2: allreduce auto - persistent exchange (us, minimum of each run's batches)")
    for (library, tree), own in sorted(floors.items()):
        print(f"{library:8} {tree:5} median {statistics.median(own):5.2f}  rounds " + " ".join(f"{x:.2f}" for x in own))
