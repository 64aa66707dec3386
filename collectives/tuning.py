"""The tuning table: best measured (algorithm, transport) per (world size, dtype, message size).

Stored as JSON at COLLECTIVES_TUNING or in the user's cache directory
(~/.cache/collectives/tuning.json). A missing file means "use the cost model";
a corrupt or foreign one gives one warning and the same fallback. The file records the MPI
library it was measured under (``"mpi_library": "Open MPI 5.0.11"``) and that library's measured
eager limit; under MPI a table measured under another library or version (or one that does not
say) is not used: the cost model decides, and ``mismatch`` says why.
"""
import json
import os
import threading
import warnings

from .config import cache_file
from .algorithms import names

_loaded = {}
_meta = {}  # path -> {"mpi_library": str or None, "eager_limit": int or None}
_lock = threading.Lock()  # the ranks of a threaded world read the file at once: one read, one warning


def path():
    return cache_file("COLLECTIVES_TUNING", "tuning.json")


def _table():
    where = path()
    if where in _loaded:
        return _loaded[where]
    with _lock:
        if where in _loaded:
            return _loaded[where]
        return _read(where)


def _read(where):
    table = None
    _meta[where] = {"mpi_library": None, "eager_limit": None}
    if os.path.exists(where):
        try:
            with open(where) as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("format") != "collectives-tuning-1":
                raise ValueError("not a collectives tuning file (no \"format\": \"collectives-tuning-1\")")
            if not isinstance(data.get("entries"), list):
                raise ValueError("no list of entries")
            table = {}
            for index, entry in enumerate(data["entries"]):
                try:
                    topology = entry.get("topology")
                    if topology is not None and not isinstance(topology, str):
                        raise ValueError(f"topology is not a string: {topology!r}")
                    transport = entry.get("transport")
                    if transport not in (None, "mpi", "shm"):
                        raise ValueError(f"transport is not mpi or shm: {transport!r}")
                    table.setdefault((int(entry["size"]), str(entry["dtype"]), topology), []).append(
                        (int(entry["nbytes"]), str(entry["algorithm"]), transport))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"entry {index} is malformed ({type(exc).__name__}: {exc})") from None
            for rows in table.values():
                rows.sort(key=lambda row: (row[0], row[1], row[2] or ""))
            library, eager = data.get("mpi_library"), data.get("eager_limit")
            if library is not None and not isinstance(library, str):
                raise ValueError(f"mpi_library is not a string: {library!r}")
            if eager is not None and (not isinstance(eager, int) or eager < 0):
                raise ValueError(f"eager_limit is not a whole number of bytes: {eager!r}")
            _meta[where] = {"mpi_library": library, "eager_limit": eager}
        except Exception as exc:  # noqa: BLE001 - any bad file falls back to the cost model
            warnings.warn(f"collectives: ignoring tuning file {where}: {exc}; using the cost model",
                          RuntimeWarning, stacklevel=4)
            table = None
    _loaded[where] = table
    return table


def mismatch(library):
    """Why the table is not used under MPI library ``library`` ("Open MPI 5.0.11"), or None when
    it is (or there is no table)."""
    if not _table():
        return None
    recorded = _meta.get(path(), {}).get("mpi_library")
    if recorded == library:
        return None
    if recorded is None:
        return f"tuning table {path()} does not record its MPI library (this is {library}); re-run collectives.tune"
    return f"tuning table measured under {recorded}, this is {library}"


def eager_limit(library):
    """The eager limit the table recorded for ``library``, or None."""
    if _table() is None or _meta.get(path(), {}).get("mpi_library") != library:
        return None
    return _meta[path()].get("eager_limit")


def topology_key(hosts):
    """The table's name for a topology: None for one host (as files without topologies mean),
    else the ranks of each host, "2,2" or "2,1,2"."""
    return None if len(hosts) <= 1 else ",".join(str(len(h)) for h in hosts)


def lookup(size, nbytes, dtype, library=None, topology=None):
    """The table's algorithm for the call, or None; ``library`` (under MPI): the table must
    have been measured under it; ``topology`` (``topology_key``): entries measured on that
    topology only (a table tuned on one host never decides for several, nor the reverse)."""
    found = lookup_pair(size, nbytes, dtype, library, topology)
    return None if found is None else found[0]


def lookup_pair(size, nbytes, dtype, library=None, topology=None):
    """(algorithm, transport) of the table's entry for the call, or None; the transport is None
    where the entry does not name one (a table written before transports were tuned)."""
    table = _table()
    if not table or (library is not None and mismatch(library) is not None):
        return None
    rows = table.get((size, str(dtype), topology)) or table.get((size, "*", topology))
    if not rows:  # tuned for another dtype at this world size: the choice follows the bytes
        rows = [row for (s, _, t), found in sorted(table.items(), key=str) if s == size and t == topology
                for row in found]
    if not rows:
        return None

    best = min(rows, key=lambda row: abs(_log2(row[0]) - _log2(nbytes)))
    if best[1] not in names():
        return None
    return best[1], best[2]


def _log2(x):
    return (max(1, x)).bit_length()


def reload():
    _loaded.clear()
