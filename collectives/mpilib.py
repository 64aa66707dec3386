"""The MPI library this process runs on, and the facts about it the library depends on.

- ``load()``: ``mpi4py.MPI``, or one ``ImportError`` naming both ways to get an MPI library
  (the embedded MPICH extra, or the cluster's own MPI) when none can be loaded.
- ``identify(text)`` / ``library()``: ("MPICH" | "Open MPI" | "Intel MPI" | first word, version),
  from ``MPI_Get_library_version``; ``describe()`` the two as one string ("Open MPI 5.0.11").
- ``node_cores()`` / ``ranks_per_core()``: oversubscription judged from the cores of the node
  available to the job (the cgroup's cpuset), never from one rank's affinity mask: Open MPI and
  Intel MPI pin each rank to a core of its own, which reads as one core.
- ``eager_limit()``: the largest message the library sends eagerly between ranks of one node,
  for this library only: measured with ``python -m collectives.protocol`` (``tune`` records it
  in the tuning table); where nothing was measured for it, the figure measured here for the same
  library and version; otherwise 0 (no splitting).

Nothing here imports mpi4py until asked for.
"""
import os
import re

from . import tuning

INSTALL_HELP = (
    "collectives needs an MPI library for mpi4py to load, and none could be loaded ({cause}). Either:\n"
    "  - install the embedded MPICH from PyPI: pip install 'collectives[mpich]' (from a checkout: "
    "pip install -e '.[mpich]'), which brings mpiexec; or\n"
    "  - use your cluster's own MPI: load it (module load openmpi / intel-mpi / mpich) or put its "
    "libmpi on LD_LIBRARY_PATH, and check with: python -c \"from mpi4py import MPI; "
    "print(MPI.Get_library_version())\" (README: Using a cluster's own MPI).\n"
    "Without MPI, collectives.run_threaded and the simulator still work.")


def load():
    """``mpi4py.MPI``; an ImportError naming both ways to an MPI library where none loads."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        if getattr(exc, "name", None) in ("mpi4py", "mpi4py.MPI") or "mpi4py" in str(exc):
            raise ImportError(INSTALL_HELP.format(cause=f"mpi4py: {exc}")) from exc
        raise
    except RuntimeError as exc:  # mpi4py 4: "cannot load MPI library", then each path it tried
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        tried = [line.split(":")[0] for line in lines if "cannot load MPI library" not in line]
        cause = "cannot load MPI library" + (f"; tried {', '.join(tried)}" if tried else "")
        raise ImportError(INSTALL_HELP.format(cause=f"mpi4py: {cause}")) from exc
    return MPI


_NAMES = (("Intel(R) MPI", "Intel MPI"), ("Open MPI", "Open MPI"), ("MPICH", "MPICH"),
          ("MVAPICH", "MVAPICH"))


def identify(text):
    """(name, version) of the MPI library whose ``MPI_Get_library_version`` string is ``text``."""
    text = text or ""
    name = next((short for key, short in _NAMES if key in text), None)
    if name is None:
        words = text.split()
        name = words[0] if words else "unknown"
    version = ""
    patterns = {"MPICH": r"MPICH Version:\s*([\w.]+)", "Open MPI": r"Open MPI v([\w.]+)",
                "Intel MPI": r"Intel\(R\) MPI Library ([\w.]+)", "MVAPICH": r"MVAPICH2? Version:\s*([\w.]+)"}
    match = re.search(patterns.get(name, r"(\d+(?:\.\d+)+)"), text)
    if match:
        version = match.group(1)
    elif name == "MPICH":  # some MPICH derivatives print "MPICH 4.2.0" on one line
        match = re.search(r"MPICH\s+(\d+(?:\.\d+)+)", text)
        version = match.group(1) if match else ""
    return name, version


_library = None


def library():
    """(name, version) of the MPI library mpi4py loaded in this process."""
    global _library
    if _library is None:
        _library = identify(load().Get_library_version())
    return _library


def describe(lib=None):
    name, version = lib or library()
    return f"{name} {version}".strip()


# --------------------------------------------------------------------------- cores of the node

def _parse_cpu_list(text):
    """Count the CPUs of a Linux list such as "0-3,6,8-9"."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def _cgroup_cpuset():
    """CPUs of this process's cgroup cpuset (v2, then v1), or None where it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidates = [f"/sys/fs/cgroup{path}/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset.cpus.effective"]
        elif "cpuset" in controllers.split(","):
            candidates = [f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus",
                          "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"]
        else:
            continue
        for where in candidates:
            try:
                with open(where) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text:
                return _parse_cpu_list(text)
    return None


def node_cores():
    """Cores of this node available to the job: the cgroup's cpuset (what a batch system or a
    container grants), else the node's online CPUs; never fewer than this rank's own mask. A
    rank's mask alone is not it: launchers that pin give every rank a core of its own."""
    try:
        own = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        own = 1
    cores = _cgroup_cpuset() or os.cpu_count() or own
    return max(cores, own, 1)


LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE",
                        "SLURM_NTASKS_PER_NODE")


def local_ranks(environ=None):
    """Ranks of this job on this node, from the launcher's environment (MPICH and Intel MPI's
    Hydra: MPI_LOCALNRANKS; Open MPI: OMPI_COMM_WORLD_LOCAL_SIZE; PMI, Slurm); 0 when unknown."""
    environ = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARIABLES:
        value = (environ.get(name) or "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 0


def ranks_per_core(environ=None, cores=None):
    """Ranks of this job on this node per core available to it (above 1: oversubscribed);
    0 when the launcher does not say how many ranks share the node."""
    ranks = local_ranks(environ)
    if not ranks:
        return 0
    return ranks / max(1, node_cores() if cores is None else cores)


# --------------------------------------------------------------------------- eager limit

# Measured here with ``mpiexec -n 2 python -m collectives.protocol`` (ranks on one node): the
# largest message each library sent without a handshake (docs/performance.md#eager-limits).
# Keyed by (library, version); a version not listed has no figure until measured (tune records one).
MEASURED_EAGER_LIMITS = {
    ("MPICH", "5.0.2"): 8000,
    ("Open MPI", "5.0.11"): 3968,
    ("Intel MPI", "2021.18.1"): 0,  # no handshake step found: nothing to split
}


def eager_limit(lib=None):
    """The eager limit in bytes for this library (see the module docstring); 0 where unknown."""

    lib = lib or library()
    recorded = tuning.eager_limit(describe(lib))
    if recorded is not None:
        return recorded
    return MEASURED_EAGER_LIMITS.get(tuple(lib), 0)
