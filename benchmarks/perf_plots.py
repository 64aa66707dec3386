"""The plots of docs/performance.md, drawn from the raw results kept in benchmarks/results/.

    python -m benchmarks.perf_plots [--out docs/img]

Each plot reads only files of one dated folder (the run performance.md names beside it), so a
rerun of that folder's command followed by this script redraws the figure. Nothing is measured
here.
"""
import argparse
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\S+\s+\S+\s+(\S+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\S+\s+[\d.]+\s+([\d.]+)")


def load(folder, name):
    with open(os.path.join(RESULTS, folder, name)) as f:
        return json.load(f) if name.endswith(".json") else f.read()


def size_label(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def sizes_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes], rotation=45, ha="right", fontsize=8)
    ax.minorticks_off()


def by_size(records, key="oop"):
    """{algorithm: {size: record[key]}} of an allreduce_perf --json run."""
    out = {}
    for r in records:
        out.setdefault(r["algorithm"], {})[r["size"]] = r[key]
    return out


def sweep_mpich(out):
    """busbw against size at n=2 and n=4: native, auto and the best other row per size."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for ax, n in zip(axes, (2, 4)):
        data = load("2026-12-03-sweep-mpich", f"sweep-n{n}.json")
        rows = by_size(data["records"])
        sizes = sorted(rows["native"])
        ours = [a for a in rows if a not in ("native", "auto") and not a.startswith("floor:")]
        best = [max(rows[a][s]["busbw"] for a in ours) for s in sizes]
        ax.plot(sizes, [rows["native"][s]["busbw"] for s in sizes], "k--o", ms=3, label="native MPI_Allreduce")
        ax.plot(sizes, [rows["auto"][s]["busbw"] for s in sizes], "C0-o", ms=3, label="collectives auto")
        ax.plot(sizes, best, "C1:", label="best single algorithm")
        sizes_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_title(f"n={n} (MPICH 5.0.2, 2 cores)")
        ax.set_ylabel("busbw (GB/s), out of place")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sweep-mpich.png"), dpi=110)
    plt.close(fig)


def text_runs(text):
    """The runs of an allreduce_perf text output: [{label: (size, oop us, ip us)}]."""
    runs, current = [], None
    for line in text.splitlines():
        if line.startswith("# collectives"):
            current = {}
            runs.append(current)
        m = ROW.match(line)
        if m and current is not None:
            current[m.group(2)] = (int(m.group(1)), float(m.group(3)), float(m.group(4)))
    return runs


def transports_floors(out):
    """n=2, 32 MiB: each row's time over the memory floor, ordinary and shared arrays."""
    runs = text_runs(load("2026-12-04-transports", "transports-n2-32M-floors.txt"))
    fig, ax = plt.subplots(figsize=(9, 4))
    names = ["native", "ring@mpi", "ring@shm", "rabenseifner@mpi", "rabenseifner@shm",
             "recursive_doubling@mpi", "recursive_doubling@shm", "shm@mpi", "shm@shm"]
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        shared = run["floor:zero-copy"][1] < 0.8 * run["floor:one-copy"][1] and run["native"][1] > 2 * run[
            "floor:zero-copy"][1] and run.get("ring@mpi", (0, 0))[1] > 1.5 * run.get("ring@shm", (0, 1))[1]
        floor = run["floor:zero-copy" if shared else "floor:one-copy"][1]
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [run[n][1] / floor if n in run else 0 for n in names], width,
               label=f"run {i + 1}: {'shared arrays / zero-copy floor' if shared else 'ordinary arrays / one-copy floor'}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time / memory floor (32 MiB, n=2)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "transports-floors.png"), dpi=110)
    plt.close(fig)


AUTO_LINE = re.compile(r"^\s*(\d+) B\s+out of place: .*? ratio ([\d.]+); in place: .*? ratio ([\d.]+)")


