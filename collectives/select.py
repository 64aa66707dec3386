"""algorithm="auto": pick an algorithm per (world size, message size, dtype).

A tuning table written by ``python -m collectives.tune`` wins where it covers
the call; else first-use calibration (one node: collectives/autotune.py; across
hosts: collectives/network_fit.py, which fits the link first); else the
alpha-beta-gamma cost of each algorithm decides, with the defaults of
collectives/model.py.
"""
import logging
from collections import namedtuple


from . import algorithms as _algorithms
from . import config
from .mpilib import describe
from .plan import ranks_by_group

# the model's defaults (collectives/model.py): shared memory inside a node, a 10 Gbit/s link per
# host between hosts (beta_inter is per byte of one host's link, which the host's ranks share)
from .model import (ALPHA, ALPHA_INTER, ALPHA_NODE_STEP, ALPHA_SHM_MESSAGE, ALPHA_SHM_STEP, BETA,  # noqa: E402,F401
                    BETA_INTER, GAMMA, wire_ratio)
from .ranking import (cost_choice, describe_topology, shm_cost_choice,  # noqa: E402,F401 - select's names too
                      two_level_choice)
from . import autotune, network_fit, tuning  # noqa: E402

_log = logging.getLogger("collectives")
_choices = {}
_logged = set()


def topology(comm):
    """(hosts, ranks per host) of ``comm``: the ranks of each host, hosts in order of their first rank
    (``Communicator.hosts()``, for any object with ``node_colors()``)."""
    hosts = getattr(comm, "hosts", None)
    return hosts() if hosts is not None else ranks_by_group(comm.node_colors())


def shm_asked(module, requested, preferred=None):
    """True when a call asks for the shared-memory transport whatever its size: by ``transport=``,
    COLLECTIVES_TRANSPORT, the algorithm's own TRANSPORT or auto's measured pick (the same answer
    on every rank: a rank alone on its node must not run a prepared program then)."""
    return "shm" in (requested, config.transport(), getattr(module, "TRANSPORT", None) if preferred is None else preferred)


Choice = namedtuple("Choice", "algorithm module params transport prepared")
Choice.__doc__ = ("What a call runs: the algorithm's name and module, its resolved options, the transport "
                  "(\"shm\" or \"mpi\"; None where the call keeps to point-to-point messages), and whether it "
                  "may run as a transport's prepared program (not where shared memory was asked for: a rank "
                  "alone on its node must meet its peers' shared-memory plan through MPI, on the plan's tags).")


def choose(comm, call, measured_call=None):
    """The one selector: the Choice for a validated call (collectives/pipeline.py's ``Call``).

    COLLECTIVES_ALGO over the caller's name; for ``auto``: the tuning table, else first-use
    calibration where ``calibrates`` allows it (``measured_call``: the pipeline's own call path,
    which the measurement times), else the cost model (compressed calls price the wire's bytes).
    Then the algorithm's options (an algorithm other than the one named keeps only those it takes)
    and, for host buffers, the transport. Every decision is logged under COLLECTIVES_DEBUG."""
    nbytes, dtype = call.sendbuf.nbytes, call.dtype
    host = call.backend.name == "numpy"
    preferred = None
    if call.fmt is not None:
        name = choose_compressed(comm, nbytes, dtype, call.fmt, call.scope, call.algorithm)
    elif call.point_to_point:
        name = pair_for(call.algorithm, comm, nbytes, dtype)[0]
    else:
        calibrate_now = None
        if call.algorithm == "auto" and host and measured_call is not None:
            def calibrate_now():
                return calibrate(comm, call.sendbuf, call.recvbuf, measured_call)
        name, preferred = pair_for(call.algorithm, comm, nbytes, dtype, call.transport, calibrate_now)
    module = _algorithms.get(name)
    options = call.options
    if name != call.algorithm and options:  # forced or chosen: keep only the options it takes
        options = {k: v for k, v in options.items() if k in module.OPTIONS}
    params = _algorithms.resolve(module, options, comm.hosts, comm.size)[1]
    transport, prepared = None, False
    if host and call.fmt is None and not call.point_to_point:
        transport, why = transport_choice(comm, module, nbytes, call.transport, preferred)
        if getattr(comm, "mpi_comm", None) is not None:  # (a threaded world has one transport)
            log_transport(comm, nbytes, module.NAME, transport, why)
        prepared = transport == "mpi" and not shm_asked(module, call.transport, preferred)
    return Choice(name, module, params, transport, prepared)


