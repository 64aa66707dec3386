"""Median Keras training-step time of a ~1M-parameter MLP per cross_device_ops, side by side.

One process, N logical CPU devices (MirroredStrategy)::

    python benchmarks/tf_step_time.py [--devices 4] [--steps 20] [--rounds 3] [--batch 256]
                                      [--algorithms ring,tree] [--implementations tf,numpy]

rows: CollectivesAllReduce per algorithm (and per implementation: "tf", the algorithm's
plan run as TensorFlow ops on each device; "numpy", one numpy_function over a threaded
world), tf.distribute.ReductionToOneDevice, and TensorFlow's default (MirroredStrategy()
without cross_device_ops).

Several processes, one CPU worker each (MultiWorkerMirroredStrategy)::

    mpiexec -n 2 python benchmarks/tf_step_time.py --multi-worker [--algorithms ring]

rows: our reduction over MPI (``tf_bridge.multi_worker_strategy``'s op) per algorithm,
and stock MultiWorkerMirroredStrategy's own collectives over gRPC, on one strategy
object in one run (TensorFlow allows one per process: the cross-device ops are swapped
before each model's train function is traced).

Every configuration gets its own model (same seed), traced and warmed up first; then
``--rounds`` rounds each run ``--steps`` steps of every configuration in turn, so that
load from other processes on the machine falls on all of them alike. A step's time is
the time between consecutive on_train_batch_end callbacks; the first step of each round
is not counted. "vs fastest TF" divides a row's median by the fastest TensorFlow
built-in's median (below 1.00: faster than TensorFlow).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FEATURES, HIDDEN, CLASSES = 512, (1024, 512), 10


def _model(keras):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((FEATURES,))] + [keras.layers.Dense(h, activation="relu") for h in HIDDEN]
    model = keras.Sequential(layers + [keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _timer(keras):
    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    return Timer()


def _run_rounds(configs, fit, rounds, keras):
    """configs: [(label, model, ops, before)]; ``before()`` runs before each of that model's fits."""
    import numpy as np

    times = {label: [] for label, *_ in configs}
    for label, model, ops, before in configs:  # trace + warm-up
        before()
        fit(model, None)
        if hasattr(ops, "reset_counters"):
            ops.reset_counters()
    for _ in range(rounds):
        for label, model, ops, before in configs:
            before()
            timer = _timer(keras)
            fit(model, timer)
            times[label].extend((np.diff(timer.stamps) * 1e3).tolist())  # the first step is not counted
    rows = []
    for label, _, ops, _ in configs:
        steps = times[label]
        calls = getattr(ops, "calls", None)
        rows.append((label, statistics.median(steps), min(steps), max(steps), calls, len(steps)))
    return rows


def _print_table(title, rows, builtin_prefix):
    best = min(median for label, median, *_ in rows if label.startswith(builtin_prefix))
    print(title)
    print()
    print("| cross_device_ops | median step (ms) | fastest (ms) | slowest (ms) | vs fastest TF | our op's calls |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, median, fastest, slowest, calls, _ in rows:
        print(f"| {label} | {median:.1f} | {fastest:.1f} | {slowest:.1f} | {median / best:.2f} | "
              f"{'-' if calls is None else calls} |")
    sys.stdout.flush()


def _data(n, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, n).astype(np.int32))


