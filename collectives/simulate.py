"""Simulator: every algorithm at thousands of ranks, from the same plans the executor runs.

``collectives.simulate(algorithm, ranks=p, nbytes=n, alpha=a, beta=b, gamma=g, **options)``
builds the plan of every rank with the algorithm's own ``build`` (no second copy of any
algorithm exists), then

- runs them through a discrete-event model: a message of m bytes takes alpha + m beta, a
  rank sends one message and receives one at a time (its send and receive ports), a rank's
  step ends when all its messages have, and reducing m bytes costs m gamma;
- checks them symbolically: each rank's input elements carry the set of ranks they stand
  for, reductions take the union and fail on overlap (double counting), and every element of
  every rank's output must end with all ranks, FINAL applied exactly once, both out of place
  and in place (IN aliased to OUT). Worlds of up to ``EXACT_LIMIT`` ranks use exact sets
  (Python int bitsets); larger ones use a fingerprint (random 64-bit weight per rank, summed
  mod 2^64, plus a contribution count), which misses an error with probability ~2^-64.

Topology: ``Topology(ranks_per_node=k, intra=(alpha, beta), inter=(alpha, beta),
shared_nic=True)`` prices messages inside and between nodes separately; with a shared NIC
every message leaving (entering) a node also holds that node's one network port.

CLI: ``python -m collectives.simulate -a ring,tree -p 1024 -b 8 -e 1G [--topology
nodes=128x8,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]] [--plot F.png] [--timeline F.png]``
and ``python -m collectives.simulate --calibrate`` under mpiexec.
"""
import heapq
import importlib
import sys
import time
import types
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .plan import COPY, FINAL, IN, OUT, REDUCE, TMP, BUFFER_NAMES

_registry = importlib.import_module("collectives.algorithms")
EXACT_LIMIT = 128


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


def _params(module, ranks, options, topology):
    from .algorithms._options import normalize
    opts = normalize(module.NAME, module.OPTIONS, options)
    if hasattr(module, "check"):
        module.check(opts, ranks)
    if hasattr(module, "resolve"):
        fake = types.SimpleNamespace(size=ranks, node_colors=lambda: tuple(
            (topology.node(r) if topology else 0) for r in range(ranks)))
        opts = module.resolve(opts, fake)
    return opts


def build_plans(algorithm, ranks, count, itemsize=4, topology=None, **options):
    module = _registry.get(algorithm)
    params = _params(module, ranks, options, topology)
    return [module.build(r, ranks, count, itemsize=itemsize, **params) for r in range(ranks)]


# timing ----------------------------------------------------------------------------------
def _match(plans):
    """For every send, the (rank, step) of its matching receive; FIFO per (src, dst, chan)."""
    pending = {}
    for rank, plan in enumerate(plans):
        for s, step in enumerate(plan.steps):
            for peer, _, lo, hi, chan in step.recvs:
                pending.setdefault((peer, rank, chan), deque()).append((s, hi - lo))
    return pending


