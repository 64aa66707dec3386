"""The executor: the one step loop (``run``) and what feeds it.

A call's plan, bound to its buffers by the transport that carries it (``bind_call``: MPI
point-to-point, the threaded world, shared memory within a node, a compressed wire), is a
sequence of actions: each step's exchange (post and wait its messages) and its local
operations. ``run`` calls them in order. ``execute`` binds a plan for one call; a ``Program``
binds it once, the transport preparing its steps (MPI: persistent requests), and reruns it."""
from functools import partial
from weakref import ref as _weakref

import numpy as np

from .backend import NUMPY as _NUMPY
from .binding import COPY, REDUCE, bind
from .ops import aligned_parts
from .plan import NCHANNELS


class StepName:
    """"allreduce(ring) step 3/6", formatted only if an error message needs it."""

    __slots__ = ("what", "index", "nsteps")

    def __init__(self, what, index, nsteps):
        self.what, self.index, self.nsteps = what, index, nsteps

    def __str__(self):
        return f"{self.what} step {self.index + 1}/{self.nsteps}"

    def __format__(self, spec):
        return format(str(self), spec)


# the step loop -----------------------------------------------------------------------------------
def run(actions):
    """The step loop: every call of every runner and transport ends here. ``actions`` are a call
    bound by its transport (``bind_call``): zero-argument callables in the plan's order, each
    step's exchange (the transport posts and waits its messages) and then its local operations."""
    for action in actions:
        action()


def actions(plan, buffers, reduce_fn, final_fn, what, step, sync=None):
    """``plan`` bound to ``buffers`` (IN, OUT, TMP; IN is OUT: in place) as the step loop's actions,
    made as the loop reaches each step: ``step(sends, recvs, name)``, the transport's callable that
    posts and waits a step's messages (``name`` formats as "allreduce(ring) step 3/6" in errors),
    then the step's operations as pre-sliced ufunc calls. ``reduce_fn(a, b, out)`` is the op's
    ufunc; ``final_fn(region)`` runs where the plan marks a region complete (``avg`` divides there)
    or is None. ``sync()``, where given (device arrays), runs before each step's messages and at
    the end, so that MPI never reads device memory a kernel is still writing."""
    nsteps = len(plan.steps)
    keyword_out = reduce_fn in _KEYWORD_OUT
    for index, sends, recvs, ops in bind(plan, buffers, buffers[0] is buffers[1], final_fn is not None):
        if sends or recvs:
            if sync is not None:
                yield sync
            yield step(sends, recvs, StepName(what, index, nsteps))
        for op in ops:
            kind = op[0]
            if kind == REDUCE:
                for out, a, b in aligned_parts(op[1], op[2], op[3]):
                    if keyword_out:
                        yield partial(reduce_fn, a, b, out=out)
                    else:  # a positional out= is the cheaper call
                        yield partial(reduce_fn, a, b, out)
            elif kind == COPY:
                yield partial(np.copyto if op[1].__class__ is np.ndarray else _copy, op[1], op[2])
            else:  # FINAL (bound only where final_fn is given)
                yield partial(final_fn, op[1])
    if sync is not None:
        yield sync


def _copy(dst, src):
    dst[...] = src


def execute(plan, comm, inbuf, outbuf, tmpbuf, reduce_fn, final_fn, what, sync=None, signature=None, transport=None):
    """Run ``plan`` once on ``comm`` with ``inbuf``/``outbuf``/``tmpbuf`` bound to IN/OUT/TMP
    (``actions`` has the arguments). ``signature`` (a string naming the call, algorithm, op,
    dtype, count, root and options) picks the call's tags (``comm.call_tag``): ranks that
    disagree on any of it never match each other's messages; None: ``comm.next_tag()``.
    ``transport`` binds the call (``bind_call``) where it is not ``comm`` itself (a ShmRoute)."""
    tag = (comm.next_tag() if signature is None else comm.call_tag(signature)) * NCHANNELS
    run((transport or comm).bind_call(plan, (inbuf, outbuf, tmpbuf), reduce_fn, final_fn, what, tag, sync=sync))


