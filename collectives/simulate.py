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
  (bitsets of ceil(p/64) words); larger ones use a fingerprint (the sum mod 2^64 of a random
  odd 64-bit weight per rank), which misses an error with probability ~2^-64. The check runs
  at ``verify_count(p, count)`` elements (the plans are built again at that count when it is
  smaller), so that its cost stays bounded at large p.

Scale: the plans are flattened once into numpy arrays (messages matched in post order per
pair and channel); the model is one event loop over those arrays, and the symbolic check
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
import heapq
import importlib
import operator
import os
import sys
import time
import types
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .plan import COPY, FINAL, IN, OUT, REDUCE, TMP, BUFFER_NAMES

_registry = importlib.import_module("collectives.algorithms")
EXACT_LIMIT = 128
VERIFY_ELEMENTS = 1 << 22  # symbolic elements per buffer, summed over ranks, in large worlds


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


# flat plans ------------------------------------------------------------------------------
# The timing model and the symbolic check both run on every rank's plan at once. The plans
# (built by the algorithms' own ``build``) are flattened once into arrays: steps numbered
# globally (rank r's step s is ``start[r] + s``, with one unused number between ranks),
# messages in post order with their matching message on the other side, local operations.
_PAD = {8: (), 6: (0, 0), 4: (0, 0, 0, 0)}
_first, _last = operator.itemgetter(0), operator.itemgetter(-1)


