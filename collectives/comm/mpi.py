"""MPIComm: the communicator interface over an mpi4py intracommunicator.

Data travels through the buffer interface as raw bytes (``MPI.BYTE``), never
pickled. The wrapped communicator is duplicated once, so the library's
messages never match the user's own traffic on the same communicator; tags
then keep successive collectives apart. Every wait polls with a deadline
(COLLECTIVES_TIMEOUT) so that a lost peer gives ``CollectiveTimeout`` naming the
silent ranks instead of a hang; with the timeout set to 0 the calls block in MPI.
"""
import os
import time

from numpy import ndarray as _ndarray

from .. import config, mpilib
from ..errors import CollectiveError
from .base import Communicator, check_received
from . import cuda as _cuda

MPI = mpilib.load()  # one ImportError naming both ways to an MPI library where none loads

from .mpi_faults import _abort_unless_raise, _bounded_dup
from . import ulfm as _ulfm
# (_OVERSUBSCRIBED, _eager_limit and _pieces are read through this module by tune and the tests)
from .mpi_steps import (_BYTE, _OVERSUBSCRIBED, _POLLS_PER_CHECK, _PROBE_AFTER,  # noqa: F401
                        _PreparedStep, _eager_limit, _live_steps, _pieces, _testall, _waitall,
                        poll_step, process_failure, raise_step_error, timeout_error as _timeout)
from . import mpi_steps as _steps



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
        self._node = None  # the ranks of this node (Split_type), made with node_colors()
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
        if self._node is not None:
            self._node.Free()
        self.mpi_comm.Free()  # mpi4py leaves the handle COMM_NULL

    def _tag_modulus(self):
        return self._modulus

    def next_tag(self):
        seq = self._seq = self._seq + 1
        return (seq - 1) % self._modulus

    # point-to-point
    def isend(self, buf, dest, tag=0):
        try:
            req = self.mpi_comm.Isend(_message(buf), dest, tag)
        except MPI.Exception as exc:
            raise process_failure(exc, "send", [dest]) or exc from None
        return _Req(req, dest, buf.nbytes, False)

    def irecv(self, buf, source, tag=0):
        try:
            req = self.mpi_comm.Irecv(_message(buf), source, tag)
        except MPI.Exception as exc:
            raise process_failure(exc, "receive", [source]) or exc from None
        return _Req(req, source, buf.nbytes, True, tag)

    def foreign(self, peer, tag):
        status = MPI.Status()
        try:
            found = self.mpi_comm.Iprobe(peer, MPI.ANY_TAG, status)
        except MPI.Exception as exc:  # a failed peer (ULFM) is no foreign call
            raise process_failure(exc, "probing for a message of another call", [peer]) or exc from None
        if found and status.Get_tag() // 8 != tag // 8:
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
            raise_step_error(exc, what, [r.peer for r in requests], [r.peer for r in requests if r.is_recv],
                             statuses)
        for r, status in zip(requests, statuses):
            if r.is_recv:
                check_received(r.peer, r.nbytes, status.Get_count(MPI.BYTE), what)

    def _poll(self, requests, mpi_reqs, statuses, limit, what):
        _steps.poll(mpi_reqs, statuses, lambda: [(r.peer, r.tag if r.is_recv else None, r.is_recv) for r in requests],
                    limit, what, self if self.signed else None)

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
        statuses = None
        try:
            reqs = [comm.Irecv([buf, _BYTE], peer, tag + chan) for peer, buf, chan in recvs]
            reqs += [comm.Isend([buf, _BYTE], peer, tag + chan) for peer, buf, chan in sends]
            statuses = self._statuses.get(len(reqs))
            if statuses is None:
                statuses = self._statuses[len(reqs)] = [MPI.Status() for _ in reqs]
            if not _testall(reqs, statuses):
                limit = config.timeout()
                if not limit:
                    _waitall(reqs, statuses)
                else:
                    poll_step(reqs, statuses, recvs, sends, limit, what, self if self.signed else None, tag)
        except MPI.Exception as exc:
            raise_step_error(exc, what, [peer for peer, _, _ in list(recvs) + list(sends)],
                             [peer for peer, _, _ in recvs], statuses or ())
        for index, (peer, buf, _) in enumerate(recvs):
            got = statuses[index].Get_count(_BYTE)
            if got != buf.nbytes:
                check_received(peer, buf.nbytes, got, what)

    prepares_steps = True

    def prepare(self, sends, recvs, tag, what, split=True):
        """One step on fixed host buffers and a fixed tag, as persistent requests: rerunning
        it starts them and polls, with the same bounded wait and size checks as exchange().
        ``split``: a message just past the eager limit travels as eager pieces; False sends
        every message whole, as exchange() does (a rank running exchange() meets it)."""
        if any(not isinstance(buf, _ndarray) for _, buf, _ in list(sends) + list(recvs)):
            return super().prepare(sends, recvs, tag, what)
        return _PreparedStep(self, sends, recvs, tag, what, split)

    # device buffers (one step's buffers all live where the call's arrays live)
    def _exchange_device(self, sends, recvs, tag, what):
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
                os.sched_yield()  # at every deadline check: the peer may share this core
        except MPI.Exception as exc:
            raise_step_error(exc, what, [r.peer for r in requests], [r.peer for r in requests if r.is_recv],
                             statuses)

    def on_failure(self, exc):
        """Abort the whole job (MPI.Abort) so that no rank waits forever or reports success;
        COLLECTIVES_ON_ERROR=raise leaves the error to the caller instead; under
        COLLECTIVES_ON_ERROR=shrink a lost rank makes the survivors raise RanksLost (ulfm.py)."""
        if config.on_error() == "shrink" and self.size > 1:
            _ulfm.recover(self, exc)  # raises RanksLost, or ends the job (bounded)
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
            self._node = node  # kept for the shared-memory transport (node_comm), freed with this one
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


    def node_comm(self):
        """The mpi4py communicator of this rank's node (its ranks in this communicator's order)."""
        self.node_colors()
        return self._node


class _Req:
    __slots__ = ("req", "peer", "nbytes", "is_recv", "tag")

    def __init__(self, req, peer, nbytes, is_recv, tag=None):
        self.req, self.peer, self.nbytes, self.is_recv, self.tag = req, peer, nbytes, is_recv, tag


_keyval = None


def _release(comm, keyval, wrapper):
    """Delete callback of the wrapper attribute: the user's communicator is being freed."""
    if not _steps._exiting:
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
