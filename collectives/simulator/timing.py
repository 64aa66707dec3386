"""The simulator's timing model: a discrete-event run of every rank's plan (``collectives.flat``).

A message of m bytes takes a turn of alpha + m beta on its sender's send port and, on a queue of
its own, one on its receiver's receive port (a rank's link is full duplex: its two ports serve
apart), each port serving its messages one at a time in the order of their post time, ties
broken by message index (the lower rank first, then the earlier step, then post order: a
deterministic model), and ends when both turns have. With a shared NIC, a message between nodes
takes its turns on the sending node's outgoing link and the receiving node's incoming link
instead of the ranks' ports. (Before, a message held both ports at once: a rank's sends then
waited on the receive ports of their peers, which the emulated hosts' links never do;
docs/concepts.md#a-ranks-link.) On fair links
(``Topology(sharing="fair")``) each link instead carries every message crossing it at once at an
equal share of its rate (``_FairLinks``), and a message that finds its link idle has the link's
burst taken off. A rank's step ends when all its messages have, then its reductions take gamma
per byte. ``collectives.simulator._waves`` computes the queued schedule in vectorised waves; the
event loop below runs where it cannot, and on fair links.
"""
import bisect
import heapq

import numpy as np

from ._waves import wave_times
from ..flat import _Flat
from ..plan import PlanError


BACK_TO_BACK_ROUNDS = 20  # at most this many calls timed to find the links' tokens repeating


def time_plans(plans, alpha, beta, gamma, itemsize, topology, record, flat=None):
    """Discrete-event model: messages start in order of their post time, each takes a turn of
    alpha + m beta on its sender's send port and one on its receiver's receive port (with a shared
    NIC and between nodes, on the two nodes' links instead), ending at the later turn's end;
    a step ends when all its messages have, then its reductions take gamma per byte. Returns
    (finish per rank, links, messages): ``links`` is, per global step, the message that ended it
    last (for the critical path). With ``topology.back_to_back`` the call is timed again, each
    time from the tokens the one before left its links, until they repeat (the last timing)."""
    f = flat if flat is not None else _Flat(plans)
    if topology is None or not topology.back_to_back:
        return _time_call(f, alpha, beta, gamma, itemsize, topology, record)[0]
    tokens = None  # the first call finds every link idle, its bucket full
    for _ in range(BACK_TO_BACK_ROUNDS):
        result, links = _time_call(f, alpha, beta, gamma, itemsize, topology, record, tokens)
        left = links.left(max(result[0], default=0.0))
        if tokens is not None and max((abs(a - b) for a, b in zip(left, tokens)), default=0.0) <= 1e-12:
            break
        tokens = left
    return result


