"""Your own algorithm: verify, PlanError's places, register/unregister, first class everywhere
(threaded allreduce, COLLECTIVES_ALGO, simulate, auto's cost model, the CLIs' --load,
COLLECTIVES_PLUGINS, entry points). The MPI side is tests/mpi/test_mpi_plugins.py."""
import os
import subprocess
import sys
import tempfile
import textwrap
import types

import numpy as np
import pytest

import collectives
from collectives import plugins, simulator as sim
from collectives.tools import simulate_cli
from collectives.plan import FINAL, IN, OUT, REDUCE, TMP, PlanBuilder, PlanError, Step, block_bounds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRECT = os.path.join(ROOT, "examples", "algorithms", "direct.py")
TORUS = os.path.join(ROOT, "examples", "algorithms", "torus.py")


@pytest.fixture
def examples():
    """The two example algorithms registered for one test, removed after it."""
    names = plugins.load_file(DIRECT) + plugins.load_file(TORUS)
    assert set(names) <= {"direct", "torus"}
    yield
    for name in ("direct", "torus"):
        if name in collectives.algorithm_names():
            collectives.unregister_algorithm(name)


def algo(build, name="t", cost=lambda p, nbytes, alpha, beta, gamma: 0.0, options=None):
    return types.SimpleNamespace(NAME=name, OPTIONS=options or {}, build=build, cost=cost)


def exchange(rank, size, count, itemsize=1, *, mutate=None):
    """A correct all-reduce for any size: every rank sends its input to every other, one step,
    then reduces in rank order from scratch. ``mutate(b, rank, size, count, tmp)`` breaks it."""
    b = PlanBuilder("t", rank, size, count)
    tmp = b.scratch(size * count)
    b.step()
    for d in range(1, size):
        b.send((rank + d) % size, IN, 0, count)
        b.recv((rank - d) % size, TMP, tmp + (rank - d) % size * count, tmp + ((rank - d) % size + 1) * count)
    b.copy(TMP, tmp + rank * count, IN, 0, count)
    b.copy(OUT, 0, TMP, tmp, count)
    for r in range(1, size):
        b.reduce(OUT, 0, OUT, 0, TMP, tmp + r * count, count)
    if mutate:
        mutate(b, rank, size, count, tmp)
    b.final(OUT, 0, count)
    return b.build()


def broken(mutate, **kw):
    return algo(lambda rank, size, count, itemsize=1: exchange(rank, size, count, itemsize, mutate=mutate), **kw)


def test_every_builtin_and_both_examples_verify(examples):
    for name in collectives.algorithm_names():
        assert collectives.verify(name, ranks=range(1, 10), counts=(0, 1, 2, 7, 100)) == 45, name
    assert collectives.verify("direct", ranks=range(1, 17), counts=(0, 1, 2, 7, 1000), fanout=3) == 80
    assert collectives.verify("torus", ranks=(4, 6, 8, 12), counts=(5, 1000), rows=2) == 8


def test_a_correct_plan_passes_and_the_helper_is_sound():
    assert collectives.verify(algo(exchange), ranks=range(1, 7), counts=(0, 3)) == 12


@pytest.mark.parametrize("mutate, match, where", [
    # a peer out of range
    (lambda b, r, s, c, t: (b.step(), b.send(s, OUT, 0, c)), r"sends to rank 3, out of range \(ranks are 0..2\)",
     (0, 2, "out", 0)),
    # an element reduced twice (rank 0's slot once more)
    (lambda b, r, s, c, t: b.reduce(OUT, 0, OUT, 0, TMP, t, c), "reduced twice", (0, 1, "out", 0)),
    # IN written
    (lambda b, r, s, c, t: b.reduce(IN, 0, IN, 0, TMP, t, c), "writes IN", (0, 1, "in", 0)),
    # FINAL twice
    (lambda b, r, s, c, t: b.final(OUT, 1, 1), "FINAL applied twice", (0, 1, "out", 1)),
    # scratch past its size
    (lambda b, r, s, c, t: b.copy(TMP, s * c, OUT, 0, 2), r"scratch used past its size: the plan's tmp_count is 9",
     (0, 1, "tmp", 9)),
    # a message nobody receives
    (lambda b, r, s, c, t: (b.step(), b.send((r + 1) % s, OUT, 0, 1, chan=3)) if r == 0 else None,
     "never receives", (0, 2, "out", 0)),
])
def test_plan_errors_name_the_place_and_what_is_wrong(mutate, match, where):
    with pytest.raises(PlanError, match=match) as info:
        collectives.verify(broken(mutate), ranks=3, counts=3)
    e = info.value
    assert (e.algorithm, e.ranks, e.count) == ("t", 3, 3)
    assert (e.rank, e.step, e.buffer, e.element) == where, str(e)
    assert str(e).startswith("t, 3 ranks, count 3")


