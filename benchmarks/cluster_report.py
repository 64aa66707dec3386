"""Tables and a plot for all-reduce across emulated hosts (docs/performance.md#emulated-cluster).

    python -m benchmarks.cluster_report --rate 500M --sweep 2x2=A.json --sweep 3x2=B.json \\
        [--calibrate 2x2=C.json --calibrate 3x2=D.json [--predict]] [--plot F.png]

``--sweep HxK=FILE``: an ``allreduce_perf --json`` run across H hosts of K ranks (with ``benchmarks.cluster``);
prints per size the link floor 2(H-1)/H N / R (R the rate of one host's link), native's, auto's and
the best algorithm's times (out of place), and the ratios issue 19 asks for: auto and best against
the floor, auto against native, auto against the best. ``--calibrate HxK=FILE``: a ``--calibrate
--json`` run across the same hosts (K may list each host's ranks: ``3x2,1,2``); prints each
algorithm's measured against predicted time from 1 MiB; with ``--predict``, the predictions are
made again by this checkout's simulator from the run's own fit (alpha, beta, gamma and the
inter-host line), so a change to the model can be judged against stored measurements;
``--inter-alpha US`` then replaces the fit's inter-host alpha (where the run's small ping-pongs
measured something else than a message's start-up cost, say a raw MPI ping-pong's half round trip),
and ``--sharing queue`` predicts with links that serve one message at a time (the model before
fair links; the default ``fair`` uses the run's fitted burst, or fits it from a stored run's
ping-pong). On fair links each call is predicted as the calibration measures it, one of a run of
calls back to back (``Topology(..., back_to_back=True)``: a link starts a call with the tokens
the call before left it); ``--calls single`` predicts a call that finds every link idle.
``--autotune HxK=FILE``: auto's first-use picks across hosts stored in a run's calibration file
(COLLECTIVES_AUTOTUNE_FILE): per bucket the pick, the fitted link, each finalist's measured and
predicted time, and what the first call cost. ``--plot``: time over the link floor against size,
one panel per shape.
"""
import argparse
import json
import sys

from benchmarks.cluster import rate_bytes


def _shape(text):
    shape, path = text.split("=", 1)
    hosts, per_host = shape.lower().split("x")
    counts = tuple(int(x) for x in per_host.split(","))
    return int(hosts), counts[0] if len(counts) == 1 else counts, path


def floor(hosts, nbytes, rate):
    return 2 * (hosts - 1) / hosts * nbytes / rate


def sweep_rows(path, hosts, rate):
    """Per size: {'size', 'floor', algorithm: seconds, 'auto_pick'}, out of place."""
    records = json.load(open(path))["records"]
    rows = {}
    for r in records:
        row = rows.setdefault(r["size"], {"size": r["size"], "floor": floor(hosts, r["size"], rate)})
        row[r["algorithm"]] = r["oop"]["time_us"] / 1e6
        if r["algorithm"] == "auto":
            pick = r["label"][5:-1] if r["label"].startswith("auto(") else r["label"]
            row["auto_pick"] = pick.split("@")[0]  # "two_level@shm": the transport inside hosts
    return [rows[s] for s in sorted(rows)]


def best_of(row):
    mine = {k: v for k, v in row.items() if k not in ("size", "floor", "native", "auto", "auto_pick")}
    name = min(mine, key=mine.get)
    return name, mine[name]


