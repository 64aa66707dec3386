"""The parts of a plan: its steps' named tuples and kinds, the Plan record, block bounds.

Defined once here, below both the builder (collectives/plan.py) and the column store
(collectives/columns.py); collectives/plan.py re-exports every name, and its docstring says
what a plan is.
"""
from collections import namedtuple

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
