"""Several processes under mpiexec: a MultiWorkerMirroredStrategy per rank, and weight broadcast."""
import json
import os
import socket

import numpy as np

import collectives

from . import _tf_internals as _tfi
from ._ops import CollectivesAllReduce


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        return sock.getsockname()[1]


def tf_config_from_mpi(comm=None):
    """A TF_CONFIG dict with one worker per rank of ``comm`` (default MPI.COMM_WORLD).

    Every rank picks a free port; the addresses are exchanged with mpi4py. Ranks that
    all run on one node use 127.0.0.1; otherwise each rank's host name.
    """
    from collectives.mpilib import load

    MPI = load()  # one clear error naming both ways to an MPI library where none loads

    comm = MPI.COMM_WORLD if comm is None else comm
    # every rank must be here before mpi4py's blocking all-gathers: bounded by COLLECTIVES_TIMEOUT
    collectives.barrier(comm)
    names = comm.allgather(MPI.Get_processor_name())
    if len(set(names)) == 1:
        host = "127.0.0.1"
        port = _free_port(host)
    else:
        host = socket.gethostname()
        port = _free_port("")
    addresses = comm.allgather(f"{host}:{port}")
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": comm.Get_rank()}}


def multi_worker_strategy(algorithm="ring", cross_device_ops=None, *, comm=None, set_tf_config=True,
                          communication_options=None, **options):
    """A MultiWorkerMirroredStrategy with one worker per MPI rank, reducing through collectives.

    Call it on every rank (under mpiexec), before any other TensorFlow op runs. TF_CONFIG is
    built from the MPI world (unless ``set_tf_config=False`` and it is already set). The
    strategy's gradient all-reduce (and every other reduction it makes) goes through
    ``cross_device_ops``, by default ``CollectivesAllReduce(algorithm, comm=comm, **options)``
    over MPI. A given ``CollectivesAllReduce`` built without ``comm`` is bound to ``comm`` here
    (that instance is the one used: its subclass, counters and options stay); one built on a
    communicator of another size is refused. The strategy returned also accepts what Keras 3's
    model.fit hands it, so plain ``model.compile`` + ``model.fit`` work (see
    tf_bridge/_tf_internals.py). Start-up waits for every rank at a barrier bounded by
    COLLECTIVES_TIMEOUT (a rank that never calls is named), before any blocking MPI call.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if cross_device_ops is not None and not isinstance(cross_device_ops, CollectivesAllReduce):
        raise TypeError("multi_worker_strategy needs a tf_bridge.CollectivesAllReduce as cross_device_ops, "
                        f"got {type(cross_device_ops).__name__}")
    if cross_device_ops is not None and cross_device_ops.comm is not None \
            and cross_device_ops.num_processes != comm.Get_size():
        raise ValueError(f"cross_device_ops was built on a communicator of {cross_device_ops.num_processes} "
                         f"process(es) but the strategy's has {comm.Get_size()}: build it without comm= (it is "
                         f"then bound to the strategy's communicator) or with comm=MPI.COMM_WORLD")
    collectives.barrier(comm)  # every rank is here, or a bounded CollectiveTimeout names the absent ones
    if cross_device_ops is None:
        cross_device_ops = CollectivesAllReduce(algorithm, comm=comm, across_processes="sum", **options)
    else:
        if cross_device_ops.comm is None:
            cross_device_ops.bind(comm)
        # the strategy scales by the global replica count itself: SUM must be the exact sum
        cross_device_ops.across_processes = "sum"
    if set_tf_config or "TF_CONFIG" not in os.environ:
        os.environ["TF_CONFIG"] = json.dumps(tf_config_from_mpi(comm))
    import tensorflow as tf

    kwargs = {}
    if communication_options is not None:
        kwargs["communication_options"] = communication_options
    strategy = _tfi.KerasFriendlyMultiWorkerStrategy(**kwargs)
    if _tfi.worker_count(strategy) != comm.Get_size():
        raise RuntimeError(f"the strategy sees {_tfi.worker_count(strategy)} workers, MPI has {comm.Get_size()}; "
                           f"TF_CONFIG={os.environ.get('TF_CONFIG')}")
    _tfi.install_cross_device_ops(strategy, cross_device_ops)
    del tf
    return strategy


def broadcast_weights(model, root=0, comm=None, optimizer=True):
    """Copy ``model``'s weights (and its optimizer's, if built and ``optimizer``) from ``root`` to every rank.

    For the one-MirroredStrategy-per-process pattern: call it on every rank after the model
    (and optionally the optimizer) is built, before training.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    variables = list(model.weights)
    opt = getattr(model, "optimizer", None)
    if optimizer and opt is not None and getattr(opt, "built", False):
        variables += list(opt.variables)
    for var in variables:
        value = np.ascontiguousarray(np.array(var.numpy(), copy=True))
        collectives.broadcast(value, root=root, comm=comm)
        var.assign(value)
    return model
