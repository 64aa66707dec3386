"""The check on atoms (collectives/atoms.py) against the check element by element, at counts
where both run: the same verdict and the same error, place included, for every built-in
algorithm and for plans broken at random."""
import random

import pytest

from collectives import atoms, simulator as sim
from collectives.flat import _Flat, build_plans
from collectives.plan import PlanError, Step
from collectives.symbolic import verify_plans

CASES = [("ring", {}), ("tree", {"segment_bytes": 64}), ("double_binary_tree", {"segment_bytes": 96}),
         ("recursive_doubling", {}), ("rabenseifner", {}), ("hierarchical_copy", {"group_size": 2}),
         ("reduce_to_one", {}), ("shm", {})]


def outcome(flat):
    try:
        return "ok " + verify_plans(None, False, flat=flat) + verify_plans(None, True, flat=flat)
    except PlanError as exc:
        return str(exc)


@pytest.mark.parametrize("name, options", CASES)
def test_atoms_agree_with_elements_on_builtins(name, options):
    for p in (1, 2, 3, 6, 8):
        for count in (1000, 4099):
            flat = _Flat(build_plans(name, p, count, 4, **options), ops=True)
            g = atoms.atomize(flat, limit=10 ** 6)
            if g is None:  # the boundaries did not settle: the simulator builds smaller plans instead
                assert name not in ("ring", "tree", "double_binary_tree", "reduce_to_one"), (name, p, count)
                continue
            assert int(g.out_count.max()) < count / 4, "atoms should be far fewer than elements"
            assert outcome(g) == outcome(flat) == "ok exactexact"


def _mutations(plans, rng):
    rank = rng.randrange(len(plans))
    steps = list(plans[rank].steps)
    if not steps:
        return False
    k = rng.randrange(len(steps))
    s = steps[k]
    choice = rng.randrange(4)
    if choice == 0 and s.local:  # drop a local operation
        j = rng.randrange(len(s.local))
        steps[k] = Step(s.sends, s.recvs, s.local[:j] + s.local[j + 1:])
    elif choice == 1 and s.local:  # shift one operation's destination by one element
        j = rng.randrange(len(s.local))
        op = list(s.local[j])
        op[2] = max(0, op[2] - 1) if op[2] else op[2] + 1
        steps[k] = Step(s.sends, s.recvs, s.local[:j] + (tuple(op),) + s.local[j + 1:])
    elif choice == 2 and s.sends:  # send one element more, or fewer
        peer, buf, lo, hi, chan = s.sends[0]
        steps[k] = Step(((peer, buf, lo, hi + rng.choice((-1, 1)), chan),) + s.sends[1:], s.recvs, s.local)
    elif choice == 3:  # duplicate an operation (doubles a reduction, or a FINAL)
        if not s.local:
            return False
        steps[k] = Step(s.sends, s.recvs, s.local + (s.local[-1],))
    else:
        return False
    plans[rank].steps = steps
    return True


class _Rebuild(Exception):
    pass


def _no_rebuild(count):
    raise _Rebuild


def test_atoms_agree_with_elements_on_broken_plans():
    rng = random.Random(7)
    tried = caught = compared = 0
    while tried < 150:
        name, options = rng.choice(CASES)
        p, count = rng.choice((2, 3, 5)), rng.choice((257, 1000))
        plans = build_plans(name, p, count, 4, **options)
        if not _mutations(plans, rng):
            continue
        tried += 1
        flat = _Flat(plans, ops=True)
        expected = outcome(flat)
        try:
            got = "ok " + sim.verify_flat(flat, count, _no_rebuild) * 2
        except PlanError as exc:
            got = str(exc)
        except _Rebuild:  # atoms did not settle (a broken plan may cut its partners unevenly)
            continue
        assert got == expected, (name, p, count)
        compared += 1
        caught += not got.startswith("ok")
    assert compared >= 50 and caught >= 40, (compared, caught)  # most mutations break the plan; both say where