def _time(plans, alpha, beta, gamma, itemsize, topology, record):
    p = len(plans)
    queues = _match(plans)
    # per rank: index of the current step, messages outstanding in it, its post time
    current = [0] * p
    outstanding = [0] * p
    post = [0.0] * p
    latest = [0.0] * p
    cause = [None] * p
    finish = [0.0] * p
    send_free, recv_free = {}, {}
    heap = []
    seq = 0
    path_links = {}
    messages = []
    recv_ready = {}  # (rank, step) -> number of receives whose sends have been posted

    def cost(src, dst, nbytes):
        if topology is None:
            return alpha + nbytes * beta
        a, b = topology.intra if topology.node(src) == topology.node(dst) else topology.inter
        return a + nbytes * b

    def start_step(rank, when):
        nonlocal seq
        plan = plans[rank]
        while current[rank] < len(plan.steps):
            step = plan.steps[current[rank]]
            post[rank] = when
            latest[rank] = when
            outstanding[rank] = len(step.sends) + len(step.recvs)
            if outstanding[rank]:
                for peer, _, lo, hi, chan in step.sends:
                    rstep, n = queues[(rank, peer, chan)].popleft()
                    if n != hi - lo:
                        raise RuntimeError(f"rank {rank} sends {hi - lo} elements to {peer}, which expects {n}")
                    heapq.heappush(heap, (when, seq, rank, current[rank], peer, rstep, (hi - lo) * itemsize))
                    seq += 1
                return
            when = _locals_done(rank, when)
        finish[rank] = when

    def _locals_done(rank, when):
        step = plans[rank].steps[current[rank]]
        work = sum(op[7] for op in step.local if op[0] == REDUCE)
        current[rank] += 1
        return when + work * itemsize * gamma

    def complete(rank, end, why):
        if end >= latest[rank]:
            latest[rank], cause[rank] = end, why
        outstanding[rank] -= 1
        if outstanding[rank] == 0:
            path_links[(rank, current[rank])] = (cause[rank], latest[rank])
            start_step(rank, _locals_done(rank, latest[rank]))

    for rank in range(p):
        start_step(rank, 0.0)
    early = {}  # messages that arrive before the receiver reaches the step: (rank, step) -> [ends]
    while heap:
        ready, _, src, sstep, dst, rstep, nbytes = heapq.heappop(heap)
        sport = ("s", src)
        rport = ("r", dst)
        start = max(ready, send_free.get(sport, 0.0), recv_free.get(rport, 0.0))
        nic = topology is not None and topology.shared_nic and topology.node(src) != topology.node(dst)
        if nic:
            start = max(start, send_free.get(("nic-s", topology.node(src)), 0.0),
                        recv_free.get(("nic-r", topology.node(dst)), 0.0))
        end = start + cost(src, dst, nbytes)
        send_free[sport] = end
        recv_free[rport] = end
        if nic:
            send_free[("nic-s", topology.node(src))] = end
            recv_free[("nic-r", topology.node(dst))] = end
        if record:
            messages.append((start, end, src, dst, sstep, nbytes))
        complete(src, end, ("send", src, sstep, dst))
        if current[dst] == rstep and outstanding[dst] > 0:
            complete(dst, end, ("recv", dst, rstep, src))
        else:
            early.setdefault((dst, rstep), []).append((end, src))
        # receivers that have now reached a step whose messages arrived early
        for rank in (src, dst):
            while outstanding[rank] > 0 and (rank, current[rank]) in early:
                arrived = early.pop((rank, current[rank]))
                for end_time, peer in arrived:
                    complete(rank, max(end_time, post[rank]), ("recv", rank, current[rank], peer))
                    if outstanding[rank] == 0:
                        break
    stuck = [r for r in range(p) if current[r] < len(plans[r].steps)]
    if stuck:
        raise RuntimeError(f"deadlock: ranks {stuck[:8]} never finish (step {current[stuck[0]]})")
    return finish, path_links, messages


def _critical_path(finish, path_links, plans):
    """Walk back from the last rank to finish: at each step, the message that ended last.

    Returns ``(rank, step, "send"|"recv", peer, time)`` tuples from the first event on."""
    import bisect

    by_rank = {}
    for (rank, step), (_, when) in path_links.items():
        by_rank.setdefault(rank, []).append((step, when))
    for rows in by_rank.values():
        rows.sort()
    rank = int(np.argmax(finish)) if finish else 0
    step = len(plans[rank].steps)
    path = []
    while step > 0 and len(path) < 10 ** 6:
        link = path_links.get((rank, step - 1))
        if link is None or link[0] is None:
            step -= 1
            continue
        (kind, _, _, peer), when = link
        path.append((rank, step - 1, kind, peer, when))
        if kind == "recv":  # continue on the sender, at its last step that ended by then
            rows = by_rank.get(peer, [])
            times = [w for _, w in rows]
            k = bisect.bisect_right(times, when) - 1
            rank, step = peer, (rows[k][0] if k >= 0 else -1)
        else:
            step -= 1
    path.reverse()
    return path


# symbolic check ----------------------------------------------------------------------------
class _Exact:
    """Each element is a bitset of the ranks it holds, plus one flag bit for "FINAL applied"."""
    name = "exact"

    def __init__(self, p):
        self.full = (1 << p) - 1
        self.flag = 1 << p

    def inputs(self, rank, count):
        return np.array([1 << rank] * count, dtype=object)

    def empty(self, count):
        return np.zeros(count, dtype=object)

    def combine(self, a, b, where):
        if (np.bitwise_and(np.bitwise_or(a, b), self.flag) != 0).any():
            raise AssertionError(f"{where}: reduces a value that is already final")
        if (np.bitwise_and(a, b) != 0).any():
            raise AssertionError(f"{where}: an element reduces some rank's contribution twice")
        return np.bitwise_or(a, b)

    def complete(self, values):
        return np.bitwise_and(values, self.full) == self.full

    def finalize(self, values, where):
        if (np.bitwise_and(values, self.flag) != 0).any():
            raise AssertionError(f"{where}: FINAL applied twice to one element")
        if not np.all(self.complete(values)):
            raise AssertionError(f"{where}: FINAL on elements not yet fully reduced")
        return np.bitwise_or(values, self.flag)

    def finished(self, values):
        return values == (self.full | self.flag)


