"""Errors raised by collectives. All derive from CollectiveError."""


class CollectiveError(RuntimeError):
    """Base class of every error a collective raises at run time."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A wait ran past COLLECTIVES_TIMEOUT; the message names the call, step and silent ranks."""


class MismatchError(CollectiveError, ValueError):
    """Ranks disagree on op, algorithm, count, dtype or options (or a message had the wrong size)."""


class PeerAborted(CollectiveError):
    """Another rank of the same world failed; this rank was released instead of left waiting."""
