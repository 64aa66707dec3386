"""Plans: one description of an all-reduce that every backend of this library runs.

A plan is what one rank does, as a list of steps. Each step posts its messages
together (nonblocking), waits for all of them, then runs its local operations
in order. The real executor (``execute``) runs a plan over any communicator; the
simulator (``collectives.simulator``) runs the plans of all ranks to predict time
and to check, with symbolic data, that every element is reduced exactly once.

Buffers are named by small integers:

- ``IN``  the caller's send buffer (read only, unless it is also the receive buffer),
- ``OUT`` the caller's receive buffer,
- ``TMP`` scratch of ``plan.tmp_count`` elements, owned by the library and reused.

A message is ``Message(peer, buf, lo, hi, chan)``: elements ``lo:hi`` of a buffer, on a
channel. Messages between one pair of ranks on one channel match in the order
they are posted (MPI's non-overtaking rule), so plans that interleave two
streams between the same pair (two trees, say) give each its own channel.

Local operations (their first field, ``kind``, tells them apart):

- ``Reduce(REDUCE, dst, dlo, a, alo, b, blo, n)``: ``dst[dlo:dlo+n] = a[alo:alo+n] (op) b[blo:blo+n]``;
  ``a`` is the left operand, so a plan fixes the order of every reduction and all
  ranks can end bitwise identical,
- ``Copy(COPY, dst, dlo, src, slo, n)``: a no-op where ``copy_is_noop`` says so (the same
  region, or IN and OUT at one offset when the call runs in place),
- ``Final(FINAL, buf, lo, n)``: the region now holds the complete reduction; ``avg``
  divides it by the world size here, other ops do nothing.

These are named tuples, defined once here. ``PlanBuilder``'s calls (``send``, ``recv``,
``reduce``, ``copy``, ``final``) make them, with ``tuple.__new__(Message, (...))`` (no
Python-level ``__new__``). ``PlanBuilder.add_step`` and ``add_steps`` (the pipelined trees) take
plain tuples of the same fields: named tuples there made tree plans slower to build at thousands
of ranks (docs/performance.md#plan-building), mostly from the garbage collector, which stops
tracking a plain tuple of ints but never a tuple subclass. The ring phases and hierarchical_copy's first phase
write all their steps at once as numpy columns (``PlanBuilder.add_columns``,
``collectives.columns``); a plan with such steps is stored as columns, ``Plan.steps`` makes its
tuples on first use, and the simulator reads the columns directly. The runners read entries by
position in one place, ``collectives.binding.bind``; a plan written by hand with plain tuples runs
the same, and ``typed(step)`` gives any step with named entries (for printing and tests).

Rules a plan keeps (the symbolic check, ``collectives.symbolic``, enforces them):
``IN`` is never written; an element of ``IN`` is never read after the same element
of ``OUT`` was written (so a plan also runs in place, with ``IN is OUT``); every
element of ``OUT`` ends complete with exactly one FINAL applied.
"""
from itertools import zip_longest

from .columns import Columns
from .steps import (BUFFER_NAMES, COPY, FINAL, IN, NCHANNELS, OUT, REDUCE, TMP, Copy, Final, Message,  # noqa: F401
                    Plan, PlanError, Reduce, Step, _EMPTY, _HELD, _OPS, _new, _new_step, block_bounds,
                    copy_is_noop, max_width, ranks_by_group, typed)


