"""Run collectives' all-reduce plans as TensorFlow ops, one rank per local device.

A plan (``collectives.plan``) says, for one rank, which element ranges it sends,
receives, adds and copies, step by step. Here the plans of all ``k`` local ranks are
walked together, once, while TensorFlow builds the graph: every message becomes a
tensor handed from one device's ops to another's, every REDUCE a ``tf.add`` placed
on the rank's device, every COPY nothing at all. At run time no Python runs and
nothing goes through NumPy; on logical CPU devices, which share one memory,
TensorFlow hands tensors between devices without copying them.

Buffers are kept as *pieces*: ``(lo, hi, tensor, offset)`` says that elements
``lo:hi`` of the buffer are ``tensor[offset:offset + hi - lo]``. A buffer is never
assembled unless an op needs a contiguous range: a send passes pieces along, a COPY
moves pieces, a REDUCE adds piece by piece (concatenating runs of small pieces first). So the "pack" of all gradients is virtual: IN starts as the
flattened gradients themselves, laid out at offsets aligned to 64 bytes (zero padding
between them), and the plan's element count is rounded so that ring-style chunk
bounds stay aligned too; TensorFlow slices a 1-D tensor at a 64-byte aligned offset
without copying. The only copies left are the concatenations that assemble each
output tensor from the chunks different ranks reduced.

Every chunk of the result is computed once, by the rank the plan says, and shared:
all replicas get bitwise identical values, and the order of every addition is the
plan's.
"""
import importlib
from collections import Counter, deque

import numpy as np
import tensorflow as tf

_algorithms = importlib.import_module("collectives.algorithms")  # the package's name is shadowed by a function
from collectives import config as _config
from collectives.binding import REDUCE, Named, bind
from collectives.plan import OUT

from . import _tf_internals as _tfi

ALIGN_BYTES = 64  # TensorFlow slices a 1-D tensor without copying at offsets aligned to this
SMALL_PIECE = 4096  # elements: consecutive pieces smaller than this are concatenated and added at once

_plans = {}


def resolve_algorithm(algorithm, options, size, nbytes, dtype):
    """(algorithm name, plan parameters) exactly as ``collectives.allreduce`` would choose them
    for ``size`` ranks on one node."""
    forced = _config.forced_algorithm()
    if forced is not None:
        name = forced
    elif algorithm == "auto":
        from collectives.select import choose_for

        name = choose_for(size, nbytes, dtype)
    else:
        name = algorithm
    module = _algorithms.get(name)
    if name != algorithm and options:
        options = {k: v for k, v in options.items() if k in module.OPTIONS}
    return name, _algorithms.resolve(module, options, (tuple(range(size)),))[1]


def plans_for(name, params, size, count, itemsize):
    key = (name, tuple(sorted(params.items())), size, count, itemsize)
    plans = _plans.get(key)
    if plans is None:
        module = _algorithms.get(name)
        plans = [module.build(r, size, count, itemsize=itemsize, **params) for r in range(size)]
        if len(_plans) > 256:
            _plans.clear()
        _plans[key] = plans
    return plans


