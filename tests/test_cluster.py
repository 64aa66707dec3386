"""The emulated cluster (python -m benchmarks.cluster): hosts as network namespaces, torn down on
every exit path; every algorithm and building block across hosts; network faults end the job.

Needs root and network namespaces: elsewhere every test here skips with the tool's own reason.
A single-process test module: it launches the tool (which launches mpiexec) as a subprocess.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from collectives import cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import cluster  # noqa: E402

PYTHON = sys.executable
CHECK = os.path.join(ROOT, "tests", "cluster", "check_across_hosts.py")
LOOP = os.path.join(ROOT, "tests", "cluster", "fault_loop.py")
HARD_TIMEOUT = 120
REASON = cluster.why_not(rate="500mbit") if os.path.exists(os.path.join(os.path.dirname(PYTHON), "mpiexec")) \
    else f"no mpiexec next to {PYTHON}"
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no emulated cluster here: {REASON}"),
              pytest.mark.timeout(HARD_TIMEOUT + 60)]


def _sigint_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(hosts, ranks, program, *, rate=None, env=None, extra=()):
    """The tool, started as a shell starts a background job: SIGINT ignored (it must still act on one)."""
    cmd = [PYTHON, "-m", "benchmarks.cluster", "--hosts", str(hosts), "--ranks-per-host", str(ranks),
           *(["--rate", rate] if rate else []), *extra, "--", PYTHON, *program]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=_sigint_ignored)


def finish(proc, timeout=HARD_TIMEOUT):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the cluster tool did not end within {timeout} s\n{out}")
    return proc.returncode, out


def leftovers(run_id):
    """Everything of run ``run_id`` still on the machine: namespaces, links (their qdiscs go with
    them), mounts, processes, the launcher's directory."""
    name = f"cl{run_id}"
    found = [f"netns {line.split()[0]}" for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                                   text=True).stdout.splitlines() if name in line]
    found += [f"link {line.split(':')[1].strip()}" for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines() if name in line]
    with open("/proc/mounts") as mounts:
        found += [f"mount {line.split()[1]}" for line in mounts if name in line]
    found += [f"process {pid}" for pid in cleanup.tagged_processes(cluster.RUN_VARIABLE, run_id)]
    found += [f"dir /tmp/{entry}" for entry in os.listdir("/tmp") if entry.startswith(f"collectives-cluster-{run_id}-")]
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = set(cleanup.stale())
    shm_before = sorted(os.listdir("/dev/shm"))
    yield
    left = sorted(set(cleanup.stale()) - before)
    assert not left, f"stale MPI litter after the test: {left}"
    assert not [e for e in os.listdir("/dev/shm") if e not in shm_before and e.startswith(cleanup.SHM_PREFIXES)
                and e in cleanup.stale()], "the job left /dev/shm entries"


@pytest.mark.parametrize("hosts, ranks", [(2, "2"), (3, "2,1,2")])
def test_every_algorithm_and_block_across_hosts(hosts, ranks):
    proc = start(hosts, ranks, [CHECK])
    run_id = f"{proc.pid:x}"
    code, out = finish(proc)
    total = sum(int(k) for k in ranks.split(",")) if "," in ranks else hosts * int(ranks)
    assert code == 0, out
    assert len(re.findall(r"CLUSTER-OK rank \d+", out)) == total, out
    assert len(set(re.findall(r"host (cl[0-9a-f]+h\d+)", out))) == hosts, out
    assert leftovers(run_id) == []


def test_shaped_links_and_torn_down_after_a_normal_end():
    show = "tc qdisc show dev eth0; tc class show dev eth0; tc filter show dev eth0 parent 10:"
    proc = start(2, "1", ["-c", "import os, socket, subprocess; os.write(1, f'HOST {socket.gethostname()}\\n'.encode()); "
                                f"subprocess.run({show!r}, shell=True)"], rate="500M")
    run_id = f"{proc.pid:x}"
    code, out = finish(proc)
    assert code == 0 and out.count("HOST cl") == 2, out
    # tbf holds the rate; under it small packets (ACKs) go ahead of bulk data, which has tbf's queue
    assert out.count("qdisc tbf 1: root") == 2 and out.count("rate 500Mbit") == 2, out
    assert out.count("qdisc htb 10: parent 1:1") == 2 and out.count("qdisc bfifo") == 2, out
    assert out.count("limit 1512144b") == 2 and out.count("match 00000000/0000ff80 at 0") == 2, out
    assert leftovers(run_id) == []


