"""Where a plan's messages lie in shared memory: the static half of the shared-memory transport.

Over shared memory a message is not sent: the sender leaves it where its peer can read it and
says so. This module decides, from one rank's plan alone, where each message will be, so that a
receiver that builds its sender's plan (plans are pure functions of the call's shape) knows
where to look with no descriptor exchanged at run time:

- a *staged* send is copied into the sender's staging area, every staged region of a call at its
  own 64-byte aligned offset (offsets in plan order, never reused within a call; a region one
  step sends to several peers is staged once, and they all read it there);
- a *direct* send is read by the receiver straight from the sender's buffer, when that buffer
  is a shared array (``collectives.empty``) and the plan never writes the sent region again in
  this call (from the send's own step on): IN of an out-of-place call always qualifies;
- a *cma* send is the same for an ordinary (private) buffer of at least CMA_MIN_BYTES where
  the node allows cross-memory attach (collectives/comm/cma.py): the receiver copies it out of
  the sender's process in one kernel copy, and the sender stages nothing.

On the receiving side a message that lands in TMP and is only read by the local operations of
the step that receives it (and never read again before TMP there is rewritten) needs no copy
either: those operations read the peer's memory in place of TMP (a *mapped* receive). Every
other receive is one copy out of the peer's memory.

Nothing here imports MPI: the layout is a function of the plan and three flags.
"""
from ..binding import NAMES, bind
from ..plan import IN, OUT, TMP, REDUCE, COPY

ALIGN = 64
STAGED, DIRECT, CMA = 0, 1, 2
# Cross-memory attach from this message size: below it a staging copy plus a read from the
# window is faster, from it the kernel's single copy wins (docs/performance.md#cma-threshold).
CMA_MIN_BYTES = 8 << 20


