"""The timing model without the event loop: every rank at once, one vectorised wave per step.

The event loop (``collectives.simulator.timing``) handles messages in the order of their post
time, ties broken by message index (rank, then step, then post order), and each message takes
a turn of its duration on its sending side (the sender's send port) and one on its receiving
side (the receiver's receive port), each from ``max(post, that port free)``, and ends at the
later turn's end; with a shared NIC, a message between nodes takes its turns on the two nodes'
links instead. So on every port the messages queue in (post time, index) order, and a schedule in
which every port serves its messages in that order, each from the latest of its post time and
the end of its port's previous message, is the event loop's answer (with durations above zero,
by induction over that order).

``wave_times`` builds such a schedule in waves: ranks that reach a step post it and issue its
sends at once (a wave's sends in (post, index) order, chained on their ports: each turn of a
message starts when its port is free); a rank whose receives have all been issued ends its step at
the latest of its post time and its messages' ends, then its reductions take gamma per byte.
Rings never contend, trees queue their children's messages on the parent's receive port. In
the end it checks that every port served its messages in (post, index) order; ``None`` (a
port served them out of that order, a duration of zero, a deadlock) sends the caller to the
event loop.
"""
import numpy as np


def _ranges(lo, hi):
    n = hi - lo
    if not n.size:
        return np.zeros(0, np.int64)
    total = int(n.sum())
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(total)


class _Ports:
    """The free time of every port; issues a wave's sends onto them. With ``check``, issuing a
    message behind one of a later (post, index) on its port answers None (the waves then run
    again, windowed)."""

    JACOBI_ROUNDS = 24  # longer queues in one wave are served one message at a time

    def __init__(self, f, dur, nic_inter, node, check):
        self.f, self.dur, self.p, self.check = f, dur, f.p, check
        nodes = int(node.max()) + 1 if node is not None and len(node) else 1
        nports = 2 * f.p + (2 * nodes if nic_inter is not None else 0)
        self.nports = nports
        self.free = np.zeros(nports)
        self.last_post = np.full(nports, -np.inf)  # the (post, index) of each port's last message
        self.last_id = np.full(nports, -1, np.int64)
        self.nic = nic_inter
        self.node, self.nodes = node, nodes
        self.start = np.zeros(len(dur))
        self.end = np.zeros(len(dur))
        self.issued = np.zeros(len(dur), bool)

    def ports_of(self, ids):
        """Per message of ``ids``, two turns: its sending side (the sender's send port, or with a
        shared NIC and between nodes the sending node's outgoing link) at positions 0..n-1, and its
        receiving side (the receiver's receive port, or the receiving node's incoming link) at
        n..2n-1, each side a queue of its own; and whether every sending side is the sender's own
        send port. A message ends when both its sides carried it."""
        f, p = self.f, self.p
        n = len(ids)
        out, into = f.s_rank[ids], p + f.s_peer[ids]
        inter = self.nic[ids] if self.nic is not None else None
        own = inter is None or not inter.any()
        if not own:
            out = np.where(inter, 2 * p + self.node[f.s_rank[ids]], out)
            into = np.where(inter, 2 * p + self.nodes + self.node[f.s_peer[ids]], into)
        return [out, into], [np.arange(n), n + np.arange(n)], own

    def in_order(self, port, ids, post):
        """True when ``ids`` (each the first of the wave on ``port``) follow the port's last."""
        lp = self.last_post[port]
        return not ((post < lp) | ((post == lp) & (ids < self.last_id[port]))).any()

    def issue(self, ids, post):
        """Start the messages ``ids`` (sorted by (post, index)) as the event loop would."""
        if not ids.size:
            return ids
        ports, owners, own = self.ports_of(ids)
        n = len(ids)
        ids, post = np.concatenate([ids, ids]), np.concatenate([post, post])  # a turn per side
        dur = self.dur[ids]
        port = np.concatenate(ports)
        longest = int(np.bincount(port, minlength=self.nports).max())
        if longest <= 1:  # no queue: each port once
            start = post.copy()
            for i, (q, o) in enumerate(zip(ports, owners)):
                if self.check and (i or not own) and not self.in_order(q, ids[o], post[o]):
                    return self.refuse()  # (a rank's own send port serves it in index order)
                start[o] = np.maximum(start[o], self.free[q])
            end = start + dur
            for q, o in zip(ports, owners):
                self.free[q] = end[o]
                self.last_post[q], self.last_id[q] = post[o], ids[o]
        else:
            owner = np.concatenate(owners)
            order = np.lexsort((owner, port))
            port, owner = port[order], owner[order]
            head = np.ones(len(port), bool)
            head[1:] = port[1:] != port[:-1]
            if self.check and not self.in_order(port[head], ids[owner[head]], post[owner[head]]):
                return self.refuse()
            floor = post.copy()
            np.maximum.at(floor, owner[head], self.free[port[head]])
            after, before = owner[1:][~head[1:]], owner[:-1][~head[1:]]  # queued behind ``before``
            if longest > self.JACOBI_ROUNDS and len(ids) > 4 * longest:
                return None  # many long queues (all to all): the event loop is quicker
            start = floor
            for _ in range(self.JACOBI_ROUNDS if longest <= self.JACOBI_ROUNDS else 0):
                new = floor.copy()
                np.maximum.at(new, after, start[before] + dur[before])
                if np.array_equal(new, start):
                    break
                start = new
            else:  # queues longer than a few rounds settle: one message at a time
                start = self.serve(port, owner, head, post, dur)
            end = start + dur
            tail = np.ones(len(port), bool)
            tail[:-1] = head[1:]
            last = owner[tail]
            self.free[port[tail]] = end[last]  # the last message of each queue ends last
            self.last_post[port[tail]], self.last_id[port[tail]] = post[last], ids[last]
        # a message ends when both its sides carried it
        ids, dur = ids[:n], dur[:n]
        end = np.maximum(end[:n], end[n:])
        start = end - dur
        self.start[ids], self.end[ids] = start, end
        self.issued[ids] = True
        return ids

    def refuse(self):
        self.out_of_order = True
        return None

    out_of_order = False

    def serve(self, port, owner, head, post, dur):
        """One message at a time, in order (a long queue)."""
        n = len(post)
        ports_of = [[] for _ in range(n)]
        for q, o in zip(port.tolist(), owner.tolist()):
            ports_of[o].append(q)
        free = {q: float(self.free[q]) for q in port[head].tolist()}
        start = post.tolist()
        d = dur.tolist()
        for i in range(n):
            s = start[i]
            for q in ports_of[i]:
                if free[q] > s:
                    s = free[q]
            start[i] = s
            e = s + d[i]
            for q in ports_of[i]:
                free[q] = e
        return np.array(start)