class _Fingerprint:
    """Rows: sum of random 64-bit rank weights (mod 2^64), contribution count, FINAL flag."""
    name = "fingerprint"

    def __init__(self, p):
        rng = np.random.default_rng(12345)
        self.weights = rng.integers(1, 2 ** 63, p, dtype=np.int64).astype(np.uint64) | np.uint64(1)
        self.total = np.uint64(int(self.weights.astype(object).sum()) % (1 << 64))
        self.p = p

    def inputs(self, rank, count):
        return np.stack([np.full(count, self.weights[rank], np.uint64), np.ones(count, np.uint64),
                         np.zeros(count, np.uint64)])

    def empty(self, count):
        return np.zeros((3, count), np.uint64)

    def combine(self, a, b, where):
        if (a[2] | b[2]).any():
            raise AssertionError(f"{where}: reduces a value that is already final")
        out = a + b
        out[2] = 0
        if (out[1] > self.p).any():
            raise AssertionError(f"{where}: an element holds more than {self.p} contributions")
        return out

    def complete(self, values):
        return (values[0] == self.total) & (values[1] == self.p)

    def finalize(self, values, where):
        if values[2].any():
            raise AssertionError(f"{where}: FINAL applied twice to one element")
        if not np.all(self.complete(values)):
            raise AssertionError(f"{where}: FINAL on elements not yet fully reduced")
        out = values.copy()
        out[2] = 1
        return out

    def finished(self, values):
        return self.complete(values) & (values[2] == 1)


def _region(engine, buf, lo, hi):
    return buf[lo:hi] if isinstance(engine, _Exact) else buf[:, lo:hi]


def _set(engine, buf, lo, values):
    if isinstance(engine, _Exact):
        buf[lo:lo + len(values)] = values
    else:
        buf[:, lo:lo + values.shape[1]] = values


def verify(plans, in_place=False, engine=None):
    """Raise AssertionError naming the first violation; return the engine's name when clean."""
    p = len(plans)
    engine = engine or (_Exact(p) if p <= EXACT_LIMIT else _Fingerprint(p))
    count = plans[0].count
    bufs = []
    for rank, plan in enumerate(plans):
        inbuf = engine.inputs(rank, plan.in_count)
        outbuf = inbuf if in_place else engine.empty(plan.out_count)
        bufs.append([inbuf, outbuf, engine.empty(max(plan.tmp_count, 1))])
    queues = {}
    current = [0] * p
    sent = [False] * p
    mode = "in place" if in_place else "out of place"
    work = deque(range(p))  # ranks that may be able to move on
    queued = [True] * p
    while work:
        rank = work.popleft()
        queued[rank] = False
        plan = plans[rank]
        while current[rank] < len(plan.steps):
            step = plan.steps[current[rank]]
            where = _Where(plan, mode, rank, current[rank])
            if not sent[rank]:
                for _, b, lo, hi, _ in step.sends:
                    for _, wb, wlo, whi, _ in step.recvs:
                        if _same(b, wb, in_place) and lo < whi and wlo < hi:
                            raise AssertionError(f"{where}: sends a region it receives into in the same step")
                for peer, b, lo, hi, chan in step.sends:
                    queues.setdefault((rank, peer, chan), deque()).append(
                        _region(engine, bufs[rank][b], lo, hi).copy())
                    if not queued[peer]:
                        queued[peer] = True
                        work.append(peer)
                sent[rank] = True
            if not all(queues.get((peer, rank, chan)) for peer, _, _, _, chan in step.recvs):
                break  # wait: a sender will put this rank back on the work list
            for peer, b, lo, hi, chan in step.recvs:
                if b == IN:
                    raise AssertionError(f"{where}: receives into IN")
                data = queues[(peer, rank, chan)].popleft()
                width = data.shape[-1]
                if width != hi - lo:
                    raise AssertionError(f"{where}: message from rank {peer} has {width} elements, expects {hi - lo}")
                _set(engine, bufs[rank][b], lo, data)
            for op in step.local:
                _apply(engine, op, bufs[rank], where, in_place)
            current[rank] += 1
            sent[rank] = False
    stuck = [r for r in range(p) if current[r] < len(plans[r].steps)]
    if stuck:
        raise AssertionError(f"deadlock: ranks {stuck[:8]} wait forever (rank {stuck[0]} at step "
                             f"{current[stuck[0]] + 1} of {plans[stuck[0]].algorithm})")
    leftover = [key for key, q in queues.items() if q]
    if leftover:
        src, dst, chan = leftover[0]
        raise AssertionError(f"{plans[0].algorithm} ({mode}): a message from rank {src} to rank {dst} "
                             f"(channel {chan}) is never received")
    for rank, plan in enumerate(plans):
        out = bufs[rank][OUT]
        ok = np.asarray(engine.complete(out), bool)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise AssertionError(f"{plan.algorithm} ({mode}): rank {rank} element {bad} of {count} "
                                 f"is not the reduction of every rank's contribution")
        ok = np.asarray(engine.finished(out), bool)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise AssertionError(f"{plan.algorithm} ({mode}): rank {rank} element {bad} never had FINAL applied")
    return engine.name


