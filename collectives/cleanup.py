"""Find and remove what dead MPI jobs left on this machine.

An MPI job that ends normally removes its shared-memory segments; one that is aborted
(``MPI_Abort``) or killed leaves them: MPICH's ``/dev/shm/mpich_shm_*`` (about 3 MB each),
UCX's ``/dev/shm/ucx_shm_posix_*``, Open MPI's ``/dev/shm/vader_segment.*``, ``ompi.*`` and
``sm_segment.*``, and Hydra's (MPICH's ``mpiexec``) topology file ``/tmp/hydra_hwloc_xmlfile_*``.
A node that runs many failing jobs fills up with them.

An entry is stale when no running process maps it, holds it open or names it on its command
line (Hydra's proxies name their topology file there); only stale entries are removed, so
running jobs are never touched.

    python -m collectives.cleanup            # remove stale entries, print what was removed
    python -m collectives.cleanup --dry-run  # only list them

Linux only (it reads /proc). Run it as the user who ran the jobs (or root).
"""
import argparse
import os
import sys

SHM_DIR = "/dev/shm"
TMP_DIR = "/tmp"
SHM_PREFIXES = ("mpich_shm_", "ucx_shm_posix_", "vader_segment.", "sm_segment.", "ompi.", "psm2_shm.")
TMP_PREFIXES = ("hydra_hwloc_xmlfile_",)


def candidates():
    """Paths of every entry this module knows an MPI job may leave behind."""
    found = []
    for directory, prefixes in ((SHM_DIR, SHM_PREFIXES), (TMP_DIR, TMP_PREFIXES)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found += [os.path.join(directory, name) for name in names if name.startswith(prefixes)]
    return sorted(found)


def in_use():
    """Paths that a running process maps, holds open or names on its command line."""
    used = set()
    try:
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit()]
    except OSError:  # pragma: no cover - not Linux
        return used
    for pid in pids:
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(None, 5)[5:]
                    if path and path[0].startswith(SHM_DIR):
                        used.add(path[0].split(" (deleted)")[0])
        except (OSError, IndexError):
            pass
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    used.add(os.readlink(f"{base}/fd/{fd}"))
                except OSError:
                    pass
        except OSError:
            pass
        try:
            with open(f"{base}/cmdline", "rb") as cmdline:
                used.update(arg.decode(errors="replace") for arg in cmdline.read().split(b"\0") if arg)
        except OSError:
            pass
    return used


def stale(among=None):
    """Entries left by MPI jobs that no running process uses (of ``among``, if given)."""
    paths = candidates() if among is None else sorted(set(among) & set(candidates()))
    if not paths:
        return []
    used = in_use()
    return [path for path in paths if path not in used]


def remove_stale(among=None, settle=0.0):
    """Remove the stale entries (of ``among``, if given); returns the paths removed. With
    ``settle`` (seconds), entries of ``among`` still in use are tried again until then: a process
    that has just exited can keep its mappings for a moment."""
    import time

    removed = []
    deadline = time.monotonic() + settle
    while True:
        for path in stale(among):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
        left = [path for path in (among or ()) if os.path.exists(path)]
        if not left or time.monotonic() >= deadline:
            return removed
        time.sleep(0.1)


def tagged_processes(name, value):
    """PIDs of the running processes whose environment holds ``name=value``. MPI launchers put
    their proxies and ranks in sessions of their own, so a job's processes are found by a
    variable set for the job (it is inherited by everything the launcher starts)."""
    needle = f"{name}={value}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def end_tagged(name, value, grace=5.0):
    """Wait up to ``grace`` seconds for the processes tagged ``name=value`` to exit, kill what
    is left (SIGKILL), and wait for them to be gone; returns the PIDs that had to be killed."""
    import signal
    import time

    deadline = time.monotonic() + grace
    while tagged_processes(name, value) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = tagged_processes(name, value)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while tagged_processes(name, value) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m collectives.cleanup", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="list the stale entries, remove nothing")
    args = parser.parse_args(argv)
    paths = stale() if args.dry_run else remove_stale()
    for path in paths:
        print(("stale " if args.dry_run else "removed ") + path)
    total = sum(1 for _ in paths)
    print(f"{total} {'stale' if args.dry_run else 'removed'} entr{'y' if total == 1 else 'ies'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
