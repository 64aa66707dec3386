"""Restart a Keras job on the survivors: checkpoint from rank 0, restore the latest at start.

Recipe 1 of docs/reliability.md ("Elastic", TensorFlow). Keras ``model.fit`` trains under
``tf_bridge.multi_worker_strategy`` (one worker per MPI rank); at the end of every epoch of
``--steps-per-epoch`` steps, rank 0 writes a checkpoint (``tf.train.CheckpointManager``: the model,
the optimizer and its step counter) to CHECKPOINT_DIR, which every rank must see. At start, every
rank restores the latest checkpoint there, if any, and ``fit`` goes on from its epoch.

    mpiexec -n 3 python examples/elastic_keras_restart.py CKPT --die-at 8 --die-rank 2   # rank 2 dies
    mpiexec -n 2 python examples/elastic_keras_restart.py CKPT                            # goes on

With ``--die-at K`` the rank ``--die-rank`` ends itself (``os._exit(1)``) before step K, as a
crashed host would; under the default COLLECTIVES_ON_ERROR=abort the job then ends (the MPI
launcher ends the other ranks). Each rank prints ``RESTORED step S loss L`` (or ``FRESH``) and at
the end ``DONE step S loss L sha256 H identical True``: the loss over the whole data set and the
digest of its weights, checked bitwise equal on every rank.
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=3)
    parser.add_argument("--die-at", type=int, default=None, help="global step before which a rank dies")
    parser.add_argument("--die-rank", type=int, default=None, help="the rank that dies (default: the last)")
    args = parser.parse_args()

    import numpy as np
    from mpi4py import MPI

    import tf_bridge  # imports TensorFlow

    strategy = tf_bridge.multi_worker_strategy()  # before any other TF op
    import keras
    import tensorflow as tf

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    batch = 12  # the global batch: every step sees the same rows whatever the number of ranks
    rng = np.random.default_rng(0)  # the same data on every rank; TensorFlow shards each batch
    x = rng.standard_normal((batch * args.steps_per_epoch, 8)).astype(np.float32)
    y = (np.sin(x @ rng.standard_normal((8, 1))) + 0.5).astype(np.float32)

    with strategy.scope():
        keras.utils.set_random_seed(1)  # the same initial weights on every rank
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
        model.optimizer.build(model.trainable_variables)  # its slots exist before a restore
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=2)
    step = lambda: int(model.optimizer.iterations.numpy())  # noqa: E731
    loss = lambda: float(np.mean((model(x).numpy() - y) ** 2))  # noqa: E731

    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        print(f"rank {rank}: RESTORED step {step()} loss {loss():.6f} from {manager.latest_checkpoint}", flush=True)
    else:
        print(f"rank {rank}: FRESH step 0 loss {loss():.6f}", flush=True)

    die_rank = comm.Get_size() - 1 if args.die_rank is None else args.die_rank

    class Elastic(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if rank == die_rank and step() == args.die_at:
                print(f"rank {rank}: DYING before step {step()} at {time.time():.3f}", flush=True)
                os._exit(1)

        def on_epoch_end(self, epoch, logs=None):
            if rank == 0:  # one writer; every rank holds the same weights
                manager.save(checkpoint_number=step())

    model.fit(x, y, batch_size=batch, epochs=args.epochs, initial_epoch=step() // args.steps_per_epoch,
              shuffle=False, callbacks=[Elastic()], verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    same = all(np.array_equal(weights, other) for other in comm.allgather(weights))
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"rank {rank}: DONE step {step()} loss {loss():.6f} sha256 {digest} identical {same}", flush=True)


if __name__ == "__main__":
    main()
