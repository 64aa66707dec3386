"""Prepared steps of small-message programs over MPI, and the polling every MPI wait shares.

A prepared step is one plan step as persistent MPI requests on fixed buffers and a fixed tag:
a run is one ``Startall`` and a poll. ``poll_step`` is the bounded wait (COLLECTIVES_TIMEOUT)
with the probe for a foreign message (another call's) from the peers not yet heard from.
"""
import atexit
import os
import time
import weakref

from .. import config, mpilib
from ..errors import CollectiveTimeout, MismatchError, ProcessFailed
from .base import check_received, foreign_message

MPI = mpilib.load()
_BYTE = MPI.BYTE
_testall = MPI.Request.Testall
_startall = MPI.Prequest.Startall
_waitall = MPI.Request.Waitall


def _ranks_per_core():
    """Ranks of this job on this node per core of the node available to the job (0 when the
    launcher does not say): judged from the node's cores, not this rank's affinity mask, which
    a pinning launcher (Open MPI, Intel MPI, -bind-to core) narrows to one core."""
    return mpilib.ranks_per_core()


# A waiting rank yields its core at every deadline check (every _POLLS_PER_CHECK polls), from the
# start: the peer it waits for may share its core, and not only when the node has more ranks
# than cores (a job confined to fewer cores than the node has, ranks bound to one core). Where two
# ranks share a core, a spin before yielding makes every step cost the whole spin; where a rank has
# its core alone, sched_yield returns at once and costs nothing (docs/performance.md#yielding).
_OVERSUBSCRIBED = _ranks_per_core() > 1
_POLLS_PER_CHECK = 4 if _OVERSUBSCRIBED else 64  # polls between deadline checks (and yields)


# Largest message the MPI library sends eagerly between ranks of one node (at once into shared
# cells, no handshake with the receiver), for this library only, or 0 where unknown: measured
# (collectives.protocol; the tuning table records it), see mpilib.eager_limit.
# COLLECTIVES_EAGER_LIMIT overrides it.
_DEFAULT_EAGER_LIMIT = None  # found when the first program is prepared


def _eager_limit():
    global _DEFAULT_EAGER_LIMIT
    if _DEFAULT_EAGER_LIMIT is None:
        _DEFAULT_EAGER_LIMIT = mpilib.eager_limit()
    return config.eager_limit(_DEFAULT_EAGER_LIMIT)


MAX_PIECES = 4


