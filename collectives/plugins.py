"""Your own algorithms: verify plans, register and unregister algorithms, load them from files
and installed packages.

An algorithm is any object (a module, a class, an instance) with

- ``NAME``: the name it is called by (``algorithm="direct"``),
- ``OPTIONS``: ``{name: collectives.Option(default, check, doc)}``, possibly empty,
- ``build(rank, size, count, itemsize=1, **options) -> collectives.plan.Plan``,
- ``cost(p, nbytes, alpha, beta, gamma, **options) -> seconds`` (``algorithm="auto"`` compares
  these where the tuning table has no entry).

``register_algorithm(algo)`` checks the plans symbolically first (1-9 ranks, a few counts, out
of place and in place) and raises ``collectives.PlanError`` naming what is wrong; once
registered the name works everywhere a built-in one does. Loading without editing the package:

- installed packages declare ``[options.entry_points] collectives.algorithms = direct =
  mypkg.direct:Direct``; they are registered when the registry first loads (a broken one gives
  a ``RuntimeWarning``, never a failed job);
- ``COLLECTIVES_PLUGINS=FILE.py[:FILE.py...]`` (the same on every rank) runs those files, which
  call ``register_algorithm``, at the same moment; an error there is raised;
- ``--load FILE.py`` does the same on ``python -m collectives.simulator``, ``python -m
  collectives.tune`` and ``python -m benchmarks.allreduce_perf``.
"""
import importlib
import importlib.util
import math
import os
import sys
import warnings

from . import api, select
from . import algorithms as _registry
from .flat import _Flat, build_plans
from .model import ALPHA, BETA, GAMMA
from .plan import Plan, PlanError
from .symbolic import verify_plans

ENTRY_POINT_GROUP = "collectives.algorithms"
PLUGINS_VARIABLE = "COLLECTIVES_PLUGINS"
RESERVED = ("auto", "native", "all")
REGISTER_RANKS = range(1, 10)
REGISTER_COUNTS = (0, 1, 2, 7, 100)
_loaded_files = {}  # real path -> names it registered
_runs = [0]


def _module_for(algorithm):
    if isinstance(algorithm, str):
        return _registry.get(algorithm)
    return algorithm


def check_interface(algo):
    """TypeError unless ``algo`` has NAME, OPTIONS, build and cost of the right kinds."""
    missing = [a for a in ("NAME", "OPTIONS", "build", "cost") if not hasattr(algo, a)]
    if missing:
        raise TypeError(f"algorithm {algo!r} lacks {', '.join(missing)} (needs NAME, OPTIONS, build, cost)")
    name = algo.NAME
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"algorithm NAME must be an identifier string, got {name!r}")
    if name in RESERVED:
        raise ValueError(f"algorithm name {name!r} is reserved ({', '.join(RESERVED)})")
    if not isinstance(algo.OPTIONS, dict) or not all(
            hasattr(o, "default") and hasattr(o, "check") for o in algo.OPTIONS.values()):
        raise TypeError(f"{name}: OPTIONS must map option names to collectives.Option(default, check, doc)")
    for attr in ("build", "cost"):
        if not callable(getattr(algo, attr)):
            raise TypeError(f"{name}: {attr} must be callable")
    return name


def _check_cost(algo, name, options):
    for p in (1, 2, 7, 1024):
        for nbytes in (0, 8, 1 << 20):
            try:
                value = float(algo.cost(p, nbytes, ALPHA, BETA, GAMMA, **options))
            except Exception as exc:  # noqa: BLE001 - reported with the place it happened
                raise PlanError(f"cost(p={p}, nbytes={nbytes}, ...) raised {exc!r}", name) from exc
            if not math.isfinite(value) or value < 0:
                raise PlanError(f"cost(p={p}, nbytes={nbytes}, ...) returned {value!r}; "
                                f"it must be a finite number of seconds >= 0", name)


