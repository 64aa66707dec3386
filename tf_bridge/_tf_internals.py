"""Every private TensorFlow attribute tf_bridge touches, and the Keras 3 workarounds, in one place.

The rest of tf_bridge uses public TensorFlow API only. This module is checked
against the TensorFlow version on import: outside the tested range it raises
ImportError naming the version found and what would need re-checking, rather
than failing later in some obscure way inside a training step.

Private things used here (all verified on TensorFlow 2.21 / Keras 3.15):

* ``tensorflow.python.distribute.values.PerReplica`` / ``Mirrored`` and
  ``distribute_utils.regroup``: to return one tensor per destination device
  wrapped the way the strategy expects.
* ``cross_device_ops.get_devices_from``: the device list of a destination
  (a device string, a variable, a PerReplica or a Mirrored value).
* ``CrossDeviceOps._num_between_graph_workers`` (overridden by our op, not read
  here) and ``CrossDeviceOps._all_reduce`` (called by MultiWorkerMirroredStrategy
  in replica context instead of merge_call).
* ``strategy.extended._cross_device_ops`` / ``_host_cross_device_ops``: the only
  way to put our op into a MultiWorkerMirroredStrategy, whose constructor takes
  no cross_device_ops and asserts its own type.
* Grappler's ArithmeticOptimizer tag ``_grappler_ArithmeticOptimizer_AddOpsRewriteStage``
  (an op attribute): set on the adds of a plan run as TF ops, so that grappler does not
  flatten a tree of same-device adds into one AddN, which would change the order of the
  additions (``keep_add_order``).
* ``resource_variable_ops.ResourceVariable`` constructed directly: a plain variable
  (our op's call counter) even inside a strategy's scope, where ``tf.Variable``
  would make a MirroredVariable.
* ``context.context().configure_coordination_service`` (with ``multi_worker_util.coordination_leader``
  and ``coordination_config_pb2.CoordinatedJob``): the coordination service
  MultiWorkerMirroredStrategy would configure itself, with a bound on the workers'
  registration (``bound_registration``), set before the strategy is made.
"""
import re

import tensorflow as tf

# (major, minor) versions whose private attributes were checked against this module.
TESTED_MIN = (2, 16)
TESTED_MAX = (2, 21)


def _version_tuple(text):
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def check_version(version=None):
    """Raise ImportError unless ``version`` (default: the installed TensorFlow) is supported."""
    version = tf.__version__ if version is None else version
    found = _version_tuple(version)
    if not TESTED_MIN <= found <= TESTED_MAX:
        raise ImportError(
            f"tf_bridge supports TensorFlow {TESTED_MIN[0]}.{TESTED_MIN[1]} to {TESTED_MAX[0]}.{TESTED_MAX[1]}, "
            f"found {version}. It relies on private tf.distribute attributes (values.PerReplica/Mirrored, "
            f"distribute_utils.regroup, cross_device_ops.get_devices_from, strategy.extended._cross_device_ops, "
            f"CrossDeviceOps._num_between_graph_workers/_all_reduce); re-check them in "
            f"tf_bridge/_tf_internals.py before widening TESTED_MAX.")
    return found


check_version()

from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as _coordination  # noqa: E402
from tensorflow.python.distribute import cross_device_ops as _cdo  # noqa: E402
from tensorflow.python.distribute import multi_worker_util as _multi_worker_util  # noqa: E402
from tensorflow.python.distribute import distribute_utils as _distribute_utils  # noqa: E402
from tensorflow.python.distribute import values as _values  # noqa: E402
from tensorflow.python.eager import context as _context  # noqa: E402
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops  # noqa: E402

PerReplica = _values.PerReplica
Mirrored = _values.Mirrored
DistributedValues = tf.distribute.DistributedValues


def devices_of(destinations):
    """The canonical device strings of a destination (string, variable, tensor or distributed value)."""
    return tuple(_cdo.get_devices_from(destinations))


def mirrored(tensors):
    """One tensor per destination device wrapped as a Mirrored value (the tensor itself for one device)."""
    return _distribute_utils.regroup(tuple(tensors), wrap_class=Mirrored)


def as_per_replica(value):
    """``value`` as a distributed value: a plain tensor becomes a one-component PerReplica."""
    if isinstance(value, DistributedValues):
        return value
    return PerReplica((value,))