def _staged_bytes(lo, hi, itemsize):
    """Staging a region of ``lo:hi`` takes: its bytes, rounded up to the next ALIGN."""
    return -(-(hi - lo) * itemsize // ALIGN) * ALIGN


def _overlaps(lo, hi, olo, ohi):
    return lo < ohi and olo < hi


def _writes(step):
    """(buffer, lo, hi) regions a step writes: its receives, then its local operations' outputs."""
    regions = [(buf, lo, hi) for (_, buf, lo, hi, _) in step.recvs]
    for op in step.local:
        if op[0] == REDUCE or op[0] == COPY:
            regions.append((op[1], op[2], op[2] + op[-1]))
        else:  # FINAL writes its region in place (avg divides)
            regions.append((op[1], op[2], op[2] + op[3]))
    return regions


def _unwritten_from(plan, index, buf, lo, hi, same):
    """True when no local operation of step ``index`` and nothing in a later step writes
    ``buf[lo:hi]`` (``same(a, b)``: whether two buffer names are one memory)."""
    steps = plan.steps
    for op in steps[index].local:
        end = op[2] + (op[-1] if op[0] != 2 else op[3])
        if same(op[1], buf) and _overlaps(lo, hi, op[2], end):
            return False
    for step in steps[index + 1:]:
        for wbuf, wlo, whi in _writes(step):
            if same(wbuf, buf) and _overlaps(lo, hi, wlo, whi):
                return False
    return True


class SendLayout:
    """Where each of one rank's shared-memory sends lies.

    ``staged_bytes``: the staging the call needs; ``sends[i]``: step i's shared-memory sends as
    ``(peer, buf, lo, hi, chan, mode, offset)`` (offset: bytes into staging for STAGED);
    ``to[(peer, chan)]``: the same entries, in order, with their step, for a receiver;
    ``direct``: whether a receiver reads the caller's own buffers (so the call must not return
    before its readers are done)."""

    __slots__ = ("staged_bytes", "sends", "to", "direct")

    def __init__(self, plan, itemsize, on_node, in_shared=False, out_shared=False, in_place=False, cma=False,
                 receiver_maps=None):
        shared = {IN: in_shared or (in_place and out_shared), OUT: out_shared or (in_place and in_shared)}
        if in_place:
            def same(a, b):
                return a == b or {a, b} == {IN, OUT}
        else:
            def same(a, b):
                return a == b
        offset = 0
        self.sends = []
        self.to = {}
        self.direct = False
        for index, step in enumerate(plan.steps):
            entries = []
            staged = {}  # (buf, lo, hi) -> offset: a region a step sends to several peers is staged once
            for peer, buf, lo, hi, chan in step.sends:
                if not on_node(peer):
                    continue
                pair = self.to.get((peer, chan))
                # cross-memory attach only for a message its receiver copies: one it reduces from
                # staging costs no copy there, while a kernel copy is slower than a staging one
                use_cma = cma and (hi - lo) * itemsize >= CMA_MIN_BYTES and not (
                    receiver_maps is not None and receiver_maps(peer, chan, len(pair) if pair else 0))
                if buf != TMP and (shared[buf] or use_cma) and (
                        (buf == IN and not in_place) or _unwritten_from(plan, index, buf, lo, hi, same)):
                    entry = (peer, buf, lo, hi, chan, DIRECT if shared[buf] else CMA, 0)
                    self.direct = True
                elif (buf, lo, hi) in staged:
                    entry = (peer, buf, lo, hi, chan, STAGED, staged[(buf, lo, hi)])
                else:
                    entry = (peer, buf, lo, hi, chan, STAGED, offset)
                    staged[(buf, lo, hi)] = offset
                    offset += _staged_bytes(lo, hi, itemsize)
                entries.append(entry)
                self.to.setdefault((peer, chan), []).append((index,) + entry)
            self.sends.append(entries)
        self.staged_bytes = offset


def staging_bound(plan, itemsize, on_node):
    """Staging bytes a plan needs with nothing sent direct (the most any registration needs):
    each region a step sends on the node once, as SendLayout stages it."""
    total = 0
    for step in plan.steps:
        regions = {(buf, lo, hi) for peer, buf, lo, hi, _ in step.sends if on_node(peer)}
        total += sum(_staged_bytes(lo, hi, itemsize) for _, lo, hi in regions)
    return total


def receive_order(plan, on_node):
    """{(sender, chan): [(step index, receive index), ...]}: a plan's receives in matching order."""
    order = {}
    for index, step in enumerate(plan.steps):
        for r, (peer, _, _, _, chan) in enumerate(step.recvs):
            if on_node(peer):
                order.setdefault((peer, chan), []).append((index, r))
    return order


def mapped_receives(plan, on_node):
    """{(step index, receive index)} of receives into TMP that the step's local operations may
    read straight from the peer's memory: nothing writes the region in that step, every read of
    it there lies inside it, and no later step reads it before rewriting all of it."""
    steps = plan.steps
    mapped = set()
    for index, step in enumerate(steps):
        for r, (peer, buf, lo, hi, _) in enumerate(step.recvs):
            if buf != TMP or not on_node(peer):
                continue
            if _mappable(steps, index, lo, hi):
                mapped.add((index, r))
    return mapped


def _reads(op):
    if op[0] == REDUCE:
        _, _, _, a, alo, b, blo, n = op
        return ((a, alo, alo + n), (b, blo, blo + n))
    if op[0] == COPY:
        _, _, _, src, slo, n = op
        return ((src, slo, slo + n),)
    return ((op[1], op[2], op[2] + op[3]),)  # FINAL reads its region


def _mappable(steps, index, lo, hi):
    for op in steps[index].local:
        for wbuf, wlo, whi in _writes_of(op):
            if wbuf == TMP and _overlaps(lo, hi, wlo, whi):
                return False
        for rbuf, rlo, rhi in _reads(op):
            if rbuf == TMP and _overlaps(lo, hi, rlo, rhi) and not (lo <= rlo and rhi <= hi):
                return False
    live = [(lo, hi)]
    for step in steps[index + 1:]:
        reads = [(b, l, h) for (_, b, l, h, _) in step.sends]
        for op in step.local:
            reads.extend(_reads(op))
        for rbuf, rlo, rhi in reads:
            if rbuf == TMP and any(_overlaps(rlo, rhi, l, h) for l, h in live):
                return False
        for wbuf, wlo, whi in _writes(step):
            if wbuf == TMP:
                live = [part for l, h in live for part in _minus(l, h, wlo, whi)]
        if not live:
            break
    return True


def _writes_of(op):
    if op[0] == REDUCE or op[0] == COPY:
        return ((op[1], op[2], op[2] + op[-1]),)
    return ((op[1], op[2], op[2] + op[3]),)


def _minus(lo, hi, wlo, whi):
    if not _overlaps(lo, hi, wlo, whi):
        return [(lo, hi)]
    return [part for part in ((lo, wlo), (whi, hi)) if part[1] > part[0]]


F_IN_SHARED, F_OUT_SHARED, F_IN_PLACE, F_CMA = 1, 2, 4, 8  # a call's flags, as its header shows them


def _kept(store, key, plan, make, *args):
    """``store[key]``'s value while it was made for this very ``plan`` object (keys hold the
    plan's id, which a new plan may reuse), else ``make(*args)``, kept; at most 256 kept."""
    found = store.get(key)
    if found is None or found[0] is not plan:
        if len(store) > 256:
            store.clear()
        found = store[key] = (plan, make(*args))
    return found[1]


class Layouts:
    """One transport's layouts, cached per plan: where each of a plan's messages lies for the
    sender's flags, which receives a rank maps, and the staging a call needs on any node rank."""

    def __init__(self, node_ranks):
        self.node_ranks = node_ranks
        self.on_node = set(node_ranks).__contains__
        self.layouts = {}  # (plan id, item size, flags) -> (plan, (SendLayout, mapped receives))
        self.receives = {}  # plan id -> (plan, (receive order, mapped receives))
        self.bounds = {}  # (plan id, item size) -> (plan, staging bytes the call needs on any node rank)
        self.bindings = {}  # (plan id, in place, finals) -> (plan, its binding to named regions)
        self.calls = {}  # (plan id, item size, flags, finals) -> (plan, Call)

    def of(self, plan, itemsize, flags, plans_of):
        """(SendLayout of ``plan`` under ``flags``, the receives ``plan``'s rank maps)."""
        return _kept(self.layouts, (id(plan), itemsize, flags), plan, self._layout, plan, itemsize, flags, plans_of)

    def _layout(self, plan, itemsize, flags, plans_of):
        sender = plan.rank

        def receiver_maps(peer, chan, k):
            order, mapped = self._receives(plans_of(peer))
            matching = order.get((sender, chan), ())
            return k < len(matching) and matching[k] in mapped
        layout = SendLayout(plan, itemsize, self.on_node, bool(flags & F_IN_SHARED), bool(flags & F_OUT_SHARED),
                            bool(flags & F_IN_PLACE), bool(flags & F_CMA), receiver_maps)
        return layout, self._receives(plan)[1]

    def call(self, plan, itemsize, flags, finals, plans_of):
        """The ``Call`` that runs ``plan`` under ``flags``: worked out on its first call, kept."""
        return _kept(self.calls, (id(plan), itemsize, flags, finals), plan, Call, self, plan, itemsize, flags,
                     finals, plans_of)

    def binding(self, plan, in_place, finals):
        """``plan`` bound (``collectives.binding.bind``) to regions named ``(IN/OUT/TMP, lo, hi)``:
        they depend on no buffer, so a plan is bound once, as it is laid out once."""
        return _kept(self.bindings, (id(plan), in_place, finals), plan, bind, plan, NAMES, in_place, finals)

    def _receives(self, plan):
        """(receive order, mapped receives) of a plan, cached."""
        return _kept(self.receives, id(plan), plan, self._receives_of, plan)

    def _receives_of(self, plan):
        return receive_order(plan, self.on_node), mapped_receives(plan, self.on_node)

    def bound(self, plan, plans_of, itemsize):
        """The most staging any node rank needs for this call (the same figure on every rank, so
        that all decide together to grow the window)."""
        return _kept(self.bounds, (id(plan), itemsize), plan, self._bound, plans_of, itemsize)

    def _bound(self, plans_of, itemsize):
        return max(staging_bound(plans_of(peer), itemsize, self.on_node) for peer in self.node_ranks)


class Call:
    """What one rank's call does at each step, worked out once per plan and flags, so that a call
    runs through it with no decisions left: ``steps`` as ``(index, far receives, far sends,
    staged sends, near receives, local operations, label)`` with messages to other hosts
    ``(region, peer, chan)``, staged sends ``(buf, lo, hi, element offset into staging)``, receives
    from this node ``(peer, region, chan, mapped)`` and ``label`` the step as errors name it;
    ``readers``: the node peers that read this rank's memory; ``direct``: whether they read the
    caller's own buffers; ``need``: the staging bytes the call needs on any node rank."""

    __slots__ = ("steps", "readers", "direct", "need")

    def __init__(self, layouts, plan, itemsize, flags, finals, plans_of):
        layout, mapped = layouts.of(plan, itemsize, flags, plans_of)
        near = layouts.on_node
        total = len(plan.steps)
        self.steps = []
        for index, sends, recvs, ops in layouts.binding(plan, bool(flags & F_IN_PLACE), finals):
            self.steps.append((
                index,
                tuple((region, peer, chan) for peer, region, chan in recvs if not near(peer)),
                tuple((region, peer, chan) for peer, region, chan in sends if not near(peer)),
                tuple({offset: (buf, lo, hi, offset // itemsize)  # one copy per staged region
                       for _, buf, lo, hi, _, mode, offset in layout.sends[index] if mode == STAGED}.values()),
                tuple((peer, region, chan, (index, r) in mapped)
                      for r, (peer, region, chan) in enumerate(recvs) if near(peer)),
                ops, f" step {index + 1}/{total}"))
        self.readers = tuple(sorted({entry[0] for entries in layout.sends for entry in entries}))
        self.direct = layout.direct
        self.need = layouts.bound(plan, plans_of, itemsize)
