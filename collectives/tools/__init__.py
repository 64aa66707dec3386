"""Command-line tools over the library: the simulator's CLI (``python -m collectives.simulator``).

The library core never imports this package; the tools import the core. The other tools
(``collectives.tune``, ``collectives.calibrate``, ``collectives.protocol``, ``collectives.cleanup``,
``collectives.cli``) keep their module names, which are their commands.
"""
