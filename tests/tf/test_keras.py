"""Keras 3 on MirroredStrategy(4 logical CPUs) with CollectivesAllReduce: fit, custom loop, save/reload."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed")
keras = pytest.importorskip("keras", reason="Keras not installed")

import tf_bridge  # noqa: E402

GLOBAL_BATCH = 16


def _data(n=64):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = (x @ rng.standard_normal((6, 1)) + 0.1).astype(np.float32)
    return x, y


def _initial_weights():
    keras.utils.set_random_seed(3)
    return _model().get_weights()


def _model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def _fit(strategy, weights, epochs=2):
    x, y = _data()
    with strategy.scope():
        model = _model()
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history["loss"]


@pytest.fixture(scope="module")
def reference(devices):
    weights = _initial_weights()
    model, losses = _fit(tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice()),
                         weights)
    return weights, model.get_weights(), losses


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical_copy"])
def test_fit_matches_reduction_to_one_device(devices, reference, algorithm):
    weights, ref_weights, ref_losses = reference
    options = {"group_size": 2} if algorithm == "hierarchical_copy" else {}
    ops = tf_bridge.CollectivesAllReduce(algorithm, **options)
    model, losses = _fit(tf.distribute.MirroredStrategy(devices, cross_device_ops=ops), weights)
    steps = 2 * (64 // GLOBAL_BATCH)
    assert ops.calls >= steps  # the gradients of every step went through our op
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for got, want, start in zip(model.get_weights(), ref_weights, weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got, start)  # training moved the weights


def test_custom_training_loop_matches_single_device_step(devices):
    weights = _initial_weights()
    x, y = _data(GLOBAL_BATCH)
    ops = tf_bridge.CollectivesAllReduce("ring")
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    with strategy.scope():
        model = _model()
        model.set_weights(weights)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    dist = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_step(batch):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(xb, training=True) - yb), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    loss = float(train_step(next(dist)))

    ref = _model()
    ref.set_weights(weights)
    with tf.GradientTape() as tape:
        ref_loss = tf.reduce_mean(tf.square(ref(x) - y))
    grads = tape.gradient(ref_loss, ref.trainable_variables)
    expected = [w - 0.1 * g.numpy() for w, g in zip(weights, grads)]
    assert ops.calls >= 1
    assert loss == pytest.approx(float(ref_loss), rel=1e-5)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_save_and_reload(devices, tmp_path):
    weights = _initial_weights()
    ops = tf_bridge.CollectivesAllReduce("tree")
    model, _ = _fit(tf.distribute.MirroredStrategy(devices, cross_device_ops=ops), weights, epochs=1)
    x, _ = _data(8)
    before = model.predict(x, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), before, rtol=1e-6)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    # reloaded under a strategy with our op again, it keeps training
    with tf.distribute.MirroredStrategy(devices, cross_device_ops=tf_bridge.CollectivesAllReduce("ring")).scope():
        again = keras.models.load_model(path)
    x, y = _data()
    again.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    assert not np.allclose(again.get_weights()[0], model.get_weights()[0])
