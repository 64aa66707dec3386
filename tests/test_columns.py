"""Plans stored as columns (collectives.columns): the same plan as its tuples, for every reader."""
import numpy as np
import pytest

import collectives
from collectives.columns import Columns
from collectives.flat import _Flat, build_plans
from collectives.plan import COPY, FINAL, IN, OUT, REDUCE, TMP, PlanBuilder, Step

SHAPES = [(1, 5), (2, 0), (2, 1), (3, 2), (4, 7), (5, 3), (6, 1000), (8, 17), (12, 4099)]


def as_tuples(plans):
    """The same plans with their columns dropped (``steps`` set by hand keeps only the tuples)."""
    for plan in plans:
        plan.steps = list(plan.steps)
    return plans


@pytest.mark.parametrize("name", collectives.algorithm_names())
def test_flattening_columns_equals_flattening_tuples(name):
    for ranks, count in SHAPES:
        for ops in (False, True):
            a = _Flat(build_plans(name, ranks, count), ops=ops)
            b = _Flat(as_tuples(build_plans(name, ranks, count)), ops=ops)
            names = [k for k, v in vars(b).items() if isinstance(v, np.ndarray)]
            assert names
            for key in names:
                assert np.array_equal(getattr(a, key), getattr(b, key)), (name, ranks, count, ops, key)


def test_the_ring_phases_write_columns_and_the_tuples_round_trip():
    for ranks, count in SHAPES[1:]:
        plans = build_plans("ring", ranks, count)
        assert all(plan.columns is not None for plan in plans)
        for plan in plans:
            steps = plan.steps
            assert plan.nsteps == len(steps) == plan.columns.nsteps
            again = Columns.from_steps(steps).steps()
            assert again == steps
            assert all(isinstance(step, Step) and (step.sends or step.recvs or step.local) for step in steps)


def test_a_ring_of_more_ranks_than_elements_drops_empty_messages_and_steps():
    plans = build_plans("ring", 5, 2)  # chunks of 1, 1, 0, 0, 0 elements
    for plan in plans:
        for step in plan.steps:
            assert step.sends or step.recvs or step.local
            assert all(hi > lo for _, _, lo, hi, _ in step.sends + step.recvs)
            assert all(op[-1] > 0 for op in step.local)
    assert collectives.simulate("ring", ranks=5, nbytes=8).verified


def test_tracks_mixing_columns_and_tuples_join_step_by_step_in_track_order():
    from collectives import phases

    b = PlanBuilder("mixed", 0, 3, 6)
    first, second = b.tracks(2)
    phases.ring_allgather(first, range(3), [0, 2, 4, 6], chan=1)  # columns, 2 steps
    second.step()
    second.send(1, OUT, 0, 1, chan=2)  # tuples, 1 step
    b.join([first, second])
    b.step()
    b.final(OUT, 0, 6)
    plan = b.build()
    assert plan.columns is not None and plan.nsteps == 3
    (s0, r0, l0), (s1, r1, l1), (s2, r2, l2) = plan.steps
    assert s0 == ((1, OUT, 0, 2, 1), (1, OUT, 0, 1, 2))  # track 0's message first, then track 1's
    assert r0 == ((2, OUT, 4, 6, 1),)
    assert s1 == ((1, OUT, 4, 6, 1),) and r1 == ((2, OUT, 2, 4, 1),)
    assert l2 == ((FINAL, OUT, 0, 6),) and not (s2 or r2 or l0 or l1)


def test_columns_of_keeps_group_order_within_a_step_and_drops_rows_not_kept():
    step = np.array([0, 1, 1])
    cols = Columns.of(3, local=[(np.array([True, True, False]), step, REDUCE, OUT, 0, TMP, 0, IN, 0, np.array([1, 2, 3])),
                                (None, np.array([1]), FINAL, OUT, 0, 4)])
    steps = cols.steps()
    assert steps[0].local == ((REDUCE, OUT, 0, TMP, 0, IN, 0, 1),)
    assert steps[1].local == ((REDUCE, OUT, 0, TMP, 0, IN, 0, 2), (FINAL, OUT, 0, 4))
    assert steps[2] == Step((), (), ())
    assert cols.without_empty_steps().nsteps == 2
    assert cols.element_counts().tolist() == [1, 2, 4]
    assert Columns.from_steps([Step((), (), ((COPY, OUT, 0, IN, 0, 5),))]).local.tolist() == [[COPY, OUT, 0, IN, 0, 5, 0, 0]]


def test_a_plan_edited_by_hand_is_its_tuples():
    plan = build_plans("ring", 4, 100)[1]
    assert plan.columns is not None
    plan.steps = plan.steps[:-1]
    assert plan.columns is None and plan.nsteps == 5


def test_columns_with_steps_out_of_range_or_unknown_operations_are_refused():
    b = PlanBuilder("bad", 0, 2, 4)
    with pytest.raises(ValueError, match="send_step outside 0..1"):
        b.add_columns(Columns.of(2, sends=[(None, np.array([0, 2]), 1, OUT, 0, 1, 0)]))
    with pytest.raises(ValueError, match="not REDUCE, COPY or FINAL"):
        b.add_columns(Columns.of(1, local=[(None, np.array([0]), 7, OUT, 0, 1)]))
    b.add_columns(Columns.of(1, local=[(None, np.array([0]), FINAL, OUT, 0, 4)]))
    assert b.build().steps[0].local == ((FINAL, OUT, 0, 4),)
