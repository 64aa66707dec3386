"""The algorithm registry: one module per all-reduce algorithm, named as its key.

A module provides ``NAME``, ``OPTIONS`` (name -> Option), ``build(rank, size,
count, itemsize, **params) -> Plan`` and ``cost(p, nbytes, alpha, beta, gamma,
**options)``; optionally ``resolve(options, comm)`` (options that need the
communicator, such as node groups), ``check(options, size)``, and
``run(comm, inbuf, outbuf, reduce_fn, final_fn)``: a transport-specific fast path
(shared memory) that moves the same data as the plan and returns False where it
does not apply. Registering
an algorithm is adding its module name to ``_MODULES``; the test sweep and
the benchmark pick it up from ``collectives.algorithms()``.
"""
import importlib
import threading

from ._options import normalize

_MODULES = ["ring", "tree", "double_binary_tree", "recursive_doubling", "rabenseifner",
            "hierarchical_copy", "reduce_to_one", "shm"]
_REGISTRY = {}
_lock = threading.Lock()
_loaded = False


def register(name, module):
    """Add (or replace) an algorithm module under ``name``."""
    for attr in ("build", "cost", "OPTIONS"):
        if not hasattr(module, attr):
            raise TypeError(f"algorithm module {module.__name__} lacks {attr}")
    _REGISTRY[name] = module


def _load():
    global _loaded
    if _loaded:
        return
    with _lock:  # threads of one world may race to the first call
        if not _loaded:
            for name in _MODULES:
                if name not in _REGISTRY:
                    register(name, importlib.import_module(f"{__name__}.{name}"))
            _loaded = True


def names():
    _load()
    return list(_REGISTRY)


def get(name):
    _load()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; valid algorithms: auto, {', '.join(_REGISTRY)}") from None


def plan_params(module, options, comm):
    """Checked options turned into the keyword arguments of ``module.build`` (hashable values)."""
    opts = normalize(module.NAME, module.OPTIONS, options)
    if hasattr(module, "check"):
        module.check(opts, comm.size)
    if hasattr(module, "resolve"):
        opts = module.resolve(opts, comm)
    return opts
