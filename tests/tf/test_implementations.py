"""The two implementations of CollectivesAllReduce agree bit for bit, and the TF-ops one
adds in exactly the order the plan says (the threaded NumPy executor is the reference)."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed")

import collectives  # noqa: E402
import tf_bridge  # noqa: E402
from tf_bridge import _tf_plan  # noqa: E402

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
ALGORITHMS = collectives.algorithm_names()
# mixed sizes: big and small tensors, odd lengths, a scalar; the pack is cut into many pieces
SHAPES = [(300, 7), (5,), (1,), (129, 3), (), (40,)]


def _values(strategy, devices, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    arrays = [[(rng.standard_normal(s) * 10.0 ** rng.integers(-6, 7, s)).astype(dtype) for s in SHAPES]
              for _ in devices]
    values = []
    for i in range(len(SHAPES)):
        def fn(ctx, i=i):
            r = ctx.replica_id_in_sync_group
            with tf.device(devices[r]):
                return tf.constant(arrays[r][i])
        values.append(strategy.experimental_distribute_values_from_function(fn))
    return values, arrays


def _run(devices, algorithm, implementation, op, seed, dtype=np.float32, graph=False, **options):
    ops = tf_bridge.CollectivesAllReduce(algorithm, implementation=implementation, **options)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    values, arrays = _values(strategy, devices, seed, dtype)
    if graph:
        @tf.function
        def reduce_all():
            return ops.batch_reduce(op, [(v, v) for v in values])
        results = reduce_all()
    else:
        results = ops.batch_reduce(op, [(v, v) for v in values])
    assert ops.calls == 1
    return [[t.numpy() for t in strategy.experimental_local_results(r)] for r in results], arrays


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tf_ops_add_in_the_plans_order(devices, algorithm):
    # a wide dynamic range: any other order of additions would change low bits somewhere
    got, arrays = _run(devices, algorithm, "tf", SUM, seed=11, graph=True)
    want, _ = _run(devices, algorithm, "numpy", SUM, seed=11)
    for g, w, tensors in zip(got, want, zip(*arrays)):
        for per_device in g:
            assert per_device.shape == tensors[0].shape
            assert per_device.tobytes() == g[0].tobytes()  # bitwise identical on every device
        assert g[0].tobytes() == w[0].tobytes()  # and equal to the NumPy executor's result
        np.testing.assert_allclose(g[0], np.sum(np.array(tensors, np.float64), axis=0), rtol=1e-4,
                                   atol=1e-6 * np.abs(np.array(tensors)).max())


@pytest.mark.parametrize("implementation", ["tf", "numpy"])
@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
def test_exact_small_integers_float64(devices, implementation, op):
    rng = np.random.default_rng(3)
    ops = tf_bridge.CollectivesAllReduce("rabenseifner", implementation=implementation)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    data = [rng.integers(-1000, 1000, (17, 3)).astype(np.float64) for _ in devices]

    def fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(devices[r]):
            return tf.constant(data[r])

    value = strategy.experimental_distribute_values_from_function(fn)
    out = ops.reduce(op, value, destinations=value)
    expected = np.sum(data, axis=0) / (len(devices) if op == MEAN else 1)
    for t in strategy.experimental_local_results(out):
        np.testing.assert_array_equal(t.numpy(), expected)


def test_options_and_auto_reach_the_tf_ops_path(devices):
    got, arrays = _run(devices, "hierarchical_copy", "tf", SUM, seed=5, group_size=2)
    want, _ = _run(devices, "hierarchical_copy", "numpy", SUM, seed=5, group_size=2)
    assert all(g[0].tobytes() == w[0].tobytes() for g, w in zip(got, want))
    got, _ = _run(devices, "auto", "tf", MEAN, seed=6)
    want, _ = _run(devices, "auto", "numpy", MEAN, seed=6)
    assert all(g[0].tobytes() == w[0].tobytes() for g, w in zip(got, want))


def test_unknown_implementation_raises():
    with pytest.raises(ValueError, match="implementation must be one of tf, numpy"):
        tf_bridge.CollectivesAllReduce("ring", implementation="cuda")


def test_aligned_layout():
    offsets, count = _tf_plan.aligned_layout([5, 16, 1, 0, 33], 4, 4)
    assert offsets == [0, 16, 32, 48, 48]
    assert count % (16 * 4) == 0 and count >= 81
    offsets, count = _tf_plan.aligned_layout([3], 8, 1)
    assert offsets == [0] and count == 8


def test_grappler_keeps_the_order_of_tagged_adds():
    # untagged, grappler's AddOpsRewrite flattens this same-device tree into AddN(x0, x1, x2, x3),
    # which adds ((x0 + x1) + x2) + x3: other low bits
    from tf_bridge import _tf_internals

    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(4099) * 10.0 ** rng.integers(-6, 7, 4099)).astype(np.float32) for _ in range(4)]

    @tf.function
    def tree(a, b, c, d):
        keep = _tf_internals.keep_add_order
        return keep(tf.add(keep(tf.add(a, b)), keep(tf.add(c, d))))

    got = tree(*[tf.constant(x) for x in xs]).numpy()
    assert got.tobytes() == ((xs[0] + xs[1]) + (xs[2] + xs[3])).tobytes()
