"""Wire compression: float32/float64 all-reduce messages travel as 16-bit values (bf16 or fp16).

``collectives.allreduce(x, compression="bf16")`` runs the chosen algorithm's plan unchanged over
``CompressedComm``, a communicator wrapper that converts messages at the message layer:

- a send of a float region to a compressed peer (one on another host, or every peer with
  ``compression_scope="all"``) first rounds the sender's own region in place to the wire
  precision, then sends its 16-bit encoding from a staging buffer: the sender goes on with
  exactly the values its peers receive;
- a receive from a compressed peer lands in a staging buffer and is decoded into the
  destination region, where the plan's reductions run in the original precision.

The plan runs in place on the result buffer (the send buffer is copied there first). Every value
that leaves a rank is then the value the sender keeps. That alone does not make every rank end
bitwise identical: a value copied exactly to a peer (inside a host, or before the sender rounded it)
can later be rounded by a rank that forwards it (a flat ring's all-gather across hosts), and a
result computed alike on several ranks can be rounded by one of them as it sends it on
(recursive doubling's folded ranks), so one rank may end with ``x`` where another holds
``round(x)``. Every rank therefore rounds its whole result once more at the end: rounding is
idempotent and the plans only copy finished values, so all ranks end identical (tested for every
algorithm, scope, format and world size 2-5), and the result is always a value of the wire format.
A registered algorithm whose ranks go on reducing a value that some of them received rounded and
others hold exact (rather than copying finished values) would not end identical: test it with
compression as tests/test_compression.py tests the built-in ones.

Error: each rounding has relative error at most u (bf16: 2^-8, fp16: 2^-11, round to nearest
even); an element is rounded at most once per hop of its longest chain, which is under n + 2
for every built-in algorithm on n ranks, so ``|result - exact| <= (n + 2) u sum_i |x_i|``
(tests/test_compression.py checks it per dtype and world size). fp16 also has a range: values
past 65504 become inf, below 6.1e-5 lose relative precision (subnormals). float64 travels as
float32 first, then 16 bits (one extra rounding of 2^-24, inside the bound).

``residual=`` (error feedback, as in 1-bit SGD, Seide et al. 2014, and EF-SGD, Karimireddy et
al. 2019): the caller keeps one array per buffer; each call adds it to its input, rounds that to
the wire precision before any message, and stores what the rounding dropped for the next call.
"""
import weakref
from dataclasses import replace

import numpy as np

from . import config
from .comm.base import Communicator
from .model import BETA, wire_ratio
from .simulator import simulate as _simulate

FORMATS = ("bf16", "fp16")
SCOPES = ("across_hosts", "all")
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------------- conversion
def _bf16_bits(src32, out16, work=None):
    """float32 values -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN.
    ``work``: a uint32 scratch of at least ``src32.size`` elements (else one is allocated)."""
    bits = src32.view(np.uint32)
    work = np.empty(bits.size, np.uint32) if work is None else work[:bits.size]
    np.right_shift(bits, 16, out=work)
    np.bitwise_and(work, 1, out=work)
    work += 0x7FFF
    work += bits  # wraps only for NaN patterns, fixed below
    np.right_shift(work, 16, out=work)
    out16[...] = work  # uint32 -> uint16 (the high half is zero)
    if bits.size and np.isnan(np.max(src32)):  # max propagates NaN: one pass, no temporary
        out16[np.isnan(src32)] = 0x7FC0


def encode(src, out16, fmt, work=None):
    """Encode float32/float64 ``src`` into ``out16`` (uint16, same length) in format ``fmt``;
    ``work``: optional uint32 scratch of ``src.size`` elements (bf16)."""
    if fmt == "fp16":
        out16.view(np.float16)[...] = src
    else:
        _bf16_bits(src if src.dtype == np.float32 else src.astype(np.float32), out16, work)


def decode(wire16, dst, fmt):
    """Decode ``wire16`` (uint16) into float32/float64 ``dst``."""
    if fmt == "fp16":
        dst[...] = wire16.view(np.float16)
    elif dst.dtype == np.float32:
        bits = dst.view(np.uint32)
        bits[...] = wire16
        bits <<= 16
    else:
        wide = np.left_shift(wire16.astype(np.uint32), 16)
        dst[...] = wide.view(np.float32)


def round_to_wire(region, fmt, staging=None, work=None):
    """Round ``region`` in place to the values format ``fmt`` can carry."""
    wire = np.empty(region.size, np.uint16) if staging is None else staging[:region.size]
    encode(region, wire, fmt, work)
    decode(wire, region, fmt)