def test_the_shaping_commands():
    commands = cluster.shaping(cluster.parse_rate("500M"))
    assert commands[0] == ("qdisc", "root", "handle", "1:", "tbf", "rate", "500mbit", "burst", "262144",
                           "latency", "20ms")
    assert ("qdisc", "parent", "10:20", "bfifo", "limit", str(500_000_000 // 8 // 50 + 262144)) in commands
    assert [c for c in commands if c[0] == "filter"][0][-1] == "10:10"  # small packets: the first class
    # one parser of rates for the tool and its report: bytes per second
    assert [cluster.rate_bytes(t) for t in ("500M", "1G", "100mbit", "800k")] == [62.5e6, 125e6, 12.5e6, 1e5]
    with pytest.raises(ValueError, match="bits per second"):
        cluster.rate_bytes("fast")


@pytest.mark.parametrize("given, seen", [(None, "inf"), ("auto", "auto")])
def test_every_message_goes_eagerly_unless_the_environment_says_otherwise(given, seen):
    # UCX's rendezvous over TCP held messages back at random (docs/performance.md#emulated-cluster); the tool turns it off
    # for the job, and a value in the environment wins
    env = {} if given is None else {"UCX_RNDV_THRESH": given}
    if given is None and "UCX_RNDV_THRESH" in os.environ:
        pytest.skip("UCX_RNDV_THRESH is set in this environment")
    proc = start(2, "1", ["-c", "import os; os.write(1, f'RNDV={os.environ.get(\"UCX_RNDV_THRESH\")}\\n'.encode())"],
                 env=env)
    code, out = finish(proc)
    assert code == 0 and out.count(f"RNDV={seen}\n") == 2, out


def test_program_error_is_passed_on_and_torn_down():
    proc = start(2, "1", ["-c", "import sys; sys.exit(3)"])
    run_id = f"{proc.pid:x}"
    code, out = finish(proc)
    assert code != 0, out
    assert leftovers(run_id) == []


def _started(proc, marker, timeout=60):
    """Read the tool's output until ``marker`` appears; returns what was read."""
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if time.monotonic() > deadline:
            break
    assert marker in seen, f"no {marker!r} from the job\n{seen}"
    return seen


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_tool_tears_everything_down(signum):
    proc = start(2, "2", [LOOP])
    run_id = f"{proc.pid:x}"
    _started(proc, "LOOP-STARTED")
    proc.send_signal(signum)
    code, out = finish(proc, timeout=60)
    assert code != 0
    assert leftovers(run_id) == []


def test_killed_job_ends_the_run_and_tears_down():
    proc = start(2, "2", [LOOP], env={"COLLECTIVES_TIMEOUT": "5"})
    run_id = f"{proc.pid:x}"
    _started(proc, "LOOP-STARTED")
    victims = [int(p) for p in subprocess.run(["ip", "netns", "pids", f"cl{run_id}h1"], capture_output=True,
                                              text=True).stdout.split()]
    assert victims, "no process on host 1"
    started = time.monotonic()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    code, out = finish(proc, timeout=90)
    assert code != 0, out
    assert time.monotonic() - started < 5 + 30, "the job outlived the timeout by more than 30 s"
    assert "LOOP-DONE" not in out
    assert leftovers(run_id) == []


def test_timeout_ends_a_job():
    proc = start(2, "1", [LOOP], extra=["--timeout", "3"])
    run_id = f"{proc.pid:x}"
    code, out = finish(proc, timeout=60)
    assert code == cluster.TIMED_OUT, out
    assert leftovers(run_id) == []


def test_two_runs_at_once_never_collide():
    first = start(2, "2", [CHECK])
    second = start(3, "1", [CHECK])
    (code1, out1), (code2, out2) = finish(first), finish(second)
    assert code1 == 0 and out1.count("CLUSTER-OK") == 4, out1
    assert code2 == 0 and out2.count("CLUSTER-OK") == 3, out2
    assert leftovers(f"{first.pid:x}") == [] and leftovers(f"{second.pid:x}") == []


def test_a_run_killed_outright_is_swept_by_the_next():
    proc = start(2, "1", [LOOP])
    run_id = f"{proc.pid:x}"
    _started(proc, "LOOP-STARTED")
    proc.send_signal(signal.SIGKILL)  # no teardown can run: its job and hosts stay behind
    proc.wait()
    cleanup.end_tagged(cluster.RUN_VARIABLE, run_id, grace=0)  # (the job holds the output pipe)
    proc.communicate()
    assert any(item.startswith("netns") for item in leftovers(run_id))
    code = subprocess.run([PYTHON, "-m", "benchmarks.cluster", "--cleanup"], cwd=ROOT, capture_output=True,
                          text=True).returncode
    assert code == 0
    assert leftovers(run_id) == []


def test_without_root_it_says_why_and_exits_77():
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        pytest.skip("no setpriv to run the tool as an unprivileged user")
    nobody = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    # a checkout in a private folder (mktemp -d) is out of an unprivileged user's reach
    probe = subprocess.run(nobody + [PYTHON, "-c", "import importlib.util, sys; "
                                     "sys.exit(importlib.util.find_spec('benchmarks.cluster') is None)"],
                           cwd=ROOT, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"an unprivileged user cannot load benchmarks.cluster from {ROOT}")
    proc = subprocess.run(nobody + [PYTHON, "-m",
                           "benchmarks.cluster", "--hosts", "2", "--", "true"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == cluster.CANNOT, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs root" in lines[0], proc.stderr


@pytest.mark.parametrize("cut", ["link", "kill"])
def test_network_fault_every_rank_ends_nonzero_within_the_bound(cut):
    # host 1's link goes down (or its ranks are killed) in the middle of a ring all-reduce loop:
    # the ranks on host 0 raise CollectiveTimeout naming ranks of host 1 within the timeout, and
    # every rank process, the cut-off ones included, ends within that timeout plus 30 s
    timeout = 5
    proc = start(2, "2", [LOOP], env={"COLLECTIVES_TIMEOUT": str(timeout)})
    run_id = f"{proc.pid:x}"
    _started(proc, "LOOP-STARTED")
    cut_at = time.monotonic()
    if cut == "link":
        subprocess.run(["ip", "link", "set", f"cl{run_id}v1", "down"], check=True)
    else:
        for pid in subprocess.run(["ip", "netns", "pids", f"cl{run_id}h1"], capture_output=True,
                                  text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    code, out = finish(proc, timeout=timeout + 60)
    elapsed = time.monotonic() - cut_at
    assert code != 0, out
    assert "LOOP-DONE" not in out, out
    assert elapsed < timeout + 30 + 5, f"the job took {elapsed:.0f} s after the cut\n{out}"
    if cut == "link":
        # the step is named where the call runs as a plan, not on a direct path (issue 18)
        assert re.search(r"CollectiveTimeout: allreduce\(ring\)( step \d+/\d+)?: no message from ranks? [23]", out), out
    assert leftovers(run_id) == []
