"""The communicator interface: all that an algorithm's executor may use.

A transport implements ``rank``, ``size``, ``isend``, ``irecv``, ``waitall``,
``split`` and ``barrier``; the blocking calls and the per-step ``exchange`` have
default implementations here in terms of those. Buffers are contiguous 1-D
arrays (NumPy, or CuPy where the transport accepts device memory); they travel
as raw bytes, never pickled.
"""
import zlib

from ..errors import MismatchError

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

    def barrier(self):
        raise NotImplementedError

    def split(self, color, key=0):
        """New communicator of the ranks that passed the same ``color``, ordered by ``key``."""
        raise NotImplementedError

    # library support
    def on_failure(self, exc):
        """Called when a collective fails after messages moved (timeout, bad size, peer gone).
        The threaded world needs nothing: run_threaded releases the other ranks."""

    def next_tag(self):
        """A tag base for the next collective: successive calls never share tags."""
        seq = getattr(self, "_seq", 0)
        self._seq = seq + 1
        return seq % self._tag_modulus()

    def program_tag(self, key):
        """A tag base for a prepared program (``key``: a string naming its call shape): the
        same on every rank for the same key, whatever each rank's call history or cache, and
        apart from every tag next_tag() gives."""
        modulus = self._tag_modulus()
        return modulus + zlib.crc32(key.encode()) % modulus

    def _tag_modulus(self):
        return 1 << 16

    def node_colors(self):
        """One integer per rank naming its node (shared-memory domain). One node by default."""
        return (0,) * self.size

    def exchange(self, sends, recvs, tag, what):
        """One plan step: post every receive and send (``(peer, array, chan)``), wait for all."""
        reqs = [self.irecv(buf, peer, tag + chan) for peer, buf, chan in recvs]
        reqs += [self.isend(buf, peer, tag + chan) for peer, buf, chan in sends]
        self.waitall(reqs, what)

    # prepared steps (the small-message programs of executor.Program)
    prepares_steps = False  # True where a prepared step is cheaper to rerun than exchange()

    def close(self):
        """Release what the communicator holds; the default holds nothing to release."""
        for hook in on_release:
            hook(self)

    def prepare(self, sends, recvs, tag, what):
        """One step bound to fixed buffers and a fixed tag, as a callable that reruns it."""
        return lambda: self.exchange(sends, recvs, tag, what)


def check_received(peer, expected, got, what):
    if got != expected:
        raise MismatchError(f"{what}: message from rank {peer} has {got} bytes, expected {expected} "
                            f"(ranks disagree on count, dtype or algorithm)")
