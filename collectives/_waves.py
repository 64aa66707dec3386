"""The timing model without the event loop, for plans whose messages never wait for a port.

When no rank sends two messages in one step and, in the resulting schedule, no two messages
into one rank (or through one shared NIC) overlap in time, every message starts when its
sender posts it, and the event loop's answer is a longest-path computation: step ``g`` of a
rank ends at the latest of its post time, its send's end and its receives' ends (a receive
that ended before the rank got there counts at the post time). ``wave_times`` computes it
for every rank at once, one vectorised wave per step (rings move in lock step), then checks
that no port was ever asked for twice at once; ``None`` sends the caller to the event loop.
"""
import numpy as np


def _ranges(lo, hi):
    n = hi - lo
    if not n.size:
        return np.zeros(0, np.int64)
    total = int(n.sum())
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(total)


def _overlap(port, start, end):
    """True when two messages through one port overlap in time (sorted by port, then start)."""
    if len(port) < 2:
        return False
    order = np.lexsort((start, port))
    port, start, end = port[order], start[order], end[order]
    return bool(((port[1:] == port[:-1]) & (end[:-1] > start[1:])).any())


def wave_times(f, dur, wt, nic_inter=None, kpn=1, record=False, itemsize=1):
    """(finish per rank, links, messages) as ``timing.time_plans`` returns them, or None."""
    p, G = f.p, f.steps_total
    nsend = np.diff(f.ss)
    if (nsend > 1).any():
        return None
    nmsg = nsend + np.diff(f.rs)
    step_rank = f.step_rank
    post = np.zeros(G)
    known = np.zeros(G, bool)
    link_time = np.zeros(G)
    link_cause = np.full(G, -1, np.int64)
    send_of = np.where(nsend > 0, f.ss[:-1], -1)
    finish = np.zeros(p)
    last = f.start[:-1] + f.nsteps
    cur = f.start[:-1].copy()
    when = np.zeros(p)

    def settle(ranks):
        """Move ``ranks`` (at steps ``cur``, time ``when``) past message-less steps, one add
        at a time as the event loop does; post the step each reaches, or finish."""
        while ranks.size:
            g = cur[ranks]
            done = g >= last[ranks]
            finish[ranks[done]] = when[ranks[done]]
            ranks, g = ranks[~done], g[~done]
            busy = nmsg[g] > 0
            post[g[busy]] = when[ranks[busy]]
            known[g[busy]] = True
            ranks, g = ranks[~busy], g[~busy]
            when[ranks] += wt[g]
            cur[ranks] = g + 1

    settle(np.arange(p))
    active = np.flatnonzero(cur < last)
    m_src = f.s_match  # receive j's message is the send r_match[j]
    while active.size:
        ready = active
        g = cur[ready]
        counts = f.rs[g + 1] - f.rs[g]
        rids = _ranges(f.rs[g], f.rs[g + 1])
        sends = f.r_match[rids]
        if (sends < 0).any():
            return None  # a receive nobody sends: the event loop names it
        ok = known[f.s_step[sends]]
        if not ok.all():
            owner = np.repeat(np.arange(len(ready)), counts)
            blocked = np.zeros(len(ready), bool)
            blocked[owner[~ok]] = True
            if blocked.all():
                return None  # a deadlock: the event loop names it
            keep = ~blocked[owner]
            ready, g, counts, rids, sends = ready[~blocked], g[~blocked], counts[~blocked], rids[keep], sends[keep]
        # candidates per step: its send (ends post + dur), its receives (end at the sender's post + dur)
        own = send_of[g]
        has = own >= 0
        c_owner = np.concatenate([np.flatnonzero(has), np.repeat(np.arange(len(ready)), counts)])
        c_msg = np.concatenate([own[has], sends])
        c_ready = post[f.s_step[c_msg]]
        c_end = c_ready + dur[c_msg]
        c_code = np.concatenate([2 * f.s_peer[own[has]], 2 * f.s_rank[sends] + 1])
        top = post[g].copy()
        np.maximum.at(top, c_owner, c_end)
        # the cause: the last processed (latest ready, then index) of those ending last
        late = c_end >= top[c_owner]
        order = np.lexsort((c_msg, c_ready, late, c_owner))
        last_of = order[np.r_[c_owner[order][1:] != c_owner[order][:-1], True]]
        link_cause[g[c_owner[last_of]]] = c_code[last_of]
        link_time[g] = top
        when[ready] = top + wt[g]
        cur[ready] = g + 1
        settle(ready)
        active = active[cur[active] < last[active]]
    if m_src.size and (m_src < 0).any():
        return None
    start = post[f.s_step]
    end = start + dur
    if _overlap(f.s_peer, start, end):
        return None
    if nic_inter is not None and nic_inter.any():
        sel = nic_inter
        if _overlap(f.s_rank[sel] // kpn, start[sel], end[sel]) or _overlap(f.s_peer[sel] // kpn, start[sel],
                                                                             end[sel]):
            return None
    messages = []
    if record:
        order = np.lexsort((np.arange(len(start)), start))
        lstep = f.s_step - f.start[f.s_rank]
        messages = list(zip(start[order].tolist(), end[order].tolist(), f.s_rank[order].tolist(),
                            f.s_peer[order].tolist(), lstep[order].tolist(), (f.s_len[order] * itemsize).tolist()))
    return finish.tolist(), (link_cause.tolist(), link_time.tolist(), f), messages
