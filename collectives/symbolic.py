"""The symbolic check: every element of every rank ends reduced from every rank exactly once.

``verify_plans(plans)`` runs all ranks' plans on symbolic data. Each rank's input elements
carry the set of ranks they stand for, reductions take the union and fail on overlap
(double counting), and every element of every rank's output must end with all ranks, FINAL
applied exactly once, out of place and in place (IN aliased to OUT). Worlds of up to
``EXACT_LIMIT`` ranks use exact sets (bitsets of ceil(p/64) words); larger ones a
fingerprint (the sum mod 2^64 of a random odd 64-bit weight per rank), which misses an error
with probability ~2^-64. Any broken rule raises ``collectives.PlanError`` naming the rank,
step, buffer and element: a region outside its buffer (scratch past ``tmp_count``), a write
to IN, a message whose sizes differ or that never matches, a deadlock (the ranks waiting on
each other), an element reduced twice or never, FINAL missing or doubled, and, in place, IN
read after the same element of OUT was written.
"""
import numpy as np

from ._static import StaticChecks
from .atoms import real_element
from ._symbols import _ENGINES, _Exact, _Fingerprint, _expand
from .flat import _Flat
from .plan import BUFFER_NAMES, COPY, FINAL, IN, OUT, REDUCE, TMP, PlanError, copy_is_noop

# All ranks' buffers live in one flat array of symbolic elements (``_symbols``). The check runs
# in waves: every rank that has reached a step posts its sends (a snapshot of the regions, as a
# real send reads them), then every rank whose receives have all been posted completes its step:
# receives land, local operations run in order. A wave is a handful of numpy operations over
# all the ranks that move in it, so a world in lock step costs one wave per step.
EXACT_LIMIT = 128
VERIFY_ELEMENTS = 1 << 22  # symbolic elements per buffer, summed over ranks, in large worlds


def _ranges(lo, hi):
    return _expand(lo, hi - lo)


def verify_plans(plans, in_place=False, engine=None, flat=None):
    """Raise PlanError naming the first violation; return the engine's name when clean.

    ``engine`` is "exact" (bitsets) or "fingerprint"; by default exact up to ``EXACT_LIMIT``
    ranks. ``flat`` is ``_Flat(plans, ops=True)`` when the caller already has it."""
    f = flat if flat is not None else _Flat(plans, ops=True)
    if engine is None:
        engine = "exact" if f.p <= EXACT_LIMIT else "fingerprint"
    eng = _ENGINES[engine](f.p) if isinstance(engine, str) else engine
    return _Verifier(f, eng, in_place).run()


