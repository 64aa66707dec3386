"""Run every test layer and print one summary: the README's test command ends here.

1. single-process tests (threaded worlds, simulator, TensorFlow, GPU skips): plain pytest;
   then the import contracts (``lint-imports``, setup.cfg) and the documentation site,
   ``mkdocs build --strict``;
2. multi-process tests under ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4,
   under MPICH (this environment), then under Open MPI (the PyPI wheel in an environment of
   its own, made once under ~/.cache/collectives/test-envs, see tests/mpi_envs.py), then under
   Intel MPI where it is installed; a library that cannot be had skips its layers with the reason.

Each layer runs under an outer timeout, so a hang anywhere ends as a failure, never a stuck CI.
Every layer runs with TMPDIR set to a directory of its own (removed at the end), and what MPI
jobs that were aborted or killed left in /dev/shm and /tmp is removed after each layer
(``collectives.cleanup``); /dev/shm and /tmp are listed before and after the whole run, and
an MPI library's entry the suite's jobs left behind (new, named as that library names them, used
by no running process) fails the run; entries other processes make meanwhile are listed only.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]
import mpi_envs  # noqa: E402
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed|deselected)")


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


# mpiexec -prepend-rank puts "[R] " before every chunk a rank writes, not only at line starts;
# the ranks' chunks interleave, even within one line ("[1] 5 passed in 1.0s[0] 5 passed in 1.1s[1] ")
RANK_CHUNK = re.compile(r"\[(\d+)\] ")
PYTEST_SUMMARY = re.compile(r"((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s")


# Open MPI's --output tag labels every line: "[1,0]<stdout>: text"
TAGGED_LINE = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>: ?(.*)$", re.M)


def rank_output(output, rank):
    """One rank's own output, rebuilt from its prefixed chunks wherever they fall in ``output``."""
    if TAGGED_LINE.search(output):
        return "\n".join(text for who, text in TAGGED_LINE.findall(output) if int(who) == rank)
    parts = RANK_CHUNK.split(output)
    return "".join(text for who, text in zip(parts[1::2], parts[2::2]) if int(who) == rank)


def parse_counts(output, rank=None):
    """passed/failed/skipped from the last pytest summary line of ``output`` (of ``rank``'s
    output alone for a job run with -prepend-rank); zeros when there is none."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    lines = output.splitlines()
    if rank is not None:
        # the rank's own stream; then, should a rank's text look like a prefix ("SKIPPED [1] ..."),
        # any "[R] <summary>" anywhere in a line
        lines = rank_output(output, rank).splitlines()
        lines = [m.group(1) for m in re.finditer(rf"\[{rank}\] ({PYTEST_SUMMARY.pattern})", output)] + lines
    for line in reversed(lines):
        match = PYTEST_SUMMARY.search(line)
        if match and re.search(r"\d+ (passed|failed|error)", match.group(1)):
            for number, kind in SUMMARY.findall(match.group(1)):
                kind = {"error": "failed", "errors": "failed"}.get(kind, kind)
                if kind in counts:
                    counts[kind] += int(number)
            break
    return counts


def litter_dirs():
    return [d for d in ("/dev/shm", "/tmp") if os.path.isdir(d)]


def snapshot():
    return {d: set(os.listdir(d)) for d in litter_dirs()}


def own_litter(libraries_before, tmpdir):
    """What the suite's own jobs left: its TMPDIR if it could not be removed, and the MPI
    libraries' named entries in /dev/shm and /tmp (collectives.cleanup knows their names) that
    appeared during the run and that no running process uses. Entries other processes on the
    machine make meanwhile are not the suite's and do not fail it."""
    from collectives import cleanup

    new = set(cleanup.candidates()) - libraries_before
    used = cleanup.in_use() if new else set()
    left = sorted(path for path in new if path not in used)
    if os.path.exists(tmpdir):
        left.append(tmpdir)
    return left


def run(label, cmd, timeout, rank=None, tmpdir=None, extra_env=None):
    print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLLECTIVES_TEST_LAYER=f"{os.getpid()}-{label}",
               **(extra_env or {}))
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        output, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        output += f"\n{label}: TIMED OUT after {timeout} s\n"
        code = 124
    sys.stdout.write(output)
    # MPI launchers start ranks in sessions of their own: a layer that timed out (or aborted) can
    # leave them running; they are found by the variable set for the layer and ended
    from collectives import cleanup

    killed = cleanup.end_tagged("COLLECTIVES_TEST_LAYER", env["COLLECTIVES_TEST_LAYER"])
    if killed:
        print(f"=== {label}: ended {len(killed)} processes left running", flush=True)
    counts = parse_counts(output, rank)
    if code != 0 and counts["failed"] == 0:
        counts["failed"] = 1  # a crash, an abort or a timeout counts as a failure
    print(f"=== {label}: exit {code}, {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, {time.monotonic() - start:.0f} s", flush=True)
    return counts


def mpi_layers(python, launcher, ns, paths, timeout, library=None):
    """Layers ``mpiexec -n N python -m mpi4py -m pytest PATHS`` under ``python``'s MPI library."""
    if library is None:
        try:
            library = mpi_envs.library_of(python)
        except Exception as exc:  # noqa: BLE001 - reported as the layer's failure below
            return [(f"mpiexec ({python})", None, f"mpi4py cannot load an MPI library: {exc}", True)]
    kind = "openmpi" if "Open MPI" in library else "hydra"
    from collectives.mpilib import describe, identify

    name = describe(identify(library))
    layers = []
    for n in ns:
        cmd = [launcher] + mpi_envs.launcher_args(kind, n) + [python, "-m", "mpi4py", "-m", "pytest", "-q", "--color=no", "-p",
                                                             "no:cacheprovider"] + paths
        label = f"{name}: mpiexec -n {n}" + (" (TensorFlow)" if paths == ["tests/tf_mpi"] else "")
        layers.append((label, cmd, timeout, mpi_envs.launch_env(kind)))
    return layers


