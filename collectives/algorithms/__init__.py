"""The algorithm registry: one module per all-reduce algorithm, named as its key.

A module provides ``NAME``, ``OPTIONS`` (name -> Option), ``build(rank, size,
count, itemsize, **params) -> Plan`` and ``cost(p, nbytes, alpha, beta, gamma,
**options)``; optionally ``resolve(options, hosts)`` (options that need the topology, such as
node groups: ``hosts`` holds the ranks of each host, as ``resolve`` below takes it),
``check(options, size)``, and ``TRANSPORT``
(``"shm"`` or ``"mpi"``: the transport the algorithm asks for where the peers share a node;
it never moves data itself: collectives/comm/ carries every plan's messages). A built-in algorithm is a module named in ``_MODULES``; algorithms from
outside the package come through ``collectives.register_algorithm`` (which verifies their
plans first, ``collectives/plugins.py``). Hooks in ``on_load`` run once, after the built-ins
are registered and before the first lookup returns (plugins from entry points and
``COLLECTIVES_PLUGINS``). The test sweep and the benchmark take every name from
``collectives.algorithm_names()``.

This package is callable: ``collectives.algorithms()`` is the deprecated name of
``collectives.algorithm_names()`` (the package keeps its own name; no function shadows it).
"""
import importlib
import sys
import threading
import types
import warnings

from ._options import normalize

_MODULES = ["ring", "tree", "double_binary_tree", "recursive_doubling", "rabenseifner",
            "hierarchical_copy", "reduce_to_one", "shm", "two_level"]
BUILTIN = tuple(_MODULES)
_REGISTRY = {}
_lock = threading.RLock()
_loaded = False
_loading = False
on_load = []  # callables run once, after the built-ins are registered


def add_load_hook(hook):
    """Run ``hook()`` when the registry first loads (now, if it already has)."""
    on_load.append(hook)
    if _loaded:
        hook()


def register(name, module):
    """Add (or replace) an algorithm under ``name``, unchecked (``collectives.register_algorithm``
    verifies the plans first)."""
    for attr in ("build", "cost", "OPTIONS"):
        if not hasattr(module, attr):
            raise TypeError(f"algorithm {getattr(module, '__name__', module)!r} lacks {attr}")
    _REGISTRY[name] = module


def unregister(name):
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(_REGISTRY)}")
    del _REGISTRY[name]


def _load():
    global _loaded, _loading
    if _loaded:
        return
    with _lock:  # threads of one world may race to the first call; hooks may look names up
        if _loaded or _loading:
            return
        _loading = True
        try:
            for name in _MODULES:
                if name not in _REGISTRY:
                    register(name, importlib.import_module(f"{__name__}.{name}"))
            for hook in list(on_load):
                hook()
        finally:
            _loaded, _loading = True, False


def names():
    _load()
    return list(_REGISTRY)


def get(name):
    _load()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; valid algorithms: auto, {', '.join(_REGISTRY)}") from None


def resolve(algorithm, options, topology, size=None):
    """``(module, params)``: the algorithm (a registered name, or an algorithm object itself) and
    the keyword arguments of its ``build`` (hashable values) for ``options``. The one place that
    turns a call's options into plan parameters: the API, the TensorFlow bridge and the simulator
    all come here.

    ``topology`` holds the ranks of each host, hosts in order of their first rank (a tuple of
    tuples of ranks, as ``select.topology(comm)`` and ``Communicator.hosts()`` give), or a
    callable returning them, called only where the algorithm's own ``resolve`` hook needs the
    hosts (a communicator's first grouping of its ranks by node is collective). ``size`` is the
    world size (default: the ranks of ``topology``). Options are checked, defaults filled in
    (ValueError naming the valid ones), then the algorithm's ``check(options, size)`` and
    ``resolve(options, hosts)`` hooks run where it has them."""
    module = get(algorithm) if isinstance(algorithm, str) else algorithm
    check, hook = getattr(module, "check", None), getattr(module, "resolve", None)
    if not options and not module.OPTIONS and check is None and hook is None:
        return module, {}
    opts = normalize(module.NAME, module.OPTIONS, options or {})
    if size is None:
        topology = topology() if callable(topology) else topology
        size = sum(len(host) for host in topology)
    if check is not None:
        check(opts, size)
    if hook is not None:
        opts = hook(opts, topology() if callable(topology) else topology)
    return module, opts


class _CallablePackage(types.ModuleType):
    """``collectives.algorithms()``: the deprecated name of ``collectives.algorithm_names()``."""

    def __call__(self):
        warnings.warn("collectives.algorithms() is deprecated; use collectives.algorithm_names()",
                      DeprecationWarning, stacklevel=2)
        return names()


sys.modules[__name__].__class__ = _CallablePackage
