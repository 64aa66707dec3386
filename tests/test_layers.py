"""What the import contracts (setup.cfg, checked by ``lint-imports`` in the test command) do not
say: the library never imports the repository's tools, tests or the TensorFlow bridge; the binder
reads plans only; modules stay under 400 lines. Read from the source (ast)."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "collectives")


def modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[rel[:-9] if rel.endswith(".__init__") else rel] = path
    return found


def imports(module, path):
    """The collectives modules (and top-level packages) ``module`` imports, with whether each
    import is at module level."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [f"{target}.{alias.name}" for alias in node.names]
            found += [(name if name in MODULES else target, id(node) in top_level) for name in names]
    return found


MODULES = modules()


def test_the_library_never_imports_its_tools():
    bad = [(m, target) for m, path in MODULES.items() for target, _ in imports(m, path)
           if target.split(".")[0] in ("benchmarks", "tests", "tf_bridge")]
    assert not bad, bad


def test_the_binder_imports_only_plans():
    # collectives.binding is where every runner (executor, programs, shm transport, TF lowering)
    # reads plan entries: the plans layer, below all of them
    targets = {target for target, _ in imports("collectives.binding", MODULES["collectives.binding"])}
    assert targets <= {"collectives.plan", "collectives.steps"}, targets


def test_every_library_module_stays_under_400_lines():
    long = {m: n for m, path in MODULES.items() if (n := sum(1 for _ in open(path))) >= 400}
    assert not long, f"modules of 400 lines or more: {long}"


def test_no_public_name_shadows_a_submodule_and_simulate_is_a_function():
    """A name of the package is the submodule of that name where there is one (``algorithms``: the
    registry subpackage, callable only as the deprecated alias); ``collectives.simulate`` is a
    plain function and the simulator is the package ``collectives.simulator``."""
    import importlib
    import pkgutil
    import types

    import collectives

    for info in pkgutil.iter_modules(collectives.__path__):
        module = importlib.import_module(f"collectives.{info.name}")
        assert getattr(collectives, info.name) is module, info.name
    assert isinstance(collectives.simulate, types.FunctionType)
    assert collectives.simulate is collectives.simulator.simulate
    assert collectives.simulate("ring", ranks=4, nbytes=64).verified


# the optional third-party packages an import inside a function may wait for
OPTIONAL = ("mpi4py", "cupy", "cupyx", "tensorflow", "matplotlib")


def _loads_an_optional_package(module):
    """Whether ``module``'s own top level imports an optional package, or loads the MPI library
    (``mpilib.load()``, which imports mpi4py)."""
    tree = ast.parse(open(MODULES[module]).read())
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import) and any(a.name.split(".")[0] in OPTIONAL for a in sub.names):
                return True
            if isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in OPTIONAL:
                return True
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "load" \
                    and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "mpilib":
                return True
    return False


def test_an_import_inside_a_function_is_only_for_an_optional_package():
    # issue 33: the library's own modules are imported at the top of a module; an import inside a
    # function waits only for an optional package (directly, or a module of ours that loads it)
    bad = []
    for module, path in MODULES.items():
        for target, top_level in imports(module, path):
            if top_level or target.split(".")[0] in OPTIONAL or target.split(".")[0] != "collectives":
                continue
            if not (target in MODULES and _loads_an_optional_package(target)):
                bad.append(f"{module} imports {target} inside a function")
    assert not bad, bad


def test_importing_the_library_and_its_tools_starts_no_mpi():
    # mpi4py's import initializes MPI (a singleton job, with its session files): the library, the
    # simulator and the tools import it only once MPI is asked for
    names = ["collectives", "collectives.cleanup", "collectives.simulator", "collectives.tools.simulate_cli",
             "collectives.tune", "collectives.calibrate", "collectives.protocol", "collectives.select"]
    code = f"import sys\nfor name in {names!r}:\n    __import__(name)\nprint('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing the library imported mpi4py"