def choose_pair(comm, nbytes, dtype, transport="auto"):
    """(algorithm, transport or None) for ``auto``: the tuning table's pair where it covers the
    call, else the cost model's (None: the transport is left to ``choose_transport``).
    ``transport`` is the call's request: the model prices the transport the call will use."""
    mpi = getattr(comm, "mpi_comm", None) is not None
    hosts = topology(comm) if mpi and comm.size > 1 else ((tuple(range(comm.size)),))
    over_shm = mpi and comm.size > 1 and len(hosts) == 1 and _shm_expected(nbytes, transport)
    name, why, transport = _decide(comm.size, nbytes, dtype, mpi, hosts, over_shm)
    log_choice(comm, nbytes, dtype, name, why)
    return name, transport


def pair_for(name, comm, nbytes, dtype, transport=None, calibrate=None):
    """(the algorithm to run, the transport auto's pick was measured over, or None) for a call
    naming ``name``: COLLECTIVES_ALGO over the caller's name; for ``auto``, the tuning table,
    else (``calibrate``: the API's first-use calibration, where ``calibrates`` allows it) the
    pair measured on this machine, else the cost model. ``transport``: the call's request
    (None: a path of point-to-point messages only)."""
    forced = config.forced_algorithm()
    if forced is not None:
        _algorithms.get(forced)
        log_choice(comm, nbytes, dtype, forced, "forced by COLLECTIVES_ALGO")
        return forced, None
    if name != "auto":
        log_choice(comm, nbytes, dtype, name, "named by the caller")
        return name, None
    if calibrate is not None and calibrates(comm, transport):
        hosts = topology(comm)
        # only the tuning table's pick comes with the transport it was measured over
        over_shm = len(hosts) == 1 and _shm_expected(nbytes, transport)
        if _decide(comm.size, nbytes, dtype, True, hosts, over_shm)[2] is None:
            name, measured, why = calibrate()
            log_choice(comm, nbytes, dtype, name, why)
            return name, measured
    return choose_pair(comm, nbytes, dtype, transport)


def calibrates(comm, requested):
    """Whether an ``auto`` call on ``comm`` asking for transport ``requested`` may be decided by
    first-use calibration: MPI ranks (on one node: collectives/autotune.py; across hosts:
    collectives/network_fit.py), the transport and the algorithm left to the library,
    COLLECTIVES_AUTOTUNE not 0."""
    if getattr(comm, "mpi_comm", None) is None or comm.size == 1 or requested != "auto":
        return False
    return bool(config.autotune()) and config.transport() == "auto"


def choose_for(size, nbytes, dtype, hosts=None):
    """The algorithm ``auto`` picks for ``size`` ranks (on one host unless ``hosts``, the ranks
    of each host, says otherwise) outside MPI: no communicator needed (the TF bridge's plans)."""
    return _decide(size, nbytes, dtype, False, hosts or (tuple(range(size)),))[0]


def _shm_expected(nbytes, requested):
    """Whether a call of one node's ranks will move its messages through shared memory when the
    algorithm leaves the transport open (as ``transport_choice`` decides it). ``requested``
    None: the call's path has point-to-point messages only (compression, iallreduce)."""
    if requested is None:
        return False
    requested = _requested(requested)[0]
    return requested == "shm" or (requested == "auto" and nbytes >= SHM_MIN_BYTES)


def _requested(requested):
    """(the transport asked for, by whom): COLLECTIVES_TRANSPORT over the call's ``transport=``."""
    forced = config.transport()
    return (forced, "forced by COLLECTIVES_TRANSPORT") if forced != "auto" else (requested, "named by the caller")


