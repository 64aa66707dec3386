"""Every rank's plan at once: built with the algorithm's own ``build`` (or its ``build_all``,
the same entries as numpy columns), flattened into arrays.

The timing model (``collectives.simulate``) and the symbolic check (``collectives.symbolic``)
both read the plans of all ranks as flat numpy arrays: steps numbered globally, messages in
post order with their matching message on the other side, local operations.
"""
import operator
from itertools import chain

import numpy as np

from .plan import COPY, FINAL, REDUCE, PlanError, ranks_by_group

_registry = __import__("importlib").import_module("collectives.algorithms")


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


class Plans:
    """Every rank's plans of one algorithm (options resolved once) at any element count, flattened:
    from the algorithm's ``build_all`` (every rank's entries as columns,
    ``collectives.algorithms._bulk``) where it has one for the case, else from the plans."""

    def __init__(self, algorithm, ranks, itemsize=4, topology=None, **options):
        self.module = algorithm_module(algorithm)
        self.ranks, self.itemsize = ranks, itemsize
        self.params = _params(self.module, ranks, options, topology)
        self._steps = {}

    def rank0_steps(self, count):
        """The number of steps of rank 0's plan at ``count`` elements (its plan built once)."""
        if count not in self._steps:
            self._steps[count] = len(self.module.build(0, self.ranks, count, itemsize=self.itemsize,
                                                       **self.params).steps)
        return self._steps[count]

    def flat(self, count, ops=False):
        """``_Flat(plans, ops)``; ``ops`` may be a callable of rank 0's step count."""
        bulk = getattr(self.module, "build_all", None)
        columns = None if bulk is None else bulk(self.ranks, count, itemsize=self.itemsize, **self.params)
        if columns is not None:
            flat = _Flat.from_columns(columns, ops(int(columns.nsteps[0])) if callable(ops) else ops)
            for rank in sorted({0, 1, self.ranks // 2, self.ranks - 1}):  # build_all against build, spot-checked
                plan = self.module.build(rank, self.ranks, count, itemsize=self.itemsize, **self.params)
                if not flat.holds(rank, plan):
                    raise RuntimeError(f"{flat.algorithm}: build_all differs from build at rank {rank} of "
                                       f"{self.ranks}, count {count}")
            return flat
        plans = [self.module.build(r, self.ranks, count, itemsize=self.itemsize, **self.params)
                 for r in range(self.ranks)]
        return _Flat(plans, ops(len(plans[0].steps) if plans else 0) if callable(ops) else ops)


# flat plans ------------------------------------------------------------------------------
# The timing model and the symbolic check both run on every rank's plan at once. The plans
# (built by the algorithms' own ``build``) are flattened once into arrays: steps numbered
# globally (rank r's step s is ``start[r] + s``, with one unused number between ranks),
# messages in post order with their matching message on the other side, local operations.
_first, _last = operator.itemgetter(0), operator.itemgetter(-1)


def _decode(local, full):
    """Columns of local operations (plan entries): kind, dst, dlo, a, alo, b, blo, n, with a for
    REDUCE and COPY and b for REDUCE only (0 elsewhere); the middle six None unless ``full``."""
    nops = len(local)
    if not full:
        return [np.fromiter(map(_first, local), np.int64, nops)] + [None] * 6 + [
            np.fromiter(map(_last, local), np.int64, nops)]
    lens = np.fromiter(map(len, local), np.int64, nops)
    values = np.fromiter(chain.from_iterable(local), np.int64, int(lens.sum()))
    if nops and (lens == 8).all():
        L = values.reshape(-1, 8)
    else:  # FINAL (4) and COPY (6) rows padded to 8 columns with zeros
        L = np.zeros((nops, 8), np.int64)
        L[np.repeat(np.arange(nops), lens), np.arange(len(values)) - np.repeat(np.cumsum(lens) - lens, lens)] = values
    kind = L[:, 0].copy()
    return [kind, L[:, 1].copy(), L[:, 2].copy(), np.where(kind == FINAL, 0, L[:, 3]),
            np.where(kind == FINAL, 0, L[:, 4]), np.where(kind == REDUCE, L[:, 5], 0),
            np.where(kind == REDUCE, L[:, 6], 0),
            np.where(kind == REDUCE, L[:, 7], np.where(kind == COPY, L[:, 5], L[:, 3]))]


class _Flat:
    """Every rank's plan as flat arrays (see the comment above)."""

    def __init__(self, plans, ops=False):
        p = len(plans)
        nsteps = np.fromiter((len(plan.steps) for plan in plans), np.int64, p)
        counts = [np.fromiter((getattr(plan, name) for plan in plans), np.int64, p)
                  for name in ("in_count", "out_count", "tmp_count")]
        # every rank's steps in one sequence, taken apart once (no loop over ranks)
        steps = list(chain.from_iterable(plan.steps for plan in plans))
        n_real = len(steps)
        s_, r_, l_ = zip(*steps) if steps else ((), (), ())
        del steps
        per_step = [np.fromiter(map(len, parts), np.int64, n_real) for parts in (s_, r_, l_)]
        nsend, nrecv = int(per_step[0].sum()), int(per_step[1].sum())
        S = np.fromiter(chain.from_iterable(chain.from_iterable(s_)), np.int64, 5 * nsend).reshape(-1, 5)
        del s_
        R = np.fromiter(chain.from_iterable(chain.from_iterable(r_)), np.int64, 5 * nrecv).reshape(-1, 5)
        del r_
        local = list(chain.from_iterable(l_))
        del l_
        columns = _decode(local, ops)
        del local
        self._fill(p, plans[0].algorithm if plans else "", plans[0].count if plans else 0, nsteps, counts,
                   per_step, S.T.copy(), R.T.copy(), columns)  # rows: contiguous

    @classmethod
    def from_columns(cls, c, ops=False):
        """From ``collectives.algorithms._bulk.Columns`` (finished): the arrays the plans would give."""
        self = cls.__new__(cls)
        local = c.local if ops else [c.local[0]] + [None] * 6 + [c.local[7]]
        self._fill(c.p, c.algorithm, c.count, c.nsteps, (c.in_count, c.out_count, c.tmp_count), c.per_step,
                   c.sends, c.recvs, local)
        return self

    def _fill(self, p, algorithm, count, nsteps, counts, per_step, S, R, ops):
        """``per_step``: sends, receives and local operations per real step (ranks in order);
        ``S``, ``R``: the messages' five columns; ``ops``: the operations' eight (kind, dst, dlo, a,
        alo, b, blo, n), the middle six None when only kind and n are kept."""
        self.p, self.algorithm, self.count = p, algorithm, count
        start = np.zeros(p + 1, np.int64)
        np.cumsum(nsteps + 1, out=start[1:])
        self.nsteps, self.start = nsteps, start
        self.in_count, self.out_count, self.tmp_count = counts
        G = int(start[-1])
        self.steps_total = G
        self.step_rank = np.repeat(np.arange(p, dtype=np.int64), nsteps + 1)
        # rank r's step s is numbered start[r] + s = (steps before rank r) + r + s
        n_real = int(nsteps.sum())
        at = np.arange(n_real, dtype=np.int64) + np.repeat(np.arange(p, dtype=np.int64), nsteps)

        def offsets(n):
            counts = np.zeros(G, np.int64)
            counts[at] = n
            out = np.zeros(G + 1, np.int64)
            np.cumsum(counts, out=out[1:])
            return out

        self.ss, self.rs, self.ls = (offsets(n) for n in per_step)
        del at
        gid = np.arange(G, dtype=np.int64)
        self.s_step = np.repeat(gid, np.diff(self.ss))
        self.r_step = np.repeat(gid, np.diff(self.rs))
        self.s_rank = self.step_rank[self.s_step]
        self.r_rank = self.step_rank[self.r_step]
        self.s_peer, self.s_buf, self.s_lo, self.s_hi, self.s_chan = S
        self.r_peer, self.r_buf, self.r_lo, self.r_hi, self.r_chan = R
        del S, R
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
        self.l_step = np.repeat(gid, np.diff(self.ls))
        self.l_kind, self.l_n = ops[0], ops[7]
        if ops[1] is not None:
            self.l_dst, self.l_dlo, self.l_a, self.l_alo, self.l_b, self.l_blo = ops[1:7]
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

    def holds(self, rank, plan):
        """Whether ``rank``'s rows are ``plan``'s entries: its counts, every message, and the kind and
        length of every local operation (tests/test_bulk.py compares every field)."""
        g, n = int(self.start[rank]), int(self.nsteps[rank])
        steps = plan.steps
        if len(steps) != n or (plan.in_count, plan.out_count, plan.tmp_count) != (
                self.in_count[rank], self.out_count[rank], self.tmp_count[rank]):
            return False
        for part, offsets, columns in ((0, self.ss, "s_peer s_buf s_lo s_hi s_chan"),
                                       (1, self.rs, "r_peer r_buf r_lo r_hi r_chan"),
                                       (2, self.ls, "l_kind l_n")):
            counts = np.fromiter((len(step[part]) for step in steps), np.int64, n)
            if not np.array_equal(np.diff(offsets[g:g + n + 1]), counts):
                return False
            entries = list(chain.from_iterable(step[part] for step in steps))
            lo, hi = int(offsets[g]), int(offsets[g + n])
            mine = [getattr(self, name)[lo:hi] for name in columns.split()]
            if part == 2:
                theirs = [c for c in _decode(entries, False) if c is not None]
            else:
                theirs = np.fromiter(chain.from_iterable(entries), np.int64, 5 * len(entries)).reshape(-1, 5).T
            if not all(np.array_equal(a, b) for a, b in zip(mine, theirs)):
                return False
        return True

    def local_step(self, g):
        return int(g - self.start[self.step_rank[g]])

    def per_rank(self, rank_of, values):
        """Sum of ``values`` per rank, for items sorted by rank (exact integers)."""
        bounds = np.searchsorted(rank_of, np.arange(self.p + 1))
        total = np.zeros(len(values) + 1, np.int64)
        np.cumsum(values, out=total[1:])
        return (total[bounds[1:]] - total[bounds[:-1]]).tolist()

