"""Elastic data-parallel training: a rank dies mid-run and the survivors finish the job.

A small NumPy network (two layers, tanh) learns a regression task; each rank computes the gradient
on its shard of the batch and a ``collectives.Bucketer`` averages the gradients with ``iallreduce``
while the backward pass goes on. At step KILL_AT the last rank kills itself (SIGKILL) in the middle
of a step, after its first bucket has started. Every survivor gets ``collectives.RanksLost`` from
``Bucketer.wait()`` and follows the recipe of docs/reliability.md:

1. go on with ``error.survivors`` (a communicator of the survivors, rank order kept);
2. take the state (weights, step) from the survivors' rank 0: every survivor then holds the same
   state, even where one had completed the step the others could not (``error.ahead`` says so:
   it had applied that step's update already; ``error.completed`` counts the bucket calls that
   returned on every survivor);
3. make a new Bucketer on the survivors and repeat the step (the shards are re-cut for the new size).

Run (Open MPI with ULFM; the launch of docs/reliability.md):

    COLLECTIVES_ON_ERROR=shrink COLLECTIVES_TIMEOUT=20 \\
      mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self -n 4 python examples/elastic_training.py

Each survivor prints ``ELASTIC-TRAIN rank R: ...``: the loss before and after the loss of the
rank, its final loss, and the digest of its weights, which the survivors check are bitwise equal.
"""
import hashlib
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import collectives

STEPS = int(os.environ.get("ELASTIC_STEPS", "60"))
KILL_AT = int(os.environ.get("ELASTIC_KILL_AT", "25"))
BATCH, FEATURES, HIDDEN, LR = 512, 8, 32, 0.05


def data():
    rng = np.random.default_rng(1)  # every rank holds the same data set and cuts its own shard
    x = rng.standard_normal((BATCH, FEATURES))
    y = np.sin(x @ rng.standard_normal((FEATURES, 1))) + 0.1 * x[:, :1]
    return x, y


def init():
    rng = np.random.default_rng(2)  # the same initial weights on every rank
    return [rng.standard_normal((FEATURES, HIDDEN)) * 0.3, np.zeros(HIDDEN),
            rng.standard_normal((HIDDEN, 1)) * 0.3, np.zeros(1)]


def loss_and_grads(weights, x, y):
    w1, b1, w2, b2 = weights
    h = np.tanh(x @ w1 + b1)
    err = h @ w2 + b2 - y
    d_out = 2 * err / len(x)
    d_h = (d_out @ w2.T) * (1 - h * h)
    return float(np.mean(err * err)), [x.T @ d_h, d_h.sum(0), h.T @ d_out, d_out.sum(0)]


def main():
    world = MPI.COMM_WORLD
    comm = world
    x, y = data()
    weights = init()
    grads = [np.zeros_like(w) for w in weights]
    buckets = collectives.Bucketer(grads, bucket_bytes=1024, op="avg", comm=comm)
    losses, lost_at, step = [], None, 0
    while step < STEPS:
        rank, size = comm.Get_rank(), comm.Get_size()
        shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
        _, local = loss_and_grads(weights, x[shard], y[shard])
        try:
            for i in reversed(range(len(grads))):  # the backward pass hands gradients over last first
                grads[i][...] = local[i]
                buckets.mark_ready(i)
                if step == KILL_AT and world.Get_rank() == world.Get_size() - 1:
                    os.kill(os.getpid(), signal.SIGKILL)  # dies with its first bucket in flight
            buckets.wait()
        except collectives.RanksLost as error:
            comm = error.survivors
            state = comm.bcast((weights, step), root=0)  # the survivors take rank 0's state
            weights, step = state
            buckets = collectives.Bucketer(grads, bucket_bytes=1024, op="avg", comm=comm)
            lost_at = step
            print(f"ELASTIC-TRAIN rank {world.Get_rank()}: lost ranks {list(error.lost)} at step {step}; "
                  f"{comm.Get_size()} survivors go on (bucket calls completed on every survivor: "
                  f"{error.completed}; this rank ahead by {error.ahead})", flush=True)
            continue
        for w, g in zip(weights, grads):
            w -= LR * g
        losses.append(loss_and_grads(weights, x, y)[0])
        step += 1
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()[:16]
    digests = comm.allgather(digest)
    same = len(set(digests)) == 1
    before = losses[KILL_AT - 1] if lost_at is not None and KILL_AT <= len(losses) else float("nan")
    falling = losses[-1] < losses[0] and (lost_at is None or losses[-1] < before)
    print(f"ELASTIC-TRAIN rank {world.Get_rank()}: {comm.Get_size()} ranks at the end; loss {losses[0]:.4f} -> "
          f"{before:.4f} (step {KILL_AT}) -> {losses[-1]:.4f}; weights {digest}; "
          f"{'identical on every survivor' if same else 'DIFFERENT across survivors'}; "
          f"{'loss falling' if falling else 'LOSS NOT FALLING'}", flush=True)
    return 0 if same and falling else 1


if __name__ == "__main__":
    sys.exit(main())
