"""Simulator: every algorithm at thousands of ranks, from the same plans the executor runs.

``collectives.simulate(algorithm, ranks=p, nbytes=n, alpha=a, beta=b, gamma=g, **options)``
builds the plan of every rank with the algorithm's own ``build`` (no second copy of any
algorithm exists), then

- runs them through a discrete-event model: a message of m bytes takes alpha + m beta, a
  rank sends one message and receives one at a time (its send and receive ports), messages
  take their ports in the order of their post time, ties broken by message index (the lower
  rank, then the earlier step, then post order: a deterministic model), a rank's step ends
  when all its messages have, and reducing m bytes costs m gamma;
- checks them symbolically (``collectives.symbolic``): every element of every rank's output
  ends reduced from every rank exactly once, FINAL applied once, out of place and in place;
  a broken rule sets ``verified=False`` and ``verify_error`` to the ``PlanError``'s text. The
  check runs at ``verify_count(p, count)`` elements (the plans are built again at that count
  when it is smaller), so that its cost stays bounded at large p.

Scale: the plans are flattened once into numpy arrays (messages matched in post order per
pair and channel); the model runs over those arrays in vectorised waves (``collectives._waves``,
every port serving in (post, index) order), or as an event loop (``collectives.timing``) where
waves do not pay (all-to-all queues) or do not apply (zero durations, deadlocks), and the symbolic check
moves every rank that can move in one vectorised wave per step. ``--scale-check`` prints
the wall time per algorithm at 1,024 ranks and, for the logarithmic ones, at 65,536.

Topology: ``Topology(ranks_per_node=k, intra=(alpha, beta), inter=(alpha, beta),
shared_nic=True)`` prices messages inside and between nodes separately; with a shared NIC
every message leaving (entering) a node also holds that node's one network port.

CLI: ``python -m collectives.simulate -a ring,tree -p 1024 -b 8 -e 1G [--topology
nodes=128x8,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]] [--plot F.png] [--timeline F.png]``,
``python -m collectives.simulate --scale-check [--scale-bytes 1M]``, and
``python -m collectives.simulate --calibrate [-a ...] [-b 8] [-e 16M]`` under mpiexec.
"""
import os
import sys
import time
import types
from dataclasses import dataclass, field

import numpy as np

from .flat import _Flat, _registry, build_plan, build_plans  # noqa: F401  (build_plans: public here too)
from .model import ALPHA, BETA, GAMMA
from .plan import PlanError
from .plugins import add_load_option, load_files
from .timing import critical_path as _critical_path, time_plans as _time
from .atoms import atomize
from .symbolic import EXACT_LIMIT, VERIFY_ELEMENTS, _Verifier, verify_count, verify_plans  # noqa: F401

verify = verify_plans  # simulate.verify(plans, in_place=...): the symbolic check of given plans


def _small(flat_steps, ranks, count, probe):
    """True when the plans at ``verify_count`` are much smaller than at ``count`` (pipelined trees:
    fewer segments), so building them again is cheaper than the check on atoms."""
    vcount = verify_count(ranks, count)
    return vcount < count and probe is not None and 4 * len(probe(vcount).steps) < flat_steps


def verify_flat(flat, count, rebuild, probe=None):
    """Both checks (out of place, in place) of every rank's plan at ``count`` elements, from
    ``flat`` (built with ops=True); returns the engine's name. Above ``verify_count`` elements,
    the check runs at the real count on atoms (``collectives.atoms``) when they are few, else
    on ``rebuild(verify_count)``'s plans."""
    vcount = verify_count(flat.p, count)
    if vcount < count:
        # atoms save building every plan again, unless the smaller plans are much smaller (pipelined
        # trees: fewer segments); ``probe(n)`` is rank 0's plan at n elements
        small = not hasattr(flat, "l_dst") or _small(int(flat.nsteps[0]), flat.p, count, probe)
        atoms = None if small else atomize(flat, limit=4 * vcount + 64)
        if atoms is None:
            flat = _Flat(rebuild(vcount), ops=True)
        else:
            for in_place in (False, True):  # the rules that need no data, on the real elements
                _Verifier(flat, None, in_place).static_checks()
            flat = atoms
    mode = verify_plans(None, in_place=False, flat=flat)
    verify_plans(None, in_place=True, flat=flat)
    return mode