def auto_vs_best(out):
    """auto's time over the best pair's, per size: n=2 twice, n=4 once; and the first call's cost."""
    folder = "2026-12-05-auto-first-use"
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, label, style in (("auto-first-use-n2-round-order.txt", "n=2, run 1", "C0-o"),
                               ("auto-first-use-n2-round-order-run2.txt", "n=2, run 2", "C2-s"),
                               ("auto-first-use-n4-round-order.txt", "n=4", "C1-^")):
        points = [tuple(map(float, m.groups())) for m in map(AUTO_LINE.match, load(folder, name).splitlines()) if m]
        sizes = [int(p[0]) for p in points]
        ax.plot(sizes, [p[1] for p in points], style, ms=3, label=f"{label}, out of place")
        ax.plot(sizes, [p[2] for p in points], style.replace("-", ":"), ms=3, alpha=0.6, label=f"{label}, in place")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.1, color="r", lw=0.6, ls="--")
    sizes_axis(ax, [8, 128, 2048, 32768, 1 << 19, 1 << 23, 1 << 27])
    ax.set_ylabel("auto time / best pair's time")
    ax.set_title("auto (calibrated on first use) against the best pair")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    cost = re.compile(r"^n=(\d)\s+(\d+) B\s+out of place\s+([\d.]+) s .*in place\s+([\d.]+) s")
    for n, style in (("2", "C0-o"), ("4", "C1-^")):
        rows = [m.groups() for m in map(cost.match, load(folder, "first-call-cost.txt").splitlines()) if m and m.group(1) == n]
        ax2.plot([int(r[1]) for r in rows], [float(r[2]) for r in rows], style, ms=3, label=f"n={n}, out of place")
        ax2.plot([int(r[1]) for r in rows], [float(r[3]) for r in rows], style.replace("-", ":"), ms=3, label=f"n={n}, in place")
    sizes_axis(ax2, [8, 2048, 32768, 1 << 20, 1 << 25])
    ax2.set_ylabel("first call of a size bucket (s)")
    ax2.set_title("What calibrating on first use costs, once")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "auto-first-use.png"), dpi=110)
    plt.close(fig)


def openmpi(out):
    """auto and the best algorithm against Open MPI's own MPI_Allreduce, n=2 and n=4."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, n in zip(axes, (2, 4)):
        rows = by_size(load("2026-12-04-openmpi", f"sweep-openmpi-n{n}.json")["records"])
        sizes = sorted(rows["native"])
        ours = [a for a in rows if a not in ("native", "auto") and not a.startswith("floor:")]
        ax.plot(sizes, [rows["native"][s]["time_us"] / rows["auto"][s]["time_us"] for s in sizes], "C0-o", ms=3,
                label="auto")
        ax.plot(sizes, [max(rows["native"][s]["time_us"] / rows[a][s]["time_us"] for a in ours) for s in sizes],
                "C1:", label="best single algorithm")
        ax.axhline(1.0, color="k", lw=0.8)
        sizes_axis(ax, sizes)
        ax.set_yscale("log")
        ax.set_title(f"n={n}, Open MPI 5.0.11 (busy machine)")
        ax.set_ylabel("native time / our time (above 1: faster)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "openmpi.png"), dpi=110)
    plt.close(fig)


def cluster(out):
    """Across emulated hosts (500 Mbit/s links): time over the link floor 2(H-1)/H N/R."""
    rate = 500e6 / 8
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (shape, hosts) in zip(axes, (("2x2", 2), ("3x2", 3))):
        rows = by_size(load("2026-12-04-cluster", f"cluster-{shape}-500M-eager.json")["records"])
        sizes = sorted(rows["native"])
        floor = {s: 2 * (hosts - 1) / hosts * s / rate * 1e6 for s in sizes}
        for name, style in (("native", "k--o"), ("auto", "C0-o"), ("two_level", "C1:s"),
                            ("hierarchical_copy", "C2:^"), ("ring", "C3:v")):
            ax.plot(sizes, [rows[name][s]["time_us"] / floor[s] for s in sizes], style, ms=3, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        sizes_axis(ax, sizes)
        ax.set_title(f"{shape.replace('x', ' hosts x ')} ranks, 500 Mbit/s links")
        ax.set_ylabel("time / link floor")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cluster.png"), dpi=110)
    plt.close(fig)


def simulator(out):
    """The simulator's prediction against measurement: measured / predicted per algorithm and size."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (folder, name, title) in zip(axes, (
            ("2026-12-03-simulator", "calibrate-n2.json", "one node, n=2"),
            ("2026-12-04-cluster", "calibrate-cluster-2x2-b2b.json", "2 emulated hosts x 2 ranks"))):
        rows = load(folder, name)["rows"]
        for i, algo in enumerate(sorted({r["algorithm"] for r in rows})):
            mine = sorted((r["size"], r["ratio"]) for r in rows if r["algorithm"] == algo)
            ax.plot([s for s, _ in mine], [q for _, q in mine], "-o", color=f"C{i}", ms=3, label=algo)
        sizes = sorted({r["size"] for r in rows})
        ax.axhline(1.0, color="k", lw=0.8)
        sizes_axis(ax, sizes[::2] if len(sizes) > 10 else sizes)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel("measured / predicted time")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "simulator.png"), dpi=110)
    plt.close(fig)


