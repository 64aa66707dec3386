"""Every rank's plan at once: built with the algorithm's own ``build``, flattened into arrays.

The timing model (``collectives.simulator``) and the symbolic check (``collectives.symbolic``)
both read the plans of all ranks as flat numpy arrays: steps numbered globally, messages in
post order with their matching message on the other side, local operations.
"""
import operator
from itertools import chain

import numpy as np

from .columns import element_counts
from .plan import FINAL, REDUCE, PlanError, ranks_by_group

from . import algorithms as _registry


def algorithm_module(algorithm):
    """The algorithm object for a registered name, or ``algorithm`` itself (module, class or
    instance with NAME, OPTIONS, build and cost)."""
    if isinstance(algorithm, str):
        return _registry.get(algorithm)
    return algorithm


def _hosts(ranks, topology):
    """The ranks of each node of a simulated ``topology`` (None: one node)."""
    if topology is None:
        return (tuple(range(ranks)),)
    return ranks_by_group(topology.nodes(ranks).tolist())


def _params(module, ranks, options, topology):
    return _registry.resolve(module, options, lambda: _hosts(ranks, topology), ranks)[1]


def build_plan(algorithm, rank, ranks, count, itemsize=4, topology=None, **options):
    """One rank's plan, with the options resolved as ``build_plans`` does."""
    module = algorithm_module(algorithm)
    return module.build(rank, ranks, count, itemsize=itemsize, **_params(module, ranks, options, topology))


def build_plans(algorithm, ranks, count, itemsize=4, topology=None, **options):
    module = algorithm_module(algorithm)
    params = _params(module, ranks, options, topology)
    return [module.build(r, ranks, count, itemsize=itemsize, **params) for r in range(ranks)]


# flat plans ------------------------------------------------------------------------------
# The timing model and the symbolic check both run on every rank's plan at once. The plans
# (built by the algorithms' own ``build``) are flattened once into arrays: steps numbered
# globally (rank r's step s is ``start[r] + s``, with one unused number between ranks),
# messages in post order with their matching message on the other side, local operations.
_first, _last = operator.itemgetter(0), operator.itemgetter(-1)


