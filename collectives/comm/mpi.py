"""MPIComm: the communicator interface over an mpi4py intracommunicator.

Data travels through the buffer interface as raw bytes (``MPI.BYTE``), never
pickled. The wrapped communicator is duplicated once, so the library's
messages never match the user's own traffic on the same communicator; tags
then keep successive collectives apart. Every wait polls with a deadline
(COLLECTIVES_TIMEOUT) so that a lost peer gives ``CollectiveTimeout`` naming the
silent ranks instead of a hang; with the timeout set to 0 the calls block in MPI.
"""
import atexit
import os
import time
import weakref

from numpy import ndarray as _ndarray

from .. import config, mpilib
from ..errors import CollectiveError, CollectiveTimeout, MismatchError
from .base import Communicator, check_received, foreign_message

MPI = mpilib.load()  # one ImportError naming both ways to an MPI library where none loads



def _ranks_per_core():
    """Ranks of this job on this node per core of the node available to the job (0 when the
    launcher does not say): judged from the node's cores, not this rank's affinity mask, which
    a pinning launcher (Open MPI, Intel MPI, -bind-to core) narrows to one core."""
    return mpilib.ranks_per_core()


# Seconds of pure polling before a waiting rank starts yielding its core between polls. With
# more ranks than cores (oversubscribed) the peer a rank waits for may need this very core, so
# it yields at once; otherwise a short spin keeps latency low.
_OVERSUBSCRIBED = _ranks_per_core() > 1
_SPIN_BEFORE_YIELD = 0.0 if _OVERSUBSCRIBED else 0.002
_POLLS_PER_CHECK = 4 if _OVERSUBSCRIBED else 64  # polls between deadline checks (and yields)
_cuda = None  # .cuda, imported when the first device buffer is seen