def _candidates(f):
    """Per step, the messages that end it: its sends, then the sends its receives match (CSR
    over steps: ``ptr``, message ids, cause codes 2 * peer + (0 send, 1 receive))."""
    ptr = f.ss + f.rs
    msg = np.empty(int(ptr[-1]), np.int64)
    code = np.empty(int(ptr[-1]), np.int64)
    at_s = f.rs[f.s_step] + np.arange(len(f.s_step))  # step g's sends start at ptr[g]
    at_r = f.ss[f.r_step + 1] + np.arange(len(f.r_step))  # its receives after its sends
    msg[at_s], code[at_s] = np.arange(len(f.s_step)), 2 * f.s_peer
    msg[at_r], code[at_r] = f.r_match, 2 * f.r_peer + 1
    return ptr, msg, code


def _run(f, dur, wt, ports, window):
    """The waves over ``ports``: (finish, link cause, link time, post per step), or None (a
    deadlock, or ``ports`` refused a message). With ``window``, a wave issues only messages
    posted before every post still to come: each rank's step ends no sooner than its messages
    (those issued end when issued, the others after their post plus duration), and any step
    posted later posts after some waiting message ends. Every port then serves in (post,
    index) order."""
    p, G = f.p, f.steps_total
    if f.r_match.size and (f.r_match < 0).any():
        return None  # a receive nobody sends: the event loop names it
    ptr, cand_msg, cand_code = _candidates(f)
    nmsg = np.diff(ptr)
    post = np.zeros(G)
    known = np.zeros(G, bool)
    link_time = np.zeros(G)
    link_cause = np.full(G, -1, np.int64)
    finish = np.zeros(p)
    last = f.start[:-1] + f.nsteps
    cur = f.start[:-1].copy()
    when = np.zeros(p)
    issued = ports.issued
    dmin = float(dur.min()) if dur.size else 1.0
    fresh = []  # steps posted since the last issue

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
            fresh.append(g[busy])
            ranks, g = ranks[~busy], g[~busy]
            when[ranks] += wt[g]
            cur[ranks] = g + 1

    settle(np.arange(p))
    active = np.flatnonzero(cur < last)
    pending = np.zeros(0, np.int64)
    while active.size:
        g = cur[active]
        counts = nmsg[g]
        ci = _ranges(ptr[g], ptr[g + 1])
        owner = np.repeat(np.arange(len(active)), counts)
        c_msg = cand_msg[ci]
        steps = np.concatenate(fresh) if fresh else np.zeros(0, np.int64)
        fresh.clear()
        ids = _ranges(f.ss[steps], f.ss[steps + 1])
        if pending.size:
            ids = np.concatenate([pending, ids])
        at = post[f.s_step[ids]]
        if window and ids.size:
            sstep = f.s_step[c_msg]
            floor = np.where(issued[c_msg], ports.end[c_msg], np.where(known[sstep], post[sstep] + dur[c_msg], 0.0))
            ends = post[g].copy()
            np.maximum.at(ends, owner, floor)
            now = at < max(float(at.min()) + dmin, float((ends + wt[g]).min()))
            if not now.all():
                pending, ids, at = ids[~now], ids[now], at[now]
            else:
                pending = pending[:0]
        order = np.lexsort((ids, at))
        went = ports.issue(ids[order], at[order])
        if went is None:
            return None  # a port would serve out of (post, index) order
        ready = active
        ok = issued[c_msg]
        if not ok.all():
            blocked = np.zeros(len(ready), bool)
            blocked[owner[~ok]] = True
            if blocked.all():
                if went.size:
                    continue  # messages went, none completes a step yet
                return None  # a deadlock: the event loop names it
            keep = ~blocked[owner]
            ci, c_msg = ci[keep], c_msg[keep]
            owner = (np.cumsum(~blocked) - 1)[owner[keep]]
            ready, g = ready[~blocked], g[~blocked]
        # the step ends at the latest of its post and its messages' ends
        c_ready = post[f.s_step[c_msg]]
        c_end = ports.end[c_msg]
        top = post[g].copy()
        np.maximum.at(top, owner, c_end)
        # the cause: the last handled (latest post, then index) of those ending last
        late = c_end >= top[owner]
        order = np.lexsort((c_msg, c_ready, late, owner))
        last_of = order[np.r_[owner[order][1:] != owner[order][:-1], True]]
        link_cause[g[owner[last_of]]] = cand_code[ci[last_of]]
        link_time[g] = top
        when[ready] = top + wt[g]
        cur[ready] = g + 1
        settle(ready)
        active = active[cur[active] < last[active]]
    return finish, link_cause, link_time, post


