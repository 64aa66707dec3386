"""A plan's steps stored as numpy columns: the form the bulk phases write and the simulator reads.

A plan of a 1,024-rank ring has 2,046 steps on each rank, two million over the world; as
tuples, making them and taking them apart again for the simulator was most of a simulation's
time. The phases that make nearly all of those entries (``phases.ring_reduce_scatter`` and
``ring_allgather``) therefore compute one rank's steps at once, as arrays over the step number,
and ``PlanBuilder`` keeps them so. The plan is the same plan: ``Plan.steps`` gives the very
tuples (``Step``, plain tuples of the same fields, empty steps as ``Step((), (), ())``) on first
use and keeps them, which is what the executor, the prepared programs and the transports read;
``collectives.flat`` concatenates the columns of every rank with no per-entry work.

``Columns`` holds, for ``nsteps`` steps:

- ``send_step`` (n,) and ``sends`` (n, 5): the step of each send and its
  ``(peer, buf, lo, hi, chan)``, steps in order and, within a step, in post order,
- ``recv_step`` and ``recvs`` the same for receives,
- ``local_step`` (n,) and ``local`` (n, 8): local operations, each row a ``Reduce``, ``Copy`` or
  ``Final`` padded with zeros to 8 fields (its first field, the kind, tells the length).
"""
import numpy as np

from .steps import COPY, FINAL, REDUCE, Step, _EMPTY, _new_step, block_bounds

_LENGTH = {REDUCE: 8, COPY: 6, FINAL: 4}


def bounds_array(bounds):
    """Chunk bounds (``block_bounds`` or any sequence of offsets) as an int64 array."""
    if isinstance(bounds, block_bounds):
        every = np.arange(bounds.parts + 1, dtype=np.int64)
        return every * bounds.q + np.minimum(every, bounds.r)
    return np.asarray(list(bounds), np.int64)


def element_counts(local):
    """Each row's element count ``n``, for local operations as rows padded to 8 fields (a row of
    an unknown kind reads as a FINAL's, for the symbolic check to name)."""
    kind = local[:, 0]
    return np.where(kind == REDUCE, local[:, 7], np.where(kind == COPY, local[:, 5], local[:, 3]))


def _table(n, fields):
    """An (n, len(fields)) int64 array from scalars and length-n arrays, one per column."""
    table = np.empty((n, len(fields)), np.int64)
    for column, value in enumerate(fields):
        table[:, column] = value
    return table


class Columns:
    """One rank's steps (or a run of them) as arrays; see the module docstring."""

    __slots__ = ("nsteps", "send_step", "sends", "recv_step", "recvs", "local_step", "local")

    def __init__(self, nsteps, send_step, sends, recv_step, recvs, local_step, local):
        self.nsteps = nsteps
        self.send_step, self.sends = send_step, sends
        self.recv_step, self.recvs = recv_step, recvs
        self.local_step, self.local = local_step, local

    @classmethod
    def of(cls, nsteps, sends=(), recvs=(), local=()):
        """Columns from groups of rows: each group ``(keep, step, fields...)`` where ``keep`` is
        a bool array (rows whose region is empty are dropped, as ``PlanBuilder.send`` and its
        siblings drop them) or None, ``step`` the steps (an array) and each field a scalar or an
        array over the same rows. Rows of one step keep the order of the groups."""
        parts = []
        for groups, width in ((sends, 5), (recvs, 5), (local, 8)):
            steps, tables = [], []
            for keep, step, *fields in groups:
                fields = list(fields) + [0] * (width - len(fields))
                table = _table(len(step), fields)
                if keep is not None:
                    step, table = step[keep], table[keep]
                steps.append(np.asarray(step, np.int64))
                tables.append(table)
            parts.append(_merge(steps, tables, width))
        (send_step, sends), (recv_step, recvs), (local_step, local) = parts
        return cls(nsteps, send_step, sends, recv_step, recvs, local_step, local)

    @classmethod
    def from_steps(cls, steps, at=None):
        """Columns from ``Step`` tuples; ``at`` gives each step's number (default 0, 1, ...)."""
        at = range(len(steps)) if at is None else at
        nsteps = (max(at) + 1) if len(steps) else 0
        rows = ([], [], [])
        numbers = ([], [], [])
        for number, step in zip(at, steps):
            for kind, entries in enumerate(step):
                if entries:
                    rows[kind].extend(entries)
                    numbers[kind].extend([number] * len(entries))
        local = np.zeros((len(rows[2]), 8), np.int64)
        for index, op in enumerate(rows[2]):
            local[index, :len(op)] = op
        return cls(nsteps, np.array(numbers[0], np.int64), np.array(rows[0], np.int64).reshape(-1, 5),
                   np.array(numbers[1], np.int64), np.array(rows[1], np.int64).reshape(-1, 5),
                   np.array(numbers[2], np.int64), local)

    @classmethod
    def concatenate(cls, nsteps, pieces):
        """One ``Columns`` of ``nsteps`` steps from ``(first step, Columns)`` pieces; entries of one
        step keep the order of the pieces."""
        merged = []
        for name, width in (("send", 5), ("recv", 5), ("local", 8)):
            steps = [getattr(part, name + "_step") + first for first, part in pieces]
            tables = [getattr(part, name + ("s" if name != "local" else "")) for _, part in pieces]
            merged.append(_merge(steps, tables, width))
        (send_step, sends), (recv_step, recvs), (local_step, local) = merged
        return cls(nsteps, send_step, sends, recv_step, recvs, local_step, local)

    def without_empty_steps(self):
        """The same entries with steps that hold none left out (a plan drops them)."""
        used = np.zeros(self.nsteps + 1, bool)
        for at in (self.send_step, self.recv_step, self.local_step):
            used[at] = True
        number = np.cumsum(used) - 1  # a used step's new number
        kept = int(number[-2]) + 1 if self.nsteps else 0
        if kept == self.nsteps:
            return self
        return Columns(kept, number[self.send_step], self.sends, number[self.recv_step], self.recvs,
                       number[self.local_step], self.local)

    def element_counts(self):
        """Each local operation's element count ``n``."""
        return element_counts(self.local)

    def steps(self):
        """The steps as ``Step`` tuples of plain tuples (see the module docstring)."""
        n = self.nsteps
        every = np.arange(n + 1)
        cuts = [np.searchsorted(at, every).tolist() for at in (self.send_step, self.recv_step, self.local_step)]
        sends = list(map(tuple, self.sends.tolist()))
        recvs = list(map(tuple, self.recvs.tolist()))
        length = _LENGTH
        local = [tuple(row[:length[row[0]]]) for row in self.local.tolist()]
        (s, r, l) = cuts
        steps = []
        append = steps.append
        for k in range(n):
            if s[k] == s[k + 1] and r[k] == r[k + 1] and l[k] == l[k + 1]:
                append(_EMPTY)
            else:
                append(_new_step(Step, (tuple(sends[s[k]:s[k + 1]]), tuple(recvs[r[k]:r[k + 1]]),
                                   tuple(local[l[k]:l[k + 1]]))))
        return steps


def _merge(steps, tables, width):
    """Concatenate runs of (step numbers, rows) and order the rows by step, stably."""
    if not steps:
        return np.zeros(0, np.int64), np.zeros((0, width), np.int64)
    step = np.concatenate(steps) if len(steps) > 1 else steps[0]
    table = np.concatenate(tables) if len(tables) > 1 else tables[0]
    if len(step) > 1 and (step[1:] < step[:-1]).any():
        order = np.argsort(step, kind="stable")
        step, table = step[order], table[order]
    return step, table
