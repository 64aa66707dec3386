"""Errors raised by collectives. All derive from CollectiveError."""


class CollectiveError(RuntimeError):
    """Base class of every error a collective raises at run time."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A wait ran past COLLECTIVES_TIMEOUT; the message names the call, step and silent ranks."""


class MismatchError(CollectiveError, ValueError):
    """Ranks disagree on op, algorithm, count, dtype or options (or a message had the wrong size)."""


class PeerAborted(CollectiveError):
    """Another rank of the same world failed; this rank was released instead of left waiting."""


class RanksLost(CollectiveError):
    """Ranks died or were cut off during a call (COLLECTIVES_ON_ERROR=shrink). Every surviving rank
    raises the same one: ``lost``, the lost ranks (ranks of the communicator the call ran on), and
    ``survivors``, an mpi4py communicator of the survivors (rank order kept, the same on every
    survivor) to pass as ``comm=``.

    Which call to repeat there: ``completed``, the same on every survivor, is how many of the
    caller's collective calls on the old communicator returned on every survivor (calls are
    counted per communicator from its first: allreduce, iallreduce requests, the building blocks,
    barrier). So call number ``completed`` (counting from 0) is the one to repeat, on every
    survivor. ``ahead`` is how many calls beyond that returned on this rank alone (0 on most; 1
    on a rank that completed the call the others could not, because the lost rank had sent it all
    it needed, and raised RanksLost from its next call): such a rank repeats the call whose result
    it already holds, with the same input, so that the others can complete it.
    ``cause``: the error that revealed the loss; ``timings``: seconds into recovery of its phases."""

    def __init__(self, message, lost, survivors, cause=None, completed=None, ahead=0):
        super().__init__(message)
        self.lost, self.survivors, self.cause = tuple(lost), survivors, cause
        self.completed, self.ahead = completed, ahead


class ProcessFailed(CollectiveError):
    """MPI reported a peer failed (ULFM's MPI_ERR_PROC_FAILED, or the communicator revoked after
    one did); the message names the call, the step and the peers."""