_KEYWORD_OUT = {np.maximum, np.minimum}  # NumPy deprecates a positional out= for these two


class Program:
    """A plan bound once to fixed buffers, for small messages, where per-call overhead is the
    cost: the transport prepares each step's message specs once (``comm.prepare``), and local
    operations are pre-sliced ufunc calls, so a call does no slicing and builds no plan data.

    A call copies the caller's data into a work buffer, runs the plan in place on it (IN and
    OUT both name the work buffer) and copies the result out; a pair of caller buffers seen
    twice in a row gets a second binding straight onto them, with no copies. A program has one
    fixed tag base, ``comm.program_tag(tag_key)``, so that the transport can set its messages
    up once (MPI: persistent requests). Every rank derives the same tag from ``tag_key``
    whatever its cache holds; the key names the call's whole signature (algorithm, op, dtype,
    count), so that ranks whose calls differ never match each other's messages: a waiting
    rank finds the peer's foreign message and raises MismatchError (or times out). Successive
    calls (of this and of other programs with the same key) share the tag and are kept apart
    by MPI's in-order matching between a pair of ranks, since every rank makes its calls in
    the same order; the tag range keeps them apart from other collectives.
    """

    def __init__(self, plan, comm, backend, dtype, count, reduce_fn, final_fn, what, tag_key):
        self.plan, self.comm, self.reduce_fn, self.final_fn, self.what = plan, comm, reduce_fn, final_fn, what
        self.work = work = backend.empty(max(count, 1), dtype)[:count]
        self.tmp = backend.empty(max(plan.tmp_count, 1), dtype)
        self.copyto = backend.copyto if backend.is_device else getattr(backend.xp, "copyto", backend.copyto)
        self.xp = backend.xp
        self.tag = comm.program_tag(tag_key) * NCHANNELS
        self.split = True  # a message past the library's eager limit travels as eager pieces
        self.calls = self._bind(work, work)
        self.bound = None  # (sendbuf, recvbuf, calls) bound to a caller's buffers
        self.last = None  # the caller's buffers of the previous call

    def _bind(self, inbuf, outbuf):
        """The plan on these buffers as the step loop's actions, the transport's steps prepared."""
        return self.comm.bind_call(self.plan, (inbuf, outbuf, self.tmp), self.reduce_fn, self.final_fn, self.what,
                                   self.tag, keep=True, split=self.split)

    def __call__(self, sendbuf, recvbuf):
        """Run on the caller's contiguous arrays (``recvbuf`` may be ``sendbuf``: in place)."""
        bound = self.bound
        if bound is not None and bound[0] is sendbuf and bound[1] is recvbuf:
            run(bound[2])
            return
        if not self._repeat(sendbuf, recvbuf):
            self._unbound(sendbuf, recvbuf)

    def _unbound(self, sendbuf, recvbuf):
        """A call on buffers with no binding: through the work buffer, copies in and out."""
        work = self.work
        self.copyto(work, sendbuf.reshape(-1))
        run(self.calls)
        self.copyto(recvbuf.reshape(-1), work)

    def _repeat(self, sendbuf, recvbuf):
        """The previous call's buffers again: bind to them and run (True); else remember them."""
        if self._was_last(sendbuf, recvbuf) and self._rebind(sendbuf, recvbuf):
            run(self.bound[2])
            return True
        self._remember(sendbuf, recvbuf)
        return False

    def _was_last(self, sendbuf, recvbuf):
        last = self.last
        return last is not None and last[0] is sendbuf and last[1] is recvbuf

    def _remember(self, sendbuf, recvbuf):
        self.last = (sendbuf, recvbuf)

    def _rebind(self, sendbuf, recvbuf):
        """Bind to the caller's buffers; False (stay on the work buffer) if they partly overlap."""
        if recvbuf is not sendbuf and self.xp.may_share_memory(sendbuf, recvbuf):
            return False
        flat_in = sendbuf.reshape(-1)
        flat_out = flat_in if recvbuf is sendbuf else recvbuf.reshape(-1)
        self.bound = (sendbuf, recvbuf, self._bind(flat_in, flat_out))
        return True

    def nbytes(self):
        """Bytes this program holds beyond the caller's buffers."""
        return self.work.nbytes + self.tmp.nbytes