def verify(algorithm, ranks=range(1, 17), counts=(0, 1, 2, 7, 1000), itemsize=4, **options):
    """Check ``algorithm`` (a registered name or an algorithm object) symbolically on every
    (ranks, count) pair, out of place and in place. Raises ``PlanError`` naming the algorithm,
    ranks, count, rank, step, buffer and element, and what is wrong; returns the number of
    (ranks, count) pairs checked. ``options`` are the algorithm's own."""
    algo = _module_for(algorithm)
    name = getattr(algo, "NAME", repr(algo))
    ranks = [ranks] if isinstance(ranks, int) else list(ranks)
    counts = [counts] if isinstance(counts, int) else list(counts)
    checked = 0
    for p in ranks:
        for count in counts:
            try:
                plans = build_plans(algo, p, count, itemsize, **options)
            except (PlanError, ValueError) as exc:
                if isinstance(exc, PlanError):
                    raise
                raise PlanError(f"build raised {exc!r}", name, p, count) from exc
            except Exception as exc:  # noqa: BLE001 - any failure of build is the plan's
                raise PlanError(f"build raised {exc!r}", name, p, count) from exc
            for rank, plan in enumerate(plans):
                if not isinstance(plan, Plan):
                    raise PlanError(f"build returned {type(plan).__name__}, not a collectives.plan.Plan "
                                    f"(end with PlanBuilder.build())", name, p, count, rank=rank)
                if (plan.rank, plan.size, plan.count) != (rank, p, count):
                    raise PlanError(f"build returned the plan of rank {plan.rank} of {plan.size}, count "
                                    f"{plan.count}", name, p, count, rank=rank)
            try:
                flat = _Flat(plans, ops=True)
                for in_place in (False, True):
                    verify_plans(None, in_place=in_place, flat=flat)
            except PlanError as exc:
                if exc.algorithm != name:  # the name it is registered by, not the one its plans carry
                    exc.algorithm = name
                    exc.args = (exc.describe(),)
                raise
            except (TypeError, ValueError, IndexError) as exc:
                raise PlanError(f"malformed plan (messages are (peer, buf, lo, hi, chan) of integers; use "
                                f"PlanBuilder): {exc}", name, p, count) from exc
            checked += 1
    return checked


def register_algorithm(algorithm, *, replace=False, ranks=REGISTER_RANKS, counts=REGISTER_COUNTS):
    """Verify ``algorithm`` (1-9 ranks, counts 0, 1, 2, 7, 100, with its default options) and
    register it under its ``NAME``; returns the name. A name already registered is refused
    (ValueError) unless ``replace=True``."""
    name = check_interface(algorithm)
    if name in _registry.names() and not replace:
        raise ValueError(f"algorithm {name!r} is already registered; pass replace=True to replace it")
    defaults = {k: o.default for k, o in algorithm.OPTIONS.items()}
    _check_cost(algorithm, name, defaults)
    verify(algorithm, ranks=ranks, counts=counts)
    _registry.register(name, algorithm)
    _forget_choices()
    return name


def unregister_algorithm(name):
    """Remove a registered algorithm (built-in ones too); cached plans of it are dropped."""
    _registry.unregister(name)
    _forget_choices()


def _forget_choices():

    api.clear_caches()
    select.reset()


# loading -------------------------------------------------------------------------------
def load_file(path):
    """Run a Python file that registers algorithms; returns the names it registered. A file
    already loaded (by real path) is not run again while its algorithms stay registered."""
    real = os.path.realpath(path)
    if real in _loaded_files and all(n in _registry.names() for n in _loaded_files[real]):
        return _loaded_files[real]  # loaded, and nothing it registered was removed since
    if not os.path.isfile(real):
        raise FileNotFoundError(f"algorithm file {path!r} not found")
    before = set(_registry.names())
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(real))[0])
    _runs[0] += 1
    module_name = f"collectives_plugin_{stem}_{_runs[0]}"
    spec = importlib.util.spec_from_file_location(module_name, real)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    names = [n for n in _registry.names() if n not in before]
    _loaded_files[real] = names
    return names


def load_files(paths):
    """``load_file`` for each path; returns every name registered."""
    return [name for path in paths or () for name in load_file(path)]


def load_entry_points():
    """Register the algorithms installed packages declare under ``collectives.algorithms``."""
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            algo = ep.load()
            if getattr(algo, "NAME", None) in _registry.names():
                continue
            names.append(register_algorithm(algo))
        except Exception as exc:  # noqa: BLE001 - one broken package must not stop every job
            warnings.warn(f"collectives: algorithm entry point {ep.name} = {ep.value} not registered: {exc}",
                          RuntimeWarning, stacklevel=2)
    return names


def load_environment():
    """Load the files named in ``COLLECTIVES_PLUGINS`` (separated by ``os.pathsep``)."""
    value = os.environ.get(PLUGINS_VARIABLE, "")
    return load_files([p for p in value.split(os.pathsep) if p.strip()])


def _on_registry_load():
    load_entry_points()
    load_environment()


def add_load_option(parser):
    """``--load FILE.py`` (repeatable) on a command-line tool; call ``load_files(args.load)``."""
    parser.add_argument("--load", action="append", default=[], metavar="FILE.py",
                        help="run FILE.py first: it registers algorithms (collectives.register_algorithm)")


_registry.add_load_hook(_on_registry_load)