@dataclass
class Topology:
    """Nodes of ``ranks_per_node`` ranks; (alpha, beta) inside a node and between nodes."""
    ranks_per_node: int
    intra: tuple
    inter: tuple
    shared_nic: bool = False

    def node(self, rank):
        return rank // self.ranks_per_node

    @classmethod
    def parse(cls, text, alpha, beta):
        """``nodes=128x8,intra=A:B,inter=A:B,nic=shared`` (nodes = count x ranks per node)."""
        fields = dict(part.split("=", 1) for part in text.split(",") if part)
        unknown = set(fields) - {"nodes", "intra", "inter", "nic"}
        if unknown:
            raise ValueError(f"unknown topology field(s) {', '.join(sorted(unknown))}; "
                             f"valid: nodes, intra, inter, nic")
        if "nodes" not in fields:
            raise ValueError("topology needs nodes=COUNTxRANKS_PER_NODE")
        count, per_node = (int(x) for x in fields["nodes"].lower().split("x"))
        pair = lambda s: tuple(float(x) for x in s.split(":"))  # noqa: E731
        intra = pair(fields["intra"]) if "intra" in fields else (alpha, beta)
        inter = pair(fields["inter"]) if "inter" in fields else (alpha, beta)
        if fields.get("nic", "").lower() not in ("", "shared", "private"):
            raise ValueError("nic must be 'shared' or 'private'")
        return cls(per_node, intra, inter, fields.get("nic", "").lower() == "shared"), count * per_node


@dataclass
class SimResult:
    algorithm: str
    ranks: int
    nbytes: int
    time: float
    verified: bool
    verify_error: str = ""
    steps: int = 0
    bytes_sent: list = field(default_factory=list)
    bytes_received: list = field(default_factory=list)
    finish: list = field(default_factory=list)
    critical_path: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    verify_mode: str = ""

    @property
    def algbw(self):
        return self.nbytes / self.time / 1e9 if self.time > 0 else float("inf")

    @property
    def busbw(self):
        return self.algbw * (2 * (self.ranks - 1) / self.ranks if self.ranks > 1 else 1.0)



# the public call ---------------------------------------------------------------------------
def simulate(algorithm, ranks, nbytes, alpha=ALPHA, beta=BETA, gamma=GAMMA, *, topology=None,
             itemsize=4, verify_data=True, record=False, **options):
    """Predict and check ``algorithm`` on ``ranks`` ranks for an ``nbytes`` all-reduce."""
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a positive integer, got {ranks!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    count = int(nbytes) // itemsize
    import gc

    collecting = gc.isenabled()
    gc.disable()  # millions of small tuples: the cycle collector would rescan them again and again
    try:
        return _simulate(algorithm, ranks, count, alpha, beta, gamma, topology, itemsize, verify_data, record,
                         options)
    finally:
        if collecting:
            gc.enable()


def _simulate(algorithm, ranks, count, alpha, beta, gamma, topology, itemsize, verify_data, record, options):
    plans = build_plans(algorithm, ranks, count, itemsize, topology, **options)
    probe = lambda n: build_plan(algorithm, 0, ranks, n, itemsize, topology, **options)  # noqa: E731
    ops = verify_data and not _small(len(plans[0].steps) if plans else 0, ranks, count, probe)
    flat = _Flat(plans, ops=ops)  # operations flattened only when the check runs on these plans
    del plans  # the flat arrays hold everything the model and the check read
    finish, links, messages = _time(None, alpha, beta, gamma, itemsize, topology, record, flat=flat)
    result = SimResult(algorithm, ranks, count * itemsize, max(finish) if finish else 0.0, False,
                       steps=int(flat.nsteps.max()) if ranks else 0,
                       bytes_sent=[b * itemsize for b in flat.per_rank(flat.s_rank, flat.s_len)],
                       bytes_received=[b * itemsize for b in flat.per_rank(flat.r_rank, flat.r_len)],
                       finish=finish, messages=messages)
    result.critical_path = _critical_path(finish, links)
    del links
    if verify_data:
        try:
            result.verify_mode = verify_flat(
                flat, count, lambda n: build_plans(algorithm, ranks, n, itemsize, topology, **options), probe)
            result.verified = True
        except PlanError as exc:
            result.verify_error = str(exc)
    return result


class _CallableModule(types.ModuleType):
    """``collectives.simulate`` is this module, and calling it calls ``simulate``."""

    def __call__(self, *args, **kwargs):
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# CLI ---------------------------------------------------------------------------------------
def _size(text):
    from .cli import parse_size  # one parser for every tool
    return parse_size(text)


def _parse(argv):
    import argparse

    p = argparse.ArgumentParser(prog="python -m collectives.simulate", description="Predict all-reduce times.")
    p.add_argument("-a", "--algorithms", default="all")
    p.add_argument("-p", "--ranks", type=int, default=64)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default=None, help="largest size (default 64M; 16M with --calibrate)")
    p.add_argument("-f", "--stepfactor", type=float, default=4)
    p.add_argument("--alpha", type=float, default=ALPHA)
    p.add_argument("--beta", type=float, default=BETA)
    p.add_argument("--gamma", type=float, default=GAMMA)
    p.add_argument("--topology", default=None, help="nodes=COUNTxK,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]")
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
        from .calibrate import main as calibrate_main
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