def other_library_layers(kind, log=print):
    """Open MPI (made here if need be) or Intel MPI (where installed): its layers, or a skip."""
    if kind == "openmpi":
        python, reason = mpi_envs.make("openmpi", log)
        paths, label = OPENMPI_TESTS, "Open MPI"
    else:
        python, reason = mpi_envs.impi_python()
        paths, label = IMPI_TESTS, "Intel MPI"
    if python is None:
        return [(f"{label} layers", None, reason, False)]
    launcher = os.path.join(os.path.dirname(python), "mpiexec")
    try:
        library = mpi_envs.library_of(python)
    except Exception as exc:  # noqa: BLE001
        return [(f"{label} layers", None, f"mpi4py in {python} cannot load an MPI library: {exc}", True)]
    if label.split()[0] not in library:
        return [(f"{label} layers", None, f"{python}'s mpi4py loads {library}, not {label}", True)]
    return mpi_layers(python, launcher, (1, 2, 3, 4) if kind == "openmpi" else (2, 4), paths, 600, library)


# Lean layers under the other libraries: the algorithms against native, reliability (timeouts,
# aborts, mismatches), the tuner and auto's calibration, the library facts; the benchmark and plug-in tests are
# library-agnostic Python and run under MPICH
OPENMPI_TESTS = ["tests/mpi/test_mpi_allreduce.py", "tests/mpi/test_mpi_reliability.py",
                 "tests/mpi/test_mpi_tune.py", "tests/mpi/test_mpi_library.py", "tests/mpi/test_mpi_transport.py",
                 "tests/mpi/test_mpi_nonblocking.py", "tests/mpi/test_mpi_autotune.py", "tests/mpi/test_mpi_bound.py"]
IMPI_TESTS = OPENMPI_TESTS


def docs_layer(python):
    """The documentation site: ``mkdocs build --strict`` (a broken link, anchor or API reference
    fails it), into site/ in the checkout (ignored by git). A pass counts one test."""
    return ("docs: mkdocs build --strict", [python, "-m", "mkdocs", "build", "--strict", "--site-dir",
                                             os.path.join(ROOT, "site")], 600, {"NO_MKDOCS_2_WARNING": "1"})


def imports_layer(python):
    """Imports point one way: the import-linter contracts of setup.cfg (``lint-imports``). A pass
    counts one test."""
    return ("imports: lint-imports", [python, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                                                    "sys.exit(lint_imports_command())"], 300, None)


def main(argv):
    if "--make-impi" in argv:
        python, reason = mpi_envs.make("impi")
        print(python or reason)
        return 0 if python else 1
    python = sys.executable
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    layers = [("single-process", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
                                  "--ignore=tests/mpi", "--ignore=tests/tf_mpi"] + argv, 2400, None),
              imports_layer(python), docs_layer(python)]
    launcher = mpiexec()
    if launcher is None:
        print("no mpiexec found: install the package with its MPICH (pip install -e '.[mpich]'), "
              "or put your MPI's mpiexec on PATH", flush=True)
        totals["failed"] += 1
    else:
        layers += mpi_layers(python, launcher, (1, 2, 3, 4), ["tests/mpi"], 600)
        if os.path.isdir(os.path.join(ROOT, "tests", "tf_mpi")):
            layers += mpi_layers(python, launcher, (2,), ["tests/tf_mpi"], 900)
    layers += ["openmpi", "impi"]  # made (or found) when their turn comes
    from collectives import cleanup

    before = snapshot()
    libraries_before = set(cleanup.candidates())
    tmpdir = tempfile.mkdtemp(prefix="collectives-tests-")
    os.environ["TMPDIR"] = tmpdir  # also for pip making the Open MPI environment, and Open MPI's singletons
    try:
        while layers:
            layer = layers.pop(0)
            if isinstance(layer, str):
                layers[:0] = other_library_layers(layer)
                continue
            label, cmd, timeout, extra = layer
            if cmd is None:  # a library that cannot be had: (label, None, reason, failed) skips or fails
                reason, failed = timeout, extra
                print(f"\n=== {label}: {'FAILED' if failed else 'skipped'}: {reason}", flush=True)
                totals["failed" if failed else "skipped"] += 1
                continue
            known = set(cleanup.candidates())
            counts = run(label, cmd, timeout, None if label == "single-process" else 0, tmpdir, extra)
            if label.startswith(("docs:", "imports:")) and not any(counts.values()):
                counts["passed"] = 1  # mkdocs and lint-imports print no pytest summary: exit 0 is one pass
            removed = cleanup.remove_stale(set(cleanup.candidates()) - known, settle=3.0)
            if removed:
                print(f"=== {label}: removed {len(removed)} entries its aborted MPI jobs left: "
                      f"{', '.join(removed)}", flush=True)
            for key in totals:
                totals[key] += counts[key]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    after = snapshot()
    left = own_litter(libraries_before, tmpdir)
    others = sorted(os.path.join(d, name) for d in after for name in after[d] - before.get(d, set())
                    if os.path.join(d, name) not in left)
    print(f"\n/dev/shm and /tmp: {sum(map(len, before.values()))} entries before, "
          f"{sum(map(len, after.values()))} after" + (f"; left behind by the suite: {', '.join(left)}" if left else "")
          + (f"; new but not the suite's (other processes' or in use): {', '.join(others)}" if others else ""))
    if left:
        totals["failed"] += 1
    print(f"\nsummary: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if totals["failed"] or not totals["passed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