def single_process(args):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    import keras

    import collectives
    import tf_bridge

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    algorithms = args.algorithms.split(",") if args.algorithms else collectives.algorithm_names()
    implementations = args.implementations.split(",")
    makers = []
    for implementation in implementations:
        for a in algorithms:
            label = f"collectives {a}" + ("" if len(implementations) == 1 else f" ({implementation})")
            makers.append((label, lambda a=a, i=implementation: tf_bridge.CollectivesAllReduce(a, implementation=i)))
    makers += [("tf ReductionToOneDevice", tf.distribute.ReductionToOneDevice), ("tf default (None)", lambda: None)]

    x, y = _data(args.batch * (args.steps + 1))
    configs = []
    params = None
    for label, make in makers:
        ops = make()
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        with strategy.scope():
            model = _model(keras)
        params = model.count_params()
        configs.append((label, model, ops, lambda: None))

    def fit(model, timer):
        model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[] if timer is None else [timer])

    rows = _run_rounds(configs, fit, args.rounds, keras)
    _print_table(f"Keras MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-{CLASSES} ({params:,} parameters), "
                 f"global batch {args.batch}, {args.devices} logical CPU devices, {args.rounds} rounds x "
                 f"{args.steps} steps ({rows[0][5]} timed per row); TensorFlow {tf.__version__}, "
                 f"Keras {keras.__version__}, {os.cpu_count()} CPU cores ({platform.machine()})",
                 rows, "tf ")


def multi_worker(args):
    from mpi4py import MPI

    import tf_bridge

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        raise SystemExit("--multi-worker runs under mpiexec -n 2 (or more)")
    os.environ["TF_CONFIG"] = json.dumps(tf_bridge.tf_config_from_mpi(comm))
    import tensorflow as tf
    import keras

    from tf_bridge import _tf_internals as tfi

    # One strategy (TensorFlow takes one collective configuration per process). Its stock
    # cross-device ops are TensorFlow's CollectiveAllReduce over gRPC; ours replace them per model.
    strategy = tfi.KerasFriendlyMultiWorkerStrategy()
    extended = strategy.extended
    stock = (extended._cross_device_ops, extended._host_cross_device_ops)

    def install(ops):
        def before():
            if ops is None:
                extended._cross_device_ops, extended._host_cross_device_ops = stock
            else:
                tfi.install_cross_device_ops(strategy, ops)
        return before

    algorithms = args.algorithms.split(",") if args.algorithms else ["ring"]
    makers = [(f"collectives {a} over MPI", lambda a=a: tf_bridge.CollectivesAllReduce(
        a, comm=comm, across_processes="sum")) for a in algorithms]
    makers.append(("tf MultiWorkerMirroredStrategy (gRPC collectives)", lambda: None))

    x, y = _data(args.batch * (args.steps + 1))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).with_options(options)

    configs = []
    params = None
    for label, make in makers:
        ops = make()
        install(ops)()
        with strategy.scope():
            model = _model(keras)
        params = model.count_params()
        configs.append((label, model, ops, install(ops)))

    def fit(model, timer):
        model.fit(dataset, epochs=1, verbose=0, callbacks=[] if timer is None else [timer])

    rows = _run_rounds(configs, fit, args.rounds, keras)
    # a step ends when every rank has it: report the slowest rank's figures
    gathered = comm.gather(rows, root=0)
    if rank == 0:
        merged = []
        for per_rank in zip(*gathered):
            label = per_rank[0][0]
            merged.append((label, max(r[1] for r in per_rank), max(r[2] for r in per_rank),
                           max(r[3] for r in per_rank), per_rank[0][4], per_rank[0][5]))
        _print_table(f"Keras MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-{CLASSES} ({params:,} parameters), "
                     f"global batch {args.batch}, {size} processes x 1 CPU worker (mpiexec -n {size}, one node), "
                     f"{args.rounds} rounds x {args.steps} steps ({merged[0][5]} timed per row, slowest rank); "
                     f"TensorFlow {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPU cores "
                     f"({platform.machine()})", merged, "tf ")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="logical CPU devices (one process)")
    parser.add_argument("--steps", type=int, default=20, help="steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="global batch size")
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated; default: all (one process), ring (--multi-worker)")
    parser.add_argument("--implementations", default="tf", help="comma-separated: tf, numpy (one process)")
    parser.add_argument("--multi-worker", action="store_true",
                        help="under mpiexec: ours over MPI against stock MultiWorkerMirroredStrategy")
    args = parser.parse_args(argv)
    if args.multi_worker:
        multi_worker(args)
    else:
        single_process(args)


if __name__ == "__main__":
    main()
