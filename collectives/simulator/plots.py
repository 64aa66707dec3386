"""Pictures of the simulator: predicted time against size, and one run's schedule as arrows."""
from ..model import ALPHA, BETA, GAMMA
from .core import simulate


def _plot(rows, path, ranks):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        pts = [(r["size"], r["time"]) for r in rows if r["algorithm"] == name]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("predicted time (s)")
    ax.set_title(f"simulated all-reduce, {ranks} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def timeline(algorithm, ranks, nbytes, path, alpha=ALPHA, beta=BETA, gamma=GAMMA, **options):
    """Draw which rank sends what to whom, when: one arrow per message, coloured by the sender's step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    r = simulate(algorithm, ranks, nbytes, alpha, beta, gamma, record=True, verify_data=False, **options)
    fig, ax = plt.subplots(figsize=(10, 0.5 * ranks + 2))
    cmap = plt.get_cmap("viridis")
    last = max((m[4] for m in r.messages), default=1) or 1
    for start, end, src, dst, step, size in r.messages:
        ax.annotate("", xy=(end * 1e6, dst), xytext=(start * 1e6, src),
                    arrowprops={"arrowstyle": "->", "color": cmap(step / last), "lw": 1.2})
    ax.set_yticks(range(ranks))
    ax.set_ylabel("rank")
    ax.set_xlabel("time (us)")
    ax.set_xlim(0, max(r.time * 1e6, 1e-3))
    ax.set_ylim(-0.5, ranks - 0.5)
    ax.invert_yaxis()
    ax.set_title(f"{algorithm}: {ranks} ranks, {nbytes} bytes, {len(r.messages)} messages "
                 f"(colour: sender's step)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return r