def test_a_deadlock_names_the_ranks_waiting_on_each_other():
    def build(rank, size, count, itemsize=1):
        b = PlanBuilder("t", rank, size, count)
        tmp = b.scratch(count)
        nxt, prev = (rank + 1) % size, (rank - 1) % size
        b.step()
        b.recv(prev, TMP, tmp, tmp + count)  # everyone receives first: nobody ever sends
        b.step()
        b.send(nxt, IN, 0, count)
        b.reduce(OUT, 0, IN, 0, TMP, tmp, count)
        b.final(OUT, 0, count)
        return b.build()

    with pytest.raises(PlanError, match=r"deadlock: ranks 0 -> 2 -> 1 -> 0 wait on each other: rank 0 at step 1 "
                                        r"waits for rank 2's message of its step 2 \(channel 0\)") as info:
        collectives.verify(algo(build), ranks=3, counts=2)
    assert info.value.rank == 0 and info.value.step == 1


def test_missing_final_and_an_element_never_reduced():
    def no_final(rank, size, count, itemsize=1):
        plan = exchange(rank, size, count)
        plan.steps = [Step(s.sends, s.recvs, tuple(op for op in s.local if op[0] != FINAL)) for s in plan.steps]
        return plan

    with pytest.raises(PlanError, match="FINAL is never applied") as info:
        collectives.verify(algo(no_final), ranks=2, counts=4)
    assert (info.value.buffer, info.value.element, info.value.mode) == ("out", 0, "out of place")

    def skip_one(rank, size, count, itemsize=1):
        plan = exchange(rank, size, count)
        plan.steps = [Step(s.sends, s.recvs, tuple(op for op in s.local if op[0] != FINAL)
                           + ((FINAL, OUT, 0, count),)) for s in plan.steps]
        drop = [op for op in plan.steps[0].local if op[0] == REDUCE][-1]
        plan.steps[0] = Step(plan.steps[0].sends, plan.steps[0].recvs,
                             tuple(op for op in plan.steps[0].local if op is not drop))
        return plan

    with pytest.raises(PlanError, match="FINAL on an element not yet reduced"):
        collectives.verify(algo(skip_one), ranks=3, counts=2)


def test_in_place_reading_in_after_out_was_written_is_named():
    def build(rank, size, count, itemsize=1):
        b = PlanBuilder("t", rank, size, count)
        tmp = b.scratch(count)
        b.step()
        b.recv(1 - rank, TMP, tmp, tmp + count)
        b.send(1 - rank, IN, 0, count)
        b.copy(OUT, 0, TMP, tmp, count)          # OUT written (in place: IN is gone) ...
        b.reduce(OUT, 0, IN, 0, OUT, 0, count)   # ... then IN read: right out of place only
        b.final(OUT, 0, count)
        return b.build()

    with pytest.raises(PlanError, match=r"in place: rank 0, step 1/1, IN\[0\]: reads IN after OUT was written"):
        collectives.verify(algo(build), ranks=2, counts=3)


