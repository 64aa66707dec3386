"""One call over the shared-memory transport, as the step loop's actions (``ShmRoute.bind_call``).

``ShmRoute`` is what the call pipeline holds for a call shape that runs over shared memory: the
node's transport (shm.ShmTransport), every rank's plan of the call (a receiver lays out its
senders' staging from them) and the call's signature. Its ``bind_call`` has the interface of every
transport's (comm/base.py): the plan on the call's buffers as actions that ``executor.run`` calls
in order. The actions of one call (``ShmCall``):

- ``begin``: wait until the readers of this rank's staging in the previous call are done, publish
  the call's header fields (growing the window, collectively, where the call needs more staging);
- per step, ``step``: post the messages to other hosts (MPI), stage the sends that are not read
  in place, raise the progress counter, wait for the senders of this step's receives from the
  node and copy them (or map them), then run the step's local operations, which read mapped
  receives in place;
- ``end``: mark the call done (and, where a shared array's memory was sent direct, wait until
  its readers are done: the caller may write the array next).
"""
from functools import partial

import numpy as np

from .. import config
from ..binding import COPY, REDUCE
from ..ops import aligned_parts
from ..plan import TMP
from . import cma as _cma
from .shm_header import DONE, FENCE, PROGRESS
from .shm_layout import F_CMA, F_IN_PLACE, F_IN_SHARED, F_OUT_SHARED


class ShmRoute:
    """A call shape's way over shared memory: ``transport``, ``plans_of(rank)`` and ``signature``."""

    __slots__ = ("transport", "plans_of", "signature")

    def __init__(self, transport, plans_of, signature):
        self.transport, self.plans_of, self.signature = transport, plans_of, signature

    def bind_call(self, plan, buffers, reduce_fn, final_fn, what, tag, keep=False, split=True, sync=None):
        """The call's actions (see the module docstring); ``keep``, ``split`` and ``sync`` do not
        apply (every call publishes its own progress; host memory only)."""
        return ShmCall(self.transport, plan, self.plans_of, buffers, reduce_fn, final_fn, what, self.signature,
                       tag).actions()


