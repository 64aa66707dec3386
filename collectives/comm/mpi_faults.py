"""MPI failure paths: creating a communicator within COLLECTIVES_TIMEOUT (and naming the ranks
that never came), and aborting the job so that no rank waits forever or reports success."""
import time

from .. import config, mpilib
from ..errors import CollectiveTimeout
from .mpi_steps import _POLLS_PER_CHECK, timeout_error

MPI = mpilib.load()
_BYTE = MPI.BYTE


def _abort_unless_raise(mpi_comm, exc):
    if mpi_comm.Get_size() > 1 and config.on_error() == "abort":
        abort_job(mpi_comm, exc, "COLLECTIVES_ON_ERROR=raise to handle errors instead")


def abort_job(mpi_comm, exc, why):
    """Print the error and ``why`` on stderr and end the job with MPI_Abort (bounded)."""
    import sys

    sys.stderr.write(f"collectives: rank {mpi_comm.Get_rank()} of {mpi_comm.Get_size()}: "
                     f"{type(exc).__name__}: {exc}\n"
                     f"collectives: aborting the MPI job ({why})\n")
    sys.stderr.flush()
    # the launcher forwards a rank's output asynchronously and drops what is in flight when
    # the abort kills the job: a moment for these lines to get out first
    time.sleep(0.2)
    _exit_if_abort_hangs()
    mpi_comm.Abort(1)


ABORT_GRACE = 10  # seconds MPI_Abort gets to end this process before the kernel does


def _exit_if_abort_hangs():
    """MPI_Abort can hang where the launcher cannot be reached (a host cut off by a network
    partition: the rank spins in MPI_Abort forever). An alarm whose default action ends the
    process bounds it; it needs no Python code to run (MPI_Abort may never let go)."""
    import signal

    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    except ValueError:  # not the main thread: the handler cannot change, the alarm is still set
        pass
    signal.alarm(ABORT_GRACE)


# A creation that timed out leaves its MPI_Comm_idup pending (MPI cannot cancel it); kept here.
_abandoned = []
_DIAGNOSIS_GRACE = 1.0  # seconds a timed-out creation listens for the other ranks' answers


def _bounded_dup(base, what="creating the communicator"):
    """``base.Dup()`` bounded by COLLECTIVES_TIMEOUT: MPI_Comm_idup, polled to the deadline.

    When it runs out, the ranks present name the absent ones: each timed-out rank sends an
    empty message tagged MPI_TAG_UB to every other rank and listens for a short grace period;
    a rank still waiting in its own creation answers such a message at once. The ranks not
    heard from are the ones named. (These messages travel on ``base`` itself, the user's
    communicator, and only after a timeout: a fault path.)"""
    limit = config.timeout()
    size, rank = base.Get_size(), base.Get_rank()
    if not limit or size == 1:
        return base.Dup()
    new, request = base.Idup()
    if request.Test():
        return new
    import numpy as np

    tag = base.Get_attr(MPI.TAG_UB) or 32767
    token = np.zeros(0, np.uint8)
    heard, told, sends = set(), set(), []
    status = MPI.Status()

    def listen():
        while base.Iprobe(MPI.ANY_SOURCE, tag, status):
            source = status.Get_source()
            base.Recv([token, _BYTE], source, tag)
            heard.add(source)
            if source not in told:  # a rank that timed out asks who is here: answer
                told.add(source)
                sends.append(base.Isend([token, _BYTE], source, tag))

    start = time.monotonic()
    polls = 0
    while True:
        if request.Test():
            return new
        polls += 1
        if polls % _POLLS_PER_CHECK == 0:
            now = time.monotonic()
            listen()
            if now - start > limit:
                break
            if now - start > 0.002:
                time.sleep(0.0002)
    for peer in range(size):
        if peer != rank and peer not in told:
            told.add(peer)
            sends.append(base.Isend([token, _BYTE], peer, tag))
    grace_end = time.monotonic() + min(_DIAGNOSIS_GRACE, limit)
    while time.monotonic() < grace_end and len(heard) < size - 1:
        listen()
        if request.Test():
            return new
        time.sleep(0.001)
    _abandoned.append((new, request, sends))
    silent = sorted(set(range(size)) - heard - {rank})
    if not silent:
        raise CollectiveTimeout(f"{what}: every rank answered, yet MPI_Comm_idup did not complete after "
                                f"{limit:g} s")
    raise timeout_error(what, silent, limit)
