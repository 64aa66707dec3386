"""An in-process world: one thread per rank, messages through shared queues.

``run_threaded(n, fn, *args)`` runs ``fn(comm, *args)`` on n threads and returns
the results by rank. If any rank raises, every other rank is released from its
waits (with ``PeerAborted``) and the first exception is re-raised in the caller.
``ThreadedWorld(n)`` does the same with n long-lived threads and communicators kept
across calls (``world.run(fn, *args)``): no threads started per call, and each rank's
scratch buffers and cached call shapes are reused, which is what a caller running
many small collectives (a training step's all-reduce) needs.
Sends copy their data at once (MPI buffer semantics: the caller may reuse the
buffer when the send returns); receives match per (source, tag) in post order.
"""
import queue as _queue
import threading
import time
import weakref
from collections import deque

from numpy import ndarray as _ndarray

from .. import config
from ..errors import CollectiveTimeout, MismatchError, PeerAborted
from .base import Communicator, Request, check_received, foreign_message

_PROBE_AFTER = 0.02  # seconds a wait runs before it looks for a foreign message, and between looks


def _synchronize(array):
    import cupy

    with array.device:
        cupy.cuda.get_current_stream().synchronize()


class _Shared:
    """State common to a world and every communicator split from it."""

    def __init__(self):
        self.cond = threading.Condition()
        self.failed = None  # (world rank, exception) of the first failure
        self.waiting = {}  # root-world rank -> root-world ranks it is blocked on (under cond)

    def silent_behind(self, peers):
        """The root-world ranks that ``peers`` wait on, followed through ranks that are
        themselves blocked, ending at ranks not waiting at all (the silent ones)."""
        seen, silent, frontier = set(), set(), list(peers)
        while frontier:
            rank = frontier.pop()
            if rank in seen:
                continue
            seen.add(rank)
            blocked_on = self.waiting.get(rank)
            if blocked_on is None:
                silent.add(rank)
            else:
                frontier.extend(blocked_on)
        return sorted(silent)

    def abort(self, rank, exc):
        with self.cond:
            self.fail_locked(rank, exc)

    def fail_locked(self, rank, exc):
        """Record the first failure and wake every waiter (the caller holds ``cond``)."""
        if self.failed is None:
            self.failed = (rank, exc)
        self.cond.notify_all()


class _World:
    def __init__(self, size, shared, world_ranks):
        self.size = size
        self.shared = shared
        self.world_ranks = world_ranks  # rank in this world -> rank in the root world
        self.queues = {}
        self.splits = {}


class _SendRequest(Request):
    __slots__ = ()

    def __init__(self, peer, nbytes):
        self.peer, self.nbytes, self.is_recv = peer, nbytes, False

    def test(self):
        return True


class _RecvRequest(Request):
    __slots__ = ("buf", "key", "done")

    def __init__(self, buf, peer, key):
        self.buf, self.peer, self.nbytes, self.key, self.is_recv = buf, peer, buf.nbytes, key, True
        self.done = False

    def test(self):
        return self.done