class ShmCall:
    """The state of one call over the shared-memory transport while the step loop runs it."""

    __slots__ = ("transport", "plan", "plans_of", "buffers", "reduce_fn", "final_fn", "what", "signature", "tag",
                 "sources", "steps", "call", "sig", "limit", "base", "mine")

    def __init__(self, transport, plan, plans_of, buffers, reduce_fn, final_fn, what, signature, tag):
        self.transport, self.plan, self.plans_of, self.buffers = transport, plan, plans_of, buffers
        self.reduce_fn, self.final_fn, self.what, self.signature, self.tag = reduce_fn, final_fn, what, signature, tag
        self.sources = {}  # (peer, chan) -> [messages taken so far, the sender's messages, its header]

    def actions(self):
        """begin, then each step (its exchange, then its local operations), then end (a generator:
        the layout of the call is worked out as the loop starts it)."""
        steps = self.begin()
        step_action = self.step
        for step in steps.steps:
            yield partial(step_action, step)
        yield self.end

    # begin -----------------------------------------------------------------------------------------
    def begin(self):
        """Lay the call out, wait for last call's readers, publish this call: its shm_layout.Call."""
        t, (inbuf, outbuf, _) = self.transport, self.buffers
        in_place = inbuf is outbuf
        flags = (F_IN_PLACE if in_place else 0) | (F_CMA if t.cma else 0)
        in_at = t.shared.locate(inbuf)
        out_at = in_at if in_place else t.shared.locate(outbuf)
        flags |= (F_IN_SHARED if in_at is not None else 0) | (F_OUT_SHARED if out_at is not None else 0)
        steps = self.steps = t.layouts.call(self.plan, outbuf.itemsize, flags, self.final_fn is not None,
                                            self.plans_of)
        call = self.call = t.calls + 1
        t.what = self.what  # the call's name, which a mismatch names (a wait names its step)
        self.sig, fields = t.signed(self.signature)
        self.limit = limit = config.timeout()
        # the staging of the last call may still be read: wait for its readers to finish it
        if t.readers:
            t._wait_done(t.readers, call - 1, self.what, limit, self.sig, self.tag)
        need = steps.need if steps.need > t.capacity else 0
        t._publish_call(fields, self.sig, flags, in_at, out_at, inbuf, outbuf, steps.direct)
        self.base = call << 32
        t.header[PROGRESS] = self.base  # this call has begun: its fields can be compared
        if need:
            t._agree_and_grow(need, self.sig, call, self.what, limit)
            t._publish_call(fields, self.sig, flags, in_at, out_at, inbuf, outbuf, steps.direct)  # the new window
            t.header[PROGRESS] = self.base
        t.calls = call
        dtype = outbuf.dtype
        mine = t.staging[t.node_index[t.comm.rank]]
        self.mine = mine[:mine.size - mine.size % dtype.itemsize].view(dtype)  # staging offsets are in elements
        return steps

    # one step: its messages, then its local operations ------------------------------------------------
    def step(self, step):
        """A step as shm_layout.Call worked it out: regions (IN/OUT/TMP, lo, hi), messages to other
        hosts (MPI), staged sends, receives from this node (a mapped one is read in place), then
        its local operations, which read mapped receives from the peer's memory."""
        index, far_recvs, far_sends, staged, near, ops, label = step
        t, bufs, tag = self.transport, self.buffers, self.tag
        # messages to other hosts: MPI, posted first
        requests = None
        if far_recvs or far_sends:
            comm = t.comm
            requests = [comm.irecv(_operand(bufs, None, region), peer, tag + chan) for region, peer, chan in far_recvs]
            requests += [comm.isend(_operand(bufs, None, region), peer, tag + chan) for region, peer, chan in far_sends]
        # shared-memory sends: stage what is not read in place, then publish the step
        mine = self.mine
        for b, lo, hi, at in staged:
            np.copyto(mine[at:at + hi - lo], bufs[b][lo:hi])
        if FENCE:
            t.window.Sync()
        t.header[PROGRESS] = self.base | (index + 1)
        # shared-memory receives: wait for the sender's step, then copy or map
        views = None
        if near:
            dtype = mine.dtype
            t._wait_steps(near, self.sources, self.plans_of, dtype.itemsize, self.call, self.sig, self.what + label,
                          self.limit, tag, requests)
            for peer, region, chan, mapped in near:
                source = t._source(self.sources, peer, chan, dtype)
                if source.__class__ is tuple:  # cross-memory attach: one copy out of the peer
                    _cma.read(source[0], source[1], _operand(bufs, None, region))
                elif mapped:
                    if views is None:
                        views = []
                    views.append((region[1], region[2], source))
                else:
                    np.copyto(_operand(bufs, None, region), source)
        if requests:
            t.comm.waitall(requests, self.what + label)
        # local operations
        for op in ops:
            kind = op[0]
            if kind == REDUCE:
                reduce_fn = self.reduce_fn
                for out, left, right in aligned_parts(_operand(bufs, None, op[1]), _operand(bufs, views, op[2]),
                                                      _operand(bufs, views, op[3])):
                    reduce_fn(left, right, out=out)
            elif kind == COPY:
                np.copyto(_operand(bufs, None, op[1]), _operand(bufs, views, op[2]))
            else:  # FINAL (bound only where final_fn is given)
                self.final_fn(_operand(bufs, None, op[1]))

    # end -------------------------------------------------------------------------------------------
    def end(self):
        t = self.transport
        if FENCE:
            t.window.Sync()
        t.header[DONE] = self.call
        t.readers = self.steps.readers
        if self.steps.direct:  # the caller may write its shared array next: its readers must be done
            t._wait_done(t.readers, self.call, self.what, self.limit, self.sig, self.tag)


def _operand(bufs, views, region):
    """The array a bound region ``(buf, lo, hi)`` names: a mapped receive's peer memory (``views``:
    (lo, hi, source) of this step's mapped receives into TMP) where one holds it, else the buffer."""
    buf, lo, hi = region
    if views is not None and buf == TMP:
        for vlo, vhi, source in views:
            if vlo <= lo and hi <= vhi:
                return source[lo - vlo:hi - vlo]
    return bufs[buf][lo:hi]