def check(compression, scope, dtype):
    """ValueError, before any communication, for a format, scope or dtype compression cannot take."""
    if compression not in FORMATS:
        raise ValueError(f"compression must be one of {', '.join(FORMATS)} or None, got {compression!r}")
    if scope not in SCOPES:
        raise ValueError(f"compression_scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if dtype not in _FLOATS:
        raise ValueError(f"compression={compression!r} takes float32 or float64 data, got {dtype}: integer "
                         f"and 16-bit dtypes are reduced as they are (pass compression=None)")


def env_default():
    """COLLECTIVES_COMPRESSION (bf16, fp16, or unset/none): the compression of calls that pass none."""
    if not config.is_set("COLLECTIVES_COMPRESSION"):
        return None
    import os

    raw = os.environ.get("COLLECTIVES_COMPRESSION", "").strip().lower()
    if raw in ("", "none", "0", "off"):
        return None
    if raw not in FORMATS:
        raise ValueError(f"COLLECTIVES_COMPRESSION must be one of {', '.join(FORMATS)} or none, got {raw!r}")
    return raw


# ---------------------------------------------------------------------------------- transport
class CompressedComm(Communicator):
    """``inner`` with messages to ``peers`` carried as 16-bit ``fmt`` values (float buffers only).

    Only ``exchange`` (the executor's one call) converts; tags, node colours and the session are
    the inner communicator's, so a compressed call is told apart from an exact one by its
    signature (the API adds the format to it)."""

    prepares_steps = False

    def __init__(self, inner, fmt, peers):
        self.inner, self.fmt, self.peers = inner, fmt, frozenset(peers)
        self.rank, self.size = inner.rank, inner.size
        self.signed = inner.signed
        self._staging = np.empty(0, np.uint16)
        self._work32 = np.empty(0, np.uint32)

    def __repr__(self):
        return f"CompressedComm({self.inner!r}, {self.fmt}, peers={sorted(self.peers)})"

    @property
    def session(self):
        return self.inner.session

    @property
    def failed(self):
        return self.inner.failed

    def call_tag(self, key):
        return self.inner.call_tag(key)

    def next_tag(self):
        return self.inner.next_tag()

    def node_colors(self):
        return self.inner.node_colors()

    def foreign(self, peer, tag):
        return self.inner.foreign(peer, tag)

    def _stage(self, total):
        if self._staging.size < total:
            self._staging = np.empty(total, np.uint16)
        return self._staging

    def _work(self, count):
        """uint32 scratch for bf16 encoding, kept across calls."""
        if self._work32.size < count:
            self._work32 = np.empty(count, np.uint32)
        return self._work32

    def round(self, region):
        """Round ``region`` in place to the wire's values (scratch kept across calls)."""
        round_to_wire(region, self.fmt, self._stage(region.size), self._work(region.size))

    def exchange(self, sends, recvs, tag, what):
        peers, fmt = self.peers, self.fmt
        packed_sends = [i for i, (peer, buf, _) in enumerate(sends) if peer in peers and buf.dtype in _FLOATS]
        packed_recvs = [i for i, (peer, buf, _) in enumerate(recvs) if peer in peers and buf.dtype in _FLOATS]
        if not packed_sends and not packed_recvs:
            return self.inner.exchange(sends, recvs, tag, what)
        staging = self._stage(sum(sends[i][1].size for i in packed_sends)
                              + sum(recvs[i][1].size for i in packed_recvs))
        at = 0
        sends = list(sends)
        # round every compressed region first: an exact send of the same region in this step
        # then carries the rounded values too
        work = self._work(max(sends[i][1].size for i in packed_sends)) if packed_sends and fmt == "bf16" else None
        for i in packed_sends:
            peer, buf, chan = sends[i]
            wire = staging[at:at + buf.size]
            at += buf.size
            encode(buf, wire, fmt, work)
            decode(wire, buf, fmt)
            sends[i] = (peer, wire, chan)
        recvs = list(recvs)
        targets = []
        for i in packed_recvs:
            peer, buf, chan = recvs[i]
            wire = staging[at:at + buf.size]
            at += buf.size
            targets.append((wire, buf))
            recvs[i] = (peer, wire, chan)
        self.inner.exchange(sends, recvs, tag, what)
        for wire, buf in targets:
            decode(wire, buf, fmt)


_wrappers = weakref.WeakKeyDictionary()  # our communicator -> {(fmt, scope): (CompressedComm, any rounding)}


def compressed(comm, fmt, scope):
    """(the CompressedComm of ``comm`` for ``fmt`` and ``scope``, whether any message of the world
    is compressed: then every rank rounds its result at the end), made once per communicator."""
    held = _wrappers.get(comm)
    if held is None:
        held = _wrappers[comm] = {}
    hit = held.get((fmt, scope))
    if hit is None:
        others = [r for r in range(comm.size) if r != comm.rank]
        if scope == "all":
            peers, rounding = others, comm.size > 1
        else:
            colors = comm.node_colors() if comm.size > 1 else (0,)
            peers = [r for r in others if colors[r] != colors[comm.rank]]
            rounding = len(set(colors)) > 1
        hit = held[(fmt, scope)] = (CompressedComm(comm, fmt, peers), rounding)
    return hit


def _forget(comm):
    _wrappers.pop(comm, None)


def simulate(algorithm, ranks, nbytes, *, compression="bf16", compression_scope="across_hosts", itemsize=4,
             topology=None, beta=None, **kwargs):
    """``collectives.simulate`` with the wire's bytes: every message (``"all"``) or the messages
    between nodes of ``topology`` (``"across_hosts"``) cost ``2 / itemsize`` of their bytes."""
    ratio = wire_ratio(compression, itemsize)
    beta = BETA if beta is None else beta
    if topology is not None:
        inter = (topology.inter[0], topology.inter[1] * ratio)
        intra = topology.intra if compression_scope == "across_hosts" else (topology.intra[0],
                                                                            topology.intra[1] * ratio)
        topology = replace(topology, inter=inter, intra=intra)
    elif compression_scope == "all":
        beta = beta * ratio
    return _simulate(algorithm, ranks, nbytes, beta=beta, topology=topology, itemsize=itemsize, **kwargs)
