"""The one binder (``collectives.binding.bind``): what it makes of a hand-written plan, in place
and out of place, and the runners that use it (the executor, prepared programs, the TensorFlow
lowering) giving the same bits for every algorithm."""
import importlib
import os

import numpy as np
import pytest

import collectives
from collectives import executor
from collectives.backend import NUMPY
from collectives.binding import NAMES, Named, bind
from collectives.comm.threaded import run_threaded
from collectives.plan import COPY, FINAL, IN, OUT, REDUCE, TMP, Plan, Step

algorithms = importlib.import_module("collectives.algorithms")  # the name is shadowed by a function
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hand_plan():
    """Rank 0 of 2, count 8: every kind of entry, plain tuples (as the bulk phases store them)
    and copies that write nothing always, only in place, or never."""
    steps = [
        Step(((1, IN, 0, 4, 0),), ((1, TMP, 0, 4, 1),),
             ((REDUCE, OUT, 4, IN, 4, TMP, 0, 4),
              (COPY, OUT, 0, IN, 0, 4),  # a no-op in place only
              (COPY, TMP, 4, TMP, 4, 2),  # onto itself: always a no-op
              (COPY, OUT, 2, IN, 3, 1),  # other offsets: never a no-op
              (COPY, TMP, 0, OUT, 0, 4),  # TMP and OUT: never a no-op
              (FINAL, OUT, 4, 4))),
        Step(((1, OUT, 4, 8, 0), (1, TMP, 0, 2, 3)), ((1, OUT, 0, 4, 0),), ()),
        Step((), (), ((COPY, IN, 6, OUT, 6, 2),  # IN <- OUT at one offset: a no-op in place only
                      (FINAL, OUT, 0, 4))),
    ]
    return Plan("hand", 0, 2, 8, steps, 6)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("finals", [True, False])
def test_bind_names_every_region_and_drops_exactly_the_noop_copies(in_place, finals):
    got = bind(_hand_plan(), NAMES, in_place, finals)
    step0 = [(REDUCE, (OUT, 4, 8), (IN, 4, 8), (TMP, 0, 4))]
    if not in_place:
        step0.append((COPY, (OUT, 0, 4), (IN, 0, 4)))
    step0 += [(COPY, (OUT, 2, 3), (IN, 3, 4)), (COPY, (TMP, 0, 4), (OUT, 0, 4))]
    step2 = [] if in_place else [(COPY, (IN, 6, 8), (OUT, 6, 8))]
    if finals:
        step0.append((FINAL, (OUT, 4, 8)))
        step2.append((FINAL, (OUT, 0, 4)))
    assert got == [
        (0, [(1, (IN, 0, 4), 0)], [(1, (TMP, 0, 4), 1)], step0),
        (1, [(1, (OUT, 4, 8), 0), (1, (TMP, 0, 2), 3)], [(1, (OUT, 0, 4), 0)], ()),
        (2, [], [], step2),
    ]
    for _, sends, recvs, ops in got:  # fresh lists, and ops a list or ()
        assert type(sends) is list and type(recvs) is list and (type(ops) is list or ops == ())


def test_bind_slices_the_callers_buffers_and_named_regions_carry_any_name():
    inbuf, outbuf, tmp = np.arange(8.0), np.zeros(8), np.zeros(6)
    steps = bind(_hand_plan(), (inbuf, outbuf, tmp), False)
    kind, dst, a, b = steps[0][3][0]
    assert kind == REDUCE and np.shares_memory(dst, outbuf) and np.shares_memory(a, inbuf)
    assert np.shares_memory(b, tmp) and dst.shape == a.shape == b.shape == (4,)
    assert a.tolist() == [4.0, 5.0, 6.0, 7.0]  # IN[4:8], a view, not a copy
    (peer, region, chan), = steps[0][1]
    assert (peer, chan) == (1, 0) and np.shares_memory(region, inbuf) and region.tolist() == [0, 1, 2, 3]
    marker = object()
    assert Named(marker)[3:7] == (marker, 3, 7)


def test_bind_refuses_an_unknown_operation():
    plan = Plan("bad", 0, 1, 4, [Step((), (), ((FINAL, OUT, 0, 4),)), Step((), (), ((9, OUT, 0, 4),))], 0)
    with pytest.raises(ValueError, match="bad plan, step 2: unknown local operation"):
        bind(plan, NAMES, False)