class ThreadComm(Communicator):
    """One rank of an in-process threaded world."""

    def __init__(self, world, rank):
        self._world = world
        self.rank = rank
        self.size = world.size
        self._split_seq = 0

    def __repr__(self):
        return f"ThreadComm(rank={self.rank}, size={self.size})"

    def isend(self, buf, dest, tag=0):
        self._check_peer(dest)
        data = buf.copy()
        if not isinstance(data, _ndarray):  # a device copy: finish it before another thread reads it
            _synchronize(data)
        world = self._world
        with world.shared.cond:
            world.queues.setdefault((self.rank, dest, tag), deque()).append(data)
            world.shared.cond.notify_all()
        return _SendRequest(dest, buf.nbytes)

    def irecv(self, buf, source, tag=0):
        self._check_peer(source)
        return _RecvRequest(buf, source, (source, self.rank, tag))

    def _check_peer(self, peer):
        if not 0 <= peer < self.size:
            raise ValueError(f"peer rank {peer} out of range for a world of {self.size}")

    def waitall(self, requests, what="wait"):
        limit = config.timeout()
        deadline = time.monotonic() + limit if limit else None
        world = self._world
        shared = world.shared
        pending = [r for r in requests if r.is_recv and not r.done]
        if not pending:
            return
        me = world.world_ranks[self.rank]
        with shared.cond:
            try:
                self._wait(pending, world, shared, me, deadline, limit, what)
            finally:
                shared.waiting.pop(me, None)

    def foreign(self, peer, tag):
        """A queued message is matched (as MPI matches an envelope): where one of this call's
        messages from ``peer`` is queued, still arriving or not, its later calls' messages are
        no evidence of a mismatch; see docs/reliability.md, "How a foreign message is judged"."""
        other = None
        for (source, dest, got), queue in list(self._world.queues.items()):
            if source == peer and dest == self.rank and queue:
                if got // 8 == tag // 8:
                    return None
                other = got
        return other

    @staticmethod
    def _arrived(queue):
        """The first message of ``queue`` once it has arrived (None before), taken off the queue:
        here every message arrives when it is sent; a transport with a latency overrides this."""
        return queue.popleft() if queue else None

    def _wait(self, pending, world, shared, me, deadline, limit, what):
        probe_at = time.monotonic() + _PROBE_AFTER
        while pending:
            if shared.failed is not None:
                raise PeerAborted(f"{what}: rank {world.world_ranks[self.rank]} released because "
                                  f"rank {shared.failed[0]} failed: {shared.failed[1]!r}")
            progressed = False
            for req in pending:
                data = self._arrived(world.queues.get(req.key))
                if data is not None:
                    check_received(req.peer, req.nbytes, data.nbytes, what)
                    req.buf[...] = data.view(req.buf.dtype) if data.dtype != req.buf.dtype else data
                    req.done = True
                    progressed = True
            if progressed:
                pending = [r for r in pending if not r.done]
                continue
            shared.waiting[me] = {world.world_ranks[r.peer] for r in pending}
            now = time.monotonic()
            if now > probe_at:
                probe_at = now + _PROBE_AFTER
                for req in pending:
                    other = self.foreign(req.peer, req.key[2])
                    if other is not None:
                        exc = MismatchError(foreign_message(what, req.peer))
                        shared.fail_locked(me, exc)
                        raise exc
            if deadline is None:
                shared.cond.wait(_PROBE_AFTER)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                exc = CollectiveTimeout(self._timeout_message(pending, world, shared, me, limit, what))
                shared.fail_locked(me, exc)  # before the lock is let go: no other rank blames this one
                raise exc
            shared.cond.wait(min(remaining, _PROBE_AFTER))

    @staticmethod
    def _timeout_message(pending, world, shared, me, limit, what):
        silent = sorted({r.peer for r in pending})
        text = (f"{what}: no message from rank{'s' if len(silent) > 1 else ''} "
                f"{', '.join(map(str, silent))} after {limit:g} s")
        direct = {world.world_ranks[p] for p in silent}
        behind = [r for r in shared.silent_behind(direct) if r != me]
        if behind and set(behind) != direct:
            prefix = "" if world.world_ranks == list(range(world.size)) else "world "
            text += (f"; {'they wait' if len(silent) > 1 else 'it waits'} in turn on silent {prefix}"
                     f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))}")
        return text

    def split(self, color, key=0):
        world = self._world
        shared = world.shared
        seq = self._split_seq
        self._split_seq += 1
        limit = config.timeout()
        deadline = time.monotonic() + limit if limit else None
        with shared.cond:
            entry = world.splits.setdefault(seq, {"votes": {}, "worlds": None, "left": self.size})
            entry["votes"][self.rank] = (color, key)
            shared.cond.notify_all()
            me = world.world_ranks[self.rank]
            try:
                while len(entry["votes"]) < self.size:
                    if shared.failed is not None:
                        raise PeerAborted(f"split: released because rank {shared.failed[0]} failed")
                    missing = sorted(set(range(self.size)) - set(entry["votes"]))
                    shared.waiting[me] = {world.world_ranks[r] for r in missing}
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        exc = CollectiveTimeout(f"split: no call from ranks {missing} after {limit:g} s")
                        shared.fail_locked(me, exc)
                        raise exc
                    shared.cond.wait(remaining)
            finally:
                shared.waiting.pop(me, None)
            if entry["worlds"] is None:
                groups = {}
                for rank, (c, k) in entry["votes"].items():
                    if c is not None:
                        groups.setdefault(c, []).append((k, rank))
                worlds = {}
                for c, members in groups.items():
                    members.sort()
                    ranks = [rank for _, rank in members]
                    sub = _World(len(ranks), shared, [world.world_ranks[r] for r in ranks])
                    worlds[c] = (sub, ranks)
                entry["worlds"] = worlds
            entry["left"] -= 1
            worlds = entry["worlds"]
            if entry["left"] == 0:
                del world.splits[seq]
        if color is None:
            return None
        sub, ranks = worlds[color]
        return ThreadComm(sub, ranks.index(self.rank))