def _decide(size, nbytes, dtype, mpi, hosts, over_shm=False):
    """(name, why, transport or None), cached per (size, bytes, dtype, MPI or not, hosts, over
    shared memory or not)."""
    key = (size, nbytes, dtype, mpi, hosts, over_shm)
    hit = _choices.get(key)
    if hit is None:
        library = None
        if key[3]:  # under MPI the table must have been measured under this library

            library = describe()
        table_choice = tuning.lookup_pair(size, nbytes, dtype, library, tuning.topology_key(hosts))
        if table_choice is not None and table_choice[0] in _algorithms.names():  # a plugin not loaded now
            # an entry that names no transport was measured before transports were tuned, as the
            # algorithm ran then: over MPI, or over its own transport (shm: shared memory)
            measured = table_choice[1] or getattr(_algorithms.get(table_choice[0]), "TRANSPORT", None) or "mpi"
            hit = (table_choice[0], (f"tuning table, {library}" if library else "tuning table")
                   + (f", {describe_topology(hosts)}" if len(hosts) > 1 else ""), measured)
        elif len(hosts) > 1:
            # across hosts: the two-level cost model (shm never spans hosts)
            candidates = [n for n in _algorithms.names() if n != "shm"]
            name, costs = two_level_choice(hosts, nbytes, candidates=candidates)
            unused = tuning.mismatch(library) if library else None
            hit = (name, f"two-level cost model, {describe_topology(hosts)} ({costs[name] * 1e6:.1f} us predicted)"
                   + (f"; {unused}: not used" if unused else ""), None)
        elif over_shm:
            # one node, messages through shared memory: steps cost more than messages
            candidates = [n for n in _algorithms.names() if n != "two_level"]
            name, costs = shm_cost_choice(size, nbytes, dtype.itemsize, candidates=candidates)
            unused = tuning.mismatch(library) if library else None
            hit = (name, f"cost model over shared memory ({costs[name] * 1e6:.1f} us predicted)"
                   + (f"; {unused}: not used" if unused else ""), None)
        else:
            # the direct plan (shm) asks for shared memory: over MPI messages it trails the ring
            candidates = [n for n in _algorithms.names() if n not in ("shm", "two_level")]
            name, costs = cost_choice(size, nbytes, alpha=ALPHA_NODE_STEP, candidates=candidates)
            unused = tuning.mismatch(library) if library else None
            hit = (name, f"cost model ({costs[name] * 1e6:.1f} us predicted)"
                   + (f"; {unused}: not used" if unused else ""), None)
        if len(_choices) > 4096:
            _choices.clear()
        _choices[key] = hit
    return hit


# Messages from this size travel through shared memory between ranks of one node when the caller
# (and the tuning table) leave the transport to the library: below it the transport's per-step
# Python work (layouts, header polls) costs more than MPI's own copies save, from it shared memory
# is ahead (docs/performance.md#transports-and-shared-arrays).
SHM_MIN_BYTES = 512 << 10


def choose_transport(comm, algorithm, nbytes, requested="auto"):
    """"shm" or "mpi": how the call's messages between ranks of one node travel. ``requested``
    (the call's ``transport=``, or COLLECTIVES_TRANSPORT) wins where it can apply; an algorithm
    may ask for one (``TRANSPORT``), unless ``auto`` took the pair from the tuning table; else
    shared memory from SHM_MIN_BYTES. Shared memory needs
    an MPI communicator with a peer on this node; messages to other hosts always go through MPI."""
    return transport_choice(comm, algorithm, nbytes, requested)[0]


def transport_choice(comm, algorithm, nbytes, requested="auto", preferred=None):
    """(transport, why): ``choose_transport`` with the reason, for the debug log. ``preferred``:
    the transport the tuning table paired with ``auto``'s algorithm (used where nothing else
    decides)."""
    requested, asked = _requested(requested)
    if requested == "mpi":
        return "mpi", asked
    if getattr(comm, "mpi_comm", None) is None or comm.size == 1:
        return "mpi", "not an MPI communicator with peers"
    colors = comm.node_colors()
    if colors.count(colors[comm.rank]) == 1:
        return "mpi", "no peer on this rank's node"
    if requested == "shm":
        return "shm", asked
    if preferred is not None:  # auto's pair from the tuning table or calibration: as it was measured
        return preferred, "the pair auto measured (tuning table or first-use calibration)"
    module = _algorithms.get(algorithm) if isinstance(algorithm, str) else algorithm
    wanted = getattr(module, "TRANSPORT", None)
    if wanted is not None:
        return wanted, f"asked for by {getattr(module, 'NAME', algorithm)}"
    if nbytes >= SHM_MIN_BYTES:
        return "shm", f"peers on this node, {nbytes} B >= SHM_MIN_BYTES {SHM_MIN_BYTES}"
    return "mpi", f"{nbytes} B < SHM_MIN_BYTES {SHM_MIN_BYTES}"


