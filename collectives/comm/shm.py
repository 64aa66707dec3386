"""The shared-memory transport: a plan's messages between ranks of one node, through memory.

Any algorithm's plan runs over it unchanged; only how a message travels differs. Each rank of a
node owns a segment of one MPI-3 shared window: a header (shm_header: how far it is, where its
buffers lie), then a staging area. A send copies the region into staging (or nothing, where
shm_layout finds the receiver can read it in place: a shared array, or the sender's buffer by
cross-memory attach) and raises a progress counter; a receive waits for that counter and copies
from the peer's memory, or nothing when the step's own reduction reads it in place of scratch.
A receiver lays its senders' plans out with their flags, so it knows where every message lies.
Messages to ranks on other hosts still go through MPI in the same step (a mixed step polls both).

Reuse: staging offsets are never reused within a call; before a rank writes its staging for
call c, every peer that read it in call c-1 has finished c-1 (its DONE), and before a call
that sent a shared array's memory direct returns, its readers have finished it (the caller may
write the array next). Neither wait can deadlock: it waits only for work whose messages are all
published. The window grows when a call needs more staging than any rank has, collectively,
once every rank shows the call and all agree on it.

Errors: a wait runs to COLLECTIVES_TIMEOUT and names the silent ranks; a peer whose header
shows another call's signature (or whose MPI messages belong to another call) raises
MismatchError naming the field on which the ranks disagree. Ordering: on x86-64 stores are seen
in program order, so a counter raised after the data's copy is enough; elsewhere ``Win.Sync``
(a memory barrier) runs around it.
"""
import os
import time
import zlib

import numpy as np

from .. import mpilib
from ..errors import MismatchError
from ..plan import IN
from .base import foreign_message
from .mpi import MPIComm
from .mpi_steps import _POLLS_PER_CHECK, _PROBE_AFTER, timeout_error
from . import cma as _cma
from .shm_arrays import SharedArrays
from .shm_header import (CALL_FIELDS, CMA_OK, DONE, FENCE, FIELD_NAMES, FLAGS, HEADER, IN_ADDRESS, IN_ARRAY,
                         IN_OFFSET, OUT_ADDRESS, OUT_ARRAY, OUT_OFFSET, PID, PROBE_ADDRESS, PROGRESS,
                         SIGNATURE, call_fields, mismatch_error)
from .shm_layout import CMA, STAGED, Layouts

MPI = mpilib.load()

FIRST_CAPACITY = 1 << 16  # staging bytes per rank of the first window


def available(comm):
    """True when some peer of ``comm`` (an MPI communicator) shares this rank's node."""
    if getattr(comm, "mpi_comm", None) is None or comm.size == 1:
        return False
    colors = comm.node_colors()
    return colors.count(colors[comm.rank]) > 1


def for_comm(comm):
    """``comm``'s transport (made on first use: collective over the communicator)."""
    transport = comm.session.windows.get("shm")
    if transport is None:
        transport = comm.session.windows["shm"] = ShmTransport(comm)
    return transport


