"""An emulated multi-host cluster on one machine, for trying algorithms on a two-level network.

    python -m benchmarks.cluster --hosts H --ranks-per-host K [--rate RATE] -- PROGRAM [ARGS...]

Each host is a Linux network namespace with its own host name, SysV IPC and a private /dev/shm
(a tmpfs that vanishes with the job), joined to the others by a veth link on a bridge; ``--rate``
shapes every host's link in both directions (tbf: ``500M`` is 500 Mbit/s; small packets such as
TCP's ACKs go ahead of bulk data in its queue; no delay emulation).
PROGRAM runs under MPICH's ``mpiexec`` (Hydra), or Open MPI's with ``--mpi openmpi`` (``--ft``:
with ULFM; ``--launcher``: another PRRTE's ``prterun`` for Open MPI's ranks;
benchmarks/cluster_openmpi.py), with K ranks per host, in rank order host by host
(K may be a comma list, one count per host: ``--hosts 3 --ranks-per-host 2,1,2``). Ranks of one
host talk through shared memory, ranks of different hosts over TCP on the links (UCX, every
message eagerly: ``UCX_RNDV_THRESH=inf`` unless the environment sets it), so MPI (and the
library) sees H nodes. The exit status is PROGRAM's (mpiexec's); 124 when ``--timeout`` ran out.

Everything is torn down on every exit path the tool controls (normal end, error, Ctrl-C, SIGTERM,
a killed job): the job's processes, namespaces, links, qdiscs, the bridge, the launcher script and
what an aborted job leaves in /tmp. Names carry this process's id, so two runs at once never
collide, and a run that was itself killed with SIGKILL is swept away by the next run (or by
``--cleanup``). Where hosts cannot be made (not root, no network namespaces) it says why in one
line and exits 77. See docs/clusters.md.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    from . import cluster_openmpi
except ImportError:  # run as a script
    import cluster_openmpi

CANNOT = 77
TIMED_OUT = 124
RUN_VARIABLE = "COLLECTIVES_CLUSTER_RUN"  # set for the job: its processes are found by it
_NAME = re.compile(r"^cl([0-9a-f]+)(?:h\d+|br)$")


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _tc(*args):
    proc = subprocess.run(["tc", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"tc {' '.join(args)}: {proc.stderr.strip()}")


def why_not(rate=None):
    """None where hosts can be made here; otherwise the reason, in one line."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "making hosts needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for network namespaces and mounts)"
    for tool in ("ip", "unshare") + (("tc",) if rate else ()):
        if shutil.which(tool) is None:
            return f"no `{tool}` command on PATH (iproute2 / util-linux)"
    probe = f"cl{os.getpid():x}h99"
    mounted = _netns_mounted()
    proc = subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        return f"cannot make a network namespace: {proc.stderr.strip() or 'ip netns add failed'}"
    subprocess.run(["ip", "netns", "del", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _unmount_netns(mounted)
    return None


def _unmount_netns(was_mounted):
    """`ip netns add` turns /run/netns into a mount point and leaves it; undone when it was not one
    before and no namespace is left in it."""
    try:
        if not was_mounted and _netns_mounted() and not os.listdir("/run/netns"):
            subprocess.run(["umount", "/run/netns"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale():
    """Remove namespaces and bridges of runs whose tool process is gone (killed with SIGKILL)."""
    removed = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1), 16)):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1), 16)):
            _ip("link", "del", name, check=False)
            removed.append(name)
    scratch = tempfile.gettempdir()
    for entry in os.listdir(scratch):
        match = re.match(r"^collectives-cluster-([0-9a-f]+)-", entry)
        if match and not _alive(int(match.group(1), 16)):
            shutil.rmtree(os.path.join(scratch, entry), ignore_errors=True)
            removed.append(os.path.join(scratch, entry))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from collectives import cleanup

    if removed:
        _unmount_netns(False)
    return removed + cleanup.remove_stale()  # what the dead runs' launchers left (Hydra's files)


