"""The MPI library facts (collectives.mpilib), single-process: which library a version string
names, oversubscription judged from the node's cores (pinned and unpinned launches), the one
error where no MPI library loads, and tuning tables tied to the library they were measured under."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from collectives import mpilib, tune, tuning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the first line of MPI_Get_library_version, as each PyPI wheel printed it here
VERSIONS = {
    "MPICH Version:      5.0.2\nMPICH Release date: ...": ("MPICH", "5.0.2"),
    "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11": ("Open MPI", "5.0.11"),
    "Intel(R) MPI Library 2021.18 for Linux* OS\n": ("Intel MPI", "2021.18"),
}


@pytest.mark.parametrize("text", VERSIONS)
def test_the_library_and_version_are_read_from_the_version_string(text):
    assert mpilib.identify(text) == VERSIONS[text]


@pytest.mark.parametrize("variable", ["MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_ranks_per_core_counts_the_nodes_cores_not_one_ranks_mask(variable):
    assert mpilib.ranks_per_core({variable: "2"}, cores=2) == 1.0  # 2 ranks, 2 cores: not oversubscribed
    assert mpilib.ranks_per_core({variable: "4"}, cores=2) == 2.0
    assert mpilib.ranks_per_core({}, cores=2) == 0  # no launcher: unknown
    assert mpilib.ranks_per_core({variable: "x"}, cores=2) == 0


def test_cpu_lists_are_counted():
    assert mpilib._parse_cpu_list("0-3,6,8-9\n") == 7
    assert mpilib._parse_cpu_list("0") == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and at least 2 cores")
def test_a_rank_pinned_to_one_core_still_sees_the_nodes_cores():
    """What a pinning launcher does (Open MPI, Intel MPI): the rank's mask is one core; two ranks
    on a node of two or more cores are not oversubscribed."""
    code = ("import os; from collectives import mpilib; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "print(len(os.sched_getaffinity(0)), mpilib.node_cores(), "
            "mpilib.ranks_per_core({'OMPI_COMM_WORLD_LOCAL_SIZE': '2'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    mask, cores, per_core = out.stdout.split()
    assert int(mask) == 1
    assert int(cores) == mpilib.node_cores() >= 2
    assert float(per_core) == 2 / int(cores) <= 1


def test_a_wait_yields_its_core_from_the_first_deadline_check():
    """A waiting rank yields at every deadline check from the start, oversubscribed or not: its
    peer may share its core anyway (a job confined to fewer cores than the node has). 200 polls
    that fail take far less than a millisecond: a spin before the first yield would give none."""
    code = ("import os; from collectives.comm import mpi_steps as m; polls, yields = [0], [0]\n"
            "def testall(reqs, statuses):\n    polls[0] += 1\n    return polls[0] > 200\n"
            "m._testall = testall; m.os.sched_yield = lambda: yields.__setitem__(0, yields[0] + 1)\n"
            "m.poll_step([], [], [], [], 60.0, 'probe')\n"
            "print(polls[0], yields[0], m._POLLS_PER_CHECK)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    polls, yields, per_check = map(int, out.stdout.split())
    assert polls == 201 and yields == 200 // per_check > 0


def _launch(args, n):
    """Run a probe under this environment's mpiexec: per rank (mask size, oversubscribed?)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec in this environment (pip install -e '.[mpich]')")
    code = ("import os; from collectives.comm import mpi; "  # one write per rank: lines never interleave
            "os.write(1, f'probe {len(os.sched_getaffinity(0))} {int(mpi._OVERSUBSCRIBED)}\\n'.encode())")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([mpiexec] + args + ["-n", str(n), sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return [tuple(map(int, line.split()[1:])) for line in out.stdout.splitlines() if line.startswith("probe")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pinned"])
def test_oversubscription_under_pinned_and_unpinned_launches(pinned):
    cores = mpilib.node_cores()
    args = ["-bind-to", "core"] if pinned else []
    for n in (2, 4):
        ranks = _launch(args, n)
        assert len(ranks) == n
        if pinned and n <= cores:
            assert all(mask == 1 for mask, _ in ranks), ranks  # the launcher did pin
        assert all(over == int(n > cores) for _, over in ranks), (n, cores, ranks)


def test_no_mpi_library_gives_one_error_naming_both_ways():
    env = dict(os.environ, MPI4PY_LIBMPI="/nonexistent/libmpi.so", PYTHONPATH=ROOT)
    code = "import numpy as np, collectives; collectives.allreduce(np.ones(2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()
    error = out.stderr[out.stderr.rindex("ImportError"):]
    assert "pip install 'collectives[mpich]'" in error and "cluster's own MPI" in error, last
    assert "cannot load MPI library" in error  # mpi4py's own words, as the cause


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    where = tmp_path / "tuning.json"
    monkeypatch.setenv("COLLECTIVES_TUNING", str(where))
    tuning.reload()
    yield where
    tuning.reload()


def _entries(size, algorithm):
    return [{"size": size, "dtype": "float32", "nbytes": 1024, "algorithm": algorithm}]


def test_a_table_of_another_library_is_not_used_under_mpi(table_file):
    table_file.write_text(json.dumps({"format": tune.FORMAT, "mpi_library": "MPICH 5.0.2", "eager_limit": 8000,
                                      "entries": _entries(4, "tree")}))
    f32 = np.dtype(np.float32)
    assert tuning.lookup(4, 1024, f32, "MPICH 5.0.2") == "tree"
    assert tuning.lookup(4, 1024, f32) == "tree"  # threaded worlds have no MPI library
    assert tuning.lookup(4, 1024, f32, "Open MPI 5.0.11") is None
    assert tuning.mismatch("Open MPI 5.0.11") == "tuning table measured under MPICH 5.0.2, this is Open MPI 5.0.11"
    assert tuning.eager_limit("MPICH 5.0.2") == 8000 and tuning.eager_limit("Open MPI 5.0.11") is None
    assert mpilib.eager_limit(("Open MPI", "5.0.11")) == mpilib.MEASURED_EAGER_LIMITS["Open MPI", "5.0.11"]
    assert mpilib.eager_limit(("MPICH", "5.0.2")) == 8000
    assert mpilib.eager_limit(("Unknown MPI", "1")) == 0  # never another library's figure


def test_a_table_that_names_no_library_is_not_used_under_mpi(table_file):
    table_file.write_text(json.dumps({"format": tune.FORMAT, "entries": _entries(4, "tree")}))
    assert tuning.lookup(4, 1024, np.dtype(np.float32), "MPICH 5.0.2") is None
    assert "does not record its MPI library" in tuning.mismatch("MPICH 5.0.2")


def test_tune_replaces_a_table_of_another_library_and_keeps_its_own(table_file):
    table_file.write_text(json.dumps({"format": tune.FORMAT, "mpi_library": "MPICH 5.0.2", "eager_limit": 8000,
                                      "entries": _entries(8, "tree")}))
    mine = _entries(4, "ring")
    assert tune.merge(str(table_file), mine, "Open MPI 5.0.11", 3968) == {
        "format": tune.FORMAT, "mpi_library": "Open MPI 5.0.11", "entries": mine, "eager_limit": 3968}
    merged = tune.merge(str(table_file), mine, "MPICH 5.0.2")
    assert merged["entries"] == _entries(8, "tree") + mine and merged["eager_limit"] == 8000


def test_mpich_is_an_extra_not_a_dependency():
    """The site-MPI path installs without MPICH: only the mpich extra (the Quick start's) brings it."""
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    assert "mpich" not in config["options"]["install_requires"]
    assert "mpich" in config["options.extras_require"]["mpich"]
    with open(os.path.join(ROOT, "README.md")) as f:
        quick = f.read().split("## Quick start", 1)[1].split("```")[1]
    assert all("[mpich" in line for line in quick.strip().splitlines()[1:]), quick