def messages_per_rank(algorithm, ranks, count=None):
    """The most messages (sent plus received) any rank handles, from the plans."""
    f = _Flat(build_plans(algorithm, ranks, ranks if count is None else count))
    per_step = np.diff(f.ss) + np.diff(f.rs)
    return int(max(f.per_rank(f.step_rank[:-1], per_step[:-1])) if ranks else 0)


def logarithmic(algorithm):
    """True when the busiest rank's message count grows like lg p (measured from the plans
    at 16 and 256 ranks: lg p doubles, p grows 16x; at most 2.5x counts as logarithmic)."""
    return messages_per_rank(algorithm, 256) <= 2.5 * messages_per_rank(algorithm, 16)


def scale_check(names=None, nbytes=1 << 20, alpha=ALPHA, beta=BETA, gamma=GAMMA, small=1024,
                large=65536, limit=60.0):
    """Print the wall time of ``simulate`` (plans, timing model and both symbolic checks) for
    every algorithm at ``small`` ranks and the logarithmic ones at ``large``. A measurement,
    not a test: the time depends on the machine and its load."""
    import gc
    import platform

    names = _registry.names() if names is None else names
    print(f"# scale check: simulate(algorithm, ranks, nbytes={nbytes}) with verification, wall time on "
          f"{platform.node() or 'this machine'} ({os.cpu_count()} cores), limit {limit:g} s")
    print(f"{'algorithm':>20}{'ranks':>8}{'wall(s)':>9}{'predicted(us)':>15}{'steps':>8}{'verified':>10}"
          f"{'check':>13}{'<limit':>8}")
    worst = 0.0
    ok = True
    for ranks in (small, large):
        for name in names:
            if ranks == large and not logarithmic(name):
                continue
            gc.collect()
            start = time.perf_counter()
            r = simulate(name, ranks, nbytes, alpha, beta, gamma)
            wall = time.perf_counter() - start
            worst = max(worst, wall)
            ok = ok and r.verified
            print(f"{name:>20}{ranks:>8}{wall:>9.1f}{r.time * 1e6:>15.1f}{r.steps:>8}"
                  f"{'yes' if r.verified else 'NO':>10}{r.verify_mode:>13}{'yes' if wall < limit else 'NO':>8}",
                  flush=True)
            if r.verify_error:
                print(f"#   verification failed: {r.verify_error}")
            del r
    print(f"# slowest: {worst:.1f} s")
    return 0 if ok else 1


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


if __name__ == "__main__":
    sys.exit(main())