TABLE_ROW = re.compile(r"^\| ([^|]+) \| ([\d.]+) \|")


def table_rows(text):
    return [(m.group(1).strip(), float(m.group(2))) for m in map(TABLE_ROW.match, text.splitlines()) if m]


def tensorflow(out):
    """Keras step times: one process, 4 logical devices; and 2 processes over MPI against gRPC."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for ax, name, title in ((axes[0], "tf-step-mirrored.txt", "MirroredStrategy, 4 logical CPUs"),
                            (axes[1], "tf-step-multi-worker.txt", "2 workers (mpiexec -n 2)")):
        rows = table_rows(load("2026-12-03-tensorflow", name))
        labels = [r[0].replace("collectives ", "").replace(" over MPI", "").replace(
            "tf MultiWorkerMirroredStrategy (gRPC collectives)", "tf MWMS (gRPC)") for r in rows]
        colors = ["C1" if r[0].startswith("tf ") else "C0" for r in rows]
        ax.barh(labels, [r[1] for r in rows], color=colors)
        ax.invert_yaxis()
        ax.set_xlabel("median step (ms)")
        ax.set_title(title)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tensorflow.png"), dpi=110)
    plt.close(fig)


def training(out):
    """16 MiB float32 on 2 emulated hosts x 2 ranks: exact and compressed, against the link floor;
    and the Keras step over 2 hosts."""
    data = load("2026-12-04-training", "training-net-2x2-500M.json")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    rows = data["compression"]["rows"]
    labels = [f"{r['algorithm']} {r['compression'] or 'exact'}" for r in rows]
    axes[0].barh(labels, [r["median_ms"] for r in rows],
                 color=["C1" if r["algorithm"] == "native" else "C2" if r["compression"] else "C0" for r in rows])
    floor = 2 * (2 - 1) / 2 * data["size"] / (500e6 / 8) * 1e3
    axes[0].axvline(floor, color="k", lw=0.8, ls="--", label=f"link floor, exact ({floor:.0f} ms)")
    axes[0].axvline(floor / 2, color="k", lw=0.8, ls=":", label=f"link floor, 16-bit ({floor / 2:.0f} ms)")
    axes[0].invert_yaxis()
    axes[0].set_xlabel("median per call (ms)")
    axes[0].set_title("16 MiB float32, 2 hosts x 2 ranks, 500 Mbit/s")
    axes[0].legend(fontsize=7)
    axes[0].tick_params(axis="y", labelsize=8)
    keras = table_rows(load("2026-12-04-training", "keras-net-2x1-500M.txt"))
    axes[1].barh([r[0].replace("collectives ", "").replace("tf MultiWorkerMirroredStrategy (gRPC collectives)",
                                                              "tf MWMS (gRPC)") for r in keras],
                 [r[1] for r in keras], color=["C1" if r[0].startswith("tf ") else "C0" for r in keras])
    axes[1].invert_yaxis()
    axes[1].set_xlabel("median step (ms)")
    axes[1].set_title("Keras MLP, 9.5M parameters, 2 hosts")
    axes[1].tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=110)
    plt.close(fig)


PLOTS = [sweep_mpich, transports_floors, auto_vs_best, openmpi, cluster, simulator, tensorflow, training]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "img"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for plot in PLOTS:
        plot(args.out)
        print(f"{plot.__name__}: done")


if __name__ == "__main__":
    main()
