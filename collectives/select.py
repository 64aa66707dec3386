"""algorithm="auto": pick an algorithm per (world size, message size, dtype).

A tuning table written by ``python -m collectives.tune`` wins where it covers
the call; otherwise the alpha-beta-gamma cost of each algorithm decides, with
defaults measured for shared memory on one node.
"""
import logging

import importlib

_algorithms = importlib.import_module("collectives.algorithms")
from . import config

# Shared-memory defaults (seconds, seconds per byte), from ping-pong and np.add on a 2-core VM.
ALPHA = 15e-6
BETA = 1 / 2.0e9
GAMMA = 1 / 6.0e9

_log = logging.getLogger("collectives")
_choices = {}
_logged = set()


def cost_choice(size, nbytes, alpha=ALPHA, beta=BETA, gamma=GAMMA, candidates=None):
    """(name, {name: predicted seconds}) of the cheapest algorithm by the cost model."""
    costs = {}
    for name in candidates or _algorithms.names():
        module = _algorithms.get(name)
        costs[name] = module.cost(size, nbytes, alpha, beta, gamma)
    return min(costs, key=costs.get), costs


def choose(comm, nbytes, dtype):
    key = (comm.size, nbytes, dtype, getattr(comm, "mpi_comm", None) is not None)
    hit = _choices.get(key)
    if hit is None:
        from . import tuning

        library = None
        if key[3]:  # under MPI the table must have been measured under this library
            from .mpilib import describe

            library = describe()
        table_choice = tuning.lookup(comm.size, nbytes, dtype, library)
        if table_choice is not None and table_choice in _algorithms.names():  # a plugin not loaded now
            hit = (table_choice, f"tuning table, {library}" if library else "tuning table")
        else:
            # shm is left to the tuning table: measured here it trails the ring (see RESULTS.md)
            candidates = [n for n in _algorithms.names() if n != "shm"]
            name, costs = cost_choice(comm.size, nbytes, candidates=candidates)
            unused = tuning.mismatch(library) if library else None
            hit = (name, f"cost model ({costs[name] * 1e6:.1f} us predicted)"
                   + (f"; {unused}: not used" if unused else ""))
        if len(_choices) > 4096:
            _choices.clear()
        _choices[key] = hit
    name, why = hit
    log_choice(comm, nbytes, dtype, name, why)
    return name


def log_choice(comm, nbytes, dtype, name, why):
    """Under COLLECTIVES_DEBUG=INFO (or DEBUG), log a call's size, algorithm and why, once per
    distinct (rank, communicator size, bytes, dtype, algorithm, why)."""
    if config.debug_level() not in ("INFO", "DEBUG"):
        return
    key = (comm.rank, comm.size, nbytes, dtype, name, why)
    if key in _logged:
        return
    _logged.add(key)
    if _log.level == logging.NOTSET:
        _log.setLevel(logging.INFO)
    if not _log.handlers and not logging.getLogger().handlers:  # nobody configured logging: stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("collectives: %(message)s"))
        _log.addHandler(handler)
    _log.info("allreduce rank %d of %d: %d bytes of %s -> %s (%s)", comm.rank, comm.size, nbytes, dtype,
              name, why)


def reset():
    _choices.clear()
    _logged.clear()