def parse_ranks(text, hosts):
    try:
        counts = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--ranks-per-host takes a count or a comma list of counts, got {text!r}") from None
    if len(counts) == 1:
        counts *= hosts
    if len(counts) != hosts or min(counts) < 1:
        raise ValueError(f"--ranks-per-host: {hosts} counts of at least 1 needed, got {text!r}")
    return counts


def _rate_parts(text):
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?\s*", text.lower())
    if not match:
        raise ValueError(f"--rate takes bits per second like 500M or 1G, got {text!r}")
    return match.group(1), match.group(2)


def parse_rate(text):
    """'500M', '1G', '800k' (bits per second) or tc's own '500mbit' -> tc's rate."""
    number, unit = _rate_parts(text)
    return f"{number}{unit}bit"


def rate_bytes(text):
    """Bytes per second of a rate as ``parse_rate`` takes it (or gives it)."""
    number, unit = _rate_parts(text)
    return float(number) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[unit] / 8


def shaping(rate):
    """tc commands (kind, args... after ``dev DEVICE``) that shape one direction of a link to
    ``rate`` (tc's form, as parse_rate gives it).

    tbf holds the rate (a 256 KB burst; its queue, below, holds 20 ms of data at the rate). Under
    it, instead of tbf's one FIFO, an htb of two classes that never limit (10 Gbit/s or more;
    tbf does): IPv4 packets under 128 bytes (TCP's pure ACKs, small control messages) are sent before
    bulk data, and bulk data waits in a FIFO of 20 ms at the rate plus the burst (tbf's own limit).
    With one FIFO, an exchange's ACKs waited behind up to 20 ms of the other direction's data
    (a queue no data-centre link has) and two exchanges on one link lost part of its rate; with
    the ACKs first they take the link's time (docs/performance.md#emulated-cluster)."""
    bytes_per_s = rate_bytes(rate)
    burst = 256 * 1024
    fast = f"{int(max(10e9, 16 * bytes_per_s * 8))}bit"
    return [
        ("qdisc", "root", "handle", "1:", "tbf", "rate", rate, "burst", str(burst), "latency", "20ms"),
        ("qdisc", "parent", "1:1", "handle", "10:", "htb", "default", "20"),
        ("class", "parent", "10:", "classid", "10:10", "htb", "rate", fast, "burst", str(burst), "prio", "0"),
        ("class", "parent", "10:", "classid", "10:20", "htb", "rate", fast, "burst", str(burst), "prio", "1"),
        ("qdisc", "parent", "10:20", "bfifo", "limit", str(int(bytes_per_s * 0.020) + burst)),
        # the IPv4 header's total length (bytes 2-3) under 128
        ("filter", "parent", "10:", "protocol", "ip", "prio", "1", "u32", "match", "u16", "0", "0xff80", "at", "2",
         "flowid", "10:10"),
    ]


class _Lock:
    """A machine-wide lock with no file behind it (an abstract unix socket), held while a run picks
    its subnet, so that two runs starting at once never pick the same one."""

    def __enter__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock.bind("\0collectives-cluster-setup")
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("another cluster run held the set-up lock for 30 s") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        self.sock.close()


def _free_subnet():
    used = set(re.findall(r"inet 198\.18\.(\d+)\.", _ip("-4", "-o", "addr", "show")))
    for octet in range(256):
        if str(octet) not in used:
            return f"198.18.{octet}"
    raise RuntimeError("every 198.18.X.0/24 subnet is in use")


def _netns_mounted():
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == "/run/netns" for line in mounts if len(line.split()) > 1)


