"""The shared-memory transport's static half with no MPI: shm_layout.Call, the per-plan record a
call runs through (collectives/comm/shm.py), checked against the plan it was made from."""
import importlib

import pytest

from collectives.comm import shm_layout
from collectives.comm.shm_layout import F_IN_PLACE, STAGED, Layouts
from collectives.plan import TMP

algorithms = importlib.import_module("collectives.algorithms")


def plans(name, size, count):
    module, params = algorithms.resolve(algorithms.get(name), {}, (tuple(range(size)),), size)
    return [module.build(rank, size, count, itemsize=4, **params) for rank in range(size)]


@pytest.mark.parametrize("name", ["recursive_doubling", "ring", "shm", "rabenseifner", "tree"])
@pytest.mark.parametrize("node_ranks", [(0, 1, 2, 3), (0, 1)])
@pytest.mark.parametrize("flags", [0, F_IN_PLACE])
def test_a_call_holds_every_message_of_its_plan_once_where_the_layout_puts_it(name, node_ranks, flags):
    count = 1003  # uneven chunks
    every = plans(name, 4, count)
    plan = every[0]
    layouts = Layouts(list(node_ranks))
    call = layouts.call(plan, 4, flags, True, every.__getitem__)
    assert layouts.call(plan, 4, flags, True, every.__getitem__) is call  # kept
    layout, mapped = layouts.of(plan, 4, flags, every.__getitem__)
    assert len(call.steps) == len(plan.steps)
    for index, (step, entry) in enumerate(zip(plan.steps, call.steps)):
        at, far_recvs, far_sends, staged, near, ops, label = entry
        assert at == index and label == f" step {index + 1}/{len(plan.steps)}"
        # every message once: off the node over MPI, on it through memory
        # (plans stored as columns give plain tuples: peer, buf, lo, hi, chan)
        assert sorted((p, r, c) for r, p, c in far_recvs) == sorted(
            (peer, (buf, lo, hi), chan) for peer, buf, lo, hi, chan in step.recvs if peer not in node_ranks)
        assert sorted((p, r, c) for r, p, c in far_sends) == sorted(
            (peer, (buf, lo, hi), chan) for peer, buf, lo, hi, chan in step.sends if peer not in node_ranks)
        on_node = [(r, m) for r, m in enumerate(step.recvs) if m[0] in node_ranks]
        assert [(p, region, c) for p, region, c, _ in near] == [(m[0], tuple(m[1:4]), m[4]) for _, m in on_node]
        assert [is_mapped for *_, is_mapped in near] == [(index, r) in mapped for r, _ in on_node]
        assert all(region[0] == TMP for _, region, _, is_mapped in near if is_mapped)
        # staged regions at the layout's byte offsets, as elements, each copied once: a region the step
        # sends to several peers shares one offset, and distinct regions never overlap
        sent = [(b, lo, hi, offset) for _, b, lo, hi, _, mode, offset in layout.sends[index] if mode == STAGED]
        assert len({(b, lo, hi) for b, lo, hi, _ in sent}) == len({offset for *_, offset in sent})
        assert [(b, lo, hi, offset * 4) for b, lo, hi, offset in staged] == list(dict.fromkeys(sent))
        assert all(offset % shm_layout.ALIGN == 0 for *_, offset in sent)
        spans = sorted((offset, offset + (hi - lo) * 4) for _, lo, hi, offset in set(sent))
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert call.readers == tuple(sorted({m[0] for s in plan.steps for m in s.sends if m[0] in node_ranks}))
    assert call.direct is False  # ordinary buffers, no cross-memory attach: everything staged
    assert call.need == max(shm_layout.staging_bound(p, 4, set(node_ranks).__contains__) for p in every
                            if p.rank in node_ranks)


def test_the_direct_plan_stages_its_reduced_chunk_once_for_all_its_readers():
    every = plans("shm", 4, 4096)
    layout, _ = Layouts([0, 1, 2, 3]).of(every[0], 4, 0, every.__getitem__)
    offsets = {offset for *_, offset in layout.sends[1]}  # step 2: the reduced chunk to each peer
    assert len(layout.sends[1]) == 3 and len(offsets) == 1
    assert layout.staged_bytes == 4 * 1024 * 4  # three chunks out in step 1, one back in step 2
    # and the window is sized for that, not for a copy per reader
    assert shm_layout.staging_bound(every[0], 4, lambda peer: True) == layout.staged_bytes


@pytest.mark.parametrize("name", ["shm", "tree", "ring", "double_binary_tree", "hierarchical_copy"])
def test_the_staging_bound_covers_every_layout_a_call_may_take(name):
    every = plans(name, 4, 1003)
    for plan in every:
        bound = shm_layout.staging_bound(plan, 8, lambda peer: True)
        for flags in range(16):  # every combination of shared IN, shared OUT, in place, cma
            layout, _ = Layouts([0, 1, 2, 3]).of(plan, 8, flags, every.__getitem__)
            assert layout.staged_bytes <= bound


def test_a_call_is_made_again_for_other_flags_and_for_a_new_plan():
    every = plans("ring", 2, 64)
    layouts = Layouts([0, 1])
    first = layouts.call(every[0], 4, 0, True, every.__getitem__)
    assert layouts.call(every[0], 4, F_IN_PLACE, True, every.__getitem__) is not first
    assert layouts.call(every[0], 8, 0, True, every.__getitem__) is not first
    again = plans("ring", 2, 64)
    assert layouts.call(again[0], 4, 0, True, again.__getitem__) is not first
