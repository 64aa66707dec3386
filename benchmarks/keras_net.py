"""Keras step time across emulated hosts: our op exact, our op with bf16 and buckets, and stock
MultiWorkerMirroredStrategy over gRPC, on one strategy object in one run.

    python -m benchmarks.cluster --hosts 2 --ranks-per-host 1 --rate 500M -- \\
        python -m benchmarks.keras_net [--steps 6] [--rounds 3] [--batch 128] [--hidden 2048,2048,2048]

The model is benchmarks/tf_step_time.py's MLP with wider hidden layers (512-2048-2048-2048-10:
9.5M parameters, 38 MB of float32 gradients a step); the rounds, timing (time between consecutive
batch ends, the slowest rank's median) and table are that script's. TF_CONFIG and TensorFlow's
bounded start-up are the library's (tf_bridge.tf_config_from_mpi: on the emulated hosts, whose
names do not resolve, each worker's interface address, checked from every rank).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import tf_step_time as base  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--hidden", default="2048,2048,2048")
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--bytes-per-pack", type=int, default=4 << 20, help="pack (and bucket) bytes of the bf16 op")
    args = parser.parse_args(argv)
    base.HIDDEN = tuple(int(h) for h in args.hidden.split(","))

    from mpi4py import MPI

    import tf_bridge

    comm = MPI.COMM_WORLD
    config = tf_bridge.tf_config_from_mpi(comm)  # bounded; raises on every rank naming an unreachable worker
    addresses = config["cluster"]["worker"]
    os.environ["TF_CONFIG"] = json.dumps(config)
    import keras
    import tensorflow as tf

    from tf_bridge import _multi_worker
    from tf_bridge import _tf_internals as tfi

    strategy = _multi_worker.start_tensorflow(comm, tfi.KerasFriendlyMultiWorkerStrategy)
    extended = strategy.extended
    stock = (extended._cross_device_ops, extended._host_cross_device_ops)

    def install(ops):
        def before():
            if ops is None:
                extended._cross_device_ops, extended._host_cross_device_ops = stock
            else:
                tfi.install_cross_device_ops(strategy, ops)
        return before

    a = args.algorithm
    makers = [
        (f"collectives {a} over MPI, exact", lambda: tf_bridge.CollectivesAllReduce(
            a, comm=comm, across_processes="sum", implementation="numpy")),
        (f"collectives {a} over MPI, bf16 + buckets of {args.bytes_per_pack >> 20} MiB",
         lambda: tf_bridge.CollectivesAllReduce(a, comm=comm, across_processes="sum", implementation="numpy",
                                                compression="bf16", bytes_per_pack=args.bytes_per_pack,
                                                bucket_bytes=args.bytes_per_pack)),
        ("tf MultiWorkerMirroredStrategy (gRPC collectives)", lambda: None),
    ]
    x, y = base._data(args.batch * (args.steps + 1))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).with_options(options)
    configs, params = [], None
    for label, make in makers:
        ops = make()
        install(ops)()
        with strategy.scope():
            model = base._model(keras)
        params = model.count_params()
        configs.append((label, model, ops, install(ops)))

    def fit(model, timer):
        model.fit(dataset, epochs=1, verbose=0, callbacks=[] if timer is None else [timer])

    rows = base._run_rounds(configs, fit, args.rounds, keras)
    gathered = comm.gather(rows, root=0)
    if comm.Get_rank() == 0:
        merged = []
        for per_rank in zip(*gathered):
            merged.append((per_rank[0][0], max(r[1] for r in per_rank), max(r[2] for r in per_rank),
                           max(r[3] for r in per_rank), per_rank[0][4], per_rank[0][5]))
        hosts = len(set(addresses and [h.split(":")[0] for h in addresses]))
        base._print_table(f"Keras MLP {base.FEATURES}-{'-'.join(map(str, base.HIDDEN))}-{base.CLASSES} "
                          f"({params:,} parameters), global batch {args.batch}, {comm.Get_size()} workers on "
                          f"{hosts} hosts, {args.rounds} rounds x {args.steps} steps ({merged[0][5]} timed per "
                          f"row, slowest rank); TensorFlow {tf.__version__}, Keras {keras.__version__}",
                          merged, "tf ")


if __name__ == "__main__":
    main()