def _pieces(peer, buf, chan, limit):
    """A prepared step's message as the pieces it travels in: a message past the eager ``limit``
    goes as the fewest pieces within the limit (on the same tag, matched in order), which stay
    eager, when that is at most MAX_PIECES; larger messages amortise the handshake and go whole
    (docs/performance.md#eager-pieces)."""
    if not limit or buf.nbytes <= limit:
        return [(peer, buf, chan)]
    flat = buf.reshape(-1)  # a view: step buffers are contiguous
    per_piece = max(1, limit // flat.itemsize)
    count = -(-flat.size // per_piece)
    if count > MAX_PIECES:
        return [(peer, buf, chan)]
    bounds = [flat.size * i // count for i in range(count + 1)]
    return [(peer, flat[lo:hi], chan) for lo, hi in zip(bounds, bounds[1:])]


_QUICK_SPINS = 4 if _OVERSUBSCRIBED else 64  # polls of a prepared step before the deadline-keeping poll loop (which yields)


_PROBE_AFTER = 0.02  # seconds a wait runs before it probes for a foreign message, and between probes


def timeout_error(what, silent, limit):
    """The error for a wait that ran out: names the call and the ranks not heard from."""
    return CollectiveTimeout(f"{what}: no message from rank{'s' if len(silent) > 1 else ''} "
                             f"{', '.join(map(str, silent))} after {limit:g} s")


# ULFM's error classes (Open MPI built with fault tolerance); where mpi4py's MPI lacks them it
# maps them to MPI_ERR_UNKNOWN, which never means a failed process
_FAILURE_CLASSES = {getattr(MPI, name, None): name for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                                              "ERR_REVOKED")}
_FAILURE_CLASSES = {cls: name for cls, name in _FAILURE_CLASSES.items()
                    if cls is not None and cls != MPI.ERR_UNKNOWN}


def process_failure(exc, what, peers, statuses=()):
    """The ProcessFailed for an MPI error that says a process failed or the communicator was
    revoked (directly, or in the statuses of MPI_ERR_IN_STATUS), else None. ``peers``: the peers
    of the requests, in order (those whose status names the failure are named where known)."""
    if not _FAILURE_CLASSES or not isinstance(exc, MPI.Exception):
        return None
    cls = exc.Get_error_class()
    named = []
    if cls == MPI.ERR_IN_STATUS:
        for peer, status in zip(peers, statuses):
            code = status.Get_error() if status is not None else MPI.SUCCESS
            if code != MPI.SUCCESS and MPI.Get_error_class(code) in _FAILURE_CLASSES:
                cls = MPI.Get_error_class(code)
                named.append(peer)
    if cls not in _FAILURE_CLASSES:
        return None
    who = sorted(set(named)) or sorted(set(peers))
    revoked = _FAILURE_CLASSES[cls] == "ERR_REVOKED"
    return ProcessFailed(f"{what}: {'the communicator was revoked (another rank found a failed process)' if revoked else 'a process failed'}"
                         f" (MPI_{_FAILURE_CLASSES[cls]}; this step waited on rank{'s' if len(who) > 1 else ''} "
                         f"{', '.join(map(str, who))})")


def raise_step_error(exc, what, peers, recv_peers, statuses=()):
    """Raise the library's error for ``exc``, an MPI error from a step's messages (called where it
    is caught): ProcessFailed where a peer failed or the communicator was revoked
    (``process_failure``), MismatchError where a message was longer than its receive
    (MPI_ERR_TRUNCATE, directly or in a status of MPI_ERR_IN_STATUS, or MPI_ERR_IN_STATUS with
    no statuses to tell), else ``exc`` itself. ``peers``: the requests' peers in order;
    ``recv_peers``: the receives' peers."""
    failure = process_failure(exc, what, peers, statuses)
    if failure is not None:
        raise failure from None
    cls = exc.Get_error_class()
    if cls == MPI.ERR_TRUNCATE or (cls == MPI.ERR_IN_STATUS and (not statuses or any(
            status is not None and MPI.Get_error_class(status.Get_error()) == MPI.ERR_TRUNCATE
            for status in statuses))):
        named = ", ".join(str(peer) for peer in dict.fromkeys(recv_peers))
        raise MismatchError(f"{what}: a message from rank(s) {named} is longer than expected "
                            f"(ranks disagree on count, dtype or algorithm)") from None
    raise exc


def poll_step(reqs, statuses, recvs, sends, limit, what, prober=None, tag=0):
    """Poll a prepared or posted step (``recvs`` then ``sends``, as ``reqs`` holds them) to the
    deadline; ``prober`` (the communicator, where calls are signed) judges foreign messages."""
    def peers():
        return [(peer, tag, True) for peer, _, _ in recvs] + [(peer, None, False) for peer, _, _ in sends]
    poll(reqs, statuses, peers, limit, what, prober)


def poll(reqs, statuses, peers, limit, what, prober=None):
    """Poll ``reqs`` until all complete, bounded by ``limit`` seconds (CollectiveTimeout naming
    the ranks not heard from). ``peers[i]``: (peer, tag, is_recv) of ``reqs[i]``; a receive whose
    tag is None is never judged. ``peers`` may be a function that makes that list: it is called
    only once the wait runs long enough to judge or time out (most waits end sooner).

    Every ``_PROBE_AFTER`` the open receives are judged: where a message of another call from
    the same peer waits unmatched here, the receive is cancelled. The cancel succeeds only if
    the receive had not been matched, which (messages between two ranks match in the order
    they were sent) means the peer sent that other call's message before this call's: a
    mismatch. If it fails, this call's message was already arriving and the wait goes on
    (docs/reliability.md, "How a foreign message is judged")."""
    start = time.monotonic()
    probe_at = start + _PROBE_AFTER
    spins = 0
    done = {}  # receives completed by a Test of their own: index -> status (Testall then reports them empty)
    cancelled = set()  # receives whose cancel was asked: judged when they complete
    while not _testall(reqs, statuses):
        spins += 1
        if spins % _POLLS_PER_CHECK:
            continue
        now = time.monotonic()
        if prober is not None and now > probe_at:
            probe_at = now + _PROBE_AFTER
            if callable(peers):
                peers = peers()
            _judge(reqs, peers, prober, done, cancelled, what)
        if now - start > limit:
            if callable(peers):
                peers = peers()
            # Test() is true for a request that is done (or, persistent, inactive)
            still_open = [not req.Test() for req in reqs]
            pending = sorted({peer for (peer, _, _), waiting in zip(peers, still_open) if waiting})
            silent = sorted({peer for (peer, _, is_recv), waiting in zip(peers, still_open)
                             if waiting and is_recv}) or pending
            raise timeout_error(what, silent, limit)
        os.sched_yield()  # at every deadline check: the peer may share this core
    for index in cancelled:
        if index not in done and statuses[index].Is_cancelled():
            raise MismatchError(foreign_message(what, peers[index][0]))
    for index, status in done.items():
        statuses[index] = status


def _judge(reqs, peers, prober, done, cancelled, what):
    """One look at the open receives (see ``poll``): raise MismatchError where a cancel proved
    that a peer sent another call's message before this call's."""
    for index, (peer, tag, is_recv) in enumerate(peers):
        if not is_recv or tag is None or index in done:
            continue
        req, status = reqs[index], MPI.Status()
        if not req.Test(status):
            if index in cancelled or prober.foreign(peer, tag) is None:
                continue
            req.Cancel()  # succeeds only if no message has matched the receive yet
            cancelled.add(index)
            if not req.Test(status):
                continue  # matched and still arriving (or the cancel is under way): judged later
        if index in cancelled and status.Is_cancelled():
            raise MismatchError(foreign_message(what, peer))
        done[index] = status


class _PreparedStep:
    """One step of a small-message program as persistent MPI requests (``Recv_init`` and
    ``Send_init``), created once on fixed buffers and a fixed tag: a run is one ``Startall``
    and a poll, with no message specs parsed per call."""

    __slots__ = ("mpi_comm", "tag", "requests", "statuses", "recvs", "sends", "what", "sizes", "pair",
                 "prober", "__weakref__")

    def __init__(self, comm, sends, recvs, tag, what, split=True):
        self.mpi_comm, self.tag = comm.mpi_comm, tag
        self.prober = comm if comm.signed else None
        # the messages as they travel (a message just past the eager limit as two pieces)
        limit = _eager_limit() if split else 0
        self.recvs = [piece for message in recvs for piece in _pieces(*message, limit)]
        self.sends = [piece for message in sends for piece in _pieces(*message, limit)]
        self.requests = self._make(self.recvs, self.sends)
        self.sizes = [(index, peer, buf.nbytes) for index, (peer, buf, _) in enumerate(self.recvs)]
        self.statuses = [MPI.Status() for _ in self.requests]
        self.what = what
        self.pair = len(self.recvs) == 1 and len(self.sends) == 1  # the common step: one receive, one send
        _live_steps.add(self)

    def __call__(self):
        reqs, statuses = self.requests, self.statuses
        try:
            _startall(reqs)
            if self.pair and (_testall(reqs, statuses) or _testall(reqs, statuses) or _testall(reqs, statuses)):
                if statuses[0].Get_count(_BYTE) != self.sizes[0][2]:
                    _, peer, nbytes = self.sizes[0]
                    check_received(peer, nbytes, statuses[0].Get_count(_BYTE), self.what)
                return
            for _ in range(_QUICK_SPINS):
                if _testall(reqs, statuses):
                    break
            else:
                limit = config.timeout()
                if not limit:
                    _waitall(reqs, statuses)
                else:
                    poll_step(reqs, statuses, self.recvs, self.sends, limit, self.what, self.prober,
                                       self.tag)
        except BaseException as exc:
            self._renew()  # requests left active by a failed run are never started again
            if isinstance(exc, MPI.Exception):
                raise_step_error(exc, self.what, [peer for peer, _, _ in self.recvs + self.sends],
                                 [peer for peer, _, _ in self.recvs], self.statuses)
            raise
        for index, peer, nbytes in self.sizes:
            got = statuses[index].Get_count(_BYTE)
            if got != nbytes:
                check_received(peer, nbytes, got, self.what)

    def _make(self, recvs, sends):
        mpi_comm, tag = self.mpi_comm, self.tag
        return ([mpi_comm.Recv_init([buf, _BYTE], peer, tag + chan) for peer, buf, chan in recvs]
                + [mpi_comm.Send_init([buf, _BYTE], peer, tag + chan) for peer, buf, chan in sends])

    def _renew(self):
        """Replace requests that may still be active with fresh ones on the same messages
        (the old ones are freed: MPI lets whatever is in flight finish, then drops them)."""
        self.free()
        if not MPI.Is_finalized():
            try:
                self.requests = self._make(self.recvs, self.sends)
            except MPI.Exception:  # a revoked communicator (ULFM): marked failed, never run again
                self.requests = []

    def free(self):
        try:
            if MPI.Is_finalized():
                return
            for req in self.requests:
                if req:
                    req.Free()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __del__(self):
        self.free()


_live_steps = weakref.WeakSet()  # every prepared step, freed before MPI_Finalize at exit


_exiting = False


@atexit.register
def _free_steps():  # registered after mpi4py's own finalizer, so it runs first
    global _exiting
    _exiting = True  # from here MPI_Finalize frees what is left; wrappers are not closed one by one
    for step in list(_live_steps):
        step.free()
