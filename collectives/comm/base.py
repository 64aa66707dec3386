"""The communicator interface: all that the step loop (``executor.run``) asks of a transport.

A transport implements ``rank``, ``size``, ``isend``, ``irecv``, ``waitall``,
``split`` and ``barrier``; the blocking calls, the per-step ``exchange`` and ``bind_call`` (a
call's plan bound to its buffers as the step loop's actions: each step's exchange, then its
local operations) have default implementations here in terms of those. Buffers are contiguous 1-D
arrays (NumPy, or CuPy where the transport accepts device memory); they travel
as raw bytes, never pickled.
"""
import zlib
from functools import partial

from .. import executor
from ..errors import CollectiveError, MismatchError
from ..plan import ranks_by_group
from ..session import Session

# Callbacks run with a communicator that is being released (``close()``): caches holding state
# bound to it (the API's prepared programs and call shapes) drop it.
on_release = []


class Request:
    """A pending send or receive. ``peer`` and ``nbytes`` let errors name who is late."""

    __slots__ = ("peer", "nbytes", "is_recv")

    def test(self):  # pragma: no cover - interface
        raise NotImplementedError


class Communicator:
    rank = 0
    size = 1
    # Calls carry their signature (call, algorithm, op, dtype, count, root, options) in their
    # message tags, so that ranks that disagree on any of it never match each other's messages:
    # a waiting rank sees the foreign message and raises MismatchError, or times out. False only
    # for a communicator wrapped under COLLECTIVES_GUARD=0 (to measure what the guard costs).
    signed = True
    failed = None  # (call, error) of the call that failed on this communicator

    def __getattr__(self, name):
        # ``session``: what the library holds for this communicator (collectives/session.py), made
        # on first use; a plain attribute afterwards, so the hot path pays nothing for it
        if name == "session":
            session = self.session = Session()
            return session
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # point-to-point (transports implement isend, irecv, waitall)
    def isend(self, buf, dest, tag=0):
        raise NotImplementedError

    def irecv(self, buf, source, tag=0):
        raise NotImplementedError

    def waitall(self, requests, what="wait"):
        """Wait for every request, bounded by COLLECTIVES_TIMEOUT; ``what`` names the call in errors."""
        raise NotImplementedError

    def send(self, buf, dest, tag=0):
        self.waitall([self.isend(buf, dest, tag)], "send")

    def recv(self, buf, source, tag=0):
        self.waitall([self.irecv(buf, source, tag)], "recv")

    def sendrecv(self, sendbuf, dest, recvbuf, source, sendtag=0, recvtag=None):
        recvtag = sendtag if recvtag is None else recvtag
        reqs = [self.irecv(recvbuf, source, recvtag), self.isend(sendbuf, dest, sendtag)]
        self.waitall(reqs, "sendrecv")

    def split(self, color, key=0):
        """New communicator of the ranks that passed the same ``color``, ordered by ``key``."""
        raise NotImplementedError

    # library support
    def on_failure(self, exc):
        """Called when a collective fails after messages moved (timeout, bad size, peer gone).
        The threaded world needs nothing: run_threaded releases the other ranks."""

    def call_tag(self, key):
        """A tag slot for a collective whose signature is ``key`` (a string naming the call,
        algorithm, op, dtype, count, root and options): the same on every rank that makes the
        same call, a different one (but for a hash collision, 1 in ``_tag_modulus()``) for a
        call that differs in any field. Successive calls with one signature share the slot and
        are kept apart by in-order matching between a pair of ranks. Unsigned: next_tag()."""
        if not self.signed:
            return self.next_tag()
        return zlib.crc32(key.encode()) % self._tag_modulus()

    def foreign(self, peer, tag):
        """The tag of a message from ``peer`` that is waiting here unmatched and belongs to
        another call than the one whose messages use tags ``tag // 8 * 8`` to ``+ 7``; None when
        there is none (or the transport cannot tell). A rank that waits for ``peer`` while such
        a message is queued will never get its own: every message between a pair of ranks
        matches in order, so ``peer`` made a different call."""
        return None

    def mark_failed(self, what, exc):
        """Record that a call failed here: later calls raise instead of risking the failed
        call's messages, still in flight, matching theirs."""
        if self.failed is None and not getattr(exc, "comm_usable", False):
            self.failed = (str(what), exc)

    def check_usable(self):
        if self.failed is not None:
            what, exc = self.failed
            raise CollectiveError(
                f"this communicator cannot be used: {what} failed on it ({type(exc).__name__}: {exc}); "
                f"messages of that call may still be in flight. Go on with a new communicator "
                f"(for example MPI.COMM_WORLD.Dup(), passed as comm=)")

    def next_tag(self):
        """A tag base for the next collective: successive calls never share tags."""
        seq = getattr(self, "_seq", 0)
        self._seq = seq + 1
        return seq % self._tag_modulus()

    def program_tag(self, key):
        """A tag base for a prepared program (``key``: a string naming its call shape): the
        same on every rank for the same key, whatever each rank's call history or cache, and
        apart from every tag next_tag() and call_tag() give."""
        modulus = self._tag_modulus()
        return modulus + zlib.crc32(key.encode()) % modulus

    def _tag_modulus(self):
        return 1 << 16

    def node_colors(self):
        """One integer per rank naming its node (shared-memory domain). One node by default."""
        return (0,) * self.size

    def hosts(self):
        """The ranks of each node, nodes in order of their first rank (a tuple of tuples of ranks,
        from ``node_colors()``): the topology ``collectives.algorithms.resolve`` takes. Kept
        while ``node_colors()`` gives the same colours."""
        colors = self.node_colors()
        kept = getattr(self, "_hosts", None)
        if kept is not None and (kept[0] is colors or kept[0] == colors):
            return kept[1]
        hosts = ranks_by_group(colors)
        self._hosts = (colors, hosts)
        return hosts

    def exchange(self, sends, recvs, tag, what):
        """One plan step: post every receive and send (``(peer, array, chan)``), wait for all."""
        reqs = [self.irecv(buf, peer, tag + chan) for peer, buf, chan in recvs]
        reqs += [self.isend(buf, peer, tag + chan) for peer, buf, chan in sends]
        self.waitall(reqs, what)

    def bind_call(self, plan, buffers, reduce_fn, final_fn, what, tag, keep=False, split=True, sync=None):
        """A call of ``plan`` on ``buffers`` (IN, OUT, TMP) as actions for the step loop
        (``executor.run``; ``executor.actions`` has the arguments), its messages on tags ``tag``
        to ``tag + 7``. ``keep``: the actions will run again and again (a program): a list, each
        step prepared (``prepare``; ``split`` as there); else made as the loop reaches them, each
        step one ``exchange``."""
        if keep:
            return list(executor.actions(plan, buffers, reduce_fn, final_fn, what,
                                         lambda sends, recvs, name: self.prepare(sends, recvs, tag, name, split), sync))
        exchange = self.exchange
        return executor.actions(plan, buffers, reduce_fn, final_fn, what,
                                lambda sends, recvs, name: partial(exchange, sends, recvs, tag, name), sync)

    def barrier(self, what="barrier"):
        """Dissemination barrier of empty messages: ceil(log2 n) rounds, each a bounded wait,
        so that a timeout names the rank not heard from."""
        if self.size == 1:
            return
        import numpy as np

        tag = self.call_tag("barrier") * 8
        token, sink = np.zeros(0, np.uint8), np.zeros(0, np.uint8)
        distance = 1
        while distance < self.size:
            self.exchange([((self.rank + distance) % self.size, token, 0)],
                          [((self.rank - distance) % self.size, sink, 0)], tag, what)
            distance *= 2

    # prepared steps (the small-message programs of executor.Program)
    prepares_steps = False  # True where a prepared step is cheaper to rerun than exchange()

    def close(self):
        """Release what the library holds for the communicator: the release hooks run (the API
        forgets its memo of the last call), then the session frees its windows and caches."""
        for hook in on_release:
            hook(self)
        session = self.__dict__.get("session")
        if session is not None:
            session.close()

    def prepare(self, sends, recvs, tag, what, split=True):
        """One step bound to fixed buffers and a fixed tag, as a callable that reruns it
        (``split``: a transport may send a message as pieces; False keeps messages whole)."""
        return lambda: self.exchange(sends, recvs, tag, what)


def check_received(peer, expected, got, what):
    if got != expected:
        raise MismatchError(f"{what}: message from rank {peer} has {got} bytes, expected {expected} "
                            f"(ranks disagree on count, dtype or algorithm)")


def foreign_message(what, peer):
    """The text of the MismatchError for a message of another call from ``peer``."""
    return (f"{what}: rank {peer} sent a message of another call (ranks disagree on the call, count, dtype, "
            f"op, root, algorithm or options; COLLECTIVES_CHECK=1 names the field)")
