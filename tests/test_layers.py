"""Imports run one way: tools over the API, over the runtime, over selection, over algorithms, over
plans. Read from the source (ast), module-level and function-level imports alike."""
import ast
import os

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
ALGORITHM_LAYER = {m for m in MODULES if m.startswith("collectives.algorithms")} | {
    "collectives.plan", "collectives.phases", "collectives.blocks", "collectives.binding",
    "collectives.columns", "collectives.plan_errors"}
TRANSPORT_LAYER = {m for m in MODULES if m.startswith("collectives.comm")}


def test_the_library_never_imports_its_tools():
    bad = [(m, target) for m, path in MODULES.items() for target, _ in imports(m, path)
           if target.split(".")[0] in ("benchmarks", "tests", "tf_bridge")]
    assert not bad, bad


@pytest.mark.parametrize("module", sorted(ALGORITHM_LAYER))
def test_plans_and_algorithms_import_only_plans_algorithms_and_leaves(module):
    allowed = ALGORITHM_LAYER | {"collectives", "collectives.errors", "collectives.ops", "collectives.config"}
    bad = [target for target, _ in imports(module, MODULES[module])
           if target.split(".")[0] in ("mpi4py", "cupy")
           or (target.startswith("collectives") and target not in allowed)]
    assert not bad, f"{module} imports {bad}"


def test_the_binder_imports_only_plans():
    # collectives.binding is where every runner (executor, programs, shm transport, TF lowering)
    # reads plan entries: the plans layer, below all of them
    targets = {target for target, _ in imports("collectives.binding", MODULES["collectives.binding"])}
    assert targets == {"collectives.plan"}, targets


@pytest.mark.parametrize("module", sorted(TRANSPORT_LAYER))
def test_transports_never_import_algorithms_selection_or_the_api(module):
    bad = [target for target, _ in imports(module, MODULES[module])
           if target.startswith(("collectives.algorithms", "collectives.api", "collectives.select",
                                 "collectives.blocks", "collectives.tune", "collectives.simulate"))]
    assert not bad, f"{module} imports {bad}"


def test_no_import_cycles_at_module_level():
    graph = {m: {t for t, top in imports(m, p) if top and t in MODULES and t != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is how packages are built, not a cycle
    for m in list(graph):
        graph[m] = {t for t in graph[m] if not (MODULES[m].endswith("__init__.py") and t.startswith(m + "."))}
    state, cycles = {}, []

    def visit(node, trail):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_every_library_module_stays_under_400_lines():
    long = {m: n for m, path in MODULES.items() if (n := sum(1 for _ in open(path))) >= 400}
    assert not long, f"modules of 400 lines or more: {long}"