class PlanBuilder:
    """Collects the steps of one rank's plan. Algorithms compose phases with it.

    ``step()`` opens a new step; ``send``/``recv``/``reduce``/``copy``/``final``
    add to the open step. ``scratch(n)`` reserves ``n`` elements of TMP and
    returns their offset; ``release(offset)`` hands back everything reserved from
    it on, so successive phases reuse the same scratch.
    """

    def __init__(self, algorithm, rank, size, count, _parent=None):
        self.algorithm = algorithm
        self.rank = rank
        self.size = size
        self.count = count
        self._steps = []
        self._runs = []  # (first step, Columns): runs of steps added as columns (add_columns)
        # the open step: its lists are made on first use (most steps of a pipelined tree
        # are empty on most ranks)
        self._is_open = False
        self._sends = self._recvs = self._local = None
        self._tmp_top = 0
        self._tmp_peak = 0
        self._parent = _parent

    # tracks: phases that run side by side, step for step (two trees, several rings)
    def tracks(self, n):
        """``n`` sub-builders sharing this one's scratch; ``join`` merges them step by step."""
        self._close()
        self._track_mark = self._tmp_top
        return [PlanBuilder(self.algorithm, self.rank, self.size, self.count, _parent=self)
                for _ in range(n)]

    def join(self, tracks):
        """Append the tracks' steps zipped: step k of the result holds step k of every track."""
        self._close()
        self._tmp_top = getattr(self, "_track_mark", self._tmp_top)  # the tracks' scratch is free again
        if any(t._runs for t in tracks):  # as columns: step k of every track, in track order
            plans = [t.build() for t in tracks]
            runs = [p.columns or Columns.from_steps(p.steps) for p in plans]
            self.add_columns(Columns.concatenate(max(r.nsteps for r in runs), [(0, r) for r in runs]))
            return
        lists = [t.build().steps for t in tracks]
        append = self._steps.append
        empty = _EMPTY
        for parts in zip_longest(*lists, fillvalue=empty):
            live = [s for s in parts if s is not empty]
            if not live:
                append(empty)
            elif len(live) == 1:
                append(live[0])
            else:
                sends, recvs, local = live[0]
                for more in live[1:]:
                    sends, recvs, local = sends + more[0], recvs + more[1], local + more[2]
                append(_new_step(Step, (sends, recvs, local)))

    # steps
    def step(self):
        if self._is_open:
            self._close()
        self._is_open = True
        return self

    def _close(self):
        # Empty steps are kept while building, so that tracks stay aligned step for step;
        # the plan drops them (they wait for nothing).
        if self._is_open:
            sends, recvs, local = self._sends, self._recvs, self._local
            if sends is None and recvs is None and local is None:
                self._steps.append(_EMPTY)
            else:
                self._steps.append(_new_step(Step, (() if sends is None else tuple(sends),
                                                    () if recvs is None else tuple(recvs),
                                                    () if local is None else tuple(local))))
                self._sends = self._recvs = self._local = None
            self._is_open = False

    def add_step(self, sends=(), recvs=(), local=()):
        """Close the open step and append a whole one: tuples of messages and operations as in
        ``Step``, taken as given (nothing empty is dropped). The fast way for phases that make
        many steps; ``step()`` and the calls below are the convenient one."""
        if self._is_open:
            self._close()
        self._steps.append(_new_step(Step, (sends, recvs, local)) if sends or recvs or local else _EMPTY)

    def add_columns(self, columns):
        """Close the open step and append ``columns.nsteps`` steps given as a
        ``collectives.columns.Columns`` (what the ring phases write: every step at once)."""
        for name in ("send_step", "recv_step", "local_step"):
            at = getattr(columns, name)
            if len(at) and (at.min() < 0 or at.max() >= columns.nsteps):
                raise ValueError(f"{self.algorithm}: columns' {name} outside 0..{columns.nsteps - 1}")
        if len(columns.local) and not ((columns.local[:, 0] >= REDUCE) & (columns.local[:, 0] <= FINAL)).all():
            raise ValueError(f"{self.algorithm}: a local operation of the columns is not REDUCE, COPY or FINAL")
        if self._is_open:
            self._close()
        self._runs.append((len(self._steps), columns))
        self._steps.extend([_HELD] * columns.nsteps)

    def add_steps(self, steps):
        """Close the open step and append whole steps, ``Step`` tuples (or ``_EMPTY``) as
        ``add_step`` makes them: the pipelined trees build theirs in one loop."""
        if self._is_open:
            self._close()
        self._steps.extend(steps)

    def send(self, peer, buf, lo, hi, chan=0):
        if hi > lo:
            self._is_open = True
            if self._sends is None:
                self._sends = [_new(Message, (peer, buf, lo, hi, chan))]
            else:
                self._sends.append(_new(Message, (peer, buf, lo, hi, chan)))

    def recv(self, peer, buf, lo, hi, chan=0):
        if hi > lo:
            self._is_open = True
            if self._recvs is None:
                self._recvs = [_new(Message, (peer, buf, lo, hi, chan))]
            else:
                self._recvs.append(_new(Message, (peer, buf, lo, hi, chan)))

    def _add_local(self, op):
        self._is_open = True
        if self._local is None:
            self._local = [op]
        else:
            self._local.append(op)

    def reduce(self, dst, dlo, a, alo, b, blo, n):
        if n > 0:
            self._add_local(_new(Reduce, (REDUCE, dst, dlo, a, alo, b, blo, n)))

    def copy(self, dst, dlo, src, slo, n):
        # An OUT <- IN copy at one offset stays in the plan: it is a no-op only when the
        # call runs in place, and runners skip it then (copy_is_noop).
        if n > 0 and not (dst == src and dlo == slo):
            self._add_local(_new(Copy, (COPY, dst, dlo, src, slo, n)))

    def final(self, buf, lo, n):
        if n > 0:
            self._add_local(_new(Final, (FINAL, buf, lo, n)))

    # scratch
    def scratch(self, n):
        if self._parent is not None:
            return self._parent.scratch(n)
        offset = self._tmp_top
        self._tmp_top += n
        self._tmp_peak = max(self._tmp_peak, self._tmp_top)
        return offset

    def release(self, offset):
        if self._parent is not None:  # a track's scratch is held until its parent joins it
            return
        self._tmp_top = offset

    def build(self, in_count=None, out_count=None):
        self._close()
        steps = self._steps
        if self._runs:  # some steps came as columns: the plan is stored as columns
            at = [k for k, step in enumerate(steps) if step is not _HELD and step is not _EMPTY]
            pieces = self._runs + ([(0, Columns.from_steps([steps[k] for k in at], at))] if at else [])
            columns = Columns.concatenate(len(steps), pieces)
            if self._parent is None:
                columns = columns.without_empty_steps()
            return Plan(self.algorithm, self.rank, self.size, self.count, None, self._tmp_peak,
                        in_count, out_count, columns=columns)
        if self._parent is None:
            steps = [s for s in steps if s is not _EMPTY and (s.sends or s.recvs or s.local)]
        return Plan(self.algorithm, self.rank, self.size, self.count, steps, self._tmp_peak,
                    in_count, out_count)
