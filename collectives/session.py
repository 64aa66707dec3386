"""The session: everything the library holds for one communicator, freed with it.

A communicator (``Communicator.session``) owns one: its prepared programs (small messages and
mid-size calls bound to their buffers, over its transport), the bound calls a repeated call
looks up (the call pipeline's fast path, collectives/pipeline.py), the executor's scratch (one buffer per backend and dtype, shared by every algorithm)
and the shared windows of its shared-memory paths. Nothing of a communicator lives in
module-level caches or in other modules' attributes on it: ``close()`` (run when the
communicator is released) frees the windows and drops the rest.

Plans are pure data that depend on the call's shape (algorithm, world size, rank, count, item
size, options), never on a communicator, so every session shares one bounded store of them:
threaded worlds made per call (``run_threaded``) and split communicators reuse them.
"""
import itertools
import threading
import weakref
from collections import OrderedDict

CACHE_SIZE = 512  # plans and programs kept per communicator (least recently used dropped)

_sessions = weakref.WeakSet()  # every live session, for clear_caches()
_plans = OrderedDict()  # plan key -> Plan, shared by every session (plans hold no communicator)
_plans_lock = threading.Lock()  # threaded worlds and progress threads share the store


class Session:
    __slots__ = ("programs", "shapes", "last", "choices", "scratch", "windows", "picks", "calls", "__weakref__")

    def __init__(self):
        self.programs = OrderedDict()  # (algorithm, op, dtype, count, params) -> Program
        self.shapes = {}  # (algorithm, op, dtype, count, options, in place) -> the pipeline's Bound of that call
        self.last = None  # the last repeated call's buffers and what runs on them (a tuple, replaced whole)
        self.choices = {}  # compressed calls' (size, bytes, dtype, hosts, format, scope) -> (algorithm, why)
        self.scratch = {}  # (backend name, dtype) -> buffer
        self.windows = {}  # name -> a shared window object with free() and nbytes
        self.picks = {}  # autotune key -> (algorithm, transport, why) the ranks agreed on for auto
        # the caller's collective calls that returned here (``next()`` on it is atomic, so threads
        # sharing the communicator count right); recovery agrees on them (RanksLost.completed)
        self.calls = itertools.count()
        _sessions.add(self)

    @staticmethod
    def plan(key, make):
        """The plan for ``key`` (the call's shape), made by ``make()`` on first use."""
        plans = _plans
        with _plans_lock:
            found = plans.get(key)
            if found is not None:
                plans.move_to_end(key)
                return found
        made = make()  # outside the lock: building may take a while, and two builds agree
        with _plans_lock:
            found = plans.setdefault(key, made)
            if len(plans) > CACHE_SIZE:
                plans.popitem(last=False)
        return found

    def program(self, key, make):
        programs = self.programs
        found = programs.get(key)
        if found is None:
            found = programs[key] = make()
            if len(programs) > CACHE_SIZE:
                programs.popitem(last=False)
        return found

    def scratch_buffer(self, backend, dtype, count):
        """The executor's scratch for ``backend`` and ``dtype``, at least ``count`` elements."""
        key = (backend.name, dtype)
        buf = self.scratch.get(key)
        if buf is None or buf.size < count:
            buf = self.scratch[key] = backend.empty(max(count, 1), dtype)
        return buf

    def completed_calls(self):
        """How many of the caller's calls have returned on this communicator (read, not counted)."""
        return int(repr(self.calls)[len("count("):-1])

    def memory(self):
        """Bytes held: scratch, programs (with their count) and windows."""
        return {"scratch": sum(buf.nbytes for buf in self.scratch.values()),
                "programs": sum(program.nbytes() for program in self.programs.values()),
                "program_shapes": len(self.programs),
                "windows": sum(w.nbytes_held() for w in self.windows.values())}

    def forget(self):
        """Drop cached programs and call shapes (scratch and windows stay)."""
        self.programs.clear()
        self.shapes.clear()
        self.last = None
        self.choices.clear()
        self.picks.clear()

    def close(self):
        """Free the windows (collective, like freeing the communicator) and drop everything."""
        windows, self.windows = self.windows, {}
        for window in windows.values():
            window.free()
        self.forget()
        self.scratch.clear()


def clear_all():
    """Drop the shared plans and every session's programs and call shapes."""
    _plans.clear()
    for session in list(_sessions):
        session.forget()
