"""multi_worker_strategy and the one-strategy-per-process pattern, under mpiexec -n 2."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed")
keras = pytest.importorskip("keras", reason="Keras not installed")

import tf_bridge  # noqa: E402

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
PER_WORKER_BATCH = 8


def _model():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])


def _initial_weights():
    keras.utils.set_random_seed(11)  # the same on every rank
    return _model().get_weights()


def _global_data(n):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)


def _same_on_every_rank(comm, arrays):
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])
    everyone = comm.allgather(flat)
    return all(np.array_equal(everyone[0], other) for other in everyone[1:])


def test_strategy_has_one_worker_per_rank_and_our_op(comm, strategy):
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert strategy.num_replicas_in_sync == comm.Get_size()
    ops = strategy.extended._cross_device_ops
    assert isinstance(ops, tf_bridge.CollectivesAllReduce)
    assert ops._num_between_graph_workers == comm.Get_size()


def test_given_op_built_without_comm_is_bound_to_the_world_and_used(comm, strategy, given_ops):
    OPS = given_ops
    assert strategy.extended._cross_device_ops is OPS
    assert OPS.comm is comm and OPS.num_processes == comm.Get_size()
    before = OPS.batches
    value = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant([2.0]))
    got = strategy.reduce(SUM, value, axis=None).numpy()
    assert got[0] == 2.0 * comm.Get_size()
    assert OPS.batches > before, "the strategy did not reduce through the given instance"


def test_op_on_a_communicator_of_another_size_is_refused(comm):
    if comm.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    alone = comm.Split(comm.Get_rank(), 0)  # one rank each
    try:
        ops = tf_bridge.CollectivesAllReduce("ring", comm=alone)
        with pytest.raises(ValueError, match=r"built on a communicator of 1 process\(es\) but the strategy's has"):
            tf_bridge.multi_worker_strategy(cross_device_ops=ops)
    finally:
        alone.Free()


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
def test_strategy_reduce_is_exact_across_processes(comm, strategy, op):
    rank, size = comm.Get_rank(), comm.Get_size()
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([1.0, 2.0, 3.0]) * (rank + 1))
    got = strategy.reduce(op, value, axis=None).numpy()
    total = sum(r + 1 for r in range(size)) * np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(got, total / size if op == MEAN else total)


def test_custom_loop_matches_single_process_step_on_global_batch(comm, strategy):
    rank, size = comm.Get_rank(), comm.Get_size()
    weights = _initial_weights()
    x, y = _global_data(PER_WORKER_BATCH * size)
    xs, ys = (a[rank * PER_WORKER_BATCH:(rank + 1) * PER_WORKER_BATCH] for a in (x, y))
    ops = strategy.extended._cross_device_ops
    calls = ops.calls
    with strategy.scope():
        model = _model()
        model.set_weights(weights)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    batch = strategy.experimental_distribute_values_from_function(lambda ctx: (tf.constant(xs), tf.constant(ys)))

    @tf.function
    def train_step(batch):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(xb, training=True) - yb), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=PER_WORKER_BATCH * size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.reduce(SUM, strategy.run(step, args=batch), axis=None)

    loss = float(train_step(batch))
    assert ops.calls > calls

    ref = _model()
    ref.set_weights(weights)
    with tf.GradientTape() as tape:
        ref_loss = tf.reduce_mean(tf.square(ref(x) - y))
    grads = tape.gradient(ref_loss, ref.trainable_variables)
    expected = [w - 0.1 * g.numpy() for w, g in zip(weights, grads)]
    assert loss == pytest.approx(float(ref_loss), rel=1e-5)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _same_on_every_rank(comm, model.get_weights())


def test_model_fit_keeps_ranks_identical(comm, strategy):
    size = comm.Get_size()
    weights = _initial_weights()
    # each rank gets different data: only the all-reduce keeps the replicas in step
    rng = np.random.default_rng(100 + comm.Get_rank())
    x = rng.standard_normal((32, 5)).astype(np.float32)
    y = x[:, :1] * 2.0
    ops = strategy.extended._cross_device_ops
    calls = ops.calls
    with strategy.scope():
        model = _model()
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8 * size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    history = model.fit(dataset.with_options(options), epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    assert ops.calls - calls >= 2 * 32 // (8 * size)
    assert not np.allclose(model.get_weights()[0], weights[0])
    assert _same_on_every_rank(comm, model.get_weights())
    assert _same_on_every_rank(comm, history.history["loss"])  # metrics are reduced across ranks too
    # predict gathers every worker's outputs (strategy.gather through collectives.allgather)
    calls_before_predict = ops.calls
    shared, _ = _global_data(20)  # the same input on every rank: each worker predicts its shard
    predicted = model.predict(shared, batch_size=8, verbose=0)
    assert predicted.shape == (20, 1)
    np.testing.assert_allclose(predicted, np.asarray(model(shared)), rtol=1e-5, atol=1e-6)
    assert ops.calls > calls_before_predict


def test_one_mirrored_strategy_per_process(comm, local_devices):
    rank, size = comm.Get_rank(), comm.Get_size()
    ops = tf_bridge.CollectivesAllReduce("ring", comm=comm)
    assert ops._num_between_graph_workers == size
    local = tf.distribute.MirroredStrategy(local_devices, cross_device_ops=ops)
    k = len(local_devices)

    def fn(ctx):
        return tf.fill([4], float(10 * rank + ctx.replica_id_in_sync_group + 1))

    value = local.experimental_distribute_values_from_function(fn)
    total = sum(10 * r + i + 1 for r in range(size) for i in range(k))
    summed, mean = (local.extended.batch_reduce_to(op, [(value, value)])[0] for op in (SUM, MEAN))
    for t in local.experimental_local_results(summed):  # "average": SUM divided by the process count
        np.testing.assert_array_equal(t.numpy(), np.full(4, total / size, np.float32))
    for t in local.experimental_local_results(mean):
        np.testing.assert_array_equal(t.numpy(), np.full(4, total / (size * k), np.float32))
    exact = tf_bridge.CollectivesAllReduce("tree", comm=comm, across_processes="sum")
    local_exact = tf.distribute.MirroredStrategy(local_devices, cross_device_ops=exact)
    value = local_exact.experimental_distribute_values_from_function(fn)
    for t in local_exact.experimental_local_results(local_exact.extended.batch_reduce_to(SUM, [(value, value)])[0]):
        np.testing.assert_array_equal(t.numpy(), np.full(4, total, np.float32))

    # Keras: different initial weights and data per rank; broadcast_weights + our op keep them in step
    with local.scope():
        keras.utils.set_random_seed(rank)
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    assert not _same_on_every_rank(comm, model.get_weights())
    tf_bridge.broadcast_weights(model, root=0)
    assert _same_on_every_rank(comm, model.get_weights())
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((32, 5)).astype(np.float32)
    before = ops.calls
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    assert ops.calls - before >= 4
    assert _same_on_every_rank(comm, model.get_weights())