def log_transport(comm, nbytes, name, transport, why):
    """Under COLLECTIVES_DEBUG=INFO (or DEBUG), log a call's transport and why, once per shape."""
    if config.debug_level() not in ("INFO", "DEBUG"):
        return
    key = ("transport", comm.rank, comm.size, nbytes, name, transport, why)
    if key in _logged:
        return
    _logged.add(key)
    _ensure_handler()
    _log.info("allreduce rank %d of %d: %d bytes with %s -> transport %s (%s)", comm.rank, comm.size, nbytes,
              name, transport, why)


def _ensure_handler():
    if _log.level == logging.NOTSET:
        _log.setLevel(logging.INFO)
    if not _log.handlers and not logging.getLogger().handlers:  # nobody configured logging: stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("collectives: %(message)s"))
        _log.addHandler(handler)


def log_choice(comm, nbytes, dtype, name, why):
    """Under COLLECTIVES_DEBUG=INFO (or DEBUG), log a call's size, algorithm and why, once per
    distinct (rank, communicator size, bytes, dtype, algorithm, why)."""
    if config.debug_level() not in ("INFO", "DEBUG"):
        return
    key = (comm.rank, comm.size, nbytes, dtype, name, why)
    if key in _logged:
        return
    _logged.add(key)
    _ensure_handler()
    _log.info("allreduce rank %d of %d: %d bytes of %s -> %s (%s)", comm.rank, comm.size, nbytes, dtype,
              name, why)


def reset():
    _choices.clear()
    _logged.clear()


def calibrate(comm, sendbuf, recvbuf, measured_call):
    """(algorithm, transport or None, why) for an ``auto`` call with no tuning table: the pick
    stored for this machine (one node) or network (several hosts), else measured now on the
    caller's buffers (collectives/autotune.py, collectives/network_fit.py). ``measured_call``:
    the pipeline's own call path, which the measurement times."""
    hosts = topology(comm)
    if len(hosts) > 1:
        return network_fit.pick(comm, hosts, sendbuf, recvbuf, measured_call, _barrier)
    from .comm import shm as _shm  # imports mpi4py: calibration runs under MPI only
    from .comm.shm_arrays import is_shared

    shared = sendbuf.flags.c_contiguous and is_shared(comm, sendbuf)
    return autotune.pick(comm, sendbuf, recvbuf, _shm.available(comm), shared, measured_call, _barrier)


def _barrier(comm):
    comm.barrier("barrier")


def choose_compressed(comm, nbytes, dtype, fmt, scope, algorithm):
    """The algorithm of a compressed call: forced, named, or by the cost model with the wire's bytes
    (the tuning table measured uncompressed messages, so it is not asked); kept in the session."""
    if algorithm != "auto" or config.forced_algorithm() is not None:
        return pair_for(algorithm, comm, nbytes, dtype)[0]

    hosts = topology(comm) if comm.size > 1 else (tuple(range(comm.size)),)
    key = (comm.size, nbytes, dtype, hosts, fmt, scope)
    choices = comm.session.choices
    hit = choices.get(key)
    if hit is None:
        ratio = wire_ratio(fmt, dtype.itemsize)
        beta = BETA * ratio if scope == "all" else BETA
        if len(hosts) > 1:
            candidates = [n for n in _algorithms.names() if n != "shm"]
            name, costs = two_level_choice(hosts, nbytes, beta=beta, beta_inter=BETA_INTER * ratio,
                                           candidates=candidates)
            why = f"two-level cost model with {fmt} on the wire, {describe_topology(hosts)}"
        else:
            candidates = [n for n in _algorithms.names() if n not in ("shm", "two_level")]
            name, costs = cost_choice(comm.size, nbytes, beta=beta, candidates=candidates)
            why = f"cost model with {fmt} on the wire ({scope})"
        hit = choices[key] = (name, f"{why} ({costs[name] * 1e6:.1f} us predicted)")
        if len(choices) > 4096:
            choices.clear()
    log_choice(comm, nbytes, dtype, *hit)
    return hit[0]
