"""Environment variables that steer the library, read at call time (cheaply)."""
import os

DEFAULT_TIMEOUT = 300.0


def timeout():
    """COLLECTIVES_TIMEOUT in seconds (default 300); 0 disables the bound."""
    raw = os.environ.get("COLLECTIVES_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be >= 0, got {raw!r}")
    return value


def check_enabled():
    """COLLECTIVES_CHECK=1 turns on the cross-rank agreement check before each call."""
    return os.environ.get("COLLECTIVES_CHECK", "0") not in ("", "0", "false", "False", "no")


def forced_algorithm():
    """COLLECTIVES_ALGO=name forces one algorithm for every call (None when unset)."""
    return os.environ.get("COLLECTIVES_ALGO") or None


def debug_level():
    return os.environ.get("COLLECTIVES_DEBUG", "").upper()