class _Flat:
    """Every rank's plan as flat arrays (see the comment above)."""

    def __init__(self, plans, ops=False):
        p = len(plans)
        self.p = p
        self.algorithm = plans[0].algorithm if plans else ""
        self.count = plans[0].count if plans else 0
        nsteps = np.fromiter((len(plan.steps) for plan in plans), np.int64, p)
        start = np.zeros(p + 1, np.int64)
        np.cumsum(nsteps + 1, out=start[1:])
        self.nsteps, self.start = nsteps, start
        self.in_count = np.fromiter((plan.in_count for plan in plans), np.int64, p)
        self.out_count = np.fromiter((plan.out_count for plan in plans), np.int64, p)
        self.tmp_count = np.fromiter((plan.tmp_count for plan in plans), np.int64, p)
        sends, recvs, local = [], [], []
        ns, nr, nl = [], [], []
        for plan in plans:
            if plan.steps:
                s_, r_, l_ = zip(*plan.steps)
                ns += map(len, s_)
                nr += map(len, r_)
                nl += map(len, l_)
                sends += chain.from_iterable(s_)
                recvs += chain.from_iterable(r_)
                local += chain.from_iterable(l_)
            ns.append(0)
            nr.append(0)
            nl.append(0)
        G = int(start[-1])
        self.steps_total = G
        self.step_rank = np.repeat(np.arange(p, dtype=np.int64), nsteps + 1)

        def offsets(counts):
            out = np.zeros(G + 1, np.int64)
            np.cumsum(np.fromiter(counts, np.int64, G), out=out[1:])
            return out

        self.ss, self.rs, self.ls = offsets(ns), offsets(nr), offsets(nl)
        del ns, nr, nl
        S = np.fromiter(chain.from_iterable(sends), np.int64, 5 * len(sends)).reshape(-1, 5)
        del sends
        R = np.fromiter(chain.from_iterable(recvs), np.int64, 5 * len(recvs)).reshape(-1, 5)
        del recvs
        gid = np.arange(G, dtype=np.int64)
        self.s_step = np.repeat(gid, np.diff(self.ss))
        self.r_step = np.repeat(gid, np.diff(self.rs))
        self.s_rank = self.step_rank[self.s_step]
        self.r_rank = self.step_rank[self.r_step]
        self.s_peer, self.s_buf, self.s_lo, self.s_hi, self.s_chan = S.T.copy()  # rows: contiguous
        self.r_peer, self.r_buf, self.r_lo, self.r_hi, self.r_chan = R.T.copy()
        del S, R
        self.s_len = self.s_hi - self.s_lo
        self.r_len = self.r_hi - self.r_lo
        self.l_step = np.repeat(gid, np.diff(self.ls))
        nops = len(local)
        if ops:
            L = np.fromiter(chain.from_iterable(op + _PAD[len(op)] for op in local), np.int64,
                            8 * nops).reshape(-1, 8)
            kind = L[:, 0]
            self.l_kind = kind.copy()
            self.l_dst, self.l_dlo = L[:, 1].copy(), L[:, 2].copy()
            # operands: a for REDUCE and COPY, b for REDUCE only (0 elsewhere)
            self.l_a = np.where(kind == FINAL, 0, L[:, 3])
            self.l_alo = np.where(kind == FINAL, 0, L[:, 4])
            self.l_b = np.where(kind == REDUCE, L[:, 5], 0)
            self.l_blo = np.where(kind == REDUCE, L[:, 6], 0)
            self.l_n = np.where(kind == REDUCE, L[:, 7], np.where(kind == COPY, L[:, 5], L[:, 3]))
        else:
            self.l_kind = np.fromiter(map(_first, local), np.int64, nops)
            self.l_n = np.fromiter(map(_last, local), np.int64, nops)
        del local
        reduces = self.l_kind == REDUCE
        self.work = np.bincount(self.l_step[reduces], weights=self.l_n[reduces], minlength=G).astype(np.int64)
        self._pair()

    def _pair(self):
        """Match sends with receives: FIFO per (source, destination, channel), in post order."""
        p = self.p
        cmin = min(int(self.s_chan.min(initial=0)), int(self.r_chan.min(initial=0)))
        nchan = max(int(self.s_chan.max(initial=0)), int(self.r_chan.max(initial=0))) - cmin + 1
        ks = (self.s_rank * p + self.s_peer) * nchan + (self.s_chan - cmin)
        kr = (self.r_peer * p + self.r_rank) * nchan + (self.r_chan - cmin)
        order_s = np.argsort(ks, kind="stable")
        order_r = np.argsort(kr, kind="stable")
        self.s_match = np.full(len(ks), -1, np.int64)
        self.r_match = np.full(len(kr), -1, np.int64)
        sorted_s, sorted_r = ks[order_s], kr[order_r]
        if len(ks) == len(kr) and np.array_equal(sorted_s, sorted_r):
            self.s_match[order_s] = order_r
            self.r_match[order_r] = order_s
            return
        # unequal counts somewhere (a broken plan): pair the k-th send with the k-th receive
        _, dense = np.unique(np.concatenate([sorted_s, sorted_r]), return_inverse=True)
        dense = dense.ravel()

        def occurrence(sorted_keys):
            n = len(sorted_keys)
            first = np.ones(n, bool)
            first[1:] = sorted_keys[1:] != sorted_keys[:-1]
            return np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))

        occ_s, occ_r = occurrence(sorted_s), occurrence(sorted_r)
        width = int(max(occ_s.max(initial=0), occ_r.max(initial=0))) + 1
        cs = dense[:len(ks)] * width + occ_s
        cr = dense[len(ks):] * width + occ_r  # sorted already
        pos = np.searchsorted(cr, cs)
        hit = pos < len(cr)
        hit[hit] = cr[pos[hit]] == cs[hit]
        self.s_match[order_s[hit]] = order_r[pos[hit]]
        self.r_match[order_r[pos[hit]]] = order_s[hit]

    def local_step(self, g):
        return int(g - self.start[self.step_rank[g]])

    def per_rank(self, rank_of, values):
        """Sum of ``values`` per rank, for items sorted by rank (exact integers)."""
        bounds = np.searchsorted(rank_of, np.arange(self.p + 1))
        total = np.zeros(len(values) + 1, np.int64)
        np.cumsum(values, out=total[1:])
        return (total[bounds[1:]] - total[bounds[:-1]]).tolist()


