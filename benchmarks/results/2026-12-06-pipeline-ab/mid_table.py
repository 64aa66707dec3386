import re, sys, statistics as st, collections
ratio = collections.defaultdict(dict)  # (lib, bytes, mode) -> {(tree, round): r}
lib = rnd = None
for line in open(sys.argv[1]):
    m = re.match(r"== (\w+) (\w+) n=\d+ round (\d+)", line)
    if m: lib, rnd = m.group(1), int(m.group(3)); continue
    m = re.match(r"(\w+) n=\d+\s+(\d+) native .* ratio\s+([\d.]+)\s+([\d.]+)", line)
    if m and lib:
        tree, b, oop, ip = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
        ratio[(lib, b, "oop")][(tree, rnd)] = oop; ratio[(lib, b, "ip")][(tree, rnd)] = ip
trees = sorted({t for d in ratio.values() for t, _ in d} - {"old"})
print("paired median of (tree auto/native)/(old auto/native) within rounds")
for key in sorted(ratio):
    d = ratio[key]; rounds = sorted({r for _, r in d})
    cells = []
    for t in trees:
        v = [d[(t, r)] / d[("old", r)] for r in rounds if (t, r) in d and ("old", r) in d]
        cells.append(f"{t} {st.median(v):.2f} [" + " ".join(f"{x:.2f}" for x in v) + "]")
    print(f"{key[0]:8s} {key[1]:>9} {key[2]:3s}  " + "   ".join(cells))