class _Flat:
    """Every rank's plan as flat arrays (see the comment above)."""

    def __init__(self, plans, ops=False):
        p = len(plans)
        self.p = p
        self.algorithm = plans[0].algorithm if plans else ""
        self.count = plans[0].count if plans else 0
        columnar = p > 0 and all(plan.columns is not None for plan in plans)
        nsteps = np.fromiter((plan.nsteps for plan in plans), np.int64, p)
        start = np.zeros(p + 1, np.int64)
        np.cumsum(nsteps + 1, out=start[1:])
        self.nsteps, self.start = nsteps, start
        self.in_count = np.fromiter((plan.in_count for plan in plans), np.int64, p)
        self.out_count = np.fromiter((plan.out_count for plan in plans), np.int64, p)
        self.tmp_count = np.fromiter((plan.tmp_count for plan in plans), np.int64, p)
        G = int(start[-1])
        self.steps_total = G
        self.step_rank = np.repeat(np.arange(p, dtype=np.int64), nsteps + 1)
        gid = np.arange(G, dtype=np.int64)
        if columnar:  # plans stored as columns (collectives.columns): concatenated, no per-entry work
            S, R, L = self._columns(plans, ops)
        else:
            S, R, L = self._tuples(plans, ops, gid)
        self.s_peer, self.s_buf, self.s_lo, self.s_hi, self.s_chan = S.T.copy()  # rows: contiguous
        self.r_peer, self.r_buf, self.r_lo, self.r_hi, self.r_chan = R.T.copy()
        del S, R
        start = self.start
        for peer, rank, step, buf, lo, verb in (
                (self.s_peer, self.s_rank, self.s_step, self.s_buf, self.s_lo, "sends to"),
                (self.r_peer, self.r_rank, self.r_step, self.r_buf, self.r_lo, "receives from")):
            bad = np.flatnonzero((peer < 0) | (peer >= p))
            if bad.size:
                k = int(bad[0])
                r = int(rank[k])
                raise PlanError(f"{verb} rank {int(peer[k])}, out of range (ranks are 0..{p - 1})", self.algorithm,
                                p, self.count, None, r, int(step[k] - start[r]) + 1, int(nsteps[r]),
                                "in out tmp".split()[int(buf[k])] if 0 <= buf[k] <= 2 else None, int(lo[k]))
        self.s_len = self.s_hi - self.s_lo
        self.r_len = self.r_hi - self.r_lo
        if ops:
            kind = L[:, 0]
            self.l_kind = kind.copy()
            self.l_dst, self.l_dlo = L[:, 1].copy(), L[:, 2].copy()
            # operands: a for REDUCE and COPY, b for REDUCE only (0 elsewhere)
            self.l_a = np.where(kind == FINAL, 0, L[:, 3])
            self.l_alo = np.where(kind == FINAL, 0, L[:, 4])
            self.l_b = np.where(kind == REDUCE, L[:, 5], 0)
            self.l_blo = np.where(kind == REDUCE, L[:, 6], 0)
            self.l_n = element_counts(L)
        else:
            self.l_kind, self.l_n = L
        del L
        reduces = self.l_kind == REDUCE
        self.work = np.bincount(self.l_step[reduces], weights=self.l_n[reduces], minlength=G).astype(np.int64)
        self._pair()

    def _columns(self, plans, ops):
        """Sends, receives and local operations of plans stored as columns, steps numbered globally."""
        G = self.steps_total
        first = self.start[:-1]
        cols = [plan.columns for plan in plans]
        tables = []
        for name, rows in (("send_step", "sends"), ("recv_step", "recvs"), ("local_step", "local")):
            steps = [getattr(c, name) for c in cols]
            sizes = np.fromiter(map(len, steps), np.int64, len(steps))
            at = np.concatenate(steps) + np.repeat(first, sizes)
            offsets = np.zeros(G + 1, np.int64)
            np.cumsum(np.bincount(at, minlength=G), out=offsets[1:])
            tables.append((at, offsets, np.concatenate([getattr(c, rows) for c in cols])))
        (self.s_step, self.ss, S), (self.r_step, self.rs, R), (self.l_step, self.ls, L) = tables
        self.s_rank = self.step_rank[self.s_step]
        self.r_rank = self.step_rank[self.r_step]
        if not ops:
            L = L[:, 0].copy(), element_counts(L)
        return S, R, L

    def _tuples(self, plans, ops, gid):
        """Sends, receives and local operations of plans stored as tuples, steps numbered globally."""
        p, G, nsteps = self.p, self.steps_total, self.nsteps
        # every rank's steps in one sequence, taken apart once (no loop over ranks)
        steps = list(chain.from_iterable(plan.steps for plan in plans))
        n_real = len(steps)
        s_, r_, l_ = zip(*steps) if steps else ((), (), ())
        del steps
        # rank r's step s is numbered start[r] + s = (steps before rank r) + r + s
        at = np.arange(n_real, dtype=np.int64) + np.repeat(np.arange(p, dtype=np.int64), nsteps)

        def offsets(parts):
            counts = np.zeros(G, np.int64)
            counts[at] = np.fromiter(map(len, parts), np.int64, n_real)
            out = np.zeros(G + 1, np.int64)
            np.cumsum(counts, out=out[1:])
            return out

        self.ss, self.rs, self.ls = offsets(s_), offsets(r_), offsets(l_)
        del at
        nsend, nrecv = int(self.ss[-1]), int(self.rs[-1])
        S = np.fromiter(chain.from_iterable(chain.from_iterable(s_)), np.int64, 5 * nsend).reshape(-1, 5)
        del s_
        R = np.fromiter(chain.from_iterable(chain.from_iterable(r_)), np.int64, 5 * nrecv).reshape(-1, 5)
        del r_
        local = list(chain.from_iterable(l_))
        del l_
        self.s_step = np.repeat(gid, np.diff(self.ss))
        self.r_step = np.repeat(gid, np.diff(self.rs))
        self.s_rank = self.step_rank[self.s_step]
        self.r_rank = self.step_rank[self.r_step]
        self.l_step = np.repeat(gid, np.diff(self.ls))
        nops = len(local)
        if ops:
            lens = np.fromiter(map(len, local), np.int64, nops)
            values = np.fromiter(chain.from_iterable(local), np.int64, int(lens.sum()))
            if nops and (lens == 8).all():
                return S, R, values.reshape(-1, 8)
            # FINAL (4) and COPY (6) rows padded to 8 columns with zeros
            L = np.zeros((nops, 8), np.int64)
            L[np.repeat(np.arange(nops), lens), np.arange(len(values)) - np.repeat(np.cumsum(lens) - lens, lens)] \
                = values
            return S, R, L
        return S, R, (np.fromiter(map(_first, local), np.int64, nops), np.fromiter(map(_last, local), np.int64, nops))

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