class BoundProgram(Program):
    """A mid-size message's plan, bound to the caller's own buffers when a call repeats the
    previous call's pair (a training loop's gradient buffers): persistent requests and pre-sliced
    ufunc calls, as small-message programs run, with no copies in or out. Any other call runs
    the executor on the session's scratch.

    Either way the messages are the executor's: the call's signature tags (``comm.call_tag``, so
    the communicator must sign its calls) and whole messages, never eager pieces. A rank running
    the bound plan and a rank running ``execute`` (its buffers changed) meet. Binding needs a
    scratch of the plan's own (``plan.tmp_count`` elements, up to the message's size), and a
    binding keeps the caller's two arrays alive until it is dropped; the session caps what its
    bindings keep (scratch and arrays) at ``budget`` bytes, past which calls stay on the executor.
    The previous call's pair, which a repeat would bind, is held by weak references only.
    A bound call skips the executor's per-step Python work: docs/performance.md#bound-plans."""

    def __init__(self, plan, comm, dtype, count, reduce_fn, final_fn, what, signature, budget):
        self.plan, self.comm, self.reduce_fn, self.final_fn, self.what = plan, comm, reduce_fn, final_fn, what
        self.dtype, self.signature, self.budget = dtype, signature, budget
        self.copyto, self.xp = np.copyto, np
        self.work = self.tmp = None
        self.tag = comm.call_tag(signature) * NCHANNELS
        self.split = False
        self.bound = None
        self.last = None

    def _unbound(self, sendbuf, recvbuf):
        """A call on buffers with no binding: the executor, on the session's scratch."""
        flat_in = sendbuf.reshape(-1)
        flat_out = flat_in if recvbuf is sendbuf else recvbuf.reshape(-1)
        into = flat_out
        if recvbuf is not sendbuf and np.may_share_memory(sendbuf, recvbuf):
            into = np.empty_like(flat_out)  # overlapping buffers: reduce apart, then copy
        plan, comm = self.plan, self.comm
        tmp = comm.session.scratch_buffer(_NUMPY, self.dtype, plan.tmp_count)
        execute(plan, comm, flat_in, into, tmp, self.reduce_fn, self.final_fn, self.what, None, self.signature)
        if into is not flat_out:
            np.copyto(flat_out, into)

    def _was_last(self, sendbuf, recvbuf):
        last = self.last
        return last is not None and last[0]() is sendbuf and last[1]() is recvbuf

    def _remember(self, sendbuf, recvbuf):
        self.last = (_weakref(sendbuf), _weakref(recvbuf))

    def _rebind(self, sendbuf, recvbuf):
        self.bound = None  # a binding to other arrays is stale: drop it (and what it keeps alive)
        scratch = max(self.plan.tmp_count, 1) * self.dtype.itemsize
        arrays = sendbuf.nbytes + (0 if recvbuf is sendbuf else recvbuf.nbytes)
        others = sum(p.pinned() for p in self.comm.session.programs.values()
                     if p is not self and p.__class__ is BoundProgram)
        if others + scratch + arrays > self.budget:
            self.tmp = None
            return False
        if self.tmp is None:
            self.tmp = np.empty(max(self.plan.tmp_count, 1), self.dtype)
        return super()._rebind(sendbuf, recvbuf)

    def pinned(self):
        """Bytes this program's binding keeps alive: its scratch and the caller's arrays."""
        bound = self.bound
        if bound is None:
            return 0
        return self.tmp.nbytes + bound[0].nbytes + (0 if bound[1] is bound[0] else bound[1].nbytes)

    def nbytes(self):
        return 0 if self.tmp is None else self.tmp.nbytes
