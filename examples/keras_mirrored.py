"""Keras model.fit on MirroredStrategy over 4 logical CPUs, gradients all-reduced by collectives.

    python examples/keras_mirrored.py [--algorithm ring] [--devices 4] [--epochs 3]
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    import keras

    import tf_bridge

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    ops = tf_bridge.CollectivesAllReduce(algorithm=args.algorithm)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    print(f"{strategy.num_replicas_in_sync} replicas, {ops!r}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 20)).astype(np.float32)
    y = (x @ rng.standard_normal((20, 1)) + 0.5).astype(np.float32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    history = model.fit(x, y, batch_size=128, epochs=args.epochs, verbose=2)
    print(f"final loss {history.history['loss'][-1]:.4f}; all-reduce calls through collectives: {ops.calls}")


if __name__ == "__main__":
    main()
