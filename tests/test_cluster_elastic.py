"""Elastic all-reduce across emulated hosts: Open MPI's launcher (with ULFM) starts one rank on
each of 3 hosts (python -m benchmarks.cluster --mpi openmpi --ft; the driver is
benchmarks/elastic_hosts.py). In the middle of an all-reduce loop:

- host 1's ranks are killed and its link cut: the other hosts' ranks raise RanksLost, agree on
  the call to repeat, and finish calls whose results equal MPI_Allreduce on the survivors;
- host 1 is killed whole (Open MPI's daemon too): Open MPI 5.0.11's runtime ends the job, soon
  and with nothing left behind (the limit docs/clusters.md states), with ``--enable-recovery``
  too (docs/clusters.md lists the launch options tried);
- the same whole-host kill launched by PRRTE's main branch (``--launcher``, built into
  ~/.cache/collectives/prrte-main by benchmarks/build_prrte_main.sh; skipped where it is not
  built): the other hosts' ranks raise RanksLost and go on, as for a host's lost ranks.

The recovery's phases are printed (``-s`` shows them). Needs root, network namespaces and the Open
MPI test environment (tests/mpi_envs.py): elsewhere every test here skips naming which is missing.
A single-process test module: it launches the tool as a subprocess, under hard timeouts.
"""
import os
import re
import subprocess
import sys

import pytest

from collectives import cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from benchmarks import cluster, elastic_hosts  # noqa: E402
import mpi_envs  # noqa: E402

MPIEXEC = os.path.join(mpi_envs.env_dir("openmpi"), "bin", "mpiexec")
PRRTE_MAIN = os.path.expanduser("~/.cache/collectives/prrte-main")
PRTERUN = os.path.join(PRRTE_MAIN, "bin", "prterun")
needs_prrte_main = pytest.mark.skipif(
    not os.path.exists(os.path.join(PRRTE_MAIN, "collectives-ready")),
    reason=f"PRRTE's main branch is not built at {PRRTE_MAIN} (benchmarks/build_prrte_main.sh builds it; "
           "docs/clusters.md)")


def _reason():
    if not os.path.exists(os.path.join(mpi_envs.env_dir("openmpi"), "collectives-ready")):
        return f"no Open MPI test environment at {mpi_envs.env_dir('openmpi')} (tests/run_all.py makes it)"
    why = cluster.why_not()
    return f"no emulated cluster here: {why}" if why else None


REASON = _reason()
# each run: start-up seconds, the loop, 60 s at most for the survivors, 60 s for the job's end
pytestmark = [pytest.mark.skipif(REASON is not None, reason=str(REASON)), pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before, tmp_before = set(cleanup.stale()), set(os.listdir("/tmp"))
    yield
    assert not sorted(set(cleanup.stale()) - before), "the job left MPI litter"
    assert not [line for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                text=True).stdout.splitlines() if line.startswith("cl")]
    left = [entry for entry in set(os.listdir("/tmp")) - tmp_before if entry.startswith(("ompi.", "prted.", "prte."))]
    assert not left, f"Open MPI session directories left in /tmp: {left}"


def _check_survivors_went_on(out, found):
    """Hosts 0 and 2 raised RanksLost for host 1's rank, agreed on the call to repeat, and finished
    with MPI_Allreduce's results."""
    assert "HOSTS-WRONG" not in out and "HOSTS-NOLOSS" not in out, out
    for rank in (0, 2):
        assert re.search(rf"HOSTS-OK rank {rank} calls=\d+ size=2 lost=\[1\]", out), f"rank {rank}\n{out}"
    assert "HOSTS-OK rank 1" not in out, out
    assert sorted(found) == [0, 2], f"{found}\n{out}"
    assert {r["lost"] for r in found.values()} == {"1"}, found
    # one call to repeat for every survivor: the one each was in, less the calls it was ahead
    assert len({r["repeat"] for r in found.values()}) == 1, f"{found}\n{out}"
    assert all(r["call"] == r["repeat"] + r["ahead"] for r in found.values()), f"{found}\n{out}"
    # the runtime reported the ranks' end: no survivor waited out COLLECTIVES_TIMEOUT (20 s)
    assert all(r["raised"] < 20 for r in found.values()), f"the survivors took COLLECTIVES_TIMEOUT or more: {found}"


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_a_host_s_ranks_killed_and_its_link_cut_the_other_hosts_go_on(algorithm):
    code, out, ended, found = elastic_hosts.run_once(MPIEXEC, 3, algorithm, kill="ranks")
    _check_survivors_went_on(out, found)
    assert code is not None, f"the job did not end once the lost host's daemon was gone\n{out}"
    for rank, r in sorted(found.items()):
        print(f"RECOVERY {algorithm} rank {rank}: " + " ".join(f"{k} {r[k]:.4f}" for k in elastic_hosts.PHASES))


