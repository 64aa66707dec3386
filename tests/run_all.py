"""Run every test layer and print one summary: the README's test command ends here.

1. single-process tests (threaded worlds, simulator, TensorFlow, GPU skips): plain pytest;
2. multi-process tests under ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``, N = 1..4.

Each layer runs under an outer timeout, so a hang anywhere ends as a failure, never a stuck CI.
Every layer runs with TMPDIR set to a directory of its own (removed at the end), and what MPI
jobs that were aborted or killed left in /dev/shm and /tmp is removed after each layer
(``collectives.cleanup``); /dev/shm and /tmp are listed before and after the whole run, and
an entry left behind fails the run.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed|deselected)")


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


# mpiexec -prepend-rank puts "[R] " before every chunk a rank writes, not only at line starts;
# the ranks' chunks interleave, even within one line ("[1] 5 passed in 1.0s[0] 5 passed in 1.1s[1] ")
RANK_CHUNK = re.compile(r"\[(\d+)\] ")
PYTEST_SUMMARY = re.compile(r"((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s")


def rank_output(output, rank):
    """One rank's own output, rebuilt from its prefixed chunks wherever they fall in ``output``."""
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


def run(label, cmd, timeout, rank=None, tmpdir=None):
    print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLLECTIVES_TEST_LAYER=f"{os.getpid()}-{label}")
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


def main(argv):
    python = sys.executable
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    layers = [("single-process", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
                                  "--ignore=tests/mpi", "--ignore=tests/tf_mpi"] + argv, 2400, None)]
    launcher = mpiexec()
    if launcher is None:
        print("no mpiexec found: install the package (pip install -e .) to get MPICH", flush=True)
        totals["failed"] += 1
    else:
        for n in (1, 2, 3, 4):
            layers.append((f"mpiexec -n {n}", [launcher, "-prepend-rank", "-n", str(n), python, "-m", "mpi4py",
                                                "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/mpi"],
                           600, 0))
        if os.path.isdir(os.path.join(ROOT, "tests", "tf_mpi")):
            layers.append(("mpiexec -n 2 (TensorFlow)", [launcher, "-prepend-rank", "-n", "2", python, "-m",
                                                         "mpi4py", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                         "tests/tf_mpi"], 900, 0))
    sys.path.insert(0, ROOT)
    from collectives import cleanup

    before = snapshot()
    tmpdir = tempfile.mkdtemp(prefix="collectives-tests-")
    try:
        for label, cmd, timeout, rank in layers:
            known = set(cleanup.candidates())
            counts = run(label, cmd, timeout, rank, tmpdir)
            removed = cleanup.remove_stale(set(cleanup.candidates()) - known)
            if removed:
                print(f"=== {label}: removed {len(removed)} entries its aborted MPI jobs left: "
                      f"{', '.join(removed)}", flush=True)
            for key in totals:
                totals[key] += counts[key]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    after = snapshot()
    left = sorted(os.path.join(d, name) for d in after for name in after[d] - before.get(d, set()))
    print(f"\n/dev/shm and /tmp: {sum(map(len, before.values()))} entries before, "
          f"{sum(map(len, after.values()))} after" + (f"; left behind: {', '.join(left)}" if left else ""))
    if left:
        totals["failed"] += 1
    print(f"\nsummary: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if totals["failed"] or not totals["passed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