def _time_call(f, alpha, beta, gamma, itemsize, topology, record, tokens=None):
    """One call's (finish, links, messages) from ``time_plans``, and the fair links (or None)."""
    p = f.p
    bad = np.flatnonzero(f.s_match < 0)
    if bad.size:
        i = int(bad[0])
        raise PlanError(f"rank {int(f.s_rank[i])} sends to {int(f.s_peer[i])} (channel {int(f.s_chan[i])}) "
                           f"a message no receive matches")
    matched = f.s_match
    wrong = np.flatnonzero(f.s_len != f.r_len[matched])
    if wrong.size:
        i = int(wrong[0])
        raise PlanError(f"rank {int(f.s_rank[i])} sends {int(f.s_len[i])} elements to {int(f.s_peer[i])}, "
                           f"which expects {int(f.r_len[matched[i]])}")
    nbytes_arr = f.s_len * itemsize
    if topology is None:
        dur_arr = alpha + nbytes_arr * beta
        nic_arr = None
    else:
        node = topology.nodes(p)
        same = node[f.s_rank] == node[f.s_peer]
        dur_arr = np.where(same, topology.intra[0] + nbytes_arr * topology.intra[1],
                           topology.inter[0] + nbytes_arr * topology.inter[1])
        nic_arr = (~same).tolist() if topology.shared_nic else None
    fair = topology is not None and topology.sharing == "fair"
    wave = None if fair else wave_times(f, dur_arr, f.work * itemsize * gamma,
                                        None if topology is None or not topology.shared_nic else ~same,
                                        node if topology else None, record, itemsize)
    if wave is not None:  # every port served its messages in (post, index) order: the event loop's answer
        return wave, None
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
        node_of = node.tolist()
        nnodes = int(node.max()) + 1 if p else 0
        nic_s, nic_r = [0.0] * nnodes, [0.0] * nnodes
        if fair:
            links_fair = _FairLinks(2 * nnodes, topology.burst * topology.inter[1], tokens)
            halves = {}  # message -> how many of its two links have carried it
            byte_time = (nbytes_arr * topology.inter[1]).tolist()

    cur = list(first)
    outstanding = [0] * p
    post = [0.0] * p
    latest = [0.0] * p
    # 2 * peer + (0 send, 1 receive): the message that ended the step last (ties: the last
    # handled), or while none ended at or after the post (``settled`` false), the last handled
    cause = [-1] * p
    settled = [False] * p
    finish = [0.0] * p
    send_free = [0.0] * p
    recv_free = [0.0] * p
    link_cause = [-1] * G
    link_time = [0.0] * G
    # receives that ended before their rank reached their step: how many, the latest end, the
    # cause of the last one to end then and of the last one to arrive
    early_n = [0] * G
    early_end = [0.0] * G
    early_max = [-1] * G
    early_last = [-1] * G
    heap = []
    push, pop = heapq.heappush, heapq.heappop
    messages = []

    def advance(rank, g, when):
        """Start step g of ``rank`` at ``when`` (skipping steps without messages, and steps
        whose messages are all receives that already ended)."""
        stop = last[rank]
        while g < stop:
            m = nmsg[g]
            if m:
                k = early_n[g]
                if k:
                    e = early_end[g]
                    late = e >= when
                    lat, why = (e, early_max[g]) if late else (when, early_last[g])
                    if m == k:  # nothing left to wait for: the step ends at once
                        link_cause[g] = why
                        link_time[g] = lat
                        when = lat + wt[g]
                        g += 1
                        continue
                    cause[rank] = why
                    settled[rank] = late
                else:
                    lat = when
                    cause[rank] = -1
                    settled[rank] = False
                post[rank] = when
                latest[rank] = lat
                outstanding[rank] = m - k
                cur[rank] = g
                if ss[g + 1] > ss[g]:  # the step's sends start in post order: one heap entry for all
                    push(heap, (when, g))  # ties: the lower step number, so the lower message index
                return
            when += wt[g]
            g += 1
        cur[rank] = g
        finish[rank] = when

    def deliver(i, start, end):
        """Message ``i`` ran from ``start`` to ``end``: its sender's and receiver's steps learn it."""
        src = s_src[i]
        dst = s_dst[i]
        if record:
            messages.append((start, end, src, dst, s_lstep[i], s_nbytes[i]))
        # the sender's step: one message fewer to wait for
        if end >= latest[src]:
            latest[src] = end
            cause[src] = 2 * dst
            settled[src] = True
        elif not settled[src]:
            cause[src] = 2 * dst
        outstanding[src] -= 1
        if not outstanding[src]:
            g = cur[src]
            link_cause[g] = cause[src]
            link_time[g] = done = latest[src]
            advance(src, g + 1, done + wt[g])
        # the receiver's, if it is there yet; else the message waits for it
        g = s_rg[i]
        if cur[dst] == g and outstanding[dst] > 0:
            if end >= latest[dst]:
                latest[dst] = end
                cause[dst] = 2 * src + 1
                settled[dst] = True
            elif not settled[dst]:
                cause[dst] = 2 * src + 1
            outstanding[dst] -= 1
            if not outstanding[dst]:
                link_cause[g] = cause[dst]
                link_time[g] = done = latest[dst]
                advance(dst, g + 1, done + wt[g])
        else:
            why = 2 * src + 1
            early_n[g] += 1
            early_last[g] = why
            if end >= early_end[g]:
                early_end[g] = end
                early_max[g] = why

    post_of = {}
    for rank in range(p):
        advance(rank, first[rank], 0.0)
    while heap:
        ready, step = pop(heap)
        if step < 0:  # fair links: a link's next message(s) end
            for i in links_fair.due(-1 - step, ready):
                halves[i] += 1
                if halves[i] == 2:
                    deliver(i, post_of[i], ready)
            for link, when in links_fair.wake:
                push(heap, (when, -1 - link))
            links_fair.wake.clear()
            continue
        for i in range(ss[step], ss[step + 1]):
            src = s_src[i]
            dst = s_dst[i]
            if fair and nic_arr[i]:  # across nodes, on fair links: it ends when both links have carried it
                post_of[i] = ready
                halves[i] = 0
                links_fair.arrive(node_of[src], i, ready, dur[i], byte_time[i])
                links_fair.arrive(nnodes + node_of[dst], i, ready, dur[i], byte_time[i])
                for link, when in links_fair.wake:
                    push(heap, (when, -1 - link))
                links_fair.wake.clear()
                continue
            # a turn on the sending side and one, on its own queue, on the receiving side: the
            # ranks' send and receive ports, or across nodes with a shared NIC the two nodes'
            # links; the message is done when both sides carried it
            if nic_arr is not None and nic_arr[i]:
                out, o, inn, n_ = nic_s, node_of[src], nic_r, node_of[dst]
            else:
                out, o, inn, n_ = send_free, src, recv_free, dst
            out_end = (ready if ready > out[o] else out[o]) + dur[i]
            in_end = (ready if ready > inn[n_] else inn[n_]) + dur[i]
            out[o] = out_end
            inn[n_] = in_end
            end = out_end if out_end > in_end else in_end
            deliver(i, end - dur[i], end)
    stuck = [r for r in range(p) if cur[r] < last[r]]
    if stuck:
        raise PlanError(f"deadlock: ranks {stuck[:8]} never finish (step {cur[stuck[0]] - first[stuck[0]]})")
    return (finish, (link_cause, link_time, f), messages), links_fair if fair and nic_arr is not None else None