def aligned_layout(sizes, itemsize, size):
    """Offsets of tensors of ``sizes`` elements in a virtual pack, and the pack's element count.

    Offsets are multiples of 64 bytes; the count is a multiple of ``size`` * 64 bytes, so the
    plan's equal chunks (``block_bounds(count, size)``) start at aligned offsets too."""
    align = max(1, ALIGN_BYTES // itemsize)
    offsets, top = [], 0
    for n in sizes:
        top = -(-top // align) * align
        offsets.append(top)
        top += n
    unit = align * size
    count = -(-top // unit) * unit if top else 0
    return offsets, count


class _Buffer:
    """One rank's buffer as pieces [lo, hi, tensor, offset], sorted, non-overlapping."""

    __slots__ = ("pieces", "name")

    def __init__(self, name):
        self.pieces = []
        self.name = name

    def read(self, lo, hi):
        """The pieces covering lo:hi exactly, as (length, tensor, offset) in order."""
        out, at = [], lo
        for plo, phi, tensor, off in self.pieces:
            if phi <= at or plo >= hi:
                continue
            if plo > at:
                break
            end = min(phi, hi)
            out.append((end - at, tensor, off + at - plo))
            at = end
            if at >= hi:
                break
        if at < hi:
            raise RuntimeError(f"plan reads elements {at}:{hi} of {self.name}, which hold no data yet")
        return out

    def write(self, lo, parts):
        """Elements lo:lo+sum(lengths) become ``parts`` ((length, tensor, offset) in order)."""
        hi = lo + sum(n for n, _, _ in parts)
        kept = []
        for piece in self.pieces:
            plo, phi, tensor, off = piece
            if phi <= lo or plo >= hi:
                kept.append(piece)
                continue
            if plo < lo:
                kept.append((plo, lo, tensor, off))
            if phi > hi:
                kept.append((hi, phi, tensor, off + hi - plo))
        at = lo
        for n, tensor, off in parts:
            kept.append((at, at + n, tensor, off))
            at += n
        kept.sort(key=lambda p: p[0])
        self.pieces = kept


class _Builder:
    """Builds the TensorFlow ops of one all-reduce over ``devices`` (one plan rank each)."""

    def __init__(self, devices, dtype):
        self.devices = devices
        self.dtype = dtype
        self._slices = {}
        self._zeros = {}

    def zeros(self, rank, n):
        key = (rank, n)
        if key not in self._zeros:
            with tf.device(self.devices[rank]):
                self._zeros[key] = tf.zeros([n], self.dtype)
        return self._zeros[key]

    def part(self, n, tensor, off):
        """``tensor[off:off+n]`` (the tensor itself when that is all of it)."""
        length = tensor.shape[0]
        if off == 0 and length == n:
            return tensor
        key = (tensor.ref(), off, n)
        hit = self._slices.get(key)
        if hit is None:
            with tf.device(tensor.device or self.devices[0]):  # slice where the data lives
                hit = self._slices[key] = tf.slice(tensor, [off], [n])
        return hit

    def contiguous(self, parts, device):
        tensors = [self.part(*p) for p in parts]
        if len(tensors) == 1:
            return tensors[0]
        with tf.device(device):
            return tf.concat(tensors, 0)

    def _add(self, device, a, b):
        """a + b (parts (n, tensor, offset) of equal length) on ``device``; a is the left operand."""
        with tf.device(device):
            return _tfi.keep_add_order(tf.add(self.part(*a), self.part(*b)))

    def add(self, rank, a_parts, b_parts):
        """a + b on ``rank``'s device: one add per piece both operands are cut into; runs of
        small pieces (biases, padding) are concatenated and added at once."""
        device = self.devices[rank]
        cuts = sorted(set(_cuts(a_parts)) | set(_cuts(b_parts)))
        runs, small = [], None  # (lo, hi) ranges added at once
        for lo, hi in zip(cuts, cuts[1:]):
            if hi - lo >= SMALL_PIECE:
                small = None
                runs.append([lo, hi])
            elif small is not None:
                small[1] = hi
            else:
                small = [lo, hi]
                runs.append(small)
        out = []
        for lo, hi in runs:
            a, b = _range(a_parts, lo, hi), _range(b_parts, lo, hi)
            if len(a) > 1 or len(b) > 1:
                a = [(hi - lo, self.contiguous(a, device), 0)]
                b = [(hi - lo, self.contiguous(b, device), 0)]
            out.append((hi - lo, self._add(device, a[0], b[0]), 0))
        return out


def _cuts(parts):
    at, cuts = 0, [0]
    for n, _, _ in parts:
        at += n
        cuts.append(at)
    return cuts


def _range(parts, lo, hi):
    """The parts covering lo:hi of ``parts`` (offsets relative to the start of ``parts``)."""
    at, out = 0, []
    for n, tensor, off in parts:
        start, end = max(lo, at), min(hi, at + n)
        if start < end:
            out.append((end - start, tensor, off + start - at))
        at += n
        if at >= hi:
            break
    return out


def allreduce_tf(inputs, devices, algorithm, options):
    """Sum ``inputs`` (per rank: a list of 1-D tensors of one dtype, the same sizes on every
    rank) over the ranks with ``algorithm``'s plans; per rank, the summed list.

    Returns (per-rank lists of output tensors, the algorithm name that ran)."""
    k = len(devices)
    first = inputs[0]
    dtype = first[0].dtype
    itemsize = dtype.size
    sizes = [int(t.shape[0]) for t in first]
    offsets, count = aligned_layout(sizes, itemsize, k)
    name, params = resolve_algorithm(algorithm, options, k, count * itemsize, np.dtype(dtype.as_numpy_dtype))
    plans = plans_for(name, params, k, count, itemsize)
    builder = _Builder(devices, dtype)

    bufs = []
    for r in range(k):
        inbuf = _Buffer("IN")
        at = 0
        pieces = []
        for tensor, off, n in zip(inputs[r], offsets, sizes):
            if off > at:
                pieces.append((at, off, builder.zeros(r, off - at), 0))
            if n:
                pieces.append((off, off + n, tensor, 0))
            at = off + n
        if count > at:
            pieces.append((at, count, builder.zeros(r, count - at), 0))
        inbuf.pieces = pieces
        bufs.append((inbuf, _Buffer("OUT"), _Buffer("TMP")))

    # each rank's plan bound to its buffers as (buffer, lo, hi) regions; IN and OUT are apart here,
    # and FINAL does nothing for a sum
    walks = [iter(bind(plans[r], tuple(Named(b) for b in bufs[r]), False, finals=False)) for r in range(k)]
    current = [next(walk, None) for walk in walks]  # each rank's next step: (index, sends, recvs, ops)
    queues = {}
    posted = [False] * k
    while any(step is not None for step in current):
        moved = False
        for r in range(k):
            while current[r] is not None:
                _, sends, recvs, ops = current[r]
                if not posted[r]:
                    for peer, (buf, lo, hi), chan in sends:
                        queues.setdefault((r, peer, chan), deque()).append(buf.read(lo, hi))
                    posted[r] = True
                need = Counter((peer, chan) for peer, _, chan in recvs)
                if any(len(queues.get((peer, r, chan), ())) < c for (peer, chan), c in need.items()):
                    break
                for peer, (buf, lo, hi), chan in recvs:
                    parts = queues[(peer, r, chan)].popleft()
                    got = sum(n for n, _, _ in parts)
                    if got != hi - lo:
                        raise RuntimeError(f"{name} plan: rank {r} expects {hi - lo} elements from rank {peer}, "
                                           f"which sends {got}")
                    buf.write(lo, parts)
                for op in ops:
                    (dst, dlo, _), (a, alo, ahi) = op[1], op[2]
                    if op[0] == REDUCE:
                        b, blo, bhi = op[3]
                        dst.write(dlo, builder.add(r, a.read(alo, ahi), b.read(blo, bhi)))
                    else:  # COPY (the binder has dropped the copies that write nothing)
                        dst.write(dlo, a.read(alo, ahi))
                current[r] = next(walks[r], None)
                posted[r] = False
                moved = True
        if not moved:
            stuck = {r: step[0] for r, step in enumerate(current) if step is not None}
            raise RuntimeError(f"{name} plans never complete on {k} devices (ranks stuck at steps {stuck})")

    outputs = []
    for r in range(k):
        out = bufs[r][OUT]
        outputs.append([(out.read(off, off + n) if n else []) for off, n in zip(offsets, sizes)])
    return outputs, name, builder


def share_memory(a, b):
    """Whether devices ``a`` and ``b`` are CPUs of one task (one process): a tensor made on
    one is read on the other without a copy."""
    a, b = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    return (a.device_type or "CPU").upper() == "CPU" and (b.device_type or "CPU").upper() == "CPU" \
        and (a.job, a.replica, a.task) == (b.job, b.replica, b.task)


def assemble(builder, parts, device, dtype):
    """One contiguous 1-D tensor on ``device`` from output parts (empty parts: a 0-length tensor)."""
    if not parts:
        with tf.device(device):
            return tf.zeros([0], dtype)
    return builder.contiguous(parts, device)


