"""Nonblocking all-reduce: ``iallreduce`` posts the call and returns a request at once.

Each communicator gets one progress thread and a communicator of its own for it (split from the
caller's on the first ``iallreduce``, a collective step, so every rank makes its first one at the
same point of its program): the thread runs the posted requests one after another, in posting
order, along the blocking call's path (collectives/pipeline.py: plans, compression, bounded
waits), while the caller computes. Messages of requests never mix with the caller's blocking
calls, which keep the caller's communicator.

Every rank must post its requests on a communicator in the same order (as for blocking calls);
under COLLECTIVES_CHECK=1 each request first checks that the ranks agree on it, so a rank that
posted in another order gets the MismatchError at ``wait``. A request's failure (timeout after
COLLECTIVES_TIMEOUT, mismatch, a peer gone) is raised by ``wait()``/``result()`` with the blocking
call's message; under MPI a failure aborts the job as a blocking call's would, unless
COLLECTIVES_ON_ERROR=raise. The progress communicator is then unusable and later requests on it
fail at their ``wait`` too.

Lifetime: the send and receive buffers belong to the request until it completes (do not write to
them before ``wait``). A progress thread with nothing to do ends after ``IDLE_SECONDS`` (the next
post starts another). At interpreter exit the requests still open are run to completion first
(each bounded by COLLECTIVES_TIMEOUT, as any wait), so a job that exits with requests open never
leaves its peers waiting and never hangs; the threads are daemons.
"""
import atexit
import sys
import threading
import time
import weakref
from collections import deque

import numpy as np

from . import calls as _calls
from . import pipeline as _pipeline
from . import config
from .comm import base as _comm_base
from .errors import CollectiveError, CollectiveTimeout

IDLE_SECONDS = 2.0


class AllreduceRequest:
    """A posted ``iallreduce``: ``wait(timeout=None)`` -> the result, ``test()`` -> done?,
    ``result()`` (the same as ``wait()``)."""

    __slots__ = ("index", "what", "_done", "_result", "_error", "_call")

    def __init__(self, index, what, call):
        self.index, self.what, self._call = index, what, call
        self._done = threading.Event()
        self._result = self._error = None

    def __repr__(self):
        state = "failed" if self._error is not None else "done" if self._done.is_set() else "in flight"
        return f"<AllreduceRequest {self.index} {self.what}: {state}>"

    def test(self):
        """True once the request has finished (its result or its error is ready for ``wait``)."""
        return self._done.is_set()

    def wait(self, timeout=None):
        """Block until done and return the result; raise the request's error. ``timeout`` (seconds)
        bounds this wait only: past it a CollectiveTimeout says the request is still in flight (it
        goes on; wait again). The call's own waits are bounded by COLLECTIVES_TIMEOUT."""
        if not self._done.wait(timeout):
            raise CollectiveTimeout(f"iallreduce request {self.index} ({self.what}) not complete after {timeout:g} s "
                                    f"(still in flight: wait again)")
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        """The reduced array (waits for it; raises the request's error)."""
        return self.wait()

    def _run(self):
        try:
            self._result = self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to wait()
            self._error = exc
        finally:
            self._call = None
            self._done.set()


