"""Several processes under mpiexec: a MultiWorkerMirroredStrategy per rank, and weight broadcast."""
import json
import os
import time

import numpy as np

import collectives
from collectives import config
from collectives.errors import CollectiveTimeout

from . import _addresses
from . import _tf_internals as _tfi
from ._watchdog import Watchdog
from ._ops import CollectivesAllReduce


def tf_config_from_mpi(comm=None, *, address=None):
    """A TF_CONFIG dict with one worker per rank of ``comm`` (default MPI.COMM_WORLD).

    Collective: call it on every rank. Each rank offers an address (``address``, else
    COLLECTIVES_TF_ADDRESS, else ``"auto"``: 127.0.0.1 when every rank runs on one node, otherwise
    the host name where it resolves to an address other than loopback on every rank, else the
    address of the interface that reaches the other nodes; ``"hostname"``, ``"interface"``, the
    name of a network interface or an address choose; tf_bridge/_addresses.py has the rules) and a
    free port. Before it returns every rank has connected to every worker's address and port,
    each connection bounded; a worker that cannot be reached raises CollectiveError on every rank,
    naming the worker, the address and the ranks that failed, within COLLECTIVES_TIMEOUT.
    """
    from collectives.mpilib import load

    MPI = load()  # one clear error naming both ways to an MPI library where none loads

    comm = MPI.COMM_WORLD if comm is None else comm
    addresses = _addresses.worker_addresses(comm, address, node=MPI.Get_processor_name())
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": comm.Get_rank()}}


def _workers_of(tf_config):
    try:
        return list(json.loads(tf_config)["cluster"]["worker"])
    except (ValueError, KeyError, TypeError):
        return []


def start_tensorflow(comm, make):
    """``make()`` (e.g. a MultiWorkerMirroredStrategy's constructor, on every rank of ``comm``, with
    TF_CONFIG set): TensorFlow's start-up, bounded. It can wait without end for a worker it cannot
    reach, and it waits holding Python's lock, so no Python thread can watch it: the workers'
    registration is bounded by TensorFlow itself (half of COLLECTIVES_TIMEOUT, configured before it
    starts), and a watchdog process ends this process with a message where the start-up and the
    ranks' exchange of how it went have not finished within COLLECTIVES_TIMEOUT. Where any rank's
    start-up failed, every rank gets the same CollectiveTimeout naming those ranks and what they
    waited for, and the job is aborted unless COLLECTIVES_ON_ERROR=raise."""
    workers = _workers_of(os.environ.get("TF_CONFIG", ""))
    what = (f"every worker's gRPC server, and all {len(workers)} workers registering with the coordination service "
            f"of worker 0 at {workers[0] if workers else '?'}")
    limit = config.timeout()
    rank, size = comm.Get_rank(), comm.Get_size()
    text = f"multi_worker_strategy: TensorFlow's start-up ({what}) did not finish on every worker within {limit:g} s"
    _tfi.bound_registration(limit / 2)
    started = time.monotonic()
    result = error = None
    with Watchdog(limit, f"collectives: rank {rank} of {size}: CollectiveTimeout: {text}; ending the process "
                         f"(TensorFlow waits holding Python's lock: nothing can be raised in it)"):
        try:
            result = make()
        except Exception as exc:  # noqa: BLE001 - every rank learns of it below
            error = exc
        status = None if error is None else \
            f"{type(error).__name__} after {time.monotonic() - started:.0f} s: {_first_line(error)}"
        collectives.barrier(comm)
        statuses = comm.allgather(status)
    failed = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if not failed:
        return result
    exc = CollectiveTimeout(f"{text}: " + "; ".join(f"rank {r}: {s}" for r, s in failed))
    collectives.as_comm(comm).on_failure(exc)  # ends the job unless COLLECTIVES_ON_ERROR=raise
    raise exc from error


def _first_line(exc, width=300):
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:width]


def multi_worker_strategy(algorithm="ring", cross_device_ops=None, *, comm=None, set_tf_config=True,
                          communication_options=None, address=None, **options):
    """A MultiWorkerMirroredStrategy with one worker per MPI rank, reducing through collectives.

    Call it on every rank (under mpiexec), before any other TensorFlow op runs. TF_CONFIG is
    built from the MPI world (unless ``set_tf_config=False`` and it is already set). The
    strategy's gradient all-reduce (and every other reduction it makes) goes through
    ``cross_device_ops``, by default ``CollectivesAllReduce(algorithm, comm=comm, **options)``
    over MPI. A given ``CollectivesAllReduce`` built without ``comm`` is bound to ``comm`` here
    (that instance is the one used: its subclass, counters and options stay); one built on a
    communicator of another size is refused. The strategy returned also accepts what Keras 3's
    model.fit hands it, so plain ``model.compile`` + ``model.fit`` work (see
    tf_bridge/_tf_internals.py). ``address`` chooses the workers' addresses (tf_config_from_mpi).

    Start-up is bounded: every rank meets at a barrier bounded by COLLECTIVES_TIMEOUT (a rank that
    never calls is named) before any blocking MPI call; tf_config_from_mpi checks that every worker
    reaches every other; TensorFlow's own start-up (its gRPC server, every worker registering with
    the coordination service of worker 0) is watched for COLLECTIVES_TIMEOUT, and one that has not
    finished by then ends the job with an error naming the ranks and what they waited for
    (COLLECTIVES_ON_ERROR=raise: raised on every rank instead).
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
        os.environ["TF_CONFIG"] = json.dumps(tf_config_from_mpi(comm, address=address))
    import tensorflow as tf

    kwargs = {}
    if communication_options is not None:
        kwargs["communication_options"] = communication_options
    strategy = start_tensorflow(comm, lambda: _tfi.KerasFriendlyMultiWorkerStrategy(**kwargs))
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
