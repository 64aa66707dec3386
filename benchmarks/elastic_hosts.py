"""A host lost in the middle of a run on the emulated cluster, under Open MPI with ULFM: how long
the other hosts take to go on (COLLECTIVES_ON_ERROR=shrink).

    python -m benchmarks.elastic_hosts --mpiexec OPENMPI/bin/mpiexec [--hosts 3] [--runs 5]
        [--algorithm ring] [--kill ranks|exit|host|silent] [--env NAME=VALUE] [--out DIR]
        [--launcher PRRTE/bin/prterun]

Each run starts ``benchmarks/elastic_hosts_job.py`` on H hosts x 1 rank (``python -m
benchmarks.cluster --mpi openmpi --ft``; the Python next to ``--mpiexec`` runs the ranks), waits
until every rank has made its first calls, then loses host 1:

- ``--kill ranks`` (default): its ranks are killed (SIGKILL); Open MPI's daemon on the host
  stays and reports their end to ``mpiexec``; 0.3 s later the host's link is cut. The other
  hosts' ranks raise RanksLost, repeat the call it names, and make their calls to the end. To
  end the job, the driver then kills the daemon too and brings the link back up, so that
  ``mpiexec`` learns the daemon is gone (on a real cluster TCP keepalive tells it, after
  ``oob_tcp_keepalive_time``).
- ``--kill exit``: as ``ranks``, but its ranks exit with status 3 themselves (the job's SIGUSR1
  handler calls ``os._exit(3)``), as a rank that crashes with an error does.
- ``--kill host``: every process of the host, Open MPI's daemon included, is killed and, once
  they have exited (their connections reset), its link cut. Open MPI 5.0.11's runtime ends the
  whole job when it loses a daemon (docs/clusters.md): this measures how soon. Under PRRTE's
  main branch (``--launcher``, below) the other hosts' ranks go on, as for ``--kill ranks``.
- ``--kill silent``: the host's link is cut first, then every process of it killed: a crash
  nothing reports. Open MPI's heartbeat detector is on (``mpi_ft_detector``, every 0.5 s, a
  peer silent for 2 s is failed); what the survivors then do is printed.

Printed per survivor, seconds: detection (the kill to the start of recovery), revoke, shrink (the
new communicator), agree (the lost set), calls (agreement on the call to repeat), raised (the
kill to RanksLost) and first_call (the first call on the survivors). ``--out`` keeps each run's
output there. ``--launcher PRTERUN`` launches with that PRRTE ``prterun`` (PRRTE's main branch,
built by benchmarks/build_prrte_main.sh) instead of Open MPI's ``mpiexec``, whose ranks it still
runs (benchmarks.cluster ``--launcher``). Needs root and network namespaces (as benchmarks.cluster).
"""
import argparse
import ast
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "elastic_hosts_job.py")
CUT_AFTER = 0.3  # seconds between the ranks' end and the link's: the daemon's report gets out first
PHASES = ("detect", "revoke", "shrink", "agree", "calls", "raised", "first_call")


