"""A watchdog process: it ends this process, with a message, when a stage outlives its bound.

For waits no Python thread can watch (TensorFlow's start-up holds Python's lock while it waits).
The watchdog is a small Python process reading a pipe from this one: the pipe closing (the stage
ended, or this process did) lets it go quietly; the bound passing first makes it print the message
and, GRACE seconds later (time for the other ranks' watchdogs, started with this one, to print
theirs), end this process with SIGKILL, which ends an MPI job.
"""
import os
import subprocess
import sys

GRACE = 1.0  # seconds between the message and the end of the process

_SCRIPT = """
import os, select, signal, sys, time
pid, limit, grace, message = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if not select.select([sys.stdin], [], [], limit)[0]:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    if not select.select([sys.stdin], [], [], grace)[0]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""


class Watchdog:
    """``with Watchdog(seconds, message):`` the block must end within ``seconds`` (0: no bound)."""

    def __init__(self, seconds, message):
        self.seconds, self.message, self.proc = seconds, message, None

    def __enter__(self):
        if self.seconds:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _SCRIPT, str(os.getpid()),
                                          repr(float(self.seconds)), repr(GRACE), self.message],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
            self.proc = None
