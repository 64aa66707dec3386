"""The executor: runs one rank's plan over a communicator, on NumPy or CuPy arrays."""
from .plan import COPY, FINAL, IN, OUT, REDUCE, NCHANNELS


class StepName:
    """"allreduce(ring) step 3/6", formatted only if an error message needs it."""

    __slots__ = ("what", "index", "nsteps")

    def __init__(self, what, index, nsteps):
        self.what, self.index, self.nsteps = what, index, nsteps

    def __str__(self):
        return f"{self.what} step {self.index + 1}/{self.nsteps}"

    def __format__(self, spec):
        return format(str(self), spec)


def execute(plan, comm, inbuf, outbuf, tmpbuf, reduce_fn, final_fn, what, sync=None):
    """Run ``plan`` with ``inbuf``/``outbuf``/``tmpbuf`` bound to IN/OUT/TMP.

    ``reduce_fn(a, b, out)`` is the op's ufunc; ``final_fn(region)`` runs where the
    plan marks a region complete (``avg`` divides there) or is None. ``what`` names
    the call in errors ("allreduce(ring)"). ``sync()``, where given (device
    arrays), runs before each step's messages so that MPI never reads device
    memory a kernel is still writing.
    """
    bufs = (inbuf, outbuf, tmpbuf)
    in_place = inbuf is outbuf
    tag = comm.next_tag() * NCHANNELS
    steps = plan.steps
    nsteps = len(steps)
    exchange = comm.exchange
    for index, (sends, recvs, local) in enumerate(steps):
        if sends or recvs:
            if sync is not None:
                sync()
            exchange([(peer, bufs[b][lo:hi], chan) for peer, b, lo, hi, chan in sends],
                     [(peer, bufs[b][lo:hi], chan) for peer, b, lo, hi, chan in recvs],
                     tag, StepName(what, index, nsteps))
        for op in local:
            kind = op[0]
            if kind == REDUCE:
                _, dst, dlo, a, alo, b, blo, n = op
                reduce_fn(bufs[a][alo:alo + n], bufs[b][blo:blo + n], out=bufs[dst][dlo:dlo + n])
            elif kind == COPY:
                _, dst, dlo, src, slo, n = op
                if not (in_place and dlo == slo and {dst, src} == {IN, OUT}):
                    bufs[dst][dlo:dlo + n] = bufs[src][slo:slo + n]
            elif kind == FINAL and final_fn is not None:
                _, buf, lo, n = op
                final_fn(bufs[buf][lo:lo + n])
    if sync is not None:
        sync()