def wave_times(f, dur, wt, nic_inter=None, node=None, record=False, itemsize=1):
    """(finish per rank, links, messages) as ``timing.time_plans`` returns them, or None.
    ``node``: the node of every rank (for ``nic_inter``, the messages between nodes)."""
    if dur.size and not (dur > 0).all():
        return None  # zero durations tie post times the event loop orders differently
    if f.s_match.size and (f.s_match < 0).any():
        return None
    nic = nic_inter if nic_inter is not None and nic_inter.any() else None
    for window in (False, True):  # waves of whole steps first (rings, gathers), windowed if out of order
        ports = _Ports(f, dur, nic, node, check=not window)
        run = _run(f, dur, wt, ports, window)
        if run is not None:
            break
        if window or not ports.out_of_order:
            return None  # a deadlock (the event loop names it), or queues it serves quicker
    finish, link_cause, link_time, post = run
    at = post[f.s_step]
    messages = []
    if record:
        order = np.lexsort((np.arange(len(at)), at))  # the event loop's order
        lstep = f.s_step - f.start[f.s_rank]
        messages = list(zip(ports.start[order].tolist(), ports.end[order].tolist(), f.s_rank[order].tolist(),
                            f.s_peer[order].tolist(), lstep[order].tolist(), (f.s_len[order] * itemsize).tolist()))
    return finish.tolist(), (link_cause.tolist(), link_time.tolist(), f), messages
