"""Elastic recovery under MPI (COLLECTIVES_ON_ERROR=shrink): when a call fails because ranks died
or were cut off, the survivors form a communicator of their own and every one of them raises the
same ``RanksLost`` (its ``lost`` ranks, its ``survivors`` communicator).

With ULFM (Open MPI launched with ``--with-ft ulfm``; docs/reliability.md has the launch):

1. the rank whose call failed (MPI_ERR_PROC_FAILED, or a wait past COLLECTIVES_TIMEOUT) revokes
   the library's communicator: every other rank's wait on it fails at once with MPI_ERR_REVOKED,
   and that rank comes here too, whatever step of the call it was in;
2. the survivors shrink it (MPI_Comm_shrink: ULFM agrees on the failed processes inside it and
   keeps the survivors' rank order; a watchdog thread ends the job should it not return in time);
3. they confirm the lost set with two MPI_Comm_iagree on the new communicator (the bitwise AND of
   a hash of the set, and of its complement, equals one's own on every rank only where every
   rank holds the same set); a rank that fails meanwhile starts the round again on the new one;
4. they agree on the calls to repeat: an MPI_Iallreduce (MIN and MAX at once) over the new
   communicator of each one's count of the caller's calls that returned on the old one (the
   session's ``calls``). The least is RanksLost.completed; a rank above it is ``ahead``: it
   completed a call that some other survivor could not.

Every step is polled against COLLECTIVES_TIMEOUT, counted from the start of recovery. Where a
step does not complete in it (a rank alive but silent: ULFM excludes only failed processes), or
the MPI library has no ULFM (MPICH here), or the error is not a lost rank (a mismatch), the job
is aborted as under ``abort``: the survivors never hang and never go on split.
"""
import threading
import time
import zlib

import numpy as np

from .. import config, mpilib
from ..errors import CollectiveTimeout, ProcessFailed, RanksLost
from .mpi_faults import abort_job
from .mpi_steps import process_failure

MPI = mpilib.load()
_MASK = 0x3FFFFFFF


def recover(comm, exc):
    """Raise RanksLost on this survivor of ``comm`` (an MPIComm whose call failed with ``exc``),
    or end the job where the survivors cannot go on (see the module's docstring)."""
    mpi_comm = comm.mpi_comm
    what = comm.failed[0] if comm.failed else "a call"
    if not isinstance(exc, (ProcessFailed, CollectiveTimeout)):
        abort_job(mpi_comm, exc, "COLLECTIVES_ON_ERROR=shrink goes on only after lost ranks; this is not one")
    start = time.monotonic()
    try:
        mpi_comm.Revoke()
    except (NotImplementedError, AttributeError) as err:
        abort_job(mpi_comm, exc, f"COLLECTIVES_ON_ERROR=shrink needs an MPI library with ULFM (Open MPI "
                                 f"with mpiexec --with-ft ulfm): {type(err).__name__}: {err}")
    except MPI.Exception as err:
        if process_failure(err, what, []) is None:  # revoked already is fine; unsupported is not
            abort_job(mpi_comm, exc, f"COLLECTIVES_ON_ERROR=shrink needs an MPI library with ULFM (Open MPI "
                                     f"with mpiexec --with-ft ulfm): MPI_Comm_revoke: {err.Get_error_string()}")
    limit = config.timeout()
    deadline = start + limit if limit else None
    original = mpi_comm.Get_group()
    mine = comm.session.completed_calls()
    current, timings = mpi_comm, {"revoke": time.monotonic() - start}
    for _ in range(comm.size):
        survivors = current
        try:
            survivors = _shrink(current, deadline, exc)
            timings["shrink"] = time.monotonic() - start
            members = MPI.Group.Translate_ranks(survivors.Get_group(), list(range(survivors.Get_size())), original)
            lost = sorted(set(range(comm.size)) - set(members))
            _agree(survivors, lost, deadline)
            timings["agree"] = time.monotonic() - start
            completed, most = _agree_calls(survivors, mine, deadline)
            timings["calls"] = time.monotonic() - start
            break
        except MPI.Exception as err:
            if process_failure(err, what, []) is None:
                abort_job(mpi_comm, exc, f"recovering from lost ranks failed: {err.Get_error_string()}")
            current = survivors  # another rank failed meanwhile: again, on the shrunken communicator
            _revoke_quietly(current)
        except CollectiveTimeout as err:
            abort_job(mpi_comm, err, f"COLLECTIVES_ON_ERROR=shrink: the survivors could not agree within "
                                     f"COLLECTIVES_TIMEOUT after {type(exc).__name__}: {exc}")
    else:  # pragma: no cover - a rank fails in every round
        abort_job(mpi_comm, exc, "recovering from lost ranks: ranks kept failing")
    if not isinstance(survivors, MPI.Intracomm):
        survivors = MPI.Intracomm(survivors)
    plural = "s" if len(lost) != 1 else ""
    ahead = f" (some survivors had completed calls up to {most - 1})" if most > completed else ""
    error = RanksLost(f"{what}: rank{plural} {', '.join(map(str, lost))} of {comm.size} lost "
                      f"({type(exc).__name__}: {exc}); the {survivors.Get_size()} survivors go on: repeat call "
                      f"{completed} (from 0) of this communicator{ahead}, with comm=error.survivors",
                      lost, survivors, exc, completed, mine - completed)
    error.timings = timings
    raise error from exc


