"""Keras model.fit on MultiWorkerMirroredStrategy, one worker per MPI rank, all-reduce over MPI.

    mpiexec -n 2 python examples/keras_multi_worker.py [--algorithm ring] [--epochs 3]

Across hosts too: each worker's address is one every other reaches (checked before TensorFlow
starts; COLLECTIVES_TF_ADDRESS chooses, docs/tensorflow.md).
"""
import argparse
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    from mpi4py import MPI

    import tf_bridge  # imports TensorFlow

    strategy = tf_bridge.multi_worker_strategy(algorithm=args.algorithm)  # before any other TF op
    import keras

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rng = np.random.default_rng(0)  # same data on every rank; TF shards it per worker
    x = rng.standard_normal((2048, 20)).astype(np.float32)
    y = (x @ rng.standard_normal((20, 1)) + 0.5).astype(np.float32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    history = model.fit(x, y, batch_size=128, epochs=args.epochs, verbose=2 if rank == 0 else 0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    same = all(np.array_equal(weights, other) for other in comm.allgather(weights))
    ops = strategy.extended._cross_device_ops
    print(f"rank {rank}: final loss {history.history['loss'][-1]:.4f}, weights identical on all ranks: {same}, "
          f"collectives calls: {ops.calls}, weights sha256 {hashlib.sha256(weights.tobytes()).hexdigest()[:16]}",
          flush=True)


if __name__ == "__main__":
    main()