class _FairLinks:
    """Links that carry every message crossing them at once, each at an equal share of the rate
    (processor sharing), each link on its own. Work is in seconds at the full rate. An idle link
    gathers ``burst`` seconds of tokens at most (a token bucket refilled at its rate while it
    idles); a message that finds it idle has that much of its bytes' time taken off. ``arrive``
    and ``due`` leave in ``wake`` the (link, time) at which a link's next message ends; a wake
    that a later arrival moved is stale, and ``due`` answers it with nothing."""

    def __init__(self, nlinks, burst, tokens=None):
        self.active = [{} for _ in range(nlinks)]  # message -> work left
        self.last = [0.0] * nlinks
        self.next = [None] * nlinks
        # idle before the call: a full bucket, or what the call before left
        self.tokens = [burst] * nlinks if tokens is None else list(tokens)
        self.idle_since = [0.0] * nlinks
        self.burst = burst
        self.wake = []

    def _progress(self, link, now):
        active = self.active[link]
        if active:
            share = (now - self.last[link]) / len(active)
            if share > 0:
                for i in active:
                    active[i] -= share
        self.last[link] = now

    def _schedule(self, link, now):
        active = self.active[link]
        if active:
            self.next[link] = when = now + min(active.values()) * len(active)
            self.wake.append((link, when))
        else:
            self.next[link] = None
            self.idle_since[link] = now

    def arrive(self, link, i, now, work, byte_time):
        self._progress(link, now)
        if not self.active[link] and self.burst:
            tokens = min(self.burst, self.tokens[link] + (now - self.idle_since[link]))
            free = min(byte_time, tokens)
            self.tokens[link] = tokens - free
            work -= free
        self.active[link][i] = work
        self._schedule(link, now)

    def left(self, end):
        """The tokens every link holds at ``end``, after the call (every link idle then)."""
        return [min(self.burst, held + max(0.0, end - since)) for held, since in zip(self.tokens, self.idle_since)]

    def due(self, link, now):
        """The messages that end on ``link`` at ``now`` (none for a stale wake), in index order."""
        if self.next[link] != now:
            return []
        self._progress(link, now)
        active = self.active[link]
        done = sorted(i for i, left in active.items() if left <= 1e-12)
        for i in done:
            del active[i]
        self._schedule(link, now)
        return done


def critical_path(finish, links, plans=None):
    """Walk back from the last rank to finish: at each step, the message that ended last.

    Returns ``(rank, step, "send"|"recv", peer, time)`` tuples from the first event on."""
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