def _revoke_quietly(mpi_comm):
    try:
        mpi_comm.Revoke()
    except MPI.Exception:
        pass


def _wait(request, deadline, what):
    """Poll ``request`` to ``deadline`` (None: block); CollectiveTimeout past it."""
    if deadline is None:
        request.Wait()
        return
    while not request.Test():
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"recovering from lost ranks: {what} did not complete in time")
        time.sleep(0.0005)


def _shrink(mpi_comm, deadline, exc):
    """MPI_Comm_shrink, bounded by a watchdog that ends the job at ``deadline`` (None: none).
    The blocking call, because MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0.11."""
    watchdog = None
    if deadline is not None:
        timeout = CollectiveTimeout(f"recovering from lost ranks: MPI_Comm_shrink did not complete within "
                                    f"COLLECTIVES_TIMEOUT (a rank alive but silent?) after {type(exc).__name__}: {exc}")
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), abort_job,
                                   (mpi_comm, timeout, "COLLECTIVES_ON_ERROR=shrink: the survivors could not "
                                                       "form a communicator in time"))
        watchdog.daemon = True
        watchdog.start()
    try:
        return mpi_comm.Shrink()
    finally:
        if watchdog is not None:
            watchdog.cancel()


def _agree(survivors, lost, deadline):
    """Check that every survivor holds the same ``lost`` set: two agreements (bitwise AND) on its
    hash and on the hash's complement; a CollectiveTimeout where they differ or run out of time."""
    mine = zlib.crc32(",".join(map(str, lost)).encode()) & _MASK
    for value in (mine, ~mine & _MASK):
        flag = np.array([value], dtype=np.intc)
        _wait(survivors.Iagree(flag), deadline, "MPI_Comm_iagree")
        if int(flag[0]) != value:
            raise CollectiveTimeout(f"recovering from lost ranks: the survivors disagree on the lost ranks "
                                    f"(this rank: {lost})")


def _agree_calls(survivors, mine, deadline):
    """(least, most) of every survivor's count ``mine`` of calls that returned: one MPI_Iallreduce
    (MIN of the count and of its negation) on the survivors' communicator, polled to ``deadline``."""
    counts = np.array([mine, -mine], dtype=np.int64)
    result = np.empty_like(counts)
    _wait(survivors.Iallreduce(counts, result, op=MPI.MIN), deadline, "agreeing on the calls to repeat")
    return int(result[0]), int(-result[1])