@pytest.mark.parametrize("env", [{}, {"PRTE_MCA_state_base_recoverable": "1"}], ids=["ulfm", "enable_recovery"])
def test_a_host_killed_whole_ends_the_job_under_open_mpi_5(env):
    # Open MPI 5.0.11's runtime (PRRTE 3.0.11) ends the whole job when it loses a daemon, whatever
    # the launch options (--enable-recovery is the one a user would try first): the limit
    # docs/clusters.md states; here the job must end soon, with no survivor going on
    code, out, ended, found = elastic_hosts.run_once(MPIEXEC, 3, "ring", kill="host", env=env)
    assert ended is not None and ended < 30, f"the job took {ended} s to end\n{out}"
    assert code is not None, out
    assert "HOSTS-OK" not in out, out
    assert "lost communication with a remote daemon" in out, out


@needs_prrte_main
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_a_host_killed_whole_the_other_hosts_go_on_under_prrte_main(algorithm):
    # PRRTE's main branch marks a lost daemon's processes terminated and keeps the job
    # (openpmix/prrte#2443): Open MPI 5.0.11's ranks, launched by its prterun, see the host's rank
    # fail as for a lost rank, and the job ends on its own once the survivors are done, with the
    # lost host still unreachable (its link stays down)
    code, out, ended, found = elastic_hosts.run_once(MPIEXEC, 3, algorithm, kill="host", launcher=PRTERUN)
    _check_survivors_went_on(out, found)
    assert "lost communication with a remote daemon" in out, out
    assert code == 0, f"the launcher exited {code}\n{out}"
    assert ended is not None and ended < 30, f"the job took {ended} s to end\n{out}"
    for rank, r in sorted(found.items()):
        print(f"RECOVERY whole host, PRRTE main, {algorithm} rank {rank}: "
              + " ".join(f"{k} {r[k]:.4f}" for k in elastic_hosts.PHASES))


@needs_prrte_main
def test_a_rank_that_exits_non_zero_the_other_hosts_go_on_under_prrte_main():
    # a crashing rank exits non-zero: PRRTE's main branch would tell the others of it with an event
    # Open MPI 5.0.11's ULFM cannot handle (every survivor aborts) unless the launch turns that
    # report off, which the cluster tool's --launcher --ft does (cluster_openmpi.FT_LAUNCHER_ARGS)
    code, out, ended, found = elastic_hosts.run_once(MPIEXEC, 3, "ring", kill="exit", launcher=PRTERUN)
    _check_survivors_went_on(out, found)
    assert "PMIx Event Notification" not in out, out
    assert code is not None, f"the job did not end once the lost host's daemon was gone\n{out}"


@needs_prrte_main
def test_a_host_that_goes_silent_the_other_hosts_go_on_under_prrte_main():
    # a host that goes silent (its link cut, then everything on it killed: nothing reports its end)
    # is failed by Open MPI's heartbeat (the driver turns it on for --kill silent); MPI_Comm_shrink
    # returns once the runtime gives up the host's daemon, which TCP keepalive bounds (3 s idle,
    # then 2 probes 1 s apart), and PRRTE's main branch keeps the job through that loss
    keepalive = {"PRTE_MCA_prte_keepalive_time": "3", "PRTE_MCA_prte_keepalive_intvl": "1",
                 "PRTE_MCA_prte_keepalive_probes": "2"}
    code, out, ended, found = elastic_hosts.run_once(MPIEXEC, 3, "ring", kill="silent", env=keepalive,
                                                     launcher=PRTERUN)
    _check_survivors_went_on(out, found)
    assert code == 0, f"the launcher exited {code}\n{out}"
