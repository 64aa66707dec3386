"""The mismatch guard on a slow link: a message of a peer's next call is no evidence of a
mismatch while this call's message from that peer is still arriving (issue: a false
MismatchError across hosts). A threaded world whose link from rank 1 to rank 0 delivers large
messages late reproduces it without a network: the message is matched (queued) when sent and
arrives later, as a message on a slow TCP link does; rank 1, its sends done, goes on to its next
call and sends that call's first message, which overtakes nothing but is there to be probed."""
import threading
import time

import numpy as np
import pytest

import collectives
from collectives.comm import threaded
from collectives.errors import CollectiveTimeout, MismatchError

DELAY = 0.15  # a large message's time on the link: past the guard's first probe several times over
LARGE = 4096  # bytes: messages from rank 1 to rank 0 this large cross the link one after another


class _InFlight:
    __slots__ = ("data", "arrives")

    def __init__(self, data, arrives):
        self.data, self.arrives = data, arrives

    @property
    def nbytes(self):
        return self.data.nbytes


class SlowLinkComm(threaded.ThreadComm):
    """A rank of a threaded world whose link from rank 1 to rank 0 is slow: large messages
    cross it one after another, DELAY each, while small ones go ahead (as the emulated hosts'
    shaped links let small packets by)."""

    def isend(self, buf, dest, tag=0):
        request = super().isend(buf, dest, tag)
        world = self._world
        if world.size == 2 and self.rank == 1 and dest == 0 and buf.nbytes >= LARGE:
            with world.shared.cond:
                free = max(time.monotonic(), getattr(world, "link_free", 0.0))
                world.link_free = free + DELAY
                queue = world.queues[(self.rank, dest, tag)]
                queue[-1] = _InFlight(queue[-1], world.link_free)
        return request

    @staticmethod
    def _arrived(queue):
        if not queue:
            return None
        head = queue[0]
        if isinstance(head, _InFlight):
            if time.monotonic() < head.arrives:
                return None
            queue.popleft()
            return head.data
        return queue.popleft()


def _run_slow(fn, monkeypatch):
    monkeypatch.setattr(threaded, "ThreadComm", SlowLinkComm)
    return collectives.run_threaded(2, fn)


def _two_calls(comm):
    big = np.arange(1 << 16, dtype=np.float64) * (comm.rank + 1)
    small = np.full(8, comm.rank + 1.0)
    first = collectives.allreduce(big, algorithm="ring", comm=comm)
    second = collectives.allreduce(small, algorithm="recursive_doubling", comm=comm)
    return first, second


def test_a_late_message_of_this_call_is_not_a_mismatch(monkeypatch):
    """Rank 0 waits for rank 1's late ring message while rank 1's next call (another algorithm,
    so another signature) has already sent its message: the calls match, so both return."""
    results = _run_slow(_two_calls, monkeypatch)
    expected_big = np.arange(1 << 16, dtype=np.float64) * 3
    for first, second in results:
        np.testing.assert_array_equal(first, expected_big)
        np.testing.assert_array_equal(second, np.full(8, 3.0))
    assert results[0][0].tobytes() == results[1][0].tobytes()


def test_a_real_mismatch_on_the_slow_link_is_still_caught(monkeypatch):
    """Rank 1 makes another call (another count) than rank 0: no rank returns a result."""
    def fn(comm):
        count = 1 << 16 if comm.rank == 0 else (1 << 16) + 8
        return collectives.allreduce(np.ones(count), algorithm="ring", comm=comm)

    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "3")
    with pytest.raises((MismatchError, CollectiveTimeout)):
        _run_slow(fn, monkeypatch)


def test_the_probe_still_accuses_a_peer_whose_message_of_this_call_never_came(monkeypatch):
    """Rank 1 skips the ring call and makes the next one: its message is of another call and
    nothing of this call from rank 1 is queued, so rank 0 raises MismatchError well within the
    timeout (not a timeout)."""
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "20")
    errors = []

    def fn(comm):
        try:
            if comm.rank == 0:
                collectives.allreduce(np.ones(1 << 16), algorithm="ring", comm=comm)
            collectives.allreduce(np.ones(8), algorithm="recursive_doubling", comm=comm)
        except Exception as exc:  # noqa: BLE001 - the test looks at which error each rank got
            errors.append((comm.rank, exc))
            raise

    start = time.monotonic()
    with pytest.raises((MismatchError, collectives.errors.PeerAborted)):
        _run_slow(fn, monkeypatch)
    assert time.monotonic() - start < 10
    assert any(isinstance(exc, MismatchError) for _, exc in errors), errors


def test_many_back_to_back_calls_on_a_slow_link(monkeypatch):
    """The issue's program in small: every algorithm once, back to back with no barrier, on a
    link that delivers late; every call matches, so every rank returns the same bits."""
    def fn(comm):
        out = []
        for name in collectives.algorithm_names():
            if name in ("shm",):
                continue
            x = np.arange(4096, dtype=np.float32) + comm.rank
            out.append(collectives.allreduce(x, algorithm=name, comm=comm).tobytes())
        return out

    results = _run_slow(fn, monkeypatch)
    assert results[0] == results[1]
    assert threading.active_count() >= 1
