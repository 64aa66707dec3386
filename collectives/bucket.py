"""Gradient buckets: many small arrays reduced as a few large all-reduces, started while the
caller is still producing the rest (the PyTorch DDP pattern, usable from any framework's hooks).

    buckets = collectives.Bucketer(grads, bucket_bytes=25 << 20, op="avg", compression="bf16")
    for i in reversed(range(len(grads))):   # as the backward pass finishes each gradient
        ...compute grads[i]...
        buckets.mark_ready(i)                # copies it into its bucket; a full bucket starts
    buckets.wait()                           # every array now holds the reduced values

Buckets are runs of consecutive arrays of one dtype, up to ``bucket_bytes`` each (an array larger
than that is a bucket alone). A bucket's ``iallreduce`` starts once all its arrays are marked
ready and every bucket before it has started: ranks may mark arrays ready in any order, and
still post the same all-reduces in the same order, which ``iallreduce`` requires. A bucket of
one C-contiguous array is reduced in place in that array (no copies). ``wait()`` finishes every
bucket, copies the results back into the arrays and readies the Bucketer for the next round.
``compression=`` applies to the float32/float64 buckets; buckets of other dtypes (integers, 16-bit
floats) are reduced exactly. ``error_feedback=True`` (with ``compression=``) keeps one residual
per compressed bucket across rounds.
"""
import threading

import numpy as np

from .nonblocking import iallreduce

_WIRE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what compression= applies to


class Bucketer:
    """Reduce ``arrays`` (NumPy, C-contiguous, writeable; updated in place) in buckets of about
    ``bucket_bytes``; ``allreduce_options`` go to every bucket's ``iallreduce`` (``op``,
    ``algorithm``, ``comm``, ``compression``, ``compression_scope``, the algorithm's options)."""

    def __init__(self, arrays, bucket_bytes=25 << 20, *, error_feedback=False, **allreduce_options):
        arrays = list(arrays)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        for i, a in enumerate(arrays):
            if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
                what = " (strided or read-only)" if isinstance(a, np.ndarray) else ""
                raise ValueError(f"array {i} must be a writeable C-contiguous NumPy array, got {type(a).__name__}{what}")
        if "residual" in allreduce_options or "recvbuf" in allreduce_options:
            raise ValueError("Bucketer keeps its own buffers: pass neither residual= nor recvbuf= "
                             "(error_feedback=True keeps a residual per bucket)")
        if error_feedback and allreduce_options.get("compression") in (None, "none"):
            raise ValueError("error_feedback=True needs compression= (bf16 or fp16)")
        self.arrays, self.options = arrays, allreduce_options
        self.buckets = []  # [array indices], one dtype each, in array order
        for i, a in enumerate(arrays):
            last = self.buckets[-1] if self.buckets else None
            if last is not None and arrays[last[0]].dtype == a.dtype \
                    and sum(arrays[j].nbytes for j in last) + a.nbytes <= bucket_bytes:
                last.append(i)
            else:
                self.buckets.append([i])
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.offsets = {}  # array index -> element offset in its bucket's buffer
        self.buffers = []
        for members in self.buckets:
            if len(members) == 1:  # reduced in place in the array itself
                self.buffers.append(arrays[members[0]].reshape(-1))
                self.offsets[members[0]] = 0
                continue
            at = 0
            for i in members:
                self.offsets[i] = at
                at += arrays[i].size
            self.buffers.append(np.empty(at, arrays[members[0]].dtype))
        self.residuals = [np.zeros_like(buf) for buf in self.buffers] if error_feedback else None
        self._lock = threading.Lock()  # hooks may mark arrays from several threads
        self._reset()

    def __repr__(self):
        return f"Bucketer({len(self.arrays)} arrays in {len(self.buckets)} buckets, {self.options})"

    def _reset(self):
        self.ready = [False] * len(self.arrays)
        self.missing = [len(members) for members in self.buckets]
        self.requests = []  # by bucket index, in posting order

    def mark_ready(self, index):
        """Array ``index`` holds its final values: it goes into its bucket, and every bucket that is
        complete (and whose predecessors have started) starts its all-reduce."""
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.arrays):
            raise ValueError(f"index must be an array index in 0..{len(self.arrays) - 1}, got {index!r}")
        with self._lock:
            self._mark(index)

    def _mark(self, index):
        if self.ready[index]:
            raise ValueError(f"array {index} was already marked ready in this round (wait() starts the next)")
        self.ready[index] = True
        bucket = self.bucket_of[index]
        buf = self.buffers[bucket]
        if len(self.buckets[bucket]) > 1:
            at = self.offsets[index]
            buf[at:at + self.arrays[index].size] = self.arrays[index].reshape(-1)
        self.missing[bucket] -= 1
        while len(self.requests) < len(self.buckets) and self.missing[len(self.requests)] == 0:
            b = len(self.requests)
            buf = self.buffers[b]
            options = self.options
            if buf.dtype not in _WIRE_DTYPES and "compression" in options:  # exact: ints, 16-bit floats
                options = {k: v for k, v in options.items() if k not in ("compression", "compression_scope")}
            residual = None if self.residuals is None or "compression" not in options else self.residuals[b]
            self.requests.append(iallreduce(buf, buf, residual=residual, **options))

    def wait(self, timeout=None):
        """Finish every bucket and unpack the results into the arrays; returns the arrays. Every
        array must have been marked ready (ValueError naming those that were not)."""
        missing = [i for i, done in enumerate(self.ready) if not done]
        if missing:
            raise ValueError(f"arrays {missing[:10]}{'...' if len(missing) > 10 else ''} were never marked ready; "
                             f"every rank must mark every array before wait()")
        try:
            first_error = None
            for b, request in enumerate(self.requests):
                try:
                    request.wait(timeout)
                except Exception as exc:  # noqa: BLE001 - raised once every bucket has ended
                    first_error = first_error or exc
                    continue
                members = self.buckets[b]
                if len(members) > 1:
                    buf = self.buffers[b]
                    for i in members:
                        at = self.offsets[i]
                        self.arrays[i].reshape(-1)[...] = buf[at:at + self.arrays[i].size]
            if first_error is not None:
                raise first_error
        finally:
            if all(request.test() for request in self.requests):  # else: wait again for those in flight
                self._reset()
        return self.arrays

    def reduce(self, timeout=None):
        """Mark every array ready (in order) and wait: one bucketed all-reduce of all of them."""
        for i in range(len(self.arrays)):
            if not self.ready[i]:
                self.mark_ready(i)
        return self.wait(timeout)
