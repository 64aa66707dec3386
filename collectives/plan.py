"""Plans: one description of an all-reduce that every backend of this library runs.

A plan is what one rank does, as a list of steps. Each step posts its messages
together (nonblocking), waits for all of them, then runs its local operations
in order. The real executor (``execute``) runs a plan over any communicator; the
simulator (``collectives.simulate``) runs the plans of all ranks to predict time
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

Rules a plan keeps (the symbolic check in ``collectives.simulate`` enforces them):
``IN`` is never written; an element of ``IN`` is never read after the same element
of ``OUT`` was written (so a plan also runs in place, with ``IN is OUT``); every
element of ``OUT`` ends complete with exactly one FINAL applied.
"""
from collections import namedtuple
from itertools import zip_longest

from .plan_errors import PlanError  # noqa: F401 - defined apart, imported from here by every reader

IN, OUT, TMP = 0, 1, 2
BUFFER_NAMES = ("in", "out", "tmp")
REDUCE, COPY, FINAL = 0, 1, 2
NCHANNELS = 8

Step = namedtuple("Step", "sends recvs local")
Step.__doc__ = "Messages posted together, then local operations: see the module docstring."
Message = namedtuple("Message", "peer buf lo hi chan")
Message.__doc__ = "Elements lo:hi of buffer ``buf``, sent to or received from ``peer`` on channel ``chan``."
Reduce = namedtuple("Reduce", "kind dst dlo a alo b blo n")
Reduce.__doc__ = "``kind`` REDUCE: dst[dlo:dlo+n] = a[alo:alo+n] (op) b[blo:blo+n], ``a`` the left operand."
Copy = namedtuple("Copy", "kind dst dlo src slo n")
Copy.__doc__ = "``kind`` COPY: dst[dlo:dlo+n] = src[slo:slo+n] (nothing where ``copy_is_noop``)."
Final = namedtuple("Final", "kind buf lo n")
Final.__doc__ = "``kind`` FINAL: buf[lo:lo+n] is complete (``avg`` divides it here)."


_OPS = {REDUCE: Reduce, COPY: Copy, FINAL: Final}


def typed(step):
    """``step`` with every message a ``Message`` and every local operation a ``Reduce``, ``Copy``
    or ``Final`` (entries are plain tuples where the bulk paths made them)."""
    sends, recvs, local = step
    return Step(tuple(Message._make(m) for m in sends), tuple(Message._make(m) for m in recvs),
                tuple(_OPS[op[0]]._make(op) for op in local))


def copy_is_noop(op, in_place):
    """Whether the COPY ``op`` writes nothing: it copies a region onto itself, or, when the call
    runs in place (IN is OUT), copies between IN and OUT at one offset. The binder
    (``collectives.binding``, for every runner) and the symbolic check skip exactly these.
    The fields may be NumPy arrays (``in_place`` a bool):
    the answer is then elementwise."""
    _, dst, dlo, src, slo, _ = op
    return (dlo == slo) & ((dst == src) | (in_place & (((dst == IN) & (src == OUT)) | ((dst == OUT) & (src == IN)))))


class Plan:
    """What one rank does in one collective: ``steps`` plus the scratch size it needs."""

    __slots__ = ("algorithm", "rank", "size", "count", "_steps", "columns", "tmp_count", "in_count", "out_count")

    def __init__(self, algorithm, rank, size, count, steps, tmp_count, in_count=None, out_count=None,
                 columns=None):
        self.algorithm = algorithm
        self.rank = rank
        self.size = size
        self.count = count
        self._steps = steps
        self.columns = columns  # the same steps as arrays (collectives.columns), where a phase wrote them so
        self.tmp_count = tmp_count
        self.in_count = count if in_count is None else in_count
        self.out_count = count if out_count is None else out_count

    @property
    def steps(self):
        """The steps as tuples; a plan stored as columns makes them on first use and keeps them."""
        if self._steps is None:
            self._steps = self.columns.steps()
        return self._steps

    nsteps = property(lambda self: self.columns.nsteps if self._steps is None else len(self._steps),
                      doc="How many steps, without making a columnar plan's tuples.")

    @steps.setter
    def steps(self, steps):  # a plan edited by hand (tests) is its tuples alone
        self._steps, self.columns = steps, None

    def __repr__(self):
        return (f"Plan({self.algorithm!r}, rank={self.rank}, size={self.size}, count={self.count}, "
                f"steps={self.nsteps}, tmp={self.tmp_count})")

    def bytes_sent(self, itemsize=1):
        return sum(hi - lo for step in self.steps for (_, _, lo, hi, _) in step.sends) * itemsize

    def bytes_received(self, itemsize=1):
        return sum(hi - lo for step in self.steps for (_, _, lo, hi, _) in step.recvs) * itemsize


class block_bounds:
    """Element bounds of ``numpy.array_split(range(count), parts)``: parts+1 offsets.

    A lazy sequence (O(1) to build and to index), so that plans of a 65,536-rank world
    do not each carry a 65,537-entry list."""

    __slots__ = ("q", "r", "parts", "max_width")

    def __init__(self, count, parts):
        self.q, self.r = divmod(count, parts)
        self.parts = parts
        self.max_width = self.q + (1 if self.r else 0)

    def __len__(self):
        return self.parts + 1

    def __getitem__(self, i):
        if i.__class__ is int and 0 <= i <= self.parts:  # the common case, first
            return i * self.q + (i if i < self.r else self.r)
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.parts + 1))]
        if i < 0:
            i += self.parts + 1
        if not 0 <= i <= self.parts:
            raise IndexError(i)
        return i * self.q + min(i, self.r)

    def __iter__(self):
        return iter(self.tolist())

    def tolist(self):
        q, r = self.q, self.r
        return [i * q + (i if i < r else r) for i in range(self.parts + 1)]

    def __eq__(self, other):
        return list(self) == list(other)

    def __repr__(self):
        return f"block_bounds({list(self)!r})"


def ranks_by_group(groups):
    """The ranks of each group, groups in order of their first rank, from the group of every
    rank (a node colour, a host number): (5, 5, 9, 5) -> ((0, 1, 3), (2,))."""
    members = {}
    for rank, group in enumerate(groups):
        members.setdefault(group, []).append(rank)
    return tuple(tuple(ranks) for ranks in members.values())


def max_width(bounds):
    """The widest chunk of a bounds sequence."""
    width = getattr(bounds, "max_width", None)
    if width is None:
        width = max((bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)), default=0)
    return width


_EMPTY = Step((), (), ())
_HELD = Step((), (), ())  # a step number held by a run of steps added as columns
_new = _new_step = tuple.__new__  # Step(...) etc. without the namedtuple's Python-level __new__


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
            from .columns import Columns
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
            from .columns import Columns
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