def sweep_table(shapes, rate):
    out = ["| hosts x ranks | size | floor (ms) | native (ms) | auto (ms, its pick) | best (ms, which) | "
           "auto / floor | best / floor | auto / native | auto / best |",
           "|---|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for hosts, per_host, rows in shapes:
        per_host = ",".join(map(str, per_host)) if isinstance(per_host, tuple) else per_host
        for row in rows:
            name, best = best_of(row)
            auto = row.get("auto")
            # full names: allreduce_perf cuts its label column short
            pick = next((n for n in row if n not in ("auto", "auto_pick") and n.startswith(row.get("auto_pick", "?"))),
                        row.get("auto_pick", "-"))
            out.append(f"| {hosts} x {per_host} | {row['size'] >> 20} MiB | {row['floor'] * 1e3:.1f} | "
                       f"{row['native'] * 1e3:.1f} | {auto * 1e3:.1f} ({pick}) | {best * 1e3:.1f} ({name}) | "
                       f"{auto / row['floor']:.2f} | {best / row['floor']:.2f} | {auto / row['native']:.2f} | "
                       f"{auto / best:.2f} |")
    return "\n".join(out)


def link_burst(inter):
    """The run's fitted link burst (bytes), or, for runs stored before it was fitted, the same
    fit made from their inter-host ping-pong."""
    from collectives.calibrate import INTER_SIZES, _link_burst

    if "burst" in inter:
        return inter["burst"]
    if "pingpong" not in inter:
        return 0.0
    return _link_burst(INTER_SIZES, inter["pingpong"], inter["alpha"], inter["beta"])


def predict(data, per_host, inter_alpha=None, sharing="fair", back_to_back=True):
    """``data`` (a ``--calibrate --json`` run) with every row's prediction made again by this
    checkout's simulator, from the run's fit, on ``Topology(per_host, intra, inter,
    shared_nic=True, sharing, burst, back_to_back)`` (the burst and back-to-back calls on fair
    links only); ``inter_alpha`` (s), where given, in place of the fit's inter-host alpha."""
    from collectives import simulator as sim

    inter = data["details"]["inter"]
    alpha = inter["alpha"] if inter_alpha is None else inter_alpha
    burst = link_burst(inter) if sharing == "fair" else 0.0
    topo = sim.Topology(per_host, (data["alpha"], data["beta"]), (alpha, inter["beta"]), True, sharing, burst,
                        back_to_back and burst > 0)
    rows = []
    for r in data["rows"]:
        t = sim.simulate(r["algorithm"], ranks=data["ranks"], nbytes=r["size"], alpha=data["alpha"],
                         beta=data["beta"], gamma=data["gamma"], topology=topo, verify_data=False).time
        rows.append(dict(r, predicted=t, ratio=r["measured"] / t))
    return dict(data, rows=rows)


def links_text(inter, again, sharing, back_to_back=True):
    """How the table's predictions shared the links: the run's own model, or --predict's."""
    calls = ", calls back to back" if back_to_back else ", each call on idle links"
    if again:
        return f", {sharing} links" + (f", burst {link_burst(inter) / 1e3:.0f} kB{calls}" if sharing == "fair" else "")
    if inter.get("sharing") == "fair":
        stored = ", calls back to back" if inter.get("back_to_back") else ", each call on idle links"
        return f", fair links, burst {inter['burst'] / 1e3:.0f} kB{stored}"
    return ", queued links"


def calibrate_table(shapes, lo=1 << 20, again=False, inter_alpha=None, sharing="fair", back_to_back=True):
    out = []
    for hosts, per_host, path in shapes:
        data = json.load(open(path))
        inter = data.get("details", {}).get("inter", {})
        given = ""
        if again:
            data = predict(data, per_host, inter_alpha, sharing, back_to_back)
            if inter_alpha is not None and inter:
                given = f" (given; the run's fit {inter['alpha'] * 1e6:.1f} us)"
                inter = dict(inter, alpha=inter_alpha)
        per_host = ",".join(map(str, per_host)) if isinstance(per_host, tuple) else per_host
        out.append(f"\n{hosts} hosts x {per_host} ranks: intra-host alpha {data['alpha'] * 1e6:.1f} us, beta "
                   f"{data['beta'] * 1e9:.3f} ns/B; inter-host alpha {inter.get('alpha', 0) * 1e6:.1f} us{given}, beta "
                   f"{inter.get('beta', 0) * 1e9:.2f} ns/B ({1 / inter['beta'] / 1e6:.1f} MB/s)"
                   f"{links_text(inter, again, sharing, back_to_back)}; gamma "
                   f"{data['gamma'] * 1e9:.3f} ns/B\n" if inter else "\n")
        sizes = sorted({r["size"] for r in data["rows"] if r["size"] >= lo})
        out.append("| algorithm | " + " | ".join(f"{s >> 20} MiB measured / predicted (ms)" for s in sizes)
                   + " | worst ratio |")
        out.append("|---|" + "---:|" * (len(sizes) + 1))
        for name in dict.fromkeys(r["algorithm"] for r in data["rows"]):
            cells, worst = [], 1.0
            for s in sizes:
                r = next(r for r in data["rows"] if r["algorithm"] == name and r["size"] == s)
                ratio = r["measured"] / r["predicted"]
                worst = ratio if abs(ratio - 1) > abs(worst - 1) else worst
                cells.append(f"{r['measured'] * 1e3:.1f} / {r['predicted'] * 1e3:.1f} ({ratio:.2f})")
            out.append(f"| {name} | " + " | ".join(cells) + f" | {worst:.2f} |")
        cells = []
        for s in sizes:  # the simulator's best against the network's: what a choice made on it would cost
            mine = [r for r in data["rows"] if r["size"] == s]
            guess = min(mine, key=lambda r: r["predicted"])
            best = min(mine, key=lambda r: r["measured"])
            cells.append(f"{guess['algorithm']} / {best['algorithm']} ({guess['measured'] / best['measured']:.2f})")
        out.append("| predicted best / measured best (its time over the best's) | " + " | ".join(cells) + " | |")
    return "\n".join(out)


def first_use_table(shapes):
    """auto's first-use picks across hosts from each run's calibration file (``--autotune
    HxK=FILE``, the run's COLLECTIVES_AUTOTUNE_FILE): per bucket the pick, the fitted link, each
    finalist's measured / predicted time and what the first call cost."""
    out = ["| hosts x ranks | bucket | in place | pick | link fitted | finalists: measured / predicted (ms) | "
           "pick predicted / measured | first call (s) |", "|---|---:|---|---|---|---|---:|---:|"]
    from collectives.network_fit import candidates

    for hosts, per_host, path in shapes:
        entries = json.load(open(path))["entries"]
        counts = per_host if isinstance(per_host, tuple) else (per_host,) * hosts
        starts = [sum(counts[:i]) for i in range(len(counts))]
        layout = tuple(tuple(range(a, a + c)) for a, c in zip(starts, counts))
        per_host = ",".join(map(str, per_host)) if isinstance(per_host, tuple) else per_host
        for key, e in sorted(entries.items(), key=lambda kv: (kv[1].get("bytes", 0), kv[0])):
            if not key.startswith("hosts|"):
                continue
            pick = e["algorithm"]
            # priced again from the stored fit at the bytes measured (at most autotune's 32 MiB of the call's)
            predicted = candidates(layout, e.get("measured_bytes", min(e["bytes"], 32 << 20)), e["alpha_inter_us"] * 1e-6,
                                   e["beta_inter_ns"] * 1e-9)[1]
            e["predicted_us"] = {n: predicted[n] * 1e6 for n in e["times_us"]}
            finalists = ", ".join(f"{n} {t / 1e3:.1f} / {e['predicted_us'][n] / 1e3:.1f}" for n, t in e["times_us"].items())
            out.append(f"| {hosts} x {per_host} | {key.split('|')[-2] and int(key.split('|')[-2]) >> 20} MiB | "
                       f"{'yes' if key.endswith('in_place') else 'no'} | {pick} | {e['alpha_inter_us']:.1f} us, "
                       f"{1e3 / e['beta_inter_ns']:.1f} MB/s | {finalists} | "
                       f"{e['predicted_us'][pick] / e['times_us'][pick]:.2f} | {e['first_call_s']:.2f} |")
    return "\n".join(out)


def plot(shapes, path, rate_text="500M"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, (hosts, per_host, rows) in zip(axes[0], shapes):
        names = [k for k in rows[0] if k not in ("size", "floor", "auto_pick")]
        for name in names:
            xs = [r["size"] for r in rows if name in r]
            ys = [r[name] / r["floor"] for r in rows if name in r]
            style = {"linestyle": "--", "color": "black"} if name == "native" else \
                {"linewidth": 2.5, "color": "tab:red"} if name == "auto" else {}
            ax.plot(xs, ys, marker="o", markersize=4, label="native MPI_Allreduce" if name == "native" else name,
                    **style)
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.axhline(1.25, color="grey", linewidth=1, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time / link floor 2(H-1)/H N/R")
        ax.set_title(f"{hosts} hosts x {per_host} ranks, {rate_text.rstrip('bitBIT')}bit/s links")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster_report", description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="500M", help="each host link's rate, as given to benchmarks.cluster")
    p.add_argument("--sweep", action="append", default=[], type=_shape, help="HxK=allreduce_perf.json")
    p.add_argument("--calibrate", action="append", default=[], type=_shape, help="HxK=calibrate.json")
    p.add_argument("--predict", action="store_true",
                   help="with --calibrate: predict again with this checkout's simulator from each run's fit")
    p.add_argument("--inter-alpha", type=float, metavar="US",
                   help="with --predict: this inter-host alpha (microseconds) in place of each run's fit")
    p.add_argument("--sharing", choices=("fair", "queue"), default="fair",
                   help="with --predict: links shared fairly by the messages crossing them at once, with "
                        "the run's fitted burst (default), or serving them one at a time, in post order")
    p.add_argument("--calls", choices=("back-to-back", "single"), default="back-to-back",
                   help="with --predict on fair links: each call one of a run back to back, as the "
                        "calibration measures (default), or one that finds every link idle")
    p.add_argument("--autotune", action="append", default=[], type=_shape,
                   help="HxK=FILE: auto's first-use picks across hosts, the run's COLLECTIVES_AUTOTUNE_FILE")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    rate = rate_bytes(args.rate)
    shapes = [(h, k, sweep_rows(path, h, rate)) for h, k, path in args.sweep]
    if shapes:
        print(sweep_table(shapes, rate))
    if args.calibrate:
        if args.inter_alpha is not None and not args.predict:
            p.error("--inter-alpha needs --predict")
        alpha = None if args.inter_alpha is None else args.inter_alpha * 1e-6
        print(calibrate_table(args.calibrate, again=args.predict, inter_alpha=alpha, sharing=args.sharing,
                              back_to_back=args.calls == "back-to-back"))
    if args.autotune:
        print(first_use_table(args.autotune))
    if args.plot and shapes:
        plot(shapes, args.plot, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
