"""tf_bridge: collectives' all-reduce algorithms as a tf.distribute.CrossDeviceOps.

One process, several devices::

    import tensorflow as tf, tf_bridge
    ops = tf_bridge.CollectivesAllReduce(algorithm="ring")
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)

Several processes (under mpiexec), one worker per MPI rank::

    strategy = tf_bridge.multi_worker_strategy(algorithm="ring")

or one MirroredStrategy per process::

    ops = tf_bridge.CollectivesAllReduce("ring", comm=MPI.COMM_WORLD)
    strategy = tf.distribute.MirroredStrategy(local_devices, cross_device_ops=ops)
    ...build the model...; tf_bridge.broadcast_weights(model, root=0)

See docs/tensorflow.md.
"""
from . import _tf_internals  # noqa: F401  (checks the TensorFlow version first)
from ._multi_worker import broadcast_weights, multi_worker_strategy, tf_config_from_mpi
from ._ops import CollectivesAllReduce

__all__ = ["CollectivesAllReduce", "multi_worker_strategy", "broadcast_weights", "tf_config_from_mpi"]