_BYTE = MPI.BYTE
_testall = MPI.Request.Testall
_startall = MPI.Prequest.Startall
_waitall = MPI.Request.Waitall


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
    eager, when that is at most MAX_PIECES; larger messages amortise the handshake and go whole.
    Measured at n=2: MPICH (8000 B) 8-16 KiB 4.8 -> 3.0 us per exchange as two pieces (16 -> 11 us
    at n=4 on 2 cores); Open MPI (3968 B) 6 KiB 5.8 -> 3.3 us as two, 8 KiB 3.7 -> 2.4 as three,
    12 KiB 4.0 -> 3.3 as four, while 16 KiB whole (4.4) matches five pieces."""
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


def _timeout(what, silent, limit):
    """The error for a wait that ran out: names the call and the ranks not heard from."""
    return CollectiveTimeout(f"{what}: no message from rank{'s' if len(silent) > 1 else ''} "
                             f"{', '.join(map(str, silent))} after {limit:g} s")


def _message(buf):
    if hasattr(buf, "__cuda_array_interface__"):  # CUDA-aware MPI takes device memory as is
        return [buf, buf.nbytes, MPI.BYTE]
    return [buf, MPI.BYTE]


class MPIComm(Communicator):
    """Wrap ``comm`` (default ``MPI.COMM_WORLD``); the wrapper owns a duplicate of it."""

    def __init__(self, comm=None, *, _dup=True):
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"MPIComm needs an mpi4py intracommunicator, got {type(base).__name__}")
        self.mpi_comm = _bounded_dup(base) if _dup else base
        self.mpi_comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.signed = config.guard_enabled()
        self.rank = self.mpi_comm.Get_rank()
        self.size = self.mpi_comm.Get_size()
        self._node_colors = None
        self._statuses = {}  # reused Status lists, by request count
        tag_ub = self.mpi_comm.Get_attr(MPI.TAG_UB) or 32767
        # next_tag() bases fill [0, 8 m), program_tag() bases [8 m, 16 m): both under TAG_UB
        self._modulus = max(1, min(tag_ub + 1, 1 << 24) // 16)
        self._seq = 0

    def __repr__(self):
        return f"MPIComm(rank={self.rank}, size={self.size})"

    def close(self):
        """Release the wrapper: the release hooks run (the API's caches drop it, shm frees its
        window), its prepared steps' persistent requests are freed, then its duplicate
        communicator. Collective, like MPI_Comm_free: it runs on every rank when the user frees
        the communicator it wraps (MPICH has room for about 2,000 communicators, so a job that
        splits and frees them in a loop needs each duplicate back). The wrapper must not be
        used afterwards."""
        if self.mpi_comm == MPI.COMM_NULL or MPI.Is_finalized():
            return
        super().close()
        for step in list(_live_steps):
            if step.mpi_comm is self.mpi_comm:
                step.free()
        self.mpi_comm.Free()  # mpi4py leaves the handle COMM_NULL

    def _tag_modulus(self):
        return self._modulus

    def next_tag(self):
        seq = self._seq = self._seq + 1
        return (seq - 1) % self._modulus

    # point-to-point
    def isend(self, buf, dest, tag=0):
        req = self.mpi_comm.Isend(_message(buf), dest, tag)
        return _Req(req, dest, buf.nbytes, False)

    def irecv(self, buf, source, tag=0):
        req = self.mpi_comm.Irecv(_message(buf), source, tag)
        return _Req(req, source, buf.nbytes, True, tag)

    def foreign(self, peer, tag):
        status = MPI.Status()
        if self.mpi_comm.Iprobe(peer, MPI.ANY_TAG, status) and status.Get_tag() // 8 != tag // 8:
            return status.Get_tag()
        return None

    def waitall(self, requests, what="wait"):
        mpi_reqs = [r.req for r in requests]
        statuses = [MPI.Status() for _ in requests]
        try:
            limit = config.timeout()
            if not limit:
                MPI.Request.Waitall(mpi_reqs, statuses)
            elif not MPI.Request.Testall(mpi_reqs, statuses):
                self._poll(requests, mpi_reqs, statuses, limit, what)
        except MPI.Exception as exc:
            if exc.Get_error_class() == MPI.ERR_TRUNCATE:
                peers = ", ".join(str(r.peer) for r in requests if r.is_recv)
                raise MismatchError(f"{what}: a message from rank(s) {peers} is longer than expected "
                                    f"(ranks disagree on count, dtype or algorithm)") from None
            raise
        for r, status in zip(requests, statuses):
            if r.is_recv:
                check_received(r.peer, r.nbytes, status.Get_count(MPI.BYTE), what)

    def _poll(self, requests, mpi_reqs, statuses, limit, what):
        start = time.monotonic()
        deadline = start + limit
        probe_at = start + _PROBE_AFTER
        testall = MPI.Request.Testall
        spins = 0
        while not testall(mpi_reqs, statuses):
            spins += 1
            if spins % _POLLS_PER_CHECK:
                continue
            now = time.monotonic()
            if now > probe_at and self.signed:
                probe_at = now + _PROBE_AFTER
                for r, m in zip(requests, mpi_reqs):
                    if m and r.is_recv and r.tag is not None and self.foreign(r.peer, r.tag) is not None:
                        raise MismatchError(foreign_message(what, r.peer))
            if now > deadline:
                silent = sorted({r.peer for r, m in zip(requests, mpi_reqs) if m and r.is_recv}
                                or {r.peer for r, m in zip(requests, mpi_reqs) if m})
                raise _timeout(what, silent, limit)
            if now - start > _SPIN_BEFORE_YIELD:
                os.sched_yield()

    def sendrecv(self, sendbuf, dest, recvbuf, source, sendtag=0, recvtag=None):
        recvtag = sendtag if recvtag is None else recvtag
        self.waitall([self.irecv(recvbuf, source, recvtag), self.isend(sendbuf, dest, sendtag)],
                     "sendrecv")

    def exchange(self, sends, recvs, tag, what):
        first = recvs[0][1] if recvs else sends[0][1] if sends else None
        if first is not None and not isinstance(first, _ndarray) and hasattr(first, "__cuda_array_interface__"):
            return self._exchange_device(sends, recvs, tag, what)
        # host buffers: the short path (no wrappers, reused statuses, lazy error text)
        comm = self.mpi_comm
        reqs = [comm.Irecv([buf, _BYTE], peer, tag + chan) for peer, buf, chan in recvs]
        reqs += [comm.Isend([buf, _BYTE], peer, tag + chan) for peer, buf, chan in sends]
        statuses = self._statuses.get(len(reqs))
        if statuses is None:
            statuses = self._statuses[len(reqs)] = [MPI.Status() for _ in reqs]
        try:
            if not _testall(reqs, statuses):
                limit = config.timeout()
                if not limit:
                    _waitall(reqs, statuses)
                else:
                    self._poll_step(reqs, statuses, recvs, sends, limit, what, self if self.signed else None, tag)
        except MPI.Exception as exc:
            if exc.Get_error_class() in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
                peers = ", ".join(str(peer) for peer, _, _ in recvs)
                raise MismatchError(f"{what}: a message from rank(s) {peers} is longer than expected "
                                    f"(ranks disagree on count, dtype or algorithm)") from None
            raise
        for index, (peer, buf, _) in enumerate(recvs):
            got = statuses[index].Get_count(_BYTE)
            if got != buf.nbytes:
                check_received(peer, buf.nbytes, got, what)

    prepares_steps = True

    def prepare(self, sends, recvs, tag, what):
        """One step on fixed host buffers and a fixed tag, as persistent requests: rerunning
        it starts them and polls, with the same bounded wait and size checks as exchange()."""
        if any(not isinstance(buf, _ndarray) for _, buf, _ in list(sends) + list(recvs)):
            return super().prepare(sends, recvs, tag, what)
        return _PreparedStep(self, sends, recvs, tag, what)

    @staticmethod
    def _poll_step(reqs, statuses, recvs, sends, limit, what, prober=None, tag=0):
        """Poll a step's requests to the deadline; ``prober`` (the communicator, where calls are
        signed) looks for a foreign message from the peers not yet heard from."""
        start = time.monotonic()
        probe_at = start + _PROBE_AFTER
        spins = 0
        done = {}  # receives the probe saw complete: index -> their status (Testall then reports them empty)
        while not _testall(reqs, statuses):
            spins += 1
            if spins % _POLLS_PER_CHECK:
                continue
            now = time.monotonic()
            if prober is not None and now > probe_at:
                probe_at = now + _PROBE_AFTER
                for index, (peer, _, _) in enumerate(recvs):
                    if index in done:
                        continue
                    status = MPI.Status()
                    if reqs[index].Test(status):
                        done[index] = status
                    elif prober.foreign(peer, tag) is not None:
                        raise MismatchError(foreign_message(what, peer))
            if now - start > limit:
                # Test() is true for a request that is done (or, persistent, inactive)
                still_open = [not req.Test() for req in reqs]
                peers = [peer for peer, _, _ in recvs] + [peer for peer, _, _ in sends]
                pending = sorted({peer for peer, waiting in zip(peers, still_open) if waiting})
                silent = sorted({peer for (peer, _, _), waiting in zip(recvs, still_open) if waiting}) or pending
                raise _timeout(what, silent, limit)
            if now - start > _SPIN_BEFORE_YIELD:
                os.sched_yield()
        for index, status in done.items():
            statuses[index] = status

    # device buffers (one step's buffers all live where the call's arrays live)
    def _exchange_device(self, sends, recvs, tag, what):
        global _cuda
        if _cuda is None:
            from . import cuda as _cuda_module

            _cuda = _cuda_module
        if _cuda.cuda_aware():  # device memory straight to MPI (the executor synchronised the stream)
            comm = self.mpi_comm
            reqs = [_Req(comm.Irecv(_message(buf), peer, tag + chan), peer, buf.nbytes, True, tag)
                    for peer, buf, chan in recvs]
            reqs += [_Req(comm.Isend(_message(buf), peer, tag + chan), peer, buf.nbytes, False)
                     for peer, buf, chan in sends]
            self.waitall(reqs, what)
            return
        stager = self.__dict__.get("_stager")
        if stager is None:
            stager = self._stager = _cuda.Stager()
        comm = self.mpi_comm
        stager.exchange(
            sends, recvs, tag,
            lambda host, peer, t: _Req(comm.Irecv([host, MPI.BYTE], peer, t), peer, host.nbytes, True),
            lambda host, peer, t: _Req(comm.Isend([host, MPI.BYTE], peer, t), peer, host.nbytes, False),
            lambda reqs, on_done: self._wait_each(reqs, on_done, what))

    def _wait_each(self, requests, on_done, what):
        """Like waitall, but ``on_done(index)`` runs as each request completes (staged receives
        start their copy to the device while the rest are still in flight)."""
        mpi_reqs = [r.req for r in requests]
        remaining = len(requests)
        limit = config.timeout()
        start = time.monotonic()
        statuses = []
        spins = 0
        try:
            while remaining:
                done = (MPI.Request.Waitsome if not limit else MPI.Request.Testsome)(mpi_reqs, statuses)
                if done is None:
                    break
                if done:
                    for index, status in zip(done, statuses):
                        r = requests[index]
                        if r.is_recv:
                            check_received(r.peer, r.nbytes, status.Get_count(MPI.BYTE), what)
                        on_done(index)
                    remaining -= len(done)
                    spins = 0
                    continue
                spins += 1
                if spins % _POLLS_PER_CHECK:
                    continue
                now = time.monotonic()
                if now - start > limit:
                    silent = sorted({r.peer for r, m in zip(requests, mpi_reqs) if m and r.is_recv}
                                    or {r.peer for r, m in zip(requests, mpi_reqs) if m})
                    raise _timeout(what, silent, limit)
                if now - start > _SPIN_BEFORE_YIELD:
                    os.sched_yield()
        except MPI.Exception as exc:
            truncated = exc.Get_error_class() == MPI.ERR_TRUNCATE or (
                exc.Get_error_class() == MPI.ERR_IN_STATUS
                and any(MPI.Get_error_class(s.Get_error()) == MPI.ERR_TRUNCATE for s in statuses))
            if truncated:
                peers = ", ".join(str(r.peer) for r in requests if r.is_recv)
                raise MismatchError(f"{what}: a message from rank(s) {peers} is longer than expected "
                                    f"(ranks disagree on count, dtype or algorithm)") from None
            raise

    def on_failure(self, exc):
        """Abort the whole job (MPI.Abort) so that no rank waits forever or reports success;
        COLLECTIVES_ON_ERROR=raise leaves the error to the caller instead."""
        _abort_unless_raise(self.mpi_comm, exc)

    def split(self, color, key=0):
        # MPI_Comm_split blocks until every rank calls it: all must be here first (bounded)
        self.barrier("splitting the communicator")
        new = self.mpi_comm.Split(MPI.UNDEFINED if color is None else color, key)
        if new == MPI.COMM_NULL:
            return None
        return MPIComm(new, _dup=False)

    def node_colors(self):
        """World ranks grouped by shared-memory node: one color (the node's lowest rank) per rank."""
        if self._node_colors is None:
            import numpy as np

            what = "grouping ranks by node"
            self.barrier(what)  # MPI_Comm_split_type blocks until every rank calls it
            node = self.mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            # the node's lowest rank, from its group alone (no communication)
            members = MPI.Group.Translate_ranks(node.Get_group(), list(range(node.Get_size())),
                                                self.mpi_comm.Get_group())
            node.Free()
            # every rank's leader: a ring all-gather of bounded steps
            colors = np.zeros(self.size, dtype=np.int64)
            colors[self.rank] = min(members)
            tag = self.call_tag(what) * 8
            right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
            for step in range(self.size - 1):
                send, recv = (self.rank - step) % self.size, (self.rank - step - 1) % self.size
                self.exchange([(right, colors[send:send + 1], 0)], [(left, colors[recv:recv + 1], 0)], tag, what)
            self._node_colors = tuple(int(c) for c in colors)
        return self._node_colors


def _abort_unless_raise(mpi_comm, exc):
    size = mpi_comm.Get_size()
    if size > 1 and config.on_error() != "raise":
        import sys

        sys.stderr.write(f"collectives: rank {mpi_comm.Get_rank()} of {size}: {type(exc).__name__}: {exc}\n"
                         f"collectives: aborting the MPI job (COLLECTIVES_ON_ERROR=raise to handle "
                         f"errors instead)\n")
        sys.stderr.flush()
        # the launcher forwards a rank's output asynchronously and drops what is in flight when
        # the abort kills the job: a moment for these lines to get out first
        time.sleep(0.2)
        _exit_if_abort_hangs()
        mpi_comm.Abort(1)


ABORT_GRACE = 10  # seconds MPI_Abort gets to end this process before the kernel does


def _exit_if_abort_hangs():
    """MPI_Abort can hang where the launcher cannot be reached (a host cut off by a network
    partition: the rank spins in MPI_Abort forever). An alarm whose default action ends the
    process bounds it; it needs no Python code to run (MPI_Abort may never let go)."""
    import signal

    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    except ValueError:  # not the main thread: the handler cannot change, the alarm is still set
        pass
    signal.alarm(ABORT_GRACE)


# A creation that timed out leaves its MPI_Comm_idup pending (MPI cannot cancel it); kept here.
_abandoned = []
_DIAGNOSIS_GRACE = 1.0  # seconds a timed-out creation listens for the other ranks' answers


def _bounded_dup(base, what="creating the communicator"):
    """``base.Dup()`` bounded by COLLECTIVES_TIMEOUT: MPI_Comm_idup, polled to the deadline.

    When it runs out, the ranks present name the absent ones: each timed-out rank sends an
    empty message tagged MPI_TAG_UB to every other rank and listens for a short grace period;
    a rank still waiting in its own creation answers such a message at once. The ranks not
    heard from are the ones named. (These messages travel on ``base`` itself, the user's
    communicator, and only after a timeout: a fault path.)"""
    limit = config.timeout()
    size, rank = base.Get_size(), base.Get_rank()
    if not limit or size == 1:
        return base.Dup()
    new, request = base.Idup()
    if request.Test():
        return new
    import numpy as np

    tag = base.Get_attr(MPI.TAG_UB) or 32767
    token = np.zeros(0, np.uint8)
    heard, told, sends = set(), set(), []
    status = MPI.Status()

    def listen():
        while base.Iprobe(MPI.ANY_SOURCE, tag, status):
            source = status.Get_source()
            base.Recv([token, _BYTE], source, tag)
            heard.add(source)
            if source not in told:  # a rank that timed out asks who is here: answer
                told.add(source)
                sends.append(base.Isend([token, _BYTE], source, tag))

    start = time.monotonic()
    polls = 0
    while True:
        if request.Test():
            return new
        polls += 1
        if polls % _POLLS_PER_CHECK == 0:
            now = time.monotonic()
            listen()
            if now - start > limit:
                break
            if now - start > 0.002:
                time.sleep(0.0002)
    for peer in range(size):
        if peer != rank and peer not in told:
            told.add(peer)
            sends.append(base.Isend([token, _BYTE], peer, tag))
    grace_end = time.monotonic() + min(_DIAGNOSIS_GRACE, limit)
    while time.monotonic() < grace_end and len(heard) < size - 1:
        listen()
        if request.Test():
            return new
        time.sleep(0.001)
    _abandoned.append((new, request, sends))
    silent = sorted(set(range(size)) - heard - {rank})
    if not silent:
        raise CollectiveTimeout(f"{what}: every rank answered, yet MPI_Comm_idup did not complete after "
                                f"{limit:g} s")
    raise _timeout(what, silent, limit)


class _PreparedStep:
    """One step of a small-message program as persistent MPI requests (``Recv_init`` and
    ``Send_init``), created once on fixed buffers and a fixed tag: a run is one ``Startall``
    and a poll, with no message specs parsed per call."""

    __slots__ = ("mpi_comm", "tag", "requests", "statuses", "recvs", "sends", "what", "sizes", "pair",
                 "prober", "__weakref__")

    def __init__(self, comm, sends, recvs, tag, what):
        self.mpi_comm, self.tag = comm.mpi_comm, tag
        self.prober = comm if comm.signed else None
        # the messages as they travel (a message just past the eager limit as two pieces)
        limit = _eager_limit()
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
                _, peer, nbytes = self.sizes[0]
                got = statuses[0].Get_count(_BYTE)
                if got != nbytes:
                    check_received(peer, nbytes, got, self.what)
                return
            for _ in range(_QUICK_SPINS):
                if _testall(reqs, statuses):
                    break
            else:
                limit = config.timeout()
                if not limit:
                    _waitall(reqs, statuses)
                else:
                    MPIComm._poll_step(reqs, statuses, self.recvs, self.sends, limit, self.what, self.prober,
                                       self.tag)
        except BaseException as exc:
            self._renew()  # requests left active by a failed run are never started again
            if isinstance(exc, MPI.Exception):
                self._raise(exc)
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
            self.requests = self._make(self.recvs, self.sends)

    def _raise(self, exc):
        if exc.Get_error_class() in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
            peers = ", ".join(str(peer) for peer in dict.fromkeys(peer for peer, _, _ in self.recvs))
            raise MismatchError(f"{self.what}: a message from rank(s) {peers} is longer than expected "
                                f"(ranks disagree on count, dtype or algorithm)") from None
        raise exc

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


class _Req:
    __slots__ = ("req", "peer", "nbytes", "is_recv", "tag")

    def __init__(self, req, peer, nbytes, is_recv, tag=None):
        self.req, self.peer, self.nbytes, self.is_recv, self.tag = req, peer, nbytes, is_recv, tag


_keyval = None


def _release(comm, keyval, wrapper):
    """Delete callback of the wrapper attribute: the user's communicator is being freed."""
    if not _exiting:
        wrapper.close()


def wrap(comm):
    """The MPIComm for an mpi4py communicator (None: COMM_WORLD), cached as an MPI attribute of
    that communicator, so that it lives exactly as long as the communicator does: freeing the
    communicator closes the wrapper and frees its duplicate."""
    global _keyval
    base = MPI.COMM_WORLD if comm is None else comm
    if base == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL (a freed communicator, or a rank outside a split)")
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_release)
    wrapper = base.Get_attr(_keyval)
    if wrapper is None:
        try:
            wrapper = MPIComm(base)
        except CollectiveError as exc:
            base.Set_attr(_keyval, _FailedCreation("creating the communicator", exc))
            _abort_unless_raise(base, exc)
            raise
        base.Set_attr(_keyval, wrapper)
    elif isinstance(wrapper, _FailedCreation):
        wrapper.check_usable()
    return wrapper


class _FailedCreation(Communicator):
    """What wrap() keeps for a communicator whose creation failed: every later use raises."""

    def __init__(self, what, exc):
        self.failed = (what, exc)

    def close(self):
        pass
