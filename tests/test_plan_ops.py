"""Plan entries: the named tuples of plan.py, the one rule for a COPY that writes nothing
(``copy_is_noop``, shared by every runner of plans), and the runners skipping exactly those."""
import importlib

import numpy as np
import pytest

from collectives import executor
from collectives.backend import NUMPY
from collectives.comm.threaded import run_threaded
from collectives.plan import (COPY, FINAL, IN, OUT, REDUCE, TMP, Copy, Final, Message, Plan, PlanBuilder, Reduce,
                              Step, copy_is_noop, typed)

BUFS = (IN, OUT, TMP)
algorithms = importlib.import_module("collectives.algorithms")  # the name is shadowed by a function


@pytest.mark.parametrize("dst", BUFS)
@pytest.mark.parametrize("src", BUFS)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shift", [0, 3])
def test_copy_is_noop_truth_table(dst, src, in_place, shift):
    op = (COPY, dst, 5, src, 5 + shift, 4)
    want = shift == 0 and (dst == src or (in_place and {dst, src} == {IN, OUT}))
    got = copy_is_noop(op, in_place)
    assert bool(got) is want
    assert bool(copy_is_noop(Copy(*op), in_place)) is want  # named or plain, the same answer


def test_copy_is_noop_is_elementwise_on_arrays():
    dst = np.array([OUT, OUT, IN, TMP, OUT, TMP])
    src = np.array([IN, IN, OUT, TMP, TMP, OUT])
    dlo = np.array([7, 7, 2, 1, 0, 4])
    slo = np.array([7, 8, 2, 1, 0, 4])
    for in_place in (False, True):
        got = copy_is_noop((COPY, dst, dlo, src, slo, None), in_place)
        want = [copy_is_noop((COPY, int(d), int(a), int(s), int(b), 1), in_place)
                for d, a, s, b in zip(dst, dlo, src, slo)]
        assert got.tolist() == [bool(w) for w in want]
    assert got.tolist() == [True, False, True, True, False, False]


def test_builder_makes_named_entries_read_by_position():
    b = PlanBuilder("t", 0, 2, 8)
    b.step()
    b.send(1, IN, 0, 4, 2)
    b.recv(1, TMP, 0, 4)
    b.reduce(OUT, 4, TMP, 0, IN, 4, 4)
    b.copy(OUT, 0, IN, 0, 4)
    b.copy(TMP, 0, TMP, 0, 4)  # the same region: never in the plan
    b.final(OUT, 0, 8)
    (step,) = b.build().steps
    assert step.sends == (Message(1, IN, 0, 4, 2),) and step.recvs == (Message(1, TMP, 0, 4, 0),)
    assert [type(op) for op in step.local] == [Reduce, Copy, Final]
    assert step.local[0] == (REDUCE, OUT, 4, TMP, 0, IN, 4, 4)  # still tuples
    assert step.local[0].a == TMP and step.local[1].src == IN and step.local[2].kind == FINAL
    peer, buf, lo, hi, chan = step.sends[0]
    assert (peer, buf, lo, hi, chan) == (1, IN, 0, 4, 2)


def test_typed_names_the_entries_of_any_step():
    plain = Step(((1, OUT, 0, 4, 0),), ((1, TMP, 0, 4, 0),),
                 ((REDUCE, OUT, 0, TMP, 0, IN, 0, 4), (COPY, OUT, 4, IN, 4, 4), (FINAL, OUT, 0, 8)))
    named = typed(plain)
    assert named == plain
    assert named.sends[0].hi == 4 and named.recvs[0].buf == TMP
    assert [type(op) for op in named.local] == [Reduce, Copy, Final]
    ring = algorithms.get("ring").build(1, 4, 100)  # bulk phase steps: plain tuples
    assert all(typed(s) == s for s in ring.steps)


def _plan_with_copies(rank, size, count):
    """A plan whose only writes to OUT are copies, two of them no-ops in place."""
    assert size == 1
    steps = [Step((), (), ((COPY, OUT, 0, IN, 0, count),  # no-op in place
                           (COPY, TMP, 0, IN, 0, count),
                           (COPY, OUT, 0, OUT, 0, count),  # always a no-op
                           (REDUCE, OUT, 0, TMP, 0, OUT, 0, count),
                           (FINAL, OUT, 0, count)))]
    return Plan("copies", rank, size, count, steps, count)


@pytest.mark.parametrize("in_place", [False, True])
def test_execute_and_programs_skip_exactly_the_noop_copies(in_place):
    count = 6
    plan = _plan_with_copies(0, 1, count)
    x = np.arange(count, dtype=np.float64)

    def run(comm):
        send = x.copy()
        recv = send if in_place else np.full(count, -1.0)
        executor.execute(plan, comm, send, recv, np.zeros(count), np.add, None, "copies")
        program = executor.Program(plan, comm, NUMPY, np.dtype(np.float64), count, np.add, None, "copies",
                                   "copies-test")
        send2 = x.copy()
        recv2 = send2 if in_place else np.full(count, -1.0)
        program(send2, recv2)  # on the program's work buffer (IN is OUT there)
        send3 = x.copy()
        recv3 = send3 if in_place else np.full(count, -1.0)
        program._rebind(send3, recv3)  # bound straight onto the caller's buffers
        for call in program.bound[2]:
            call()
        return recv, recv2, recv3

    # OUT <- IN writes x out of place; in place it is skipped and OUT already holds x: the same
    # result, 2x, from every runner
    for got in run_threaded(1, run)[0]:
        assert got.tolist() == (2 * x).tolist()


def test_ranks_by_group_keeps_groups_in_order_of_their_first_rank():
    from collectives.plan import ranks_by_group

    assert ranks_by_group((5, 5, 9, 5)) == ((0, 1, 3), (2,))
    assert ranks_by_group((0, 0, 1, 1)) == ((0, 1), (2, 3))
    assert ranks_by_group(()) == ()
