"""The simulator's symbolic check of every rank's plan (``collectives.symbolic``), at the real
element count on atoms or on plans built again at ``verify_count`` elements."""
from ..atoms import atomize
from ..flat import _Flat
from ..symbolic import _Verifier, verify_count, verify_plans

verify = verify_plans  # simulate.verify(plans, in_place=...): the symbolic check of given plans


def _small(flat_steps, ranks, count, probe):
    """True when the plans at ``verify_count`` are much smaller than at ``count`` (pipelined trees:
    fewer segments), so building them again is cheaper than the check on atoms."""
    vcount = verify_count(ranks, count)
    return vcount < count and probe is not None and 4 * probe(vcount).nsteps < flat_steps


def verify_flat(flat, count, rebuild, probe=None):
    """Both checks (out of place, in place) of every rank's plan at ``count`` elements, from
    ``flat`` (built with ops=True); returns the engine's name. Above ``verify_count`` elements,
    the check runs at the real count on atoms (``collectives.atoms``) when they are few, else
    on ``rebuild(verify_count)``'s plans."""
    vcount = verify_count(flat.p, count)
    if vcount < count:
        # atoms save building every plan again, unless the smaller plans are much smaller (pipelined
        # trees: fewer segments); ``probe(n)`` is rank 0's plan at n elements
        small = not hasattr(flat, "l_dst") or _small(int(flat.nsteps[0]), flat.p, count, probe)
        atoms = None if small else atomize(flat, limit=4 * vcount + 64)
        if atoms is None:
            flat = _Flat(rebuild(vcount), ops=True)
        else:
            for in_place in (False, True):  # the rules that need no data, on the real elements
                _Verifier(flat, None, in_place).static_checks()
            flat = atoms
    mode = verify_plans(None, in_place=False, flat=flat)
    verify_plans(None, in_place=True, flat=flat)
    return mode