def test_build_and_cost_mistakes_are_plan_errors():
    with pytest.raises(PlanError, match="not a collectives.plan.Plan"):
        collectives.register_algorithm(algo(lambda rank, size, count, itemsize=1: [], name="nolist"))
    with pytest.raises(PlanError, match=r"cost\(p=1, nbytes=0, ...\) returned -1.0"):
        collectives.register_algorithm(algo(exchange, name="negative", cost=lambda *a: -1.0))
    with pytest.raises(PlanError, match="build raised ZeroDivisionError"):
        collectives.verify(algo(lambda rank, size, count, itemsize=1: 1 // 0), ranks=2, counts=1)
    assert "nolist" not in collectives.algorithm_names() and "negative" not in collectives.algorithm_names()


def test_register_refuses_taken_and_reserved_names_and_replaces_on_request():
    with pytest.raises(ValueError, match="'ring' is already registered; pass replace=True"):
        collectives.register_algorithm(algo(exchange, name="ring"))
    with pytest.raises(ValueError, match="reserved"):
        collectives.register_algorithm(algo(exchange, name="auto"))
    with pytest.raises(TypeError, match="lacks cost"):
        collectives.register_algorithm(types.SimpleNamespace(NAME="x", OPTIONS={}, build=exchange))
    bad = broken(lambda b, r, s, c, t: b.reduce(OUT, 0, OUT, 0, TMP, t, c), name="doubled")
    with pytest.raises(PlanError, match="doubled, 1 rank, count 1, out of place: rank 0, step 1/1, OUT.0.: "
                                        "the element is reduced twice"):
        collectives.register_algorithm(bad)
    assert "doubled" not in collectives.algorithm_names()
    ring = collectives.plugins._registry.get("ring")
    assert collectives.register_algorithm(algo(exchange, name="mine")) == "mine"
    try:
        with pytest.raises(ValueError, match="already registered"):
            collectives.register_algorithm(algo(exchange, name="mine"))
        collectives.register_algorithm(types.SimpleNamespace(NAME="mine", OPTIONS={}, build=ring.build,
                                                             cost=ring.cost), replace=True)
        assert collectives.plugins._registry.get("mine").build is ring.build
    finally:
        collectives.unregister_algorithm("mine")
    assert "mine" not in collectives.algorithm_names()
    with pytest.raises(ValueError, match="unknown algorithm 'mine'"):
        collectives.unregister_algorithm("mine")


@pytest.mark.parametrize("name, options", [("direct", {}), ("direct", {"fanout": 2}), ("torus", {}),
                                           ("torus", {"rows": 1})])
def test_examples_allreduce_on_threaded_worlds_exactly(examples, name, options):
    for n in (1, 2, 3, 4, 6):
        data = [np.arange(11, dtype=np.int64) * (r + 1) + r for r in range(n)]
        expected = sum(data)

        def body(comm):
            x = data[comm.rank].copy()
            y = collectives.allreduce(x, algorithm=name, comm=comm, **options)
            z = x.copy()
            collectives.allreduce(z, z, algorithm=name, comm=comm, **options)
            return y, z, x

        for y, z, x in collectives.run_threaded(n, body):
            assert np.array_equal(y, expected) and np.array_equal(z, expected)
        assert all(np.array_equal(x, d) for (_, _, x), d in zip(collectives.run_threaded(n, body), data))
    assert collectives.algorithm_options(name).keys() == {"direct": {"fanout"}, "torus": {"rows"}}[name]


def test_examples_options_are_checked(examples):
    with pytest.raises(ValueError, match="fanout must be a positive integer"):
        collectives.run_threaded(2, lambda comm: collectives.allreduce(np.ones(3), comm=comm, algorithm="direct",
                                                                       fanout=0))
    with pytest.raises(ValueError, match="rows=4 does not divide 6 ranks"):
        collectives.run_threaded(6, lambda comm: collectives.allreduce(np.ones(3), comm=comm, algorithm="torus",
                                                                       rows=4))


def test_forced_by_environment_and_simulated(examples, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_ALGO", "torus")
    out = collectives.run_threaded(4, lambda comm: collectives.allreduce(np.full(5, comm.rank), comm=comm))
    assert all((y == 6).all() for y in out)
    r = collectives.simulate("torus", ranks=64, nbytes=1 << 20)
    ring = collectives.simulate("ring", ranks=64, nbytes=1 << 20)
    assert r.verified and r.steps == 2 * (8 + 8 - 2) and r.time < ring.time
    r = collectives.simulate("direct", ranks=16, nbytes=4096, fanout=4)
    assert r.verified and r.steps == 2 * 4


def test_auto_uses_a_registered_cost(monkeypatch):
    from collectives import select

    monkeypatch.setenv("COLLECTIVES_TUNING", os.path.join(os.devnull, "none.json"))  # no table
    ring = collectives.plugins._registry.get("ring")
    free = types.SimpleNamespace(NAME="free", OPTIONS={}, build=ring.build, cost=lambda p, n, a, b, g: 0.0)
    collectives.register_algorithm(free)
    try:
        assert select.cost_choice(64, 1 << 20)[0] == "free"
        out = collectives.run_threaded(3, lambda comm: (collectives.allreduce(np.ones(4), comm=comm),
                                                        select.choose_pair(comm, 32, np.dtype(np.float64))[0]))
        assert all(name == "free" and (y == 3).all() for y, name in out)
    finally:
        collectives.unregister_algorithm("free")
    assert select.cost_choice(64, 1 << 20)[0] != "free"


def test_load_options_on_the_three_command_lines(examples, capsys):
    assert simulate_cli.main(["--load", DIRECT, "--load", TORUS, "-a", "torus,direct", "-p", "12", "-b", "1K",
                     "-e", "1K"]) == 0
    out = capsys.readouterr().out
    assert "torus" in out and "direct" in out and " NO" not in out
    from benchmarks import allreduce_perf
    from collectives import tune

    args = allreduce_perf.parse_args(["--load", TORUS, "-a", "torus,ring"])
    assert allreduce_perf.algorithm_list(args.algorithms) == ["torus", "ring"]
    assert tune.parse_args(["--load", DIRECT, "-a", "direct", "--dry-run"]).algorithms == ["direct"]


def _python(code, **env):
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [env.pop("PYTHONPATH")] if "PYTHONPATH" in env
                                                        else [ROOT]), **env)
    full.pop("COLLECTIVES_PLUGINS", None) if "COLLECTIVES_PLUGINS" not in env else None
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_collectives_plugins_variable_loads_files_in_any_program():
    code = ("import numpy as np, collectives; "
            "print(sorted(set(collectives.algorithm_names()) - {'ring'})[:2], "
            "collectives.run_threaded(3, lambda c: int(collectives.allreduce(np.ones(2), comm=c, "
            "algorithm='torus')[0]))[0])")
    proc = _python(code, COLLECTIVES_PLUGINS=DIRECT + os.pathsep + TORUS)
    assert proc.returncode == 0, proc.stderr
    assert "direct" in proc.stdout and proc.stdout.strip().endswith("3")
    proc = _python("import collectives; collectives.algorithm_names()", COLLECTIVES_PLUGINS="/nonexistent/x.py")
    assert proc.returncode != 0 and "algorithm file '/nonexistent/x.py' not found" in proc.stderr


def test_entry_points_register_on_first_use_and_a_broken_one_only_warns():
    with tempfile.TemporaryDirectory() as where:
        os.makedirs(os.path.join(where, "myalgos"))
        with open(os.path.join(where, "myalgos", "__init__.py"), "w") as f:
            f.write(textwrap.dedent("""\
                from collectives.algorithms import ring as _ring
                class Copy:
                    NAME = "ring_copy"
                    OPTIONS = {}
                    build = staticmethod(_ring.build)
                    cost = staticmethod(_ring.cost)
                """))
        info = os.path.join(where, "myalgos-1.0.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: myalgos\nVersion: 1.0\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[collectives.algorithms]\nring_copy = myalgos:Copy\nbroken = myalgos:Missing\n")
        proc = _python("import numpy as np, collectives; "
                       "print(collectives.run_threaded(2, lambda c: int(collectives.allreduce(np.ones(1), comm=c, "
                       "algorithm='ring_copy')[0]))); print('ring_copy' in collectives.algorithm_names())",
                       PYTHONPATH=where)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[2,", "2]", "True"]
    assert "entry point broken = myalgos:Missing not registered" in proc.stderr


def test_phases_are_public_and_compose():
    from collectives import phases

    def build(rank, size, count, itemsize=1):
        b = PlanBuilder("rs_ag", rank, size, count)
        bounds = block_bounds(count, size)
        phases.halving_doubling(b, range(size), bounds, allgather=False)
        phases.ring_allgather(b, range(size), bounds)
        return b.build()

    assert collectives.verify(algo(build, name="rs_ag"), ranks=range(1, 9), counts=(0, 5, 100)) == 24
    for name in ("ring_reduce_scatter", "ring_allgather", "recursive_doubling", "halving_doubling",
                 "tree_reduce", "tree_broadcast", "binomial_reduce", "binomial_broadcast", "segments"):
        assert getattr(phases, name).__doc__, name
