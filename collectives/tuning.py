"""The tuning table: best measured algorithm per (world size, dtype, message size).

Stored as JSON at COLLECTIVES_TUNING or in the user's cache directory
(~/.cache/collectives/tuning.json). A missing file means "use the cost model";
a corrupt or foreign one gives one warning and the same fallback.
"""
import json
import os
import warnings

_loaded = {}


def path():
    explicit = os.environ.get("COLLECTIVES_TUNING")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "collectives", "tuning.json")


def _table():
    where = path()
    if where in _loaded:
        return _loaded[where]
    table = None
    if os.path.exists(where):
        try:
            with open(where) as f:
                data = json.load(f)
            if data.get("format") != "collectives-tuning-1":
                raise ValueError("not a collectives tuning file")
            table = {}
            for entry in data["entries"]:
                table.setdefault((int(entry["size"]), str(entry["dtype"])), []).append(
                    (int(entry["nbytes"]), str(entry["algorithm"])))
            for rows in table.values():
                rows.sort()
        except Exception as exc:  # noqa: BLE001 - any bad file falls back to the cost model
            warnings.warn(f"collectives: ignoring tuning file {where}: {exc}; using the cost model",
                          RuntimeWarning, stacklevel=3)
            table = None
    _loaded[where] = table
    return table


def lookup(size, nbytes, dtype):
    table = _table()
    if not table:
        return None
    rows = table.get((size, str(dtype))) or table.get((size, "*"))
    if not rows:
        return None
    from .algorithms import names

    best = min(rows, key=lambda row: abs(_log2(row[0]) - _log2(nbytes)))
    name = best[1]
    if name not in names():
        return None
    return name


def _log2(x):
    return (max(1, x)).bit_length()


def reload():
    _loaded.clear()
