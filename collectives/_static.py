"""The plan rules that need no data: regions inside their buffers, IN never written, message
sizes that agree, no step sending a region it receives into. A mixin of the symbolic check."""
import numpy as np

from .plan import BUFFER_NAMES, FINAL, IN, OUT, REDUCE, TMP


class StaticChecks:
    """Needs ``f`` (flat plans), ``sizes``, ``base``, ``index``, ``in_place`` and ``fail``."""

    def addresses(self, rank, buf, lo, n, steps, what):
        """Flat addresses of regions, after checking that each lies inside its buffer."""
        if len(buf) == 0:
            return buf.astype(self.index)
        badbuf = (buf < 0) | (buf > 2)
        if badbuf.any():
            k = int(np.flatnonzero(badbuf)[0])
            self.fail(steps[k], f"{what} names buffer {int(buf[k])} (valid: IN=0, OUT=1, TMP=2)")
        size = self.sizes[buf, rank]
        outside = (lo < 0) | (n < 0) | (lo + n > size)
        if outside.any():
            k = int(np.flatnonzero(outside)[0])
            name = BUFFER_NAMES[buf[k]]
            region = f"{what} {name.upper()}[{int(lo[k])}:{int(lo[k] + n[k])}]"
            if buf[k] == TMP:
                detail = f"scratch used past its size: the plan's tmp_count is {int(self.f.tmp_count[rank[k]])}"
            else:
                detail = f"outside the {int(size[k])} elements of {name.upper()}"
            self.fail(steps[k], f"{region}: {detail}", buf[k], max(int(lo[k]), min(int(lo[k] + n[k]), int(size[k]))))
        return (self.base[buf, rank] + lo).astype(self.index)

    def passed(self):
        """True when these plans (or the real plans these atoms cut, alike in every rule here)
        already passed the checks in this mode, or out of place with IN and OUT of one size
        everywhere and no region sent and received in one step even in place (then the in
        place rules add nothing)."""
        real = getattr(self.f, "real", self.f)
        done = getattr(real, "static_passed", ())
        if self.in_place in done:
            return True
        return self.in_place and False in done and getattr(real, "overlap_free", False) and bool(
            np.array_equal(real.in_count, real.out_count))

    def static_checks(self):
        f = self.f
        if self.passed():  # only the addresses
            address = lambda rank, buf, lo: (self.base[buf, rank] + lo).astype(self.index)  # noqa: E731
            self.s_addr, self.r_addr = address(f.s_rank, f.s_buf, f.s_lo), address(f.r_rank, f.r_buf, f.r_lo)
            l_rank = f.step_rank[f.l_step]
            self.l_dst = address(l_rank, f.l_dst, f.l_dlo)
            self.l_a = address(l_rank, f.l_a, f.l_alo)
            self.l_b = address(l_rank, f.l_b, f.l_blo)
            return
        self.all_checks()
        if not hasattr(f, "real"):
            f.static_passed = getattr(f, "static_passed", ()) + (self.in_place,)

    def all_checks(self):
        f = self.f
        self.s_addr = self.addresses(f.s_rank, f.s_buf, f.s_lo, f.s_len, f.s_step, "sends")
        self.r_addr = self.addresses(f.r_rank, f.r_buf, f.r_lo, f.r_len, f.r_step, "receives into")
        into_in = np.flatnonzero(f.r_buf == IN)
        if into_in.size:
            j = into_in[0]
            self.fail(f.r_step[j], "receives into IN (IN is never written)", IN, f.r_lo[j])
        ok = f.r_match >= 0
        wrong = np.flatnonzero(ok & (f.s_len[np.where(ok, f.r_match, 0)] != f.r_len))
        if wrong.size:
            j = int(wrong[0])
            self.fail(f.r_step[j], f"the message from rank {int(f.r_peer[j])} (channel {int(f.r_chan[j])}) has "
                                   f"{int(f.s_len[f.r_match[j]])} elements, this receive expects {int(f.r_len[j])}",
                      f.r_buf[j], f.r_lo[j])
        self.overlap_check()
        kind = f.l_kind
        unknown = np.flatnonzero((kind < REDUCE) | (kind > FINAL))
        if unknown.size:
            self.fail(f.l_step[unknown[0]], f"unknown local operation {int(kind[unknown[0]])}")
        writes_in = np.flatnonzero((kind != FINAL) & (f.l_dst == IN))
        if writes_in.size:
            k = writes_in[0]
            self.fail(f.l_step[k], f"{'REDUCE' if kind[k] == REDUCE else 'COPY'} writes IN (IN is never written)",
                      IN, f.l_dlo[k])
        final_ok = (f.l_dst == OUT) | ((f.l_dst == IN) & self.in_place)
        bad_final = np.flatnonzero((kind == FINAL) & ~final_ok)
        if bad_final.size:
            k = int(bad_final[0])
            self.fail(f.l_step[k], "FINAL outside OUT", f.l_dst[k], f.l_dlo[k])
        l_rank = f.step_rank[f.l_step]
        self.l_dst = self.addresses(l_rank, f.l_dst, f.l_dlo, f.l_n, f.l_step, "writes")
        self.l_a = self.addresses(l_rank, f.l_a, f.l_alo, np.where(kind == FINAL, 0, f.l_n), f.l_step, "reads")
        self.l_b = self.addresses(l_rank, f.l_b, f.l_blo, np.where(kind == REDUCE, f.l_n, 0), f.l_step, "reads")

    def overlap_check(self):
        """No step sends a region it receives into (IN and OUT are one buffer in place). Plans
        clean in place are clean out of place too (IN and OUT apart only split the regions):
        that is found once per plans and kept on them (atoms share it: they cut alike)."""
        f = self.f
        if not len(f.s_step) or not len(f.r_step):
            return
        real = getattr(f, "real", f)
        if getattr(real, "overlap_free", False):
            return
        if self.first_overlap(True) is None:
            real.overlap_free = True
            return
        hit = self.first_overlap(self.in_place)
        if hit is not None:
            step, buf, at = hit
            self.fail(step, "sends a region it receives into in the same step", buf, at)

    def first_overlap(self, in_place):
        """(step, buffer, offset) of the first region sent and received in one step, or None."""
        f = self.f
        cls = lambda b: np.where(b == IN, OUT, b) if in_place else b  # noqa: E731
        nsend, nrecv = np.diff(f.ss), np.diff(f.rs)
        if nsend.max(initial=0) <= 1 and nrecv.max(initial=0) <= 1:  # one region of each: compare directly
            both = np.flatnonzero((nsend == 1) & (nrecv == 1))
            s, r = f.ss[both], f.rs[both]
            a, b, c, d = f.s_lo[s], f.s_hi[s], f.r_lo[r], f.r_hi[r]
            if not ((cls(f.s_buf[s]) == cls(f.r_buf[r])) & (((a <= c) & (b > c)) | ((c < a) & (d > a)))).any():
                return None  # else the general search below finds the same first one
        # intervals on a line: step, then buffer, then the element offset
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
                if i < len(f.s_step):
                    return f.s_step[i], f.s_buf[i], f.s_lo[i]
                j = i - len(f.s_step)
                return f.r_step[j], f.r_buf[j], f.r_lo[j]
        return None
