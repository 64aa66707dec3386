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
    survivor) to pass as ``comm=``: repeat the call there (a survivor may have completed the call
    the others could not: docs/reliability.md, "Elastic", says how to agree on what to repeat).
    ``cause``: the error that revealed it; ``timings``: seconds into recovery of its phases."""

    def __init__(self, message, lost, survivors, cause=None):
        super().__init__(message)
        self.lost, self.survivors, self.cause = tuple(lost), survivors, cause


class ProcessFailed(CollectiveError):
    """MPI reported a peer failed (ULFM's MPI_ERR_PROC_FAILED, or the communicator revoked after
    one did); the message names the call, the step and the peers."""
