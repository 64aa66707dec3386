"""Environment variables that steer the library, read at call time (cheaply)."""
import os

DEFAULT_TIMEOUT = 300.0

# os.environ encodes every key on each lookup; its backing dict (bytes keys on POSIX) answers
# the hot-path questions in a few tens of nanoseconds, and still sees every os.environ change.
_data = getattr(os.environ, "_data", None)
if os.name == "posix" and isinstance(_data, dict):
    def is_set(name, _data=_data):
        """Whether environment variable ``name`` is set (cheap enough for every call)."""
        return name.encode() in _data if name not in _KEYS else _KEYS[name] in _data
else:  # pragma: no cover - other platforms
    def is_set(name):
        return name in os.environ
_KEYS = {name: name.encode() for name in ("COLLECTIVES_ALGO", "COLLECTIVES_CHECK", "COLLECTIVES_COMPRESSION",
                                           "COLLECTIVES_TIMEOUT", "COLLECTIVES_TRANSPORT")}
_OVERRIDES = ("COLLECTIVES_ALGO", "COLLECTIVES_CHECK", "COLLECTIVES_COMPRESSION", "COLLECTIVES_TRANSPORT")


if os.name == "posix" and isinstance(_data, dict):
    def no_overrides(_data=_data, _algo=_KEYS["COLLECTIVES_ALGO"], _check=_KEYS["COLLECTIVES_CHECK"],
                     _compression=_KEYS["COLLECTIVES_COMPRESSION"], _transport=_KEYS["COLLECTIVES_TRANSPORT"]):
        """None of COLLECTIVES_ALGO, COLLECTIVES_CHECK, COLLECTIVES_COMPRESSION,
        COLLECTIVES_TRANSPORT is set: the calls' short paths apply."""
        return _algo not in _data and _check not in _data and _compression not in _data and _transport not in _data
else:  # pragma: no cover - other platforms
    def no_overrides():
        return not any(k in os.environ for k in _OVERRIDES)
_timeout_cache = [None, DEFAULT_TIMEOUT]


def timeout():
    """COLLECTIVES_TIMEOUT in seconds (default 300); 0 disables the bound."""
    if not is_set("COLLECTIVES_TIMEOUT"):
        return DEFAULT_TIMEOUT
    raw = os.environ.get("COLLECTIVES_TIMEOUT")
    if raw == _timeout_cache[0]:
        return _timeout_cache[1]
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be >= 0, got {raw!r}")
    _timeout_cache[:] = [raw, value]
    return value


def check_enabled():
    """COLLECTIVES_CHECK=1 turns on the cross-rank agreement check before each call."""
    return os.environ.get("COLLECTIVES_CHECK", "0") not in ("", "0", "false", "False", "no")


def guard_enabled():
    """COLLECTIVES_GUARD (default 1): calls carry their signature in their message tags, so that
    ranks that disagree on a call never match each other's messages. Read when a communicator
    is wrapped; ``0`` exists to measure what the guard costs."""
    raw = os.environ.get("COLLECTIVES_GUARD", "1").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"COLLECTIVES_GUARD must be 0 or 1, got {raw!r}")
    return raw != "0"


def on_error():
    """COLLECTIVES_ON_ERROR: ``raise``, ``shrink`` (survivors of lost ranks raise RanksLost with a
    communicator of their own, collectives/comm/ulfm.py) or ``abort`` (the default, and any other
    value: a failure path never stops on a malformed setting)."""
    value = os.environ.get("COLLECTIVES_ON_ERROR", "").strip().lower()
    return value if value in ("raise", "shrink") else "abort"


TRANSPORTS = ("auto", "mpi", "shm")


def transport():
    """COLLECTIVES_TRANSPORT: ``mpi`` or ``shm`` forces how every call's messages travel between
    ranks of one node (``auto``, the default, or unset: the library chooses)."""
    raw = os.environ.get("COLLECTIVES_TRANSPORT", "").strip().lower() or "auto"
    if raw not in TRANSPORTS:
        raise ValueError(f"COLLECTIVES_TRANSPORT must be one of {', '.join(TRANSPORTS)}, got {raw!r}")
    return raw


def forced_algorithm():
    """COLLECTIVES_ALGO=name forces one algorithm for every call (None when unset)."""
    return os.environ.get("COLLECTIVES_ALGO") or None


def cache_file(variable, name):
    """The path in ``variable`` where set, else ``name`` in the user's cache folder
    (``$XDG_CACHE_HOME/collectives``, else ``~/.cache/collectives``): the tuning table and the
    first-use calibration live there."""
    explicit = os.environ.get(variable)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "collectives", name)


def autotune():
    """COLLECTIVES_AUTOTUNE (default 1): an ``auto`` call of ranks on one node that no tuning table
    covers runs the pair measured the first time its size met this machine
    (collectives/autotune.py); ``0``: the cost model decides."""
    raw = os.environ.get("COLLECTIVES_AUTOTUNE", "1").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"COLLECTIVES_AUTOTUNE must be 0 or 1, got {raw!r}")
    return raw != "0"


def debug_level():
    return os.environ.get("COLLECTIVES_DEBUG", "").upper()


def eager_limit(default):
    """COLLECTIVES_EAGER_LIMIT in bytes (``default`` when unset or empty; 0 turns splitting off).
    Read when a small-message program is prepared, not per call."""
    raw = os.environ.get("COLLECTIVES_EAGER_LIMIT", "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"COLLECTIVES_EAGER_LIMIT must be a whole number of bytes (0: off), got {raw!r}")
    return int(raw)