def run_threaded(n, fn, *args):
    """Run ``fn(comm, *args)`` on ``n`` threads, one communicator each; return results by rank."""
    _check_size(n, "run_threaded")
    shared = _Shared()
    world = _World(n, shared, list(range(n)))
    results = [None] * n

    def body(rank):
        try:
            results[rank] = fn(ThreadComm(world, rank), *args)
        except BaseException as exc:  # noqa: BLE001 - every failure must release the others
            shared.abort(rank, exc)

    threads = [threading.Thread(target=body, args=(rank,), name=f"collectives-rank-{rank}", daemon=True)
               for rank in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if shared.failed is not None:
        raise shared.failed[1]
    return results


def _check_size(n, what):
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{what} needs a world size >= 1, got {n!r}")


def _serve(tasks, done):
    """A ThreadedWorld rank thread: run tasks until told to stop (None)."""
    while True:
        task = tasks.get()
        if task is None:
            return
        comm, fn, args, results = task
        try:
            results[comm.rank] = fn(comm, *args)
        except BaseException as exc:  # noqa: BLE001 - every failure must release the others
            comm._world.shared.abort(comm.rank, exc)
        finally:
            done.put(comm.rank)


def _stop(task_queues):
    for tasks in task_queues:
        tasks.put(None)


class ThreadedWorld:
    """A threaded world of ``n`` ranks whose threads and communicators live across calls.

    ``run(fn, *args)`` runs ``fn(comm, *args)`` on every rank and returns the results by
    rank, like ``run_threaded``; calls are serialized (one collective program at a time).
    If a rank raises, the others are released (``PeerAborted``), the first exception is
    re-raised, and the next call gets fresh communicators. ``close()`` (or garbage
    collection) ends the threads.
    """

    def __init__(self, n):
        _check_size(n, "ThreadedWorld")
        self.size = n
        self._lock = threading.Lock()
        self._tasks = [_queue.SimpleQueue() for _ in range(n)]
        self._done = _queue.SimpleQueue()
        self._threads = None
        self._closed = False
        self._comms = None
        self._finalizer = weakref.finalize(self, _stop, self._tasks)

    def __repr__(self):
        return f"ThreadedWorld(size={self.size})"

    def _fresh(self):
        shared = _Shared()
        world = _World(self.size, shared, list(range(self.size)))
        self._comms = [ThreadComm(world, rank) for rank in range(self.size)]

    def comms(self):
        """The communicators the next ``run`` hands its ranks (rank order)."""
        with self._lock:
            if self._comms is None:
                self._fresh()
            return list(self._comms)

    def run(self, fn, *args):
        with self._lock:
            if self._closed:
                raise RuntimeError("ThreadedWorld is closed")
            if self._comms is None:
                self._fresh()
            if self._threads is None:
                self._threads = [threading.Thread(target=_serve, args=(self._tasks[rank], self._done),
                                                  name=f"collectives-world-rank-{rank}", daemon=True)
                                 for rank in range(self.size)]
                for thread in self._threads:
                    thread.start()
            comms = self._comms
            comms[0]._world.queues.clear()  # nothing from an earlier call can be matched now
            results = [None] * self.size
            for rank, comm in enumerate(comms):
                self._tasks[rank].put((comm, fn, args, results))
            for _ in range(self.size):
                self._done.get()
            failed = comms[0]._world.shared.failed
            if failed is not None:
                self._comms = None  # the next call starts from a clean world
                raise failed[1]
            return results

    def close(self):
        with self._lock:
            if not self._closed:
                self._closed = True
                self._finalizer()
                for thread in self._threads or ():
                    thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
