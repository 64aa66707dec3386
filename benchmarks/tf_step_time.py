"""Median Keras training-step time of a ~1M-parameter MLP per cross_device_ops, side by side.

    python benchmarks/tf_step_time.py [--devices 4] [--steps 20] [--batch 256] [--algorithms ring,tree]

Runs MirroredStrategy on N logical CPU devices with: CollectivesAllReduce for every
algorithm in collectives.algorithms(), tf.distribute.ReductionToOneDevice, and
TensorFlow's default (MirroredStrategy() without cross_device_ops). Each row: the
median, fastest and slowest of --steps timed steps after --warmup untimed ones (the
time between consecutive on_train_batch_end callbacks in model.fit).
"""
import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="global batch size")
    parser.add_argument("--algorithms", default=None, help="comma-separated; default: all")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    import keras

    import collectives
    import tf_bridge

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    algorithms = args.algorithms.split(",") if args.algorithms else collectives.algorithms()
    configs = [(f"collectives {a}", lambda a=a: tf_bridge.CollectivesAllReduce(a)) for a in algorithms]
    configs += [("tf ReductionToOneDevice", tf.distribute.ReductionToOneDevice), ("tf default (None)", lambda: None)]

    rng = np.random.default_rng(0)
    n = args.batch * (args.steps + args.warmup)
    x = rng.standard_normal((n, 512)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    rows = []
    params = None
    for label, make in configs:
        ops = make()
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                                      keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        params = model.count_params()
        timer = Timer()
        model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        steps = np.diff(timer.stamps[args.warmup - 1:]) * 1e3
        calls = getattr(ops, "calls", None)
        rows.append((label, statistics.median(steps), steps.min(), steps.max(), calls))

    print(f"Keras MLP 512-1024-512-10 ({params:,} parameters), global batch {args.batch}, "
          f"{args.devices} logical CPU devices, {args.steps} timed steps; TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}, {os.cpu_count()} CPU cores ({platform.machine()})")
    print()
    print("| cross_device_ops | median step (ms) | fastest (ms) | slowest (ms) | our op's calls |")
    print("|---|---:|---:|---:|---:|")
    for label, median, fastest, slowest, calls in rows:
        print(f"| {label} | {median:.1f} | {fastest:.1f} | {slowest:.1f} | {'-' if calls is None else calls} |")


if __name__ == "__main__":
    main()