# timing ----------------------------------------------------------------------------------
def _time(plans, alpha, beta, gamma, itemsize, topology, record, flat=None):
    """Discrete-event model: messages start in order of their post time, each holds its
    sender's send port and its receiver's receive port (and, with a shared NIC, both nodes'
    network ports) for alpha + m beta; a step ends when all its messages have, then its
    reductions take gamma per byte. Returns (finish per rank, links, messages): ``links``
    is, per global step, the message that ended it last (for the critical path)."""
    f = flat if flat is not None else _Flat(plans)
    p = f.p
    bad = np.flatnonzero(f.s_match < 0)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(f"rank {int(f.s_rank[i])} sends to {int(f.s_peer[i])} (channel {int(f.s_chan[i])}) "
                           f"a message no receive matches")
    matched = f.s_match
    wrong = np.flatnonzero(f.s_len != f.r_len[matched])
    if wrong.size:
        i = int(wrong[0])
        raise RuntimeError(f"rank {int(f.s_rank[i])} sends {int(f.s_len[i])} elements to {int(f.s_peer[i])}, "
                           f"which expects {int(f.r_len[matched[i]])}")
    nbytes_arr = f.s_len * itemsize
    if topology is None:
        dur_arr = alpha + nbytes_arr * beta
        nic_arr = None
    else:
        k = topology.ranks_per_node
        same = (f.s_rank // k) == (f.s_peer // k)
        dur_arr = np.where(same, topology.intra[0] + nbytes_arr * topology.intra[1],
                           topology.inter[0] + nbytes_arr * topology.inter[1])
        nic_arr = (~same).tolist() if topology.shared_nic else None
    dur = dur_arr.tolist()
    s_src = f.s_rank.tolist()
    s_dst = f.s_peer.tolist()
    s_rg = f.r_step[matched].tolist() if len(matched) else []
    ss = f.ss.tolist()
    nmsg = (np.diff(f.ss) + np.diff(f.rs)).tolist()
    wt = (f.work * itemsize * gamma).tolist()  # == work * itemsize * gamma for each step
    first = f.start[:-1].tolist()
    last = (f.start[:-1] + f.nsteps).tolist()
    G = f.steps_total
    if record:
        s_lstep = (f.s_step - f.start[f.s_rank]).tolist()
        s_nbytes = nbytes_arr.tolist()
    if nic_arr is not None:
        kpn = topology.ranks_per_node
        nnodes = (p + kpn - 1) // kpn
        nic_s, nic_r = [0.0] * nnodes, [0.0] * nnodes

    cur = list(first)
    outstanding = [0] * p
    post = [0.0] * p
    latest = [0.0] * p
    cause = [-1] * p  # 2 * peer + (0 send, 1 receive): the message that ended the step last
    finish = [0.0] * p
    send_free = [0.0] * p
    recv_free = [0.0] * p
    link_cause = [-1] * G
    link_time = [0.0] * G
    heap = []
    push, pop = heapq.heappush, heapq.heappop
    messages = []
    seq = 0
    early = {}  # global step -> [(end, sender)]: messages that ended before their receiver got there

    def advance(rank, g, when):
        """Start step g of ``rank`` at ``when`` (skipping steps without messages)."""
        nonlocal seq
        stop = last[rank]
        while g < stop:
            post[rank] = when
            latest[rank] = when
            m = nmsg[g]
            outstanding[rank] = m
            if m:
                cur[rank] = g
                for i in range(ss[g], ss[g + 1]):
                    push(heap, (when, seq, i))
                    seq += 1
                return
            when += wt[g]
            g += 1
        cur[rank] = g
        finish[rank] = when

    def step_done(rank):
        g = cur[rank]
        link_cause[g] = cause[rank]
        link_time[g] = end = latest[rank]
        advance(rank, g + 1, end + wt[g])

    def arrived(rank, when, why):
        """One message of ``rank``'s current step ended at ``when`` (``why``: its cause code);
        True when that was the step's last one."""
        if when >= latest[rank]:
            latest[rank] = when
            cause[rank] = why
        outstanding[rank] -= 1
        if outstanding[rank]:
            return False
        step_done(rank)
        return True

    for rank in range(p):
        advance(rank, first[rank], 0.0)
    while heap:
        ready, _, i = pop(heap)
        src = s_src[i]
        dst = s_dst[i]
        start = ready
        if send_free[src] > start:
            start = send_free[src]
        if recv_free[dst] > start:
            start = recv_free[dst]
        if nic_arr is not None and nic_arr[i]:
            ns_, nd_ = src // kpn, dst // kpn
            start = max(start, nic_s[ns_], nic_r[nd_])
            end = start + dur[i]
            nic_s[ns_] = end
            nic_r[nd_] = end
        else:
            end = start + dur[i]
        send_free[src] = end
        recv_free[dst] = end
        if record:
            messages.append((start, end, src, dst, s_lstep[i], s_nbytes[i]))
        arrived(src, end, 2 * dst)  # the sender's step: one message fewer to wait for
        # the receiver's, if it is there yet
        g = s_rg[i]
        if cur[dst] == g and outstanding[dst] > 0:
            arrived(dst, end, 2 * src + 1)
        elif g in early:
            early[g].append((end, src))
        else:
            early[g] = [(end, src)]
        if early:  # ranks that have now reached a step whose messages arrived early
            for rank in (src, dst):
                while outstanding[rank] > 0 and cur[rank] in early:
                    for end_time, peer in early.pop(cur[rank]):
                        if arrived(rank, post[rank] if post[rank] > end_time else end_time, 2 * peer + 1):
                            break
    stuck = [r for r in range(p) if cur[r] < last[r]]
    if stuck:
        raise RuntimeError(f"deadlock: ranks {stuck[:8]} never finish (step {cur[stuck[0]] - first[stuck[0]]})")
    return finish, (link_cause, link_time, f), messages


def _critical_path(finish, links, plans=None):
    """Walk back from the last rank to finish: at each step, the message that ended last.

    Returns ``(rank, step, "send"|"recv", peer, time)`` tuples from the first event on."""
    import bisect

    link_cause, link_time, f = links
    first = f.start[:-1].tolist()
    nsteps = f.nsteps.tolist()
    rows_of = {}

    def rows(rank):  # (local step, end time) of the rank's steps that have messages
        if rank not in rows_of:
            base = first[rank]
            steps = [s for s in range(nsteps[rank]) if link_cause[base + s] >= 0]
            rows_of[rank] = (steps, [link_time[base + s] for s in steps])
        return rows_of[rank]

    rank = int(np.argmax(finish)) if finish else 0
    step = nsteps[rank] if finish else 0
    path = []
    while step > 0 and len(path) < 10 ** 6:
        g = first[rank] + step - 1
        why = link_cause[g]
        if why < 0:
            step -= 1
            continue
        peer, kind = divmod(why, 2)
        when = link_time[g]
        path.append((rank, step - 1, "recv" if kind else "send", peer, when))
        if kind:  # continue on the sender, at its last step that ended by then
            steps, times = rows(peer)
            k = bisect.bisect_right(times, when) - 1
            rank, step = peer, (steps[k] if k >= 0 else -1)
        else:
            step -= 1
    path.reverse()
    return path


# symbolic check ----------------------------------------------------------------------------
# All ranks' buffers live in one flat array of symbolic elements. The check runs in waves:
# every rank that has reached a step posts its sends (a snapshot of the regions, as a real
# send reads them), then every rank whose receives have all been posted completes its step:
# receives land, local operations run in order. A wave is a handful of numpy operations over
# all the ranks that move in it, so a world that moves in lock step costs one wave per step,
# not one Python call per rank and step.
class _Exact:
    """Each element is a bitset of the ranks it holds: ``ceil(p/64)`` words per element."""
    name = "exact"

    def __init__(self, p):
        self.p = p
        self.rows = (p + 63) // 64
        self.full = np.array([(1 << min(64, p - 64 * w)) - 1 for w in range(self.rows)], np.uint64)

    def zeros(self, n):
        return np.zeros((n, self.rows), np.uint64)

    def inputs(self, values, idx, owners):
        values[idx, owners // 64] = np.left_shift(np.uint64(1), (owners % 64).astype(np.uint64))

    @staticmethod
    def get(values, idx):
        return values[idx]

    @staticmethod
    def put(values, idx, new):
        values[idx] = new

    def combine(self, a, b):
        """(a op b, mask of the elements that would count some rank twice)."""
        return a | b, (a & b).any(axis=1)

    twice = "an element reduces some rank's contribution twice"

    def complete(self, values):
        return (values == self.full).all(axis=1)


class _Fingerprint:
    """Each element is the sum (mod 2^64) of the random odd 64-bit weights of the ranks it
    holds: it equals the sum of all weights, with the rank multiset wrong, with probability
    about 2^-64 (2^-63 for a rank counted three times)."""
    name = "fingerprint"
    twice = None

    def __init__(self, p):
        rng = np.random.default_rng(12345)
        self.weights = rng.integers(1, 2 ** 63, p, dtype=np.int64).astype(np.uint64) | np.uint64(1)
        self.total = np.uint64(int(self.weights.astype(object).sum()) % (1 << 64))
        self.p = p

    @staticmethod
    def zeros(n):
        return np.zeros(n, np.uint64)

    def inputs(self, values, idx, owners):
        values[idx] = self.weights[owners]

    @staticmethod
    def get(values, idx):
        return values.take(idx)

    @staticmethod
    def put(values, idx, new):
        np.put(values, idx, new)

    @staticmethod
    def combine(a, b):
        return a + b, None

    def complete(self, values):
        return values == self.total


_ENGINES = {"exact": _Exact, "fingerprint": _Fingerprint}


def _expand(starts, lens, dtype=np.int64):
    """The element indices of the regions ``starts[i] : starts[i] + lens[i]``, concatenated."""
    if len(starts) == 0:
        return np.zeros(0, dtype)
    starts = starts.astype(dtype, copy=False)
    width = int(lens[0])
    if (lens == width).all():
        if width == 1:
            return starts
        return (starts[:, None] + np.arange(width, dtype=dtype)).ravel()
    total = int(lens.sum())
    shift = (np.cumsum(lens) - lens).astype(dtype, copy=False)
    return np.repeat(starts - shift, lens) + np.arange(total, dtype=dtype)


def _ranges(lo, hi):
    return _expand(lo, hi - lo)


def verify(plans, in_place=False, engine=None, flat=None):
    """Raise AssertionError naming the first violation; return the engine's name when clean.

    ``engine`` is "exact" (bitsets) or "fingerprint"; by default exact up to ``EXACT_LIMIT``
    ranks. ``flat`` is ``_Flat(plans, ops=True)`` when the caller already has it."""
    f = flat if flat is not None else _Flat(plans, ops=True)
    if engine is None:
        engine = "exact" if f.p <= EXACT_LIMIT else "fingerprint"
    eng = _ENGINES[engine](f.p) if isinstance(engine, str) else engine
    return _Verifier(f, eng, in_place).run()


class _Verifier:
    def __init__(self, f, eng, in_place):
        self.f, self.eng, self.in_place = f, eng, in_place
        self.mode = "in place" if in_place else "out of place"
        p = f.p
        tmp = np.maximum(f.tmp_count, 1)
        out = f.in_count if in_place else f.out_count  # in place, OUT is IN
        sizes = np.stack([f.in_count, out, tmp])
        rank_base = np.zeros(p + 1, np.int64)
        np.cumsum(f.in_count + (0 if in_place else out) + tmp, out=rank_base[1:])
        base = np.empty((3, p), np.int64)
        base[IN] = rank_base[:-1]
        base[OUT] = rank_base[:-1] + (0 if in_place else f.in_count)
        base[TMP] = base[OUT] + out
        self.sizes, self.base, self.total = sizes, base, int(rank_base[-1])
        self.index = np.int32 if self.total < 2 ** 31 - 1 else np.int64

    # errors -------------------------------------------------------------------------------
    def where(self, g):
        f = self.f
        rank = int(f.step_rank[g])
        return f"{f.algorithm} ({self.mode}) rank {rank} step {f.local_step(g) + 1}/{int(f.nsteps[rank])}"

    def fail(self, g, text):
        raise AssertionError(f"{self.where(g)}: {text}")

    def addresses(self, rank, buf, lo, n, steps, what):
        """Flat addresses of regions, after checking that each lies inside its buffer."""
        if len(buf) == 0:
            return buf.astype(self.index)
        badbuf = (buf < 0) | (buf > 2)
        if badbuf.any():
            k = int(np.flatnonzero(badbuf)[0])
            self.fail(steps[k], f"{what} names buffer {int(buf[k])}")
        size = self.sizes[buf, rank]
        outside = (lo < 0) | (n < 0) | (lo + n > size)
        if outside.any():
            k = int(np.flatnonzero(outside)[0])
            self.fail(steps[k], f"{what} {BUFFER_NAMES[buf[k]]}[{int(lo[k])}:{int(lo[k] + n[k])}] lies outside "
                                f"its {int(size[k])} elements")
        return (self.base[buf, rank] + lo).astype(self.index)

    def static_checks(self):
        f = self.f
        self.s_addr = self.addresses(f.s_rank, f.s_buf, f.s_lo, f.s_len, f.s_step, "sends")
        self.r_addr = self.addresses(f.r_rank, f.r_buf, f.r_lo, f.r_len, f.r_step, "receives into")
        into_in = np.flatnonzero(f.r_buf == IN)
        if into_in.size:
            self.fail(f.r_step[into_in[0]], "receives into IN")
        ok = f.r_match >= 0
        wrong = np.flatnonzero(ok & (f.s_len[np.where(ok, f.r_match, 0)] != f.r_len))
        if wrong.size:
            j = int(wrong[0])
            self.fail(f.r_step[j], f"message from rank {int(f.r_peer[j])} has {int(f.s_len[f.r_match[j]])} "
                                   f"elements, expects {int(f.r_len[j])}")
        self.overlap_check()
        kind = f.l_kind
        unknown = np.flatnonzero((kind < REDUCE) | (kind > FINAL))
        if unknown.size:
            self.fail(f.l_step[unknown[0]], f"unknown local operation {int(kind[unknown[0]])}")
        writes_in = np.flatnonzero((kind != FINAL) & (f.l_dst == IN))
        if writes_in.size:
            self.fail(f.l_step[writes_in[0]], "writes IN")
        final_ok = (f.l_dst == OUT) | ((f.l_dst == IN) & self.in_place)
        bad_final = np.flatnonzero((kind == FINAL) & ~final_ok)
        if bad_final.size:
            k = int(bad_final[0])
            name = BUFFER_NAMES[f.l_dst[k]] if 0 <= f.l_dst[k] <= 2 else str(int(f.l_dst[k]))
            self.fail(f.l_step[k], f"FINAL on {name}")
        l_rank = f.step_rank[f.l_step]
        self.l_dst = self.addresses(l_rank, f.l_dst, f.l_dlo, f.l_n, f.l_step, "writes")
        self.l_a = self.addresses(l_rank, f.l_a, f.l_alo, np.where(kind == FINAL, 0, f.l_n), f.l_step, "reads")
        self.l_b = self.addresses(l_rank, f.l_b, f.l_blo, np.where(kind == REDUCE, f.l_n, 0), f.l_step, "reads")

    def overlap_check(self):
        """No step sends a region it receives into (IN and OUT are one buffer in place)."""
        f = self.f
        if not len(f.s_step) or not len(f.r_step):
            return
        # intervals on a line: step, then buffer, then the element offset
        cls = lambda b: np.where(b == IN, OUT, b) if self.in_place else b  # noqa: E731
        span = int(max(f.s_hi.max(initial=0), f.r_hi.max(initial=0))) + 1
        key = lambda step, buf: (step * 3 + cls(buf)) * span  # noqa: E731
        lo = np.concatenate([key(f.s_step, f.s_buf) + f.s_lo, key(f.r_step, f.r_buf) + f.r_lo])
        hi = np.concatenate([key(f.s_step, f.s_buf) + f.s_hi, key(f.r_step, f.r_buf) + f.r_hi])
        is_send = np.zeros(len(lo), bool)
        is_send[:len(f.s_step)] = True
        order = np.argsort(lo, kind="stable")
        lo, hi, is_send = lo[order], hi[order], is_send[order]
        group = lo - lo % span  # the start of the interval's (step, buffer) line
        for mine in (is_send, ~is_send):  # each interval against the earlier ones of the other kind
            reach = np.maximum.accumulate(np.where(mine, hi, group))
            hit = np.flatnonzero(~mine[1:] & (reach[:-1] > lo[1:]) & (reach[:-1] > group[1:]))
            if hit.size:
                i = int(order[hit[0] + 1])
                step = f.s_step[i] if i < len(f.s_step) else f.r_step[i - len(f.s_step)]
                self.fail(step, "sends a region it receives into in the same step")

    # the run ------------------------------------------------------------------------------
    def run(self):
        f, eng = self.f, self.eng
        p = f.p
        self.static_checks()
        values = eng.zeros(self.total)
        final = np.zeros(self.total, bool)
        inputs = _expand(self.base[IN], f.in_count, self.index)
        eng.inputs(values, inputs, np.repeat(np.arange(p, dtype=np.int64), f.in_count))
        del inputs
        self.values, self.final = values, final
        cur = f.start[:-1].copy()
        stop = cur + f.nsteps
        posted = np.zeros(p, bool)
        chunks = {}  # wave -> [values, final flags, messages not yet received]
        s_chunk = np.full(len(f.s_len), -1, np.int64)
        s_off = np.zeros(len(f.s_len), np.int64)
        active = np.flatnonzero(cur < stop)
        wave = 0
        while active.size:
            # ranks that reached a new step post its sends: a snapshot of the regions
            new = active[~posted[active]]
            if new.size:
                g = cur[new]
                ids = _ranges(f.ss[g], f.ss[g + 1])
                if ids.size:
                    live = int(np.count_nonzero(f.s_match[ids] >= 0))
                    if live:
                        lens = f.s_len[ids]
                        idx = _expand(self.s_addr[ids], lens, self.index)
                        chunks[wave] = [eng.get(values, idx), final.take(idx), live]
                        s_chunk[ids] = wave
                        s_off[ids] = np.cumsum(lens) - lens
                posted[new] = True
            # ranks whose receives have all been posted move on
            g = cur[active]
            counts = f.rs[g + 1] - f.rs[g]
            rids = _ranges(f.rs[g], f.rs[g + 1])
            m = f.r_match[rids]
            ok = m >= 0
            mm = m[ok]
            ok[ok] = cur[f.s_rank[mm]] >= f.s_step[mm]
            if ok.all():
                ready = active
            else:
                owner = np.repeat(np.arange(len(active)), counts)
                blocked = np.zeros(len(active), bool)
                blocked[owner[~ok]] = True
                if blocked.all():
                    break
                ready = active[~blocked]
                rids = rids[~blocked[owner]]
                g = cur[ready]
            if rids.size:
                self.receive(rids, chunks, s_chunk, s_off)
            lids = _ranges(f.ls[g], f.ls[g + 1])
            if lids.size:
                self.local(lids, f.ls[g], f.ls[g + 1] - f.ls[g])
            cur[ready] += 1
            posted[ready] = False
            active = active[cur[active] < stop[active]]
            wave += 1
        if active.size:
            stuck = active.tolist()
            r = stuck[0]
            raise AssertionError(f"deadlock: ranks {stuck[:8]} wait forever (rank {r} at step "
                                 f"{int(cur[r] - f.start[r]) + 1} of {f.algorithm})")
        lost = np.flatnonzero(f.s_match < 0)
        if lost.size:
            i = int(lost[0])
            raise AssertionError(f"{f.algorithm} ({self.mode}): a message from rank {int(f.s_rank[i])} to rank "
                                 f"{int(f.s_peer[i])} (channel {int(f.s_chan[i])}) is never received")
        self.check_outputs()
        return eng.name

    def receive(self, rids, chunks, s_chunk, s_off):
        f, eng = self.f, self.eng
        m = f.r_match[rids]
        lens = f.r_len[rids]
        which = s_chunk[m]
        waves = np.unique(which)
        for c in waves.tolist():
            sel = slice(None) if len(waves) == 1 else np.flatnonzero(which == c)
            here = _expand(self.r_addr[rids[sel]], lens[sel], self.index)
            chunk = chunks[c]
            src = _expand(s_off[m[sel]], lens[sel], self.index)
            eng.put(self.values, here, eng.get(chunk[0], src))
            np.put(self.final, here, chunk[1].take(src))
            chunk[2] -= len(m) if len(waves) == 1 else len(sel)
            if chunk[2] == 0:
                del chunks[c]

    def local(self, lids, lstart, counts):
        """Run the local operations of the steps that complete, position by position."""
        kinds = self.f.l_kind
        deepest = int(counts.max())
        if deepest == 1:
            groups = [lids]
        else:
            pos = lids - np.repeat(lstart, counts)
            order = np.argsort(pos, kind="stable")
            groups = np.split(lids[order], np.cumsum(np.bincount(pos, minlength=deepest))[:-1])
        for ids in groups:
            k = kinds[ids]
            if (k == k[0]).all():
                self.apply(int(k[0]), ids)
            else:
                for kind in (REDUCE, COPY, FINAL):
                    sub = ids[k == kind]
                    if sub.size:
                        self.apply(kind, sub)

    def first_bad(self, mask, ids, n):
        k = int(np.searchsorted(np.cumsum(n), int(np.flatnonzero(mask)[0]), side="right"))
        return self.f.l_step[ids[k]]

    def apply(self, kind, ids):
        f, eng, values, final = self.f, self.eng, self.values, self.final
        n = f.l_n[ids]
        dst = _expand(self.l_dst[ids], n, self.index)
        if kind == REDUCE:
            ia = _expand(self.l_a[ids], n, self.index)
            ib = _expand(self.l_b[ids], n, self.index)
            done = final.take(ia) | final.take(ib)
            if done.any():
                self.fail(self.first_bad(done, ids, n), "reduces a value that is already final")
            out, twice = eng.combine(eng.get(values, ia), eng.get(values, ib))
            if twice is not None and twice.any():
                self.fail(self.first_bad(twice, ids, n), eng.twice)
            eng.put(values, dst, out)
            np.put(final, dst, False)
        elif kind == COPY:
            src = _expand(self.l_a[ids], n, self.index)
            new, flags = eng.get(values, src), final.take(src)
            eng.put(values, dst, new)
            np.put(final, dst, flags)
        else:
            if final.take(dst).any():
                self.fail(self.first_bad(final.take(dst), ids, n), "FINAL applied twice to one element")
            partial = ~eng.complete(eng.get(values, dst))
            if partial.any():
                self.fail(self.first_bad(partial, ids, n), "FINAL on elements not yet fully reduced")
            np.put(final, dst, True)

    def check_outputs(self):
        f, eng = self.f, self.eng
        out_size = self.sizes[OUT]
        idx = _expand(self.base[OUT], out_size, self.index)
        ends = np.cumsum(out_size)
        for mask, text in ((eng.complete(eng.get(self.values, idx)),
                            f"of {f.count} is not the reduction of every rank's contribution"),
                           (self.final.take(idx), "never had FINAL applied")):
            if not mask.all():
                k = int(np.flatnonzero(~mask)[0])
                rank = int(np.searchsorted(ends, k, side="right"))
                element = k - int(ends[rank] - out_size[rank])
                raise AssertionError(f"{f.algorithm} ({self.mode}): rank {rank} element {element} {text}")


def verify_count(ranks, count):
    """A small count with the plan's structure: every rank's chunk non-empty where possible,
    uneven splits, and work bounded at large worlds (about 4 Mi symbolic elements per buffer
    over all ranks: 2,051 elements at 1,024 ranks, 64 at 65,536)."""
    if ranks <= EXACT_LIMIT:
        return min(count, 3 * ranks + 2)
    return max(1, min(count, 2 * ranks + 3, VERIFY_ELEMENTS // ranks))


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
    vcount = verify_count(ranks, count)
    reuse = verify_data and vcount == count
    flat = _Flat(plans, ops=reuse)
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
        if not reuse:
            del flat
            flat = _Flat(build_plans(algorithm, ranks, vcount, itemsize, topology, **options), ops=True)
        try:
            result.verify_mode = verify(None, in_place=False, flat=flat)
            verify(None, in_place=True, flat=flat)
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
    p.add_argument("-e", "--maxbytes", default=None, help="largest size (default 64M; 16M with --calibrate)")
    p.add_argument("-f", "--stepfactor", type=float, default=4)
    p.add_argument("--alpha", type=float, default=15e-6)
    p.add_argument("--beta", type=float, default=1 / 2.0e9)
    p.add_argument("--gamma", type=float, default=1 / 6.0e9)
    p.add_argument("--topology", default=None, help="nodes=COUNTxK,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--plot")
    p.add_argument("--timeline", help="draw the schedule of the first algorithm at the smallest size")
    p.add_argument("--calibrate", action="store_true", help="under mpiexec: fit alpha, beta, gamma here")
    p.add_argument("--scale-check", action="store_true",
                   help="time simulate() for every algorithm at 1024 ranks and the logarithmic ones at 65536")
    p.add_argument("--scale-bytes", default="1M", help="message size for --scale-check (default 1M)")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
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


def scale_check(names=None, nbytes=1 << 20, alpha=15e-6, beta=1 / 2.0e9, gamma=1 / 6.0e9, small=1024,
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