class _Where:
    """Names a step in an error message; formatted only when an error is raised."""
    __slots__ = ("plan", "mode", "rank", "step")

    def __init__(self, plan, mode, rank, step):
        self.plan, self.mode, self.rank, self.step = plan, mode, rank, step

    def __str__(self):
        return (f"{self.plan.algorithm} ({self.mode}) rank {self.rank} step {self.step + 1}/"
                f"{len(self.plan.steps)}")

    __format__ = lambda self, spec: str(self)  # noqa: E731


def _same(a, b, in_place):
    return a == b or (in_place and {a, b} == {IN, OUT})


def _apply(engine, op, bufs, where, in_place):
    kind = op[0]
    if kind == REDUCE:
        _, dst, dlo, a, alo, b, blo, n = op
        if dst == IN:
            raise AssertionError(f"{where}: writes IN")
        value = engine.combine(_region(engine, bufs[a], alo, alo + n), _region(engine, bufs[b], blo, blo + n), where)
        _set(engine, bufs[dst], dlo, value)
    elif kind == COPY:
        _, dst, dlo, src, slo, n = op
        if dst == IN:
            raise AssertionError(f"{where}: writes IN")
        if in_place and dlo == slo and {dst, src} == {IN, OUT}:
            return
        _set(engine, bufs[dst], dlo, _region(engine, bufs[src], slo, slo + n).copy())
    elif kind == FINAL:
        _, buf, lo, n = op
        if buf != OUT and not (in_place and buf == IN):
            raise AssertionError(f"{where}: FINAL on {BUFFER_NAMES[buf]}")
        _set(engine, bufs[buf], lo, engine.finalize(_region(engine, bufs[buf], lo, lo + n), where))


def verify_count(ranks, count):
    """A small count with the plan's structure: every rank's chunk non-empty where possible,
    uneven splits, and memory bounded at large worlds."""
    if ranks <= EXACT_LIMIT:
        return min(count, 3 * ranks + 2)
    return max(1, min(count, 2 * ranks + 3, (1 << 28) // (24 * ranks)))


# the public call ---------------------------------------------------------------------------
def simulate(algorithm, ranks, nbytes, alpha=15e-6, beta=1 / 2.0e9, gamma=1 / 6.0e9, *, topology=None,
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
    finish, links, messages = _time(plans, alpha, beta, gamma, itemsize, topology, record)
    result = SimResult(algorithm, ranks, count * itemsize, max(finish) if finish else 0.0, False,
                       steps=max(len(p.steps) for p in plans),
                       bytes_sent=[p.bytes_sent(itemsize) for p in plans],
                       bytes_received=[p.bytes_received(itemsize) for p in plans],
                       finish=finish, messages=messages)
    result.critical_path = _critical_path(finish, links, plans)
    if verify_data:
        vcount = verify_count(ranks, count)
        small = plans if vcount == count else build_plans(algorithm, ranks, vcount, itemsize, topology, **options)
        del plans
        try:
            result.verify_mode = verify(small, in_place=False)
            verify(small, in_place=True)
            result.verified = True
        except AssertionError as exc:
            result.verify_error = str(exc)
    return result


class _CallableModule(types.ModuleType):
    """``collectives.simulate`` is this module, and calling it calls ``simulate``."""

    def __call__(self, *args, **kwargs):
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# CLI ---------------------------------------------------------------------------------------
def _size(text):
    from benchmarks.allreduce_perf import parse_size  # one parser for both tools
    return parse_size(text)


def _parse(argv):
    import argparse

    p = argparse.ArgumentParser(prog="python -m collectives.simulate", description="Predict all-reduce times.")
    p.add_argument("-a", "--algorithms", default="all")
    p.add_argument("-p", "--ranks", type=int, default=64)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=float, default=4)
    p.add_argument("--alpha", type=float, default=15e-6)
    p.add_argument("--beta", type=float, default=1 / 2.0e9)
    p.add_argument("--gamma", type=float, default=1 / 6.0e9)
    p.add_argument("--topology", default=None, help="nodes=COUNTxK,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--plot")
    p.add_argument("--timeline", help="draw the schedule of the first algorithm at the smallest size")
    p.add_argument("--calibrate", action="store_true", help="under mpiexec: fit alpha, beta, gamma here")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.calibrate:
        from .calibrate import main as calibrate_main
        return calibrate_main()
    names = _registry.names() if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
    for name in names:
        _registry.get(name)
    topology, ranks = None, args.ranks
    if args.topology:
        topology, ranks = Topology.parse(args.topology, args.alpha, args.beta)
    lo, hi = _size(args.minbytes), _size(args.maxbytes)
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


def timeline(algorithm, ranks, nbytes, path, alpha=15e-6, beta=1 / 2.0e9, gamma=1 / 6.0e9, **options):
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
