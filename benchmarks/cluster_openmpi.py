"""Open MPI's launcher into the emulated cluster's hosts (``python -m benchmarks.cluster --mpi openmpi``).

Open MPI 5's ``mpiexec`` (PRRTE) starts one daemon (``prted``) per host through its ssh agent
(the MCA parameter ``plm_ssh_agent``), which it calls as it would call ssh: ``AGENT [options]
HOST COMMAND...``, COMMAND being shell text (``PRTE_PREFIX=...; export PRTE_PREFIX; ...
prted ...``). The agent written here maps HOST (a host's address) to its namespace and has a
shell there run that text, after giving the host its name and a private /dev/shm, as the
Hydra script of benchmarks/cluster.py does; the shell must ``eval`` the text (it is a command
list, not one command to ``exec``). The daemons then connect back to ``mpiexec`` over the
bridge, and start the ranks of their host.

Every daemon is started by ``mpiexec`` itself (``plm_ssh_no_tree_spawn``: a daemon inside a host
need not reach the others' namespaces), the runtime's own connections and the TCP transport
are kept to the cluster's subnet (``oob_tcp_if_include``, ``btl_tcp_if_include``: the only
interface a host has besides loopback is its link, and ``mpiexec`` sits on the bridge).
``--ft`` adds the launch ULFM needs (COLLECTIVES_ON_ERROR=shrink, docs/reliability.md).

``--launcher PRTERUN`` launches with another PRRTE's ``prterun`` (PRRTE's main branch, which
survives a lost daemon: benchmarks/build_prrte_main.sh) instead of Open MPI's own ``mpiexec``,
with Open MPI's personality (``--personality ompi``: the same options and ``--with-ft ulfm``
directives); the ranks are still Open MPI's (the Python beside ``--mpiexec``), found through
``OPAL_PREFIX``, and each host runs that PRRTE's ``prted``.
"""
import os

# the launch the library's elastic mode is tested with (docs/reliability.md)
FT_ARGS = ("--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self")
# PRRTE's main branch tells the other ranks of a rank's non-zero exit (PMIX_ERR_EXIT_NONZERO_TERM),
# an event Open MPI 5.0.11's ULFM does not handle: every survivor would abort (docs/clusters.md#prrte-main)
FT_LAUNCHER_ARGS = ("--prtemca", "state_base_error_non_zero_exit", "0")


def write_agent(path, addresses, hosts):
    """Write the ssh agent that runs a daemon's command inside its host's namespaces."""
    cases = "\n".join(f"    {address}) ns={host};;" for address, host in zip(addresses, hosts))
    with open(path, "w") as script:
        script.write(f"""#!/bin/sh
# PRRTE calls this as it would call ssh: [options] HOST COMMAND...; run COMMAND on HOST's namespace
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
{cases}
    *) echo "openmpi-agent: unknown host $host" >&2; exit 255;;
esac
ip netns exec "$ns" unshare --uts --ipc --mount --propagation private \\
    sh -c 'hostname "$1" && mount -t tmpfs -o size=1g,mode=1777 "$1" /dev/shm && shift && eval "$*"' agent "$ns" "$@"
status=$?
# the host's daemon ended by a signal: the host was killed. ssh to a crashed host does not return
# (its connection just goes silent), and mpiexec ends the whole job when an ssh ends abnormally
[ $status -gt 128 ] && exec sleep 86400
exit $status
""")
    os.chmod(path, 0o700)


def command(mpiexec, agent, addresses, ranks, subnet, program, ft=False, launcher=None):
    """The ``mpiexec`` command line that runs ``program`` with ``ranks[i]`` ranks on host i
    (``launcher``: a PRRTE ``prterun`` in its place, with Open MPI's personality)."""
    hosts = ",".join(f"{address}:{count}" for address, count in zip(addresses, ranks))
    start = [launcher, "--personality", "ompi"] if launcher else [mpiexec]
    return [*start, "--host", hosts, "-n", str(sum(ranks)),
            "--prtemca", "plm_ssh_agent", agent, "--prtemca", "plm_ssh_no_tree_spawn", "1",
            # PRRTE's main branch names oob_tcp_if_include prte_if_include (and warns at each daemon)
            "--prtemca", "prte_if_include" if launcher else "oob_tcp_if_include", subnet,
            "--mca", "btl_tcp_if_include", subnet,
            *(FT_ARGS if ft else ()), *(FT_LAUNCHER_ARGS if ft and launcher else ()), *program]


def environment(env, mpiexec, tmpdir, launcher=None):
    """``env`` for an Open MPI job: as root (the tool runs as root), with ``mpiexec``'s folder
    first on PATH so that each host's shell finds ``prted``, and TMPDIR ``tmpdir`` (the run's
    own, removed with it): the session directories of ``mpiexec`` and of a daemon that was
    killed (``ompi.PID``, ``prted.PID``) would otherwise stay in /tmp. With ``launcher`` (another
    PRRTE's ``prterun``), its folder goes first instead (its own ``prted``), and ``OPAL_PREFIX``
    names Open MPI's installation (the folder above ``mpiexec``'s), which Open MPI's ``mpiexec``
    wrapper would otherwise set for the ranks."""
    env = dict(env)
    os.makedirs(tmpdir, exist_ok=True)
    env["TMPDIR"] = tmpdir
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    first = launcher or mpiexec
    env["PATH"] = os.path.dirname(os.path.abspath(first)) + os.pathsep + env.get("PATH", "")
    if launcher:
        env.setdefault("OPAL_PREFIX", os.path.dirname(os.path.dirname(os.path.abspath(mpiexec))))
        for name in ("PRTE_PREFIX", "PMIX_PREFIX"):  # Open MPI's own PRRTE and PMIx must not be looked for
            env.pop(name, None)
    return env