class Cluster:
    """H hosts (namespaces) with ``ranks`` ranks each; a context manager that tears down on exit."""

    def __init__(self, ranks, rate=None, mpi="mpich", ft=False):
        self.ranks = list(ranks)
        self.rate = rate
        self.mpi, self.ft = mpi, ft
        self.run_id = f"{os.getpid():x}"
        self.bridge = f"cl{self.run_id}br"
        self.hosts = [f"cl{self.run_id}h{i}" for i in range(len(self.ranks))]
        self.links = [f"cl{self.run_id}v{i}" for i in range(len(self.ranks))]
        self.addresses = []
        self.made = []  # (kind, name) in the order made, undone in reverse
        self.workdir = None
        self.mounted_before = _netns_mounted()
        self.litter_before = None

    def __enter__(self):
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()

    def _setup(self):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from collectives import cleanup

        self.litter_before = set(cleanup.candidates())
        sweep_stale()
        with _Lock():
            subnet = _free_subnet()
            self.subnet = f"{subnet}.0/24"
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made.append(("link", self.bridge))
            self.gateway = f"{subnet}.254"
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index, (host, link) in enumerate(zip(self.hosts, self.links)):
            address = f"{subnet}.{index + 1}"
            _ip("netns", "add", host)
            self.made.append(("netns", host))
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", host)
            self.made.append(("link", link))
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", host, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            _ip("-n", host, "link", "set", "lo", "up")
            if self.rate:
                for kind, *args in shaping(self.rate):
                    _tc("-n", host, kind, "add", "dev", "eth0", *args)
                    _tc(kind, "add", "dev", link, *args)
            self.addresses.append(address)
        self.workdir = tempfile.mkdtemp(prefix=f"collectives-cluster-{self.run_id}-")
        self.launcher = os.path.join(self.workdir, "launch-on-host")
        cases = "\n".join(f"    {address}) ns={host};;" for address, host in zip(self.addresses, self.hosts))
        with open(self.launcher, "w") as script:
            script.write(f"""#!/bin/sh
# Hydra calls this as it would call ssh: [options] HOST COMMAND...; run COMMAND on HOST's namespace
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
{cases}
    *) echo "launch-on-host: unknown host $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts --ipc --mount --propagation private \\
    sh -c "hostname $ns && mount -t tmpfs -o size=1g,mode=1777 $ns /dev/shm && exec $*"
""")
        os.chmod(self.launcher, 0o700)
        if self.mpi == "openmpi":
            self.launcher = os.path.join(self.workdir, "openmpi-agent")
            cluster_openmpi.write_agent(self.launcher, self.addresses, self.hosts)

    def command(self, program, mpiexec=None, launcher=None):
        mpiexec = mpiexec or _mpiexec()
        if self.mpi == "openmpi":
            return cluster_openmpi.command(mpiexec, self.launcher, self.addresses, self.ranks, self.subnet, program,
                                           self.ft, launcher)
        hosts = ",".join(f"{address}:{count}" for address, count in zip(self.addresses, self.ranks))
        return [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher, "-localhost", self.gateway,
                "-hosts", hosts, "-n", str(sum(self.ranks)), *program]

    def run(self, program, timeout=None, mpiexec=None, env=None, launcher=None):
        """Run ``program`` (a list) across the hosts; its exit status (124 past ``timeout``).
        ``launcher``: Open MPI only, a PRRTE ``prterun`` to launch with instead of ``mpiexec``."""
        full_env = dict(os.environ if env is None else env)
        full_env[RUN_VARIABLE] = self.run_id
        full_env.setdefault("UCX_NET_DEVICES", "eth0")  # traffic between hosts crosses the links
        # every message eagerly: over TCP, UCX's rendezvous now and then holds a message back for
        # another's whole transfer (docs/performance.md#emulated-cluster)
        full_env.setdefault("UCX_RNDV_THRESH", "inf")
        if self.mpi == "openmpi":
            full_env = cluster_openmpi.environment(full_env, mpiexec or _mpiexec(), os.path.join(self.workdir, "tmp"),
                                                   launcher)
        proc = subprocess.Popen(self.command(program, mpiexec, launcher), env=full_env)
        start = time.monotonic()
        empty_since = None
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if timeout is not None and now - start > timeout:
                    sys.stderr.write(f"benchmarks.cluster: the job ran past --timeout {timeout:g} s; ending it\n")
                    self.end_job(grace=0)
                    proc.wait()
                    return TIMED_OUT
                # Hydra's mpiexec can hang after every rank has ended, when a host's proxy became
                # unreachable (a network partition): once no process is left on any host, the job
                # is over, whatever the launcher thinks
                if any(self._host_pids(host) for host in self.hosts):
                    empty_since = None
                elif empty_since is None:
                    empty_since = now
                elif now - empty_since > 5:
                    sys.stderr.write("benchmarks.cluster: every process on the hosts has ended but mpiexec "
                                     "has not (a host was unreachable); ending it\n")
                    self.end_job(grace=0)
                    proc.wait()
                    return proc.returncode or 1
        finally:
            if proc.poll() is None:  # an exception (Ctrl-C) on the way out: the job goes too
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @staticmethod
    def _host_pids(host):
        return _ip("netns", "pids", host, check=False).split()

    def end_job(self, grace=3.0):
        from collectives import cleanup

        return cleanup.end_tagged(RUN_VARIABLE, self.run_id, grace=grace)

    def teardown(self):
        """Undo everything, in reverse; never raises (it runs on the way out of errors)."""
        try:
            self.end_job()
        except Exception:  # noqa: BLE001 - the rest of the teardown must run
            pass
        for kind, name in reversed(self.made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self.made = []
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        _unmount_netns(self.mounted_before)
        if self.litter_before is not None:
            from collectives import cleanup

            cleanup.remove_stale(set(cleanup.candidates()) - self.litter_before, settle=3.0)


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def _raise_on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    program = []
    if "--" in argv:
        cut = argv.index("--")
        argv, program = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n")[0],
                                epilog="everything after -- is the program to run on the hosts")
    p.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    p.add_argument("--ranks-per-host", default="2", help="ranks per host, or a comma list (one per host)")
    p.add_argument("--rate", help="shape every host link to this rate, bits per second (500M, 1G)")
    p.add_argument("--timeout", type=float, help="end the job after this many seconds (exit 124)")
    p.add_argument("--mpiexec", help="the MPI library's mpiexec (default: next to this Python, else on PATH)")
    p.add_argument("--mpi", choices=("mpich", "openmpi"), default="mpich", help="whose launcher: MPICH's Hydra "
                   "(default) or Open MPI's (PRRTE)")
    p.add_argument("--ft", action="store_true", help="Open MPI: launch with ULFM (--with-ft ulfm --mca pml ob1 "
                   "--mca btl tcp,self), as COLLECTIVES_ON_ERROR=shrink needs")
    p.add_argument("--launcher", metavar="PRTERUN", help="Open MPI: launch with this PRRTE prterun (with Open MPI's "
                   "personality) instead of --mpiexec, whose ranks and Python it still runs (docs/clusters.md)")
    p.add_argument("--cleanup", action="store_true", help="only remove what runs killed with SIGKILL left")
    args = p.parse_args(argv)
    if args.cleanup:
        reason = why_not()
        if reason:
            print(f"benchmarks.cluster: {reason}", file=sys.stderr)
            return CANNOT
        for name in sweep_stale():
            print(f"removed {name}")
        return 0
    if args.hosts < 1:
        p.error("--hosts must be at least 1")
    if args.ft and args.mpi != "openmpi":
        p.error("--ft is Open MPI's ULFM launch: give --mpi openmpi too")
    if args.launcher and args.mpi != "openmpi":
        p.error("--launcher is a PRRTE prterun for Open MPI's ranks: give --mpi openmpi too")
    if not program:
        p.error("no program: put it after --, e.g. -- python -m benchmarks.allreduce_perf -b 1M -e 16M")
    try:
        ranks = parse_ranks(args.ranks_per_host, args.hosts)
        rate = parse_rate(args.rate) if args.rate else None
    except ValueError as exc:
        p.error(str(exc))
    reason = why_not(rate)
    if reason:
        print(f"benchmarks.cluster: cannot make hosts here: {reason}", file=sys.stderr)
        return CANNOT
    # SIGINT too: a tool started in the background by a shell inherits it ignored, and must still
    # tear down when it is sent one
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_on_signal)
    try:
        with Cluster(ranks, rate, args.mpi, args.ft) as cluster:
            return cluster.run(program, timeout=args.timeout, mpiexec=args.mpiexec, launcher=args.launcher)
    except KeyboardInterrupt:
        print("benchmarks.cluster: interrupted; torn down", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"benchmarks.cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
