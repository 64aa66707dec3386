"""CollectivesAllReduce called directly and through MirroredStrategy on 4 logical CPUs: exact values."""
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed")

import collectives  # noqa: E402
import tf_bridge  # noqa: E402
from tf_bridge import _tf_internals  # noqa: E402

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
ALGORITHMS = collectives.algorithm_names()


def _strategy(devices, ops):
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


def _per_replica(strategy, shape=(3, 5), dtype=tf.float32, offset=0.0):
    def fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(strategy.extended.worker_devices[r]):  # eager values would all land on CPU:0
            base = tf.reshape(tf.range(int(np.prod(shape)), dtype=tf.float64), shape)
            return tf.cast(base * (r + 1) + r + offset, dtype)
    return strategy.experimental_distribute_values_from_function(fn)


def _expected(n, shape=(3, 5), op=SUM, offset=0.0, dtype=np.float32):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    total = sum(base * (r + 1) + r + offset for r in range(n))
    return (total / n if op == MEAN else total).astype(dtype)


def _local(strategy, value):
    return [t.numpy() for t in strategy.experimental_local_results(value)]


def test_unknown_algorithm_and_option_raise():
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        tf_bridge.CollectivesAllReduce(algorithm="nope")
    with pytest.raises(ValueError, match="takes no option"):
        tf_bridge.CollectivesAllReduce(algorithm="ring", bogus=3)
    with pytest.raises(ValueError, match="bytes_per_pack"):
        tf_bridge.CollectivesAllReduce(algorithm="ring", bytes_per_pack=-1)


def test_is_a_cross_device_ops_and_reports_one_process():
    ops = tf_bridge.CollectivesAllReduce("tree")
    assert isinstance(ops, tf.distribute.CrossDeviceOps)
    assert ops._num_between_graph_workers == 1


def test_version_check_rejects_untested_versions():
    assert _tf_internals.check_version("2.21.0") == (2, 21)
    for bad in ("2.15.1", "2.22.0", "3.0.0"):
        with pytest.raises(ImportError, match="tf_bridge supports TensorFlow"):
            _tf_internals.check_version(bad)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
def test_reduce_exact_on_every_device(devices, algorithm, op):
    ops = tf_bridge.CollectivesAllReduce(algorithm)
    strategy = _strategy(devices, ops)
    value = _per_replica(strategy)
    result = ops.reduce(op, value, destinations=value)
    out = _local(strategy, result)
    assert len(out) == len(devices)
    expected = _expected(len(devices), op=op)
    for got in out:
        np.testing.assert_array_equal(got, expected)
    sources = [t.device for t in strategy.experimental_local_results(value)]
    assert len(set(sources)) == len(devices)
    assert [t.device for t in strategy.experimental_local_results(result)] == sources
    assert ops.calls == 1


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("bytes_per_pack", [0, 64])
def test_batch_reduce_exact_mixed_shapes_and_dtypes(devices, op, bytes_per_pack):
    ops = tf_bridge.CollectivesAllReduce("ring", bytes_per_pack=bytes_per_pack)
    strategy = _strategy(devices, ops)
    specs = [((3, 5), tf.float32, 0.0), ((7,), tf.float64, 1.5), ((2, 2, 2), tf.float32, -3.0), ((), tf.float32, 2.0),
             ((4, 3), tf.float32, 0.25)]
    if op == SUM:
        specs.append(((6,), tf.int32, 5.0))
    values = [_per_replica(strategy, s, d, o) for s, d, o in specs]
    results = ops.batch_reduce(op, [(v, v) for v in values])
    n = len(devices)
    for (shape, dtype, offset), result in zip(specs, results):
        expected = _expected(n, shape, op, offset, dtype.as_numpy_dtype)
        for got in _local(strategy, result):
            assert got.shape == expected.shape and got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)
    assert ops.calls == 1
    dtypes = len({d for _, d, _ in specs})
    if bytes_per_pack == 0:
        assert ops.reduced_tensors == dtypes  # one pack per dtype
    else:
        assert ops.reduced_tensors > dtypes  # 64-byte packs: several float32 packs


def test_reduce_to_one_device(devices):
    ops = tf_bridge.CollectivesAllReduce("recursive_doubling")
    strategy = _strategy(devices, ops)
    value = _per_replica(strategy)
    result = ops.reduce(SUM, value, destinations=devices[2])
    assert isinstance(result, tf.Tensor)
    assert result.device.endswith("CPU:2")
    np.testing.assert_array_equal(result.numpy(), _expected(len(devices)))


def test_strategy_reductions_in_replica_context_use_the_op(devices):
    ops = tf_bridge.CollectivesAllReduce("tree")
    strategy = _strategy(devices, ops)

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
            return ctx.all_reduce(SUM, [tf.fill([4], r + 1.0), tf.fill([2, 2], 2.0 * r)])
        return strategy.run(replica_fn)

    a, b = step()
    n = len(devices)
    for got in _local(strategy, a):
        np.testing.assert_array_equal(got, np.full(4, n * (n + 1) / 2, np.float32))
    for got in _local(strategy, b):
        np.testing.assert_array_equal(got, np.full((2, 2), n * (n - 1), np.float32))
    assert ops.calls >= 1


def test_broadcast_and_gather(devices):
    ops = tf_bridge.CollectivesAllReduce("ring")
    strategy = _strategy(devices, ops)
    with tf.device(devices[0]):
        t = tf.constant([1.0, 2.0, 3.0])
    mirrored = ops.broadcast(t, destinations=_per_replica(strategy))
    outs = strategy.experimental_local_results(mirrored)
    assert len(outs) == len(devices)
    assert [o.device.rsplit(":", 1)[-1] for o in outs] == [str(i) for i in range(len(devices))]
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), [1.0, 2.0, 3.0])
    value = _per_replica(strategy, (2, 3))
    gathered = strategy.gather(value, axis=0)
    expected = np.concatenate([np.arange(6.0).reshape(2, 3) * (r + 1) + r for r in range(len(devices))], axis=0)
    np.testing.assert_array_equal(gathered.numpy(), expected.astype(np.float32))


def test_indexed_slices_are_densified_with_a_warning(devices):
    ops = tf_bridge.CollectivesAllReduce("ring")
    strategy = _strategy(devices, ops)

    def fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(strategy.extended.worker_devices[r]):
            return tf.IndexedSlices(tf.fill([1, 3], float(r + 1)), tf.constant([r % 2]), tf.constant([2, 3]))

    value = strategy.experimental_distribute_values_from_function(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ops.reduce(SUM, value, destinations=_per_replica(strategy, (2, 3)))
    assert any("IndexedSlices" in str(w.message) for w in caught)
    expected = np.zeros((2, 3), np.float32)
    for r in range(len(devices)):
        expected[r % 2] += r + 1
    for got in _local(strategy, result):
        np.testing.assert_array_equal(got, expected)
