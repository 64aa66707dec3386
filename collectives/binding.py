"""Binding: the one place where a plan's entries become what a runner does.

Plan entries are tuples read by position (``collectives.plan``: the bulk phase paths store
plain tuples, for speed). Every runner of plans on data (the executor's ``execute``, the
prepared ``Program``, the shared-memory transport, the TensorFlow lowering in ``tf_bridge``)
walks them through ``bind`` instead of unpacking them itself, so the layout of an entry and the
rule for a copy that writes nothing (``copy_is_noop``) live in plan.py and here, nowhere else.
(The simulator and the symbolic check read every rank's plan at once as NumPy columns,
``collectives.flat``; the shared-memory transport's static layout, ``comm/shm_layout.py``, reads
where each message lies from the plan itself.)

``bind(plan, buffers, in_place, finals=True)`` gives a list with, for each step of ``plan`` in
order, ``(index, sends, recvs, ops)``:

- ``index``: the step's index in ``plan.steps`` (a runner's error names step ``index + 1``);
- ``sends``, ``recvs``: the step's messages, in the plan's order (none dropped), as
  ``(peer, region, chan)``, in fresh lists (the caller's to keep or change);
- ``ops``: its local operations, in order (a list; ``()`` where it has none), as tuples
  whose first field is their kind:

  - ``(REDUCE, dst, a, b)``: ``dst = a (op) b``, ``a`` the left operand (the plan's order),
  - ``(COPY, dst, src)``: ``dst = src``; the copies that write nothing when the call runs with
    ``in_place`` (IN is OUT) are already dropped,
  - ``(FINAL, region)``: the region is complete (``avg`` divides it); only where ``finals``.

``buffers`` are the runner's IN, OUT and TMP, and a region is ``buffers[buf][lo:hi]``: for the
executor and programs, NumPy or CuPy arrays, so a region is an array view made at C speed (no
Python call per region: ``execute`` binds its plan on every call). Runners that resolve regions
themselves pass ``Named`` buffers, whose regions are ``(name, lo, hi)``: the shared-memory
transport (``NAMES``: a region of TMP may be read from a peer's memory instead) and the
TensorFlow lowering (its buffers of tensor pieces as names). A binding holds views or names,
never data: a region is read when the runner reaches its step.
"""
from .plan import COPY, FINAL, IN, OUT, REDUCE, TMP, copy_is_noop

__all__ = ["bind", "Named", "NAMES", "REDUCE", "COPY", "FINAL"]


def bind(plan, buffers, in_place, finals=True):
    """``[(index, sends, recvs, ops), ...]``: every step of ``plan`` with its regions sliced from
    ``buffers`` (IN, OUT, TMP); see the module docstring."""
    # plain loops: in Python 3.11 a comprehension costs a function call, and most steps hold
    # one message each way and one operation (execute binds on every call)
    bound = []
    index = 0
    for sends, recvs, local in plan.steps:
        bound_sends = []
        for peer, buf, lo, hi, chan in sends:
            bound_sends.append((peer, buffers[buf][lo:hi], chan))
        bound_recvs = []
        for peer, buf, lo, hi, chan in recvs:
            bound_recvs.append((peer, buffers[buf][lo:hi], chan))
        if local:
            ops = []
            for op in local:
                kind = op[0]
                if kind == REDUCE:
                    _, dst, dlo, a, alo, b, blo, n = op
                    ops.append((REDUCE, buffers[dst][dlo:dlo + n], buffers[a][alo:alo + n], buffers[b][blo:blo + n]))
                elif kind == COPY:
                    if not copy_is_noop(op, in_place):
                        _, dst, dlo, src, slo, n = op
                        ops.append((COPY, buffers[dst][dlo:dlo + n], buffers[src][slo:slo + n]))
                elif kind == FINAL:
                    if finals:
                        _, buf, lo, n = op
                        ops.append((FINAL, buffers[buf][lo:lo + n]))
                else:
                    raise ValueError(f"{plan.algorithm} plan, step {index + 1}: unknown local operation {op!r}")
        else:
            ops = ()
        bound.append((index, bound_sends, bound_recvs, ops))
        index += 1
    return bound


class Named:
    """A buffer for ``bind`` whose region ``[lo:hi]`` is ``(name, lo, hi)``: for runners that
    resolve regions themselves (``name`` is theirs: IN/OUT/TMP, or a buffer object)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __getitem__(self, region):
        return (self.name, region.start, region.stop)

    def __repr__(self):
        return f"Named({self.name!r})"


NAMES = (Named(IN), Named(OUT), Named(TMP))  # regions as (IN/OUT/TMP, lo, hi)