class Job:
    """The cluster tool running the job on ``hosts`` hosts x 1 rank, its output read as it comes."""

    def __init__(self, mpiexec, hosts, env=(), timeout=100, launcher=None):
        full = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT, COLLECTIVES_ON_ERROR="shrink",
                    COLLECTIVES_TIMEOUT="20", OMPI_MCA_osc="^ucx")
        full.update(env)
        for key in ("COLLECTIVES_CHECK", "COLLECTIVES_ALGO", "COLLECTIVES_TRANSPORT"):
            full.pop(key, None)
        python = os.path.join(os.path.dirname(mpiexec), "python")
        cmd = [sys.executable, "-m", "benchmarks.cluster", "--hosts", str(hosts), "--ranks-per-host", "1",
               "--mpi", "openmpi", "--ft", "--mpiexec", mpiexec, "--timeout", str(timeout),
               *(("--launcher", launcher) if launcher else ()), "--", python, JOB]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.run_id = f"{self.proc.pid:x}"
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self):
        return "".join(self.lines)

    def wait_for(self, pattern, count, timeout=60):
        """True once ``pattern`` is in the output ``count`` times; False if the job ended or time ran out."""
        deadline = time.monotonic() + timeout
        while len(re.findall(pattern, self.out)) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _pids(self, host):
        return subprocess.run(["ip", "netns", "pids", f"cl{self.run_id}h{host}"], capture_output=True,
                              text=True).stdout.split()

    def _link(self, host, state):
        subprocess.run(["ip", "link", "set", f"cl{self.run_id}v{host}", state], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def lose(self, host, kill):
        """Lose ``host`` (``kill``: as the module says); time.monotonic() of the kill."""
        pids = self._pids(host)
        if kill in ("ranks", "exit"):
            pids = [pid for pid in pids if _is_rank(pid)]
        at = time.monotonic()
        if kill == "silent":
            self._link(host, "down")
        _kill(pids, signal.SIGUSR1 if kill == "exit" else signal.SIGKILL)
        if kill != "silent":  # their sockets closed (a killed host's connections reset), then the cut
            _wait_gone(pids)
        if kill in ("ranks", "exit"):
            time.sleep(CUT_AFTER)
        if kill != "silent":
            self._link(host, "down")
        return at

    def end_lost_host(self, host):
        """Kill what is left of ``host`` and bring its link up: ``mpiexec`` learns its daemon is gone."""
        _kill(self._pids(host))
        self._link(host, "up")

    def finish(self, timeout):
        """The tool's exit status (None where it had to be ended) once it ends."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # the tool tears everything down on SIGTERM
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            code = None
        self.reader.join(timeout=5)
        return code


def _is_rank(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return JOB.encode() in cmdline.read()
    except OSError:
        return False


def _wait_gone(pids, limit=5.0):
    """Wait until every process of ``pids`` has exited (gone, or a zombie: its files closed)."""
    deadline = time.monotonic() + limit
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.005)


def _kill(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(int(pid), sig)
        except ProcessLookupError:
            pass


def recovery(out, survivors, killed_at):
    """Per survivor rank: {"lost", "repeat", "ahead", and each of PHASES in seconds}."""
    found = {}
    for rank in survivors:
        lost = re.findall(rf"HOSTS-LOST rank {rank}: lost=\[([\d, ]*)\] repeat=(\d+) ahead=(\d+) call=(\d+) "
                          rf"at=([\d.]+) raised=([\d.]+) timings=(\{{.*\}})", out)
        first = re.findall(rf"HOSTS-FIRST rank {rank} seconds=([\d.]+)", out)
        if len(lost) != 1 or len(first) != 1:
            continue
        lost_ranks, repeat, ahead, call, _, raised, timings = lost[0]
        t = ast.literal_eval(timings)
        found[rank] = {"lost": lost_ranks, "repeat": int(repeat), "ahead": int(ahead), "call": int(call),
                       "detect": float(raised) - t["calls"] - killed_at, "revoke": t["revoke"],
                       "shrink": t["shrink"] - t["revoke"], "agree": t["agree"] - t["shrink"],
                       "calls": t["calls"] - t["agree"], "raised": float(raised) - killed_at,
                       "first_call": float(first[0])}
    return found


def why_ended(out):
    """The line of a job's output that says why it ended without survivors."""
    for marker in ("lost communication with a remote daemon", "could not form a communicator",
                   "collectives: rank", "daemon failed"):
        for line in out.splitlines():
            if marker in line:
                return line.strip()[:200]
    return "(no reason printed)"


def run_once(mpiexec, hosts=3, algorithm="ring", kill="ranks", after=10, env=(), launcher=None):
    """(exit status or None, output, seconds from the kill to the job's end, recovery per survivor);
    ``launcher``: a PRRTE ``prterun`` to launch with instead of ``mpiexec``."""
    env = dict(env)
    if kill == "silent":  # Open MPI's heartbeat failure detector (off by default)
        env.update(OMPI_MCA_mpi_ft_detector="true", OMPI_MCA_mpi_ft_detector_period="0.5",
                   OMPI_MCA_mpi_ft_detector_timeout="2")
    job = Job(mpiexec, hosts, {"ALGO": algorithm, "AFTER": str(after), **env}, launcher=launcher)
    if not job.wait_for(r"HOSTS-STARTED rank \d", hosts):
        return job.finish(10), job.out, None, {}
    killed_at = job.lose(1, kill)
    if kill in ("ranks", "exit"):
        job.wait_for(r"HOSTS-OK rank \d", hosts - 1, timeout=60)
        if job.proc.poll() is None:  # not ended already (by Open MPI's runtime)
            job.end_lost_host(1)
    code = job.finish(60)
    ended = time.monotonic() - killed_at
    return code, job.out, ended, recovery(job.out, [r for r in range(hosts) if r != 1], killed_at)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.elastic_hosts", description=__doc__.split("\n")[0])
    p.add_argument("--mpiexec", required=True, help="Open MPI's mpiexec (the ranks run the Python beside it)")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--kill", choices=("ranks", "exit", "host", "silent"), default="ranks")
    p.add_argument("--out", help="a folder for each run's output")
    p.add_argument("--launcher", metavar="PRTERUN", help="launch with this PRRTE prterun (Open MPI's personality) "
                   "instead of --mpiexec, whose ranks still run")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set for the job (Open MPI's PRTE_MCA_*/OMPI_MCA_* parameters, the job's AFTER, COUNT)")
    args = p.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    print(f"# {args.hosts} hosts x 1 rank, {args.algorithm}, --kill {args.kill}; seconds; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}" + (f"; launcher {args.launcher}" if args.launcher else ""))
    print("run rank exit ended " + " ".join(PHASES) + " repeat ahead")
    for run in range(args.runs):
        env = dict(item.split("=", 1) for item in args.env)
        after = int(env.pop("AFTER", "10"))
        code, out, ended, found = run_once(args.mpiexec, args.hosts, args.algorithm, args.kill, after, env,
                                           args.launcher)
        if args.out:
            with open(os.path.join(args.out, f"run{run}.log"), "w") as log:
                log.write(out)
        ended = f"{ended:.2f}" if ended is not None else "-"
        if not found:
            print(f"{run} - {code} {ended} no survivor went on: {why_ended(out)}")
        for rank, r in sorted(found.items()):
            print(f"{run} {rank} {code} {ended} " + " ".join(f"{r[k]:.4f}" for k in PHASES)
                  + f" {r['repeat']} {r['ahead']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