_ADD_ORDER_TAG = "_grappler_ArithmeticOptimizer_AddOpsRewriteStage"


def keep_add_order(tensor):
    """Mark the Add/AddN op that made ``tensor`` as already rewritten, so that grappler's
    AddOpsRewrite stage neither rewrites it nor absorbs it into a consumer's AddN
    (which would reassociate the sum). A no-op in eager mode, where grappler never runs."""
    if not tf.executing_eagerly() and hasattr(tensor, "op"):
        from tensorflow.core.framework import attr_value_pb2

        tensor.op._set_attr(_ADD_ORDER_TAG, attr_value_pb2.AttrValue(b=True))
    return tensor


def plain_variable(initial_value, device, name):
    """A non-trainable resource variable on ``device``, created eagerly (outside any tf.function
    being traced) and outside every strategy's variable creator."""
    with tf.init_scope(), tf.device(device):
        return _resource_variable_ops.ResourceVariable(initial_value, trainable=False, name=name)


def install_cross_device_ops(strategy, ops):
    """Make a MultiWorkerMirroredStrategy reduce through ``ops`` (device and host reductions)."""
    extended = strategy.extended
    for attr in ("_cross_device_ops", "_host_cross_device_ops"):
        if not hasattr(extended, attr):
            raise ImportError(f"this TensorFlow's {type(extended).__name__} has no {attr}; "
                              f"tf_bridge/_tf_internals.py needs updating for TensorFlow {tf.__version__}")
        setattr(extended, attr, ops)
    return strategy


def bound_registration(seconds):
    """Configure the coordination service as MultiWorkerMirroredStrategy does (from TF_CONFIG; it
    keeps a service already configured), with the workers' registration bounded by ``seconds``
    (0: TensorFlow's own bound): past it TensorFlow's start-up raises instead of waiting. A no-op
    where a service is configured already or TF_CONFIG names no worker or chief."""
    ctx = _context.context()
    if ctx.coordination_service is not None:
        return False
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    jobs = [_coordination.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker") if job in spec.jobs]
    if not jobs or resolver.task_type not in ("chief", "worker"):
        return False
    ctx.configure_coordination_service(service_type="standalone",
                                       service_leader=_multi_worker_util.coordination_leader(spec),
                                       coordinated_jobs=jobs,
                                       cluster_register_timeout_in_ms=int(seconds * 1000))
    return True


def worker_count(strategy):
    """The number of workers a multi-worker strategy knows about."""
    return int(getattr(strategy.extended, "_num_workers", 1))


# --------------------------------------------------------------------------------------------------
# Keras 3 under MultiWorkerMirroredStrategy
#
# Keras 3.15's TensorFlow trainer does two things the stock strategy rejects:
# 1. _maybe_symbolic_build calls strategy.reduce("MEAN", (x, y), axis=None) on a *nested* batch;
#    CollectiveAllReduceExtended._reduce_to handles one value only ("Attempt to convert a value
#    (PerReplica...) to a Tensor").
# 2. reduce_per_replica calls strategy.reduce("MEAN", v, axis=0) on scalar metric values
#    ("Invalid reduction dimension 0 for input with 0 dimensions", tensorflow issue 72388).
# The strategy class below maps reduce over nested structures and reduces scalars across replicas
# without an axis, which is what Keras means in both places. It subclasses the public
# tf.distribute.MultiWorkerMirroredStrategy, so Keras still takes its multi-worker paths.
# --------------------------------------------------------------------------------------------------


def _rank_of(value):
    if isinstance(value, DistributedValues):
        value = value.values[0]
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    return shape.rank


class KerasFriendlyMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy whose ``reduce`` accepts what Keras 3's model.fit passes it."""

    def reduce(self, reduce_op, value, axis=None):
        base = super().reduce
        flat = tf.nest.flatten(value, expand_composites=False)
        if len(flat) != 1 or flat[0] is not value:
            reduced = [self.reduce(reduce_op, v, axis) for v in flat]
            return tf.nest.pack_sequence_as(value, reduced)
        if axis is not None and _rank_of(value) == 0:
            axis = None  # a scalar per replica: reduce across replicas only
        return base(reduce_op, value, axis)