def verify_count(ranks, count):
    """A small count with the plan's structure: every rank's chunk non-empty where possible,
    uneven splits, and work bounded at large worlds (about 4 Mi symbolic elements per buffer
    over all ranks: 2,051 elements at 1,024 ranks, 64 at 65,536)."""
    if ranks <= EXACT_LIMIT:
        return min(count, 3 * ranks + 2)
    return max(1, min(count, 2 * ranks + 3, VERIFY_ELEMENTS // ranks))


def _buffer_name(code):
    return BUFFER_NAMES[code] if 0 <= code <= 2 else f"buffer {code}"


class _Verifier(StaticChecks):
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
    def error(self, what, rank=None, g=None, buffer=None, element=None):
        f = self.f
        if element is not None and buffer is not None and hasattr(f, "bounds"):  # atoms: the real element
            element = real_element(f, _buffer_name(int(buffer)), int(element))
        if g is not None:
            rank = int(f.step_rank[g])
        return PlanError(what, f.algorithm, f.p, f.count, self.mode, rank,
                         None if g is None else f.local_step(g) + 1,
                         None if rank is None else int(f.nsteps[rank]),
                         None if buffer is None else _buffer_name(int(buffer)),
                         None if element is None else int(element))

    def fail(self, g, what, buffer=None, element=None):
        raise self.error(what, g=int(g), buffer=buffer, element=element)

    def fail_at(self, mask, ids, n, bufs, los, what):
        """Fail at the first element set in ``mask`` over the regions of ``ids`` (lengths ``n``,
        buffers ``bufs``, offsets ``los``, one per id), naming its step, buffer and element."""
        k = int(np.flatnonzero(mask)[0])
        ends = np.cumsum(n)
        j = int(np.searchsorted(ends, k, side="right"))
        offset = k - int(ends[j] - n[j])
        self.fail(self.step_of[ids[j]], what, int(bufs[j]), int(los[j]) + offset)

    def who(self, value):
        """Ranks missing from (or counted twice in) an exact bitset, as text."""
        if not isinstance(self.eng, _Exact):
            return "some rank"
        bits = [64 * w + b for w in range(value.shape[-1]) for b in range(64) if int(value[w]) >> b & 1]
        shown = ", ".join(map(str, bits[:6])) + (" ..." if len(bits) > 6 else "")
        return f"rank{'s' if len(bits) > 1 else ''} {shown}"

    # the run ------------------------------------------------------------------------------
    def run(self):
        f, eng = self.f, self.eng
        p = f.p
        self.static_checks()
        self.step_of = f.l_step
        values = eng.zeros(self.total)
        final = np.zeros(self.total, bool)
        inputs = _expand(self.base[IN], f.in_count, self.index)
        eng.inputs(values, inputs, np.repeat(np.arange(p, dtype=np.int64), f.in_count))
        del inputs
        self.values, self.final = values, final
        # in place, IN and OUT are one buffer: remember which elements were written
        self.written = np.zeros(self.total, bool) if self.in_place else None
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
                    if self.written is not None:
                        self.check_in_reads(ids)
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
            raise self.deadlock(active, cur)
        lost = np.flatnonzero(f.s_match < 0)
        if lost.size:
            i = int(lost[0])
            n = int(getattr(f, "real", f).s_len[i])  # on atoms, the real length
            self.fail(f.s_step[i], f"sends {n} elements to rank {int(f.s_peer[i])} on channel "
                                   f"{int(f.s_chan[i])}, a message rank {int(f.s_peer[i])} never receives",
                      f.s_buf[i], f.s_lo[i])
        self.check_outputs()
        return eng.name

    def deadlock(self, active, cur):
        """The ranks waiting on each other: follow each stuck rank to the sender it waits for."""
        f = self.f
        waits = {}
        for r in active.tolist():
            g = int(cur[r])
            for j in range(int(f.rs[g]), int(f.rs[g + 1])):
                m = int(f.r_match[j])
                if m < 0:
                    n = int(getattr(f, "real", f).r_len[j])  # on atoms, the real length
                    return self.error(f"receives {n} elements from rank {int(f.r_peer[j])} on "
                                      f"channel {int(f.r_chan[j])}, a message rank {int(f.r_peer[j])} never "
                                      f"sends: it waits forever", g=g, buffer=f.r_buf[j], element=f.r_lo[j])
                if cur[f.s_rank[m]] < f.s_step[m]:
                    waits[r] = (int(f.s_rank[m]), int(f.s_step[m]), int(f.r_chan[j]))
                    break
        r = int(active[0])
        chain = []
        while r in waits and r not in chain:
            chain.append(r)
            r = waits[r][0]
        cycle = chain[chain.index(r):] if r in chain else chain
        parts = []
        for q in cycle:
            sender, sstep, chan = waits[q]
            parts.append(f"rank {q} at step {f.local_step(int(cur[q])) + 1} waits for rank {sender}'s message "
                         f"of its step {f.local_step(sstep) + 1} (channel {chan})")
        ring = " -> ".join(map(str, cycle + cycle[:1]))
        return self.error(f"deadlock: ranks {ring} wait on each other: " + "; ".join(parts),
                          g=int(cur[cycle[0]]) if cycle else None)

    def check_in_reads(self, ids, local=False):
        """In place: IN read where OUT was already written (send regions, or operands of ops)."""
        f = self.f
        if not local:
            sel = ids[f.s_buf[ids] == IN]
            if sel.size:
                n = f.s_len[sel]
                bad = self.written.take(_expand(self.s_addr[sel], n, self.index))
                if bad.any():
                    self.step_of = f.s_step
                    self.fail_at(bad, sel, n, f.s_buf[sel], f.s_lo[sel],
                                 "sends IN after OUT was written there (in place IN is OUT)")
                    self.step_of = f.l_step
            return
        kind = f.l_kind[ids]
        noop = (kind == COPY) & copy_is_noop((COPY, f.l_dst[ids], f.l_dlo[ids], f.l_a[ids], f.l_alo[ids], None), True)
        for code, addr, lo in ((f.l_a, self.l_a, f.l_alo), (f.l_b, self.l_b, f.l_blo)):
            sel = ids[(code[ids] == IN) & (kind != FINAL) & ~noop]
            if sel.size:
                n = f.l_n[sel]
                bad = self.written.take(_expand(addr[sel], n, self.index))
                if bad.any():
                    self.fail_at(bad, sel, n, code[sel], lo[sel],
                                 "reads IN after OUT was written there (in place IN is OUT)")

    def receive(self, rids, chunks, s_chunk, s_off):
        f, eng = self.f, self.eng
        m = f.r_match[rids]
        lens = f.r_len[rids]
        which = s_chunk[m]
        waves = which[:1] if which.min() == which.max() else np.unique(which)
        for c in waves.tolist():
            sel = slice(None) if len(waves) == 1 else np.flatnonzero(which == c)
            here = _expand(self.r_addr[rids[sel]], lens[sel], self.index)
            chunk = chunks[c]
            src = _expand(s_off[m[sel]], lens[sel], self.index)
            eng.put(self.values, here, eng.get(chunk[0], src))
            np.put(self.final, here, chunk[1].take(src))
            if self.written is not None:
                self.written[here] = True
            chunk[2] -= len(m) if len(waves) == 1 else len(sel)
            if chunk[2] == 0:
                del chunks[c]

    def local(self, lids, lstart, counts):
        """Run the local operations of the steps that complete, position by position (a step
        with many operations runs alone, its accumulating chains folded in one go)."""
        kinds = self.f.l_kind
        long = np.flatnonzero(counts > 16)
        if long.size:
            for i in long.tolist():
                self.long_step(np.arange(lstart[i], lstart[i] + counts[i]))
            keep = np.repeat(counts <= 16, counts)
            lids, lstart, counts = lids[keep], lstart[counts <= 16], counts[counts <= 16]
            if not lids.size:
                return
        deepest = int(counts.max())
        if deepest == 1:
            groups = [lids]
        else:
            pos = lids - np.repeat(lstart, counts)
            order = np.argsort(pos, kind="stable")
            groups = np.split(lids[order], np.cumsum(np.bincount(pos, minlength=deepest))[:-1])
        for ids in groups:
            if self.written is not None:
                self.check_in_reads(ids, local=True)
            k = kinds[ids]
            if (k == k[0]).all():
                self.apply(int(k[0]), ids)
            else:
                for kind in (REDUCE, COPY, FINAL):
                    sub = ids[k == kind]
                    if sub.size:
                        self.apply(kind, sub)

    def long_step(self, ids):
        """One rank's step of many operations, in order; a run of ``dst = dst op b`` on one
        region (an accumulator) is folded at once."""
        f = self.f
        kind, dst, dlo, n = f.l_kind[ids], f.l_dst[ids], f.l_dlo[ids], f.l_n[ids]
        cont = np.zeros(len(ids), bool)
        cont[1:] = ((kind[1:] == REDUCE) & (f.l_a[ids[1:]] == dst[1:]) & (f.l_alo[ids[1:]] == dlo[1:])
                    & (dst[1:] == dst[:-1]) & (dlo[1:] == dlo[:-1]) & (n[1:] == n[:-1]))
        b, blo = f.l_b[ids], f.l_blo[ids]
        cont &= (b != dst) | (blo + n <= dlo) | (dlo + n <= blo)  # b never overlaps the accumulator
        heads = np.flatnonzero(~cont).tolist() + [len(ids)]
        for h, nxt in zip(heads[:-1], heads[1:]):
            head = ids[h:h + 1]
            if self.written is not None:
                self.check_in_reads(head, local=True)
            self.apply(int(kind[h]), head)
            if nxt > h + 1:
                self.fold(ids[h + 1:nxt])

    def fold(self, run):
        f, eng = self.f, self.eng
        if self.written is not None:
            self.check_in_reads(run, local=True)
        n = int(f.l_n[run[0]])
        acc = np.arange(n, dtype=self.index) + self.l_dst[run[0]]
        idx = _expand(self.l_b[run], f.l_n[run], self.index)
        result, bad = eng.fold(eng.get(self.values, acc), eng.get(self.values, idx).reshape((len(run), n) + (
            () if isinstance(eng, _Fingerprint) else (-1,))))
        if bad is not None and bad.any() or self.final.take(idx).any():
            for op in run:  # replay one by one: the first broken one raises with its place
                self.apply(REDUCE, run[op == run])
        eng.put(self.values, acc, result)
        np.put(self.final, acc, False)
        if self.written is not None:
            self.written[acc] = True

    def apply(self, kind, ids):
        f, eng, values, final = self.f, self.eng, self.values, self.final
        n = f.l_n[ids]
        dst = _expand(self.l_dst[ids], n, self.index)
        if kind == REDUCE:
            ia = _expand(self.l_a[ids], n, self.index)
            ib = _expand(self.l_b[ids], n, self.index)
            fa, fb = final.take(ia), final.take(ib)
            for mask, code, lo in ((fa, f.l_a, f.l_alo), (fb, f.l_b, f.l_blo)):
                if mask.any():
                    self.fail_at(mask, ids, n, code[ids], lo[ids], "reduces a value that is already FINAL")
            a, b = eng.get(values, ia), eng.get(values, ib)
            out, twice = eng.combine(a, b)
            if twice is not None and twice.any():
                k = int(np.flatnonzero(twice)[0])
                self.fail_at(twice, ids, n, f.l_dst[ids], f.l_dlo[ids],
                             f"the element is reduced twice: this REDUCE counts the contribution of "
                             f"{self.who(a[k] & b[k])} twice")
            eng.put(values, dst, out)
            np.put(final, dst, False)
        elif kind == COPY:
            src = _expand(self.l_a[ids], n, self.index)
            new, flags = eng.get(values, src), final.take(src)
            eng.put(values, dst, new)
            np.put(final, dst, flags)
        else:
            twice = final.take(dst)
            if twice.any():
                self.fail_at(twice, ids, n, f.l_dst[ids], f.l_dlo[ids], "FINAL applied twice to the element")
            partial = ~eng.complete(eng.get(values, dst))
            if partial.any():
                self.fail_at(partial, ids, n, f.l_dst[ids], f.l_dlo[ids],
                             "FINAL on an element not yet reduced from every rank")
            np.put(final, dst, True)
        if self.written is not None:
            if kind == COPY:  # in place, an OUT <- IN copy at one offset is skipped: nothing written
                f = self.f
                keep = ~copy_is_noop((COPY, f.l_dst[ids], f.l_dlo[ids], f.l_a[ids], f.l_alo[ids], None), True)
                dst = _expand(self.l_dst[ids[keep]], n[keep], self.index)
            self.written[dst] = True

    def check_outputs(self):
        f, eng = self.f, self.eng
        out_size = self.sizes[OUT]
        idx = _expand(self.base[OUT], out_size, self.index)
        ends = np.cumsum(out_size)
        values = eng.get(self.values, idx)
        complete = eng.complete(values)
        for mask, text in ((complete, "the element is never fully reduced: it misses some rank's contribution"),
                           (self.final.take(idx), "FINAL is never applied to the element")):
            if not mask.all():
                k = int(np.flatnonzero(~mask)[0])
                rank = int(np.searchsorted(ends, k, side="right"))
                element = k - int(ends[rank] - out_size[rank])
                if mask is complete and isinstance(eng, _Exact):
                    text = (f"the element is never fully reduced: it misses the contribution of "
                            f"{self.who(~values[k] & eng.full)}")
                raise self.error(text, rank=rank, buffer=OUT, element=element)
