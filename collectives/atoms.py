"""The symbolic check at the real count, on the plans the timing model already has.

Every region a plan names (a message's elements, a local operation's operands, FINAL) starts
and ends on a boundary; between two neighbouring boundaries every element is treated alike by
every operation, provided that regions moved onto each other (a message's two ends, an
operation's destination and operands) cut the same way. ``atomize`` closes the set of
boundaries under that rule (each region's inner boundaries are carried to its partners until
nothing new appears) and renumbers the plans in atoms: one symbolic element per atom, so the
check of a 64 Mi-element plan whose chunks are atoms costs what a plan of a few thousand
elements does, and is exact for every element. IN and OUT share one line (they are one
buffer in place); scratch has its own. ``None`` when the atoms would be too many.
"""
import copy

import numpy as np

from .plan import COPY, FINAL, IN, OUT, REDUCE, TMP  # noqa: F401  (IN, OUT: the line's buffers)


def _inner(bounds, start, length, target):
    """The boundaries strictly inside each region, moved onto its partner (``target``)."""
    lo = np.searchsorted(bounds, start, side="right")
    hi = np.searchsorted(bounds, start + length, side="left")
    count = hi - lo
    keep = count > 0
    if not keep.any():
        return np.zeros(0, np.int64)
    lo, count = lo[keep], count[keep]
    shift = np.repeat(target[keep] - start[keep], count)
    first = np.repeat(lo - (np.cumsum(count) - count), count)
    return bounds[first + np.arange(int(count.sum()))] + shift


def atomize(f, limit, rounds=16):
    """A shallow copy of flat plans ``f`` (built with ``ops=True``) renumbered in atoms, or
    None when more than ``limit`` atoms (or more closing rounds) would be needed."""
    ends = [f.in_count, f.out_count, f.s_hi, f.r_hi, f.l_dlo + f.l_n, f.l_alo + f.l_n, f.l_blo + f.l_n]
    tmp0 = int(max(int(e.max(initial=0)) for e in ends)) + 1  # scratch's line starts past every IN/OUT end

    def at(buf, lo):
        return np.where(buf == TMP, lo + tmp0, lo)

    s_at, r_at = at(f.s_buf, f.s_lo), at(f.r_buf, f.r_lo)
    d_at = at(f.l_dst, f.l_dlo)
    a_at, b_at = at(f.l_a, f.l_alo), at(f.l_b, f.l_blo)
    kind = f.l_kind
    moved, ab, bb = f.s_match >= 0, kind != FINAL, kind == REDUCE
    pairs = [(s_at[moved], r_at[f.s_match[moved]], f.s_len[moved]), (d_at[ab], a_at[ab], f.l_n[ab]),
             (d_at[bb], b_at[bb], f.l_n[bb])]
    bounds = np.unique(np.concatenate(
        [s_at, s_at + f.s_len, r_at, r_at + f.r_len, d_at, d_at + f.l_n, a_at[ab], a_at[ab] + f.l_n[ab],
         b_at[bb], b_at[bb] + f.l_n[bb], [0, tmp0], f.in_count, f.out_count, tmp0 + f.tmp_count]))
    for _ in range(rounds):
        if len(bounds) > limit:
            return None
        found = [_inner(bounds, x, n, y) for x, y, n in pairs] + [_inner(bounds, y, n, x) for x, y, n in pairs]
        found = np.unique(np.concatenate(found))
        new = found[~np.isin(found, bounds, assume_unique=True)]
        if not new.size:
            break
        bounds = np.union1d(bounds, new)
    else:
        return None
    atom = lambda x: np.searchsorted(bounds, x)  # noqa: E731 - every x is a boundary
    t = int(atom(tmp0))
    g = copy.copy(f)
    g.real, g.bounds, g.tmp0, g.tmp_atom = f, bounds, tmp0, t

    def renumber(buf, start, length):
        first = atom(start)
        return first - np.where(buf == TMP, t, 0), atom(start + length) - first

    g.s_lo, g.s_len = renumber(f.s_buf, s_at, f.s_len)
    g.r_lo, g.r_len = renumber(f.r_buf, r_at, f.r_len)
    g.s_hi, g.r_hi = g.s_lo + g.s_len, g.r_lo + g.r_len
    g.l_dlo, g.l_n = renumber(f.l_dst, d_at, f.l_n)
    g.l_alo, a_n = renumber(f.l_a, a_at, f.l_n)
    g.l_blo, b_n = renumber(f.l_b, b_at, f.l_n)
    if not (np.array_equal(g.s_len[moved], g.r_len[f.s_match[moved]]) and np.array_equal(a_n[ab], g.l_n[ab])
            and np.array_equal(b_n[bb], g.l_n[bb])):
        return None  # partners cut differently: not closed (cannot happen once closed, kept as a guard)
    g.l_alo = np.where(ab, g.l_alo, 0)
    g.l_blo = np.where(bb, g.l_blo, 0)
    g.in_count, g.out_count = atom(f.in_count), atom(f.out_count)
    g.tmp_count = atom(tmp0 + f.tmp_count) - t
    return g


def real_element(g, buffer, element):
    """The first element of atom ``element`` of ``buffer`` ("in", "out", "tmp") in the real plan."""
    if buffer == "tmp":
        return int(g.bounds[g.tmp_atom + element]) - g.tmp0
    return int(g.bounds[element])