def test_the_runners_read_plans_only_through_the_binder():
    # the shared-memory transport runs (shm_call.py) through shm_layout.Call, which binds the plan once
    call = open(os.path.join(ROOT, "collectives/comm/shm_layout.py")).read().split("class Call", 1)[1]
    assert "layouts.binding(" in call and "copy_is_noop" not in call and ".local" not in call
    for path, binds in (("collectives/executor.py", "bind("), ("collectives/comm/shm_call.py", "layouts.call("),
                        ("tf_bridge/_tf_plan.py", "bind(")):
        source = open(os.path.join(ROOT, path)).read()
        assert "copy_is_noop" not in source and binds in source, path
        assert "for op in local" not in source and "enumerate(plan.steps)" not in source, path


# the runners against each other ------------------------------------------------------------------

SIZE = 4


def _plans(name, count, itemsize=4):
    module, params = algorithms.resolve(algorithms.get(name), {}, (tuple(range(SIZE)),))
    return [module.build(r, SIZE, count, itemsize=itemsize, **params) for r in range(SIZE)]


def _data(count, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    # a wide dynamic range: another order of additions changes low bits somewhere
    return [(rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count)).astype(dtype) for _ in range(SIZE)]


def _final(op):
    if op != "avg":
        return None

    def divide(region):
        np.divide(region, region.dtype.type(SIZE), out=region)
    return divide


def _run_all(plans, data, op="sum", in_place=False):
    """Per rank: the executor's result, then a program's on its work buffer, rebinding and bound."""
    count = len(data[0])
    final = _final(op)

    def body(comm):
        plan, x = plans[comm.rank], data[comm.rank]
        tmp = np.zeros(max(plan.tmp_count, 1), x.dtype)
        send = x.copy()
        recv = send if in_place else np.full(count, np.nan, x.dtype)
        executor.execute(plan, comm, send, recv, tmp, np.add, final, "binding")
        results = [recv]
        program = executor.Program(plan, comm, NUMPY, x.dtype, count, np.add, final, "binding", "binding-test")
        send = x.copy()
        recv = send if in_place else np.full(count, np.nan, x.dtype)
        for _ in range(3):  # the work buffer, then a binding onto the caller's buffers (twice)
            send[:] = x
            if not in_place:
                recv[:] = np.nan
            program(send, recv)
            results.append(recv.copy())
        assert program.bound is not None
        return results

    return run_threaded(SIZE, body)


@pytest.mark.parametrize("name", collectives.algorithm_names())
@pytest.mark.parametrize("in_place", [False, True])
def test_executor_and_programs_give_the_same_bits(name, in_place):
    count = 1001
    data = _data(count, seed=5)
    per_rank = _run_all(_plans(name, count), data, in_place=in_place)
    first = per_rank[0][0]
    for results in per_rank:
        for got in results:
            assert got.tobytes() == first.tobytes(), name
    np.testing.assert_allclose(first, np.sum(np.array(data, np.float64), axis=0), rtol=1e-4,
                               atol=1e-6 * np.abs(np.array(data)).max())


@pytest.mark.parametrize("name", ["ring", "recursive_doubling", "tree"])
def test_executor_and_programs_agree_on_avg(name):
    count = 300
    data = _data(count, seed=7, dtype=np.float64)
    per_rank = _run_all(_plans(name, count, 8), data, op="avg")
    first = per_rank[0][0]
    assert all(got.tobytes() == first.tobytes() for results in per_rank for got in results)
    np.testing.assert_allclose(first, np.mean(np.array(data), axis=0), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["ring", "recursive_doubling", "double_binary_tree", "rabenseifner", "two_level"])
def test_the_tensorflow_lowering_gives_the_executors_bits(name):
    tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed")
    from tf_bridge import _tf_plan

    n = 1001
    offsets, count = _tf_plan.aligned_layout([n], 4, SIZE)
    data = _data(n, seed=9)
    padded = [np.concatenate([x, np.zeros(count - n, np.float32)]) for x in data]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    devices = [cpus[r % len(cpus)] for r in range(SIZE)]
    inputs = []
    for r, device in enumerate(devices):
        with tf.device(device):
            inputs.append([tf.constant(data[r])])
    per_rank, ran, builder = _tf_plan.allreduce_tf(inputs, devices, name, {})
    assert ran == name
    want = _run_all(_plans(name, count), padded)
    for r, device in enumerate(devices):
        got = _tf_plan.assemble(builder, per_rank[r][0], device, tf.float32).numpy()
        assert got.tobytes() == want[r][0][offsets[0]:offsets[0] + n].tobytes(), (name, r)