class ShmTransport:
    """The shared-memory transport of one MPI communicator (its ranks on this node)."""

    def __init__(self, comm):
        self.comm = comm
        colors = comm.node_colors()
        self.node_ranks = [r for r, c in enumerate(colors) if c == colors[comm.rank]]  # comm ranks here
        self.node_index = {r: i for i, r in enumerate(self.node_ranks)}
        # bounded barriers among the node's ranks (the communicator owns the node's MPI communicator)
        self.node = MPIComm(comm.node_comm(), _dup=False)
        self.calls = 0
        self.what = ""  # the running call's name
        self.readers = ()  # node peers that read this rank's memory in the last call
        self.shared = SharedArrays(self.node)  # collectives.empty's arrays
        self.signatures = {}  # a call's signature -> (its checksum, its header fields)
        self.layouts = Layouts(self.node_ranks)  # per plan: where each message lies, what is mapped
        self.window = None
        self.pid = os.getpid()
        self._probe = np.array([self.pid * 7919 + 12345], np.int64)  # what peers read to try CMA
        self._grow(FIRST_CAPACITY)
        self.cma = self._try_cma()

    def _try_cma(self):
        """Whether every rank of the node can read every other's memory (cross-memory attach)."""
        self.header[CMA_OK] = 1 if all(
            _cma.usable(int(h[PID]), int(h[PROBE_ADDRESS]), int(h[PID]) * 7919 + 12345)
            for i, h in enumerate(self.headers) if i != self.node_index[self.comm.rank]) else 0
        self.node.barrier("trying cross-memory attach")
        return all(int(h[CMA_OK]) == 1 for h in self.headers)

    # the window ------------------------------------------------------------------------------
    def _grow(self, capacity):
        if self.window is not None:
            self._free_window()
        self.node.barrier("allocating the shared window")  # Allocate_shared blocks until every rank calls it
        self.capacity = capacity
        total = HEADER + capacity
        self.window = MPI.Win.Allocate_shared(total, 1, comm=self.node.mpi_comm)
        self.headers, self.staging = [], []
        for index in range(len(self.node_ranks)):
            memory, _ = self.window.Shared_query(index)
            segment = np.frombuffer(memory, dtype=np.uint8, count=total)
            self.headers.append(segment[:HEADER].view(np.int64))
            self.staging.append(segment[HEADER:])
        self.header = self.headers[self.node_index[self.comm.rank]]
        self.published = None  # the call slots last written to this header (none yet)
        self.header[PID], self.header[PROBE_ADDRESS] = self.pid, self._probe.ctypes.data
        self.header[CMA_OK] = 1 if getattr(self, "cma", False) else 0
        self.header[PROGRESS] = self.calls << 32
        self.header[DONE] = self.calls
        self.node.barrier("starting the shared window")  # every header is written
    def _free_window(self):
        self.headers = self.staging = self.header = None
        self.window.Free()
        self.window = None

    def nbytes_held(self):
        return (HEADER + self.capacity) + self.shared.nbytes()

    def free(self):
        """Free the window and the shared arrays that no rank uses any more (collective over
        the node); arrays still in use on some rank stay mapped until MPI_Finalize."""
        if self.window is not None:
            self._free_window()
        self.shared.release()

    # what a call (shm_call.ShmCall) asks of the transport -------------------------------------------
    def signed(self, signature):
        """(the checksum of ``signature``, its header fields), kept for the calls to come."""
        signed = self.signatures.get(signature)
        if signed is None:
            if len(self.signatures) > 1024:
                self.signatures.clear()
            signed = self.signatures[signature] = (zlib.crc32(signature.encode()), call_fields(signature))
        return signed

    def _publish_call(self, fields, sig, flags, in_at, out_at, inbuf, outbuf, direct):
        """This call's header slots where they changed (peers poll the row: a write costs them a miss)."""
        header = self.header
        row = (sig, flags, in_at, out_at)
        if row != self.published:
            header[CALL_FIELDS:CALL_FIELDS + len(FIELD_NAMES)] = fields
            header[SIGNATURE], header[FLAGS] = sig, flags
            header[IN_ARRAY], header[IN_OFFSET] = in_at if in_at is not None else (0, 0)
            header[OUT_ARRAY], header[OUT_OFFSET] = out_at if out_at is not None else (0, 0)
            self.published = row
        if direct:
            header[IN_ADDRESS], header[OUT_ADDRESS] = inbuf.ctypes.data, outbuf.ctypes.data

    def _source(self, sources, peer, chan, dtype):
        entry = sources[(peer, chan)]
        taken, messages, h = entry
        entry[0] = taken + 1
        _, _, b, lo, hi, _, mode, offset = messages[taken]
        index = self.node_index[peer]
        if mode == STAGED:
            n = (hi - lo) * dtype.itemsize
            return self.staging[index][offset:offset + n].view(dtype)
        if mode == CMA:  # (pid, address): read by the caller
            return int(h[PID]), int(h[IN_ADDRESS if b == IN else OUT_ADDRESS]) + lo * dtype.itemsize
        ident, start = (int(h[IN_ARRAY]), int(h[IN_OFFSET])) if b == IN else (int(h[OUT_ARRAY]), int(h[OUT_OFFSET]))
        part = self.shared.arrays[ident].parts[index]
        return part[start + lo * dtype.itemsize:start + hi * dtype.itemsize].view(dtype)

    def _wait_steps(self, near, sources, plans_of, itemsize, call, sig, what, limit, tag, requests):
        """Wait until the sender of each of a step's receives from this node (``near``: (peer, region,
        chan, mapped)) has published the step that sends it."""
        needs = {}
        me = self.comm.rank
        counts = {}
        for peer, _, chan, _ in near:
            entry = sources.get((peer, chan))
            if entry is None:
                entry = sources[(peer, chan)] = self._sender(peer, chan, plans_of, itemsize, call, sig, what,
                                                             limit, tag, me)
            k = counts.get((peer, chan), 0)
            counts[(peer, chan)] = k + 1
            messages = entry[1]
            if entry[0] + k >= len(messages):
                raise MismatchError(f"{what}: rank {peer} sends fewer messages than this rank expects "
                                    f"(ranks disagree on the call)")
            step = messages[entry[0] + k][0]
            needs[peer] = max(needs.get(peer, 0), (call << 32) | (step + 1))
        self._wait(needs, call, sig, what, limit, tag, requests)

    def _sender(self, peer, chan, plans_of, itemsize, call, sig, what, limit, tag, me):
        """[messages taken, the peer's messages to this rank on ``chan``, the peer's header (where its
        buffers lie: it holds this call's fields until this rank is done)], once the header names this call."""
        self._wait({peer: call << 32}, call, sig, what, limit, tag, ())
        h = self.headers[self.node_index[peer]]
        layout, _ = self.layouts.of(plans_of(peer), itemsize, int(h[FLAGS]), plans_of)
        return [0, layout.to.get((me, chan), []), h]

    def _wait(self, needs, call, sig, what, limit, tag, requests):
        """Poll the peers' PROGRESS counters up to ``needs`` (and MPI ``requests``), bounded."""
        headers, index = self.headers, self.node_index
        waiting = [(peer, need, headers[index[peer]]) for peer, need in needs.items()]
        if all(h[PROGRESS] >= need and (h[PROGRESS] >> 32 != call or h[SIGNATURE] == sig)
               for _, need, h in waiting):
            return
        start = time.monotonic()
        probe_at = start + _PROBE_AFTER
        spins = 0
        while True:
            left = []
            for peer, need, h in waiting:
                progress = int(h[PROGRESS])
                if progress >> 32 == call and h[SIGNATURE] != sig:  # the call's error, not a step's
                    raise self._mismatch(self.what, call)
                if progress < need:
                    left.append((peer, need, h))
            if not left:
                if FENCE:
                    self.window.Sync()
                return
            waiting = left
            spins += 1
            if spins % _POLLS_PER_CHECK:
                continue
            if requests:  # keep MPI moving while memory is polled (a rendezvous send needs it)
                self.comm.mpi_comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            now = time.monotonic()
            if now > probe_at and self.comm.signed:
                probe_at = now + _PROBE_AFTER
                for peer, need, h in waiting:
                    # a peer's progress is written before its later calls' messages are sent: a
                    # foreign message from a peer still short of ``need`` came before this call's step
                    if self.comm.foreign(peer, tag) is not None and int(h[PROGRESS]) < need:
                        raise MismatchError(foreign_message(what, peer))
            if limit and now - start > limit:
                raise timeout_error(what, sorted(peer for peer, _, _ in waiting), limit)
            os.sched_yield()  # at every deadline check: the peer may share this core

    def _wait_done(self, peers, call, what, limit, sig, tag):
        headers, index = self.headers, self.node_index
        waiting, start, spins = peers, time.monotonic(), 0
        while waiting:
            waiting = [p for p in waiting if headers[index[p]][DONE] < call]
            spins += 1
            if spins % _POLLS_PER_CHECK:
                continue
            now = time.monotonic()
            if limit and now - start > limit:
                raise timeout_error(what, waiting, limit)
            os.sched_yield()  # at every deadline check: the peer may share this core

    def _mismatch(self, what, call):
        """The MismatchError naming the first field of the call on which the node's ranks
        disagree, with each rank's value where it can be shown: the same text on every rank
        (it waits, briefly, for every rank to show its fields of this call)."""
        deadline = time.monotonic() + 1.0
        while any(int(h[PROGRESS]) >> 32 < call for h in self.headers) and time.monotonic() < deadline:
            os.sched_yield()
        rows = {r: [int(v) for v in h[CALL_FIELDS:CALL_FIELDS + len(FIELD_NAMES)]]
                for r, h in zip(self.node_ranks, self.headers) if int(h[PROGRESS]) >> 32 == call}
        error = mismatch_error(what, rows)
        if error is None:
            mine = int(self.header[SIGNATURE])
            differ = [r for r, h in zip(self.node_ranks, self.headers) if int(h[SIGNATURE]) != mine]
            error = MismatchError(foreign_message(what, differ[0] if differ else self.comm.rank))
        return error

    def _agree_and_grow(self, need, sig, call, what, limit):
        """Grow the staging of every node rank to ``need`` bytes, once all show this call with
        one signature (else MismatchError; a rank that never shows it: a timeout naming it)."""
        start = time.monotonic()
        while True:
            behind = [r for r, h in zip(self.node_ranks, self.headers) if int(h[PROGRESS]) >> 32 < call]
            if any(int(h[PROGRESS]) >> 32 == call and int(h[SIGNATURE]) != sig for h in self.headers):
                raise self._mismatch(what, call)
            if not behind:
                break
            if limit and time.monotonic() - start > limit:
                raise timeout_error(what, behind, limit)
            os.sched_yield()
        self.node.barrier(f"{what}: growing the shared window")
        self._grow(max(need, 2 * self.capacity))


def shared_empty(comm, shape, dtype):
    """A NumPy array of ``shape`` and ``dtype`` in memory the ranks of ``comm`` on this node
    share (collective over ``comm``); a plain array where no peer shares the node."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if not available(comm):
        return np.empty(shape, dtype)
    raw = for_comm(comm).shared.allocate(count * dtype.itemsize)
    return raw.view(dtype).reshape(shape)