class _Progress:
    """The progress thread of one communicator, its own communicator and its queue."""

    def __init__(self, comm):
        self.comm = comm.split(0, comm.rank)  # collective: a context of its own
        self.cond = threading.Condition()
        self.queue = deque()
        self.thread = None
        self.posted = 0
        self.running = None  # the request being run

    def post(self, request):
        with self.cond:
            self.queue.append(request)
            if self.thread is None:
                _active.add(self)
                self.thread = threading.Thread(target=self._serve, name=f"collectives-progress-{self.comm.rank}",
                                               daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _serve(self):
        while True:
            with self.cond:
                deadline = time.monotonic() + IDLE_SECONDS
                while not self.queue:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.thread = None
                        _active.discard(self)
                        self.cond.notify_all()
                        return
                    self.cond.wait(left)
                self.running = self.queue.popleft()
            self.running._run()
            with self.cond:
                self.running = None
                self.cond.notify_all()

    def open_requests(self):
        with self.cond:
            return len(self.queue) + (self.running is not None)

    def drain(self, limit):
        """Wait until every posted request has finished, at most ``limit`` seconds; False if not."""
        deadline = time.monotonic() + limit
        with self.cond:
            while self.queue or self.running is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
        return True


_progress = weakref.WeakKeyDictionary()  # our communicator -> _Progress
_active = set()  # progress objects whose thread runs (kept even once their communicator is gone)
_lock = threading.Lock()


def _progress_of(comm):
    with _lock:
        found = _progress.get(comm)
    if found is None:
        found = _Progress(comm)  # collective (every rank's first iallreduce on comm)
        with _lock:
            _progress[comm] = found
    return found


def _validate(sendbuf, recvbuf, op, algorithm, comm, options, compression, scope, residual):
    """The blocking call's argument checks (the pipeline's ``Call``), on the caller's thread,
    before anything is posted; an algorithm's options are resolved here too."""
    if not isinstance(sendbuf, np.ndarray):
        raise ValueError(f"iallreduce takes host (NumPy) arrays, got {type(sendbuf).__name__}")
    call = _pipeline.Call(sendbuf, recvbuf, op, algorithm, options, compression, scope, residual,
                          point_to_point=True)
    if algorithm != "auto":
        _pipeline._algorithms.resolve(algorithm, call.options, comm.hosts, comm.size)


def iallreduce(sendbuf, recvbuf=None, *, op="sum", algorithm="auto", comm=None, compression=None,
               compression_scope="across_hosts", residual=None, **options):
    """Post an all-reduce of ``sendbuf`` and return its ``AllreduceRequest`` at once.

    Arguments as ``collectives.allreduce`` (``recvbuf=None``: a new array, the request's result).
    The plan runs on the communicator's progress thread, requests in posting order; every rank
    must post the same requests in the same order. Do not touch ``sendbuf``, ``recvbuf`` or
    ``residual`` until ``wait()`` returns."""
    ours = _calls.usable(comm)
    _validate(sendbuf, recvbuf, op, algorithm, ours, options, compression, compression_scope, residual)
    result = np.empty(sendbuf.shape, sendbuf.dtype) if recvbuf is None else recvbuf
    progress = _progress_of(ours)
    progress.posted += 1
    what = f"allreduce({algorithm}{', ' + compression if compression not in (None, 'none') else ''})"
    target = progress.comm
    options = dict(options)

    def call():
        return _pipeline.call(sendbuf, result, op, algorithm, target, options, compression, compression_scope,
                              residual, point_to_point=True)

    request = AllreduceRequest(progress.posted, what, call)
    progress.post(request)
    return request


def waitall(requests, timeout=None):
    """Wait for every request (in order); their results. The first error is raised after all have
    finished or failed, so no request is left behind."""
    results, first = [], None
    for request in requests:
        try:
            results.append(request.wait(timeout))
        except CollectiveError as exc:
            if first is None:
                first = exc
            results.append(None)
    if first is not None:
        raise first
    return results


def open_requests(comm=None):
    """How many requests posted on ``comm`` have not finished."""
    found = _progress.get(_calls.as_comm(comm))
    return 0 if found is None else found.open_requests()


def _release(comm):
    """``comm`` is being released: finish its requests, then release its progress communicator."""
    found = _progress.pop(comm, None)
    if found is not None:
        found.drain(_drain_limit(found))
        found.comm.close()


def _drain_limit(progress):
    return (config.timeout() or 60.0) * (progress.open_requests() + 1)


_comm_base.on_release.append(_release)


@atexit.register
def _finish_at_exit():
    """Run every open request to completion (bounded) before MPI is finalized."""
    for progress in list(_active):
        if progress.open_requests() and not progress.drain(_drain_limit(progress)):
            print(f"collectives: {progress.open_requests()} iallreduce request(s) still open at exit after "
                  f"{_drain_limit(progress):g} s", file=sys.stderr)
