"""CollectivesAllReduce: a tf.distribute.CrossDeviceOps whose reductions run collectives' algorithms.

How a reduction runs (one ``tf.numpy_function`` per batch of values sharing source devices):

1. IndexedSlices are densified (a warning, once per op).
2. The values are grouped by dtype and packed: each replica's tensors are flattened
   and concatenated on that replica's device into packs of about ``bytes_per_pack``
   bytes (0: one pack per dtype).
3. One numpy_function receives every replica's packs. Without ``comm`` it runs a
   threaded world of one rank per local device (``collectives.run_threaded``), each
   rank calling ``collectives.allreduce(pack, algorithm=..., comm=rank_comm)``.
   With ``comm`` (an mpi4py communicator) it adds the local replicas' packs, then
   reduces them across processes through ``collectives.Bucketer`` (one ``iallreduce`` per
   bucket, ``compression=`` on the wire where given; stateful, so every rank runs its
   reductions in program order). That code lives in _numpy_path.py.
4. The results are split back, reshaped and placed on every destination device.
"""
import threading
import warnings

import numpy as np
import tensorflow as tf

import collectives
import collectives.compression

from . import _tf_internals as _tfi
from . import _tf_plan
from ._numpy_path import NumpyPath, _static_size

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN

_SUPPORTED = frozenset(collectives.DTYPES)


def _np_dtype(tf_dtype):
    try:
        return np.dtype(tf.as_dtype(tf_dtype).as_numpy_dtype)
    except TypeError:
        return None


def _scale_tf(tensor, divisor):
    if tensor.dtype.is_integer:
        return tf.math.floordiv(tensor, tf.constant(divisor, tensor.dtype))
    return tensor / tf.constant(divisor, tensor.dtype)


IMPLEMENTATIONS = ("tf", "numpy")


def _reduce_op(reduce_op):
    if isinstance(reduce_op, str):
        reduce_op = tf.distribute.ReduceOp(reduce_op.upper())
    if reduce_op not in (SUM, MEAN):
        raise ValueError(f"reduce_op must be ReduceOp.SUM or ReduceOp.MEAN, got {reduce_op!r}")
    return reduce_op


class CollectivesAllReduce(NumpyPath, tf.distribute.CrossDeviceOps):
    """A ``tf.distribute.CrossDeviceOps`` running ``collectives.allreduce`` with a chosen algorithm.

    Args:
      algorithm: one of ``collectives.algorithm_names()`` (or ``"auto"``).
      comm: ``None`` for one process (local devices reduced by a threaded world), or an
        mpi4py communicator: local devices are added, the result all-reduced across its
        processes and copied back to every local device.
      bytes_per_pack: pack size in bytes for batching small tensors (0: one pack per dtype;
        ``None``: TensorFlow's ``CommunicationOptions.bytes_per_pack``, 0 by default).
      across_processes: with ``comm`` and one MirroredStrategy per process, ``"average"``
        (default) divides SUM by the number of processes, which is what gradients need
        there (Keras scales the loss by the *local* replica count); ``"sum"`` keeps the
        exact sum. ``multi_worker_strategy`` sets ``"sum"`` (that strategy knows the
        global replica count).
      compression: ``"bf16"`` or ``"fp16"``: float32/float64 packs cross hosts as 16-bit values
        (``collectives.allreduce(compression=)``; reductions across processes only);
        ``compression_scope="all"`` compresses every message, not only those between hosts.
      bucket_bytes: packs reduced across processes go through ``collectives.Bucketer``, one
        ``iallreduce`` per bucket; ``None`` (default): one bucket per pack, reduced in place (the
        packs already batch small tensors, ``bytes_per_pack`` sets their size); a number merges
        consecutive packs of one dtype into buckets of up to that many bytes (copied in and out).
      **options: the algorithm's own options (``collectives.algorithm_options(name)``).

    ``calls`` counts reductions executed (numpy_function runs), ``reduced_tensors`` the
    tensors they carried.
    """

    def __init__(self, algorithm="ring", *, comm=None, bytes_per_pack=None, across_processes="average",
                 implementation="tf", compression=None, compression_scope="across_hosts", bucket_bytes=None,
                 **options):
        super().__init__()
        if compression not in (None,) + collectives.compression.FORMATS:
            raise ValueError(f"compression must be one of {', '.join(collectives.compression.FORMATS)} or None, "
                             f"got {compression!r}")
        if bucket_bytes is not None and (isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int)
                                         or bucket_bytes < 1):
            raise ValueError(f"bucket_bytes must be a positive integer or None, got {bucket_bytes!r}")
        if compression_scope not in collectives.compression.SCOPES:
            raise ValueError(f"compression_scope must be one of {', '.join(collectives.compression.SCOPES)}, "
                             f"got {compression_scope!r}")
        self.compression, self.compression_scope, self.bucket_bytes = compression, compression_scope, bucket_bytes
        valid = collectives.algorithm_names()
        if algorithm != "auto" and algorithm not in valid:
            raise ValueError(f"unknown algorithm {algorithm!r}; valid algorithms: auto, {', '.join(valid)}")
        if algorithm != "auto":
            known = collectives.algorithm_options(algorithm)
            unknown = sorted(set(options) - set(known))
            if unknown:
                raise ValueError(f"algorithm {algorithm!r} takes no option(s) {', '.join(unknown)}; "
                                 f"valid options: {', '.join(sorted(known)) or 'none'}")
        if bytes_per_pack is not None and (isinstance(bytes_per_pack, bool) or not isinstance(bytes_per_pack, int)
                                           or bytes_per_pack < 0):
            raise ValueError(f"bytes_per_pack must be an integer >= 0 or None, got {bytes_per_pack!r}")
        if across_processes not in ("average", "sum"):
            raise ValueError(f"across_processes must be 'average' or 'sum', got {across_processes!r}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
        self.algorithm = algorithm
        self.options = dict(options)
        self.bytes_per_pack = bytes_per_pack
        self.across_processes = across_processes
        self.implementation = implementation
        self._comm = comm
        self._mpi = None if comm is None else collectives.as_comm(comm)
        self._lock = threading.Lock()
        self._py_calls = 0  # reductions run in a numpy_function
        self._py_packs = 0
        self._counter = None  # [calls, packs] of reductions run as TF ops (a variable, made when first needed)
        self._worlds = {}  # local device count -> ThreadedWorld ("numpy" without comm)
        self._warned_sparse = False

    def __repr__(self):
        where = "local devices" if self._mpi is None else f"{self._mpi.size} processes"
        return (f"CollectivesAllReduce(algorithm={self.algorithm!r}, {where}, "
                f"implementation={self.implementation!r}, compression={self.compression!r}, options={self.options})")

    def __deepcopy__(self, memo):
        # strategies deep-copy their cross_device_ops; communicators cannot be copied
        memo[id(self)] = self
        return self

    # ------------------------------------------------------------------ properties TF reads
    @property
    def _num_between_graph_workers(self):
        return 1 if self._mpi is None else self._mpi.size

    @property
    def num_processes(self):
        return self._num_between_graph_workers

    @property
    def comm(self):
        """The mpi4py communicator reduced across, or None (one process: local devices only)."""
        return self._comm

    def bind(self, comm):
        """Reduce across the processes of ``comm`` (an mpi4py communicator) from now on; for an
        instance built without ``comm`` (``multi_worker_strategy`` binds the one it is given)."""
        if self._comm is not None and self._comm is not comm:
            raise ValueError("this CollectivesAllReduce is already bound to a communicator")
        self._mpi = collectives.as_comm(comm)
        self._comm = comm

    @property
    def calls(self):
        """How many reductions have run (each batch of values sharing source devices counts once)."""
        return self._py_calls + (0 if self._counter is None else int(self._counter.numpy()[0]))

    @property
    def reduced_tensors(self):
        """How many packs those reductions carried."""
        return self._py_packs + (0 if self._counter is None else int(self._counter.numpy()[1]))

    def reset_counters(self):
        with self._lock:
            self._py_calls = 0
            self._py_packs = 0
            if self._counter is not None:
                self._counter.assign(tf.zeros([2], tf.int64))

    # ------------------------------------------------------------------ CrossDeviceOps API
    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self._batch([(per_replica_value, destinations)], _reduce_op(reduce_op), options)[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        return self._batch(list(value_destination_pairs), _reduce_op(reduce_op), options)

    def broadcast_implementation(self, tensor, destinations):
        copies = []
        for device in _tfi.devices_of(destinations):
            with tf.device(device):
                copies.append(tf.identity(tensor))
        return _tfi.mirrored(copies)

    def _gather_implementation(self, per_replica_value, destinations, axis, options):
        per_replica_value = _tfi.as_per_replica(per_replica_value)
        parts = [self._dense(v) for v in per_replica_value.values]
        devices = _tfi.devices_of(destinations)
        if self._mpi is None:
            out = []
            for device in devices:
                with tf.device(device):
                    out.append(tf.concat(parts, axis))
            return _tfi.mirrored(out)
        gathered = self._mpi_gather(parts, axis)
        out = []
        for device in devices:
            with tf.device(device):
                out.append(tf.identity(gathered))
        return _tfi.mirrored(out)

    def _all_reduce(self, reduce_op, value, replica_id, options):
        # MultiWorkerMirroredStrategy calls this in replica context (no merge_call of its own):
        # merge the replicas and reduce them in one batch.
        context = tf.distribute.get_replica_context()
        flat = tf.nest.flatten(value)

        def merge_fn(strategy, *flat_values):
            return strategy.extended.batch_reduce_to(reduce_op, [(v, v) for v in flat_values], options)

        reduced = context.merge_call(merge_fn, args=tuple(flat))
        return tf.nest.pack_sequence_as(value, reduced)

    # ------------------------------------------------------------------ the work
    def _dense(self, tensor):
        if isinstance(tensor, tf.IndexedSlices):
            if not self._warned_sparse:
                warnings.warn("CollectivesAllReduce: densifying IndexedSlices (tf.convert_to_tensor) "
                              "before reduction; sparse gradients are reduced as dense tensors",
                              stacklevel=3)
                self._warned_sparse = True
            return tf.convert_to_tensor(tensor)
        return tf.convert_to_tensor(tensor)

    def _pack_limit(self, options):
        if self.bytes_per_pack is not None:
            return self.bytes_per_pack
        return int(getattr(options, "bytes_per_pack", 0) or 0)

    def _batch(self, pairs, reduce_op, options):
        values = []
        for value, dest in pairs:
            value = _tfi.as_per_replica(value)
            values.append(([self._dense(v) for v in value.values], _tfi.devices_of(value), _tfi.devices_of(dest)))
        results = [None] * len(values)
        groups = {}
        for index, (_, sources, _) in enumerate(values):
            groups.setdefault(sources, []).append(index)
        for sources, indices in groups.items():  # insertion order: the same on every process
            for index, out in zip(indices, self._reduce_group(sources, [values[i] for i in indices],
                                                              reduce_op, self._pack_limit(options))):
                results[index] = out
        return results

    def _reduce_group(self, sources, items, reduce_op, pack_limit):
        k = len(sources)
        processes = 1 if self._mpi is None else self._mpi.size
        replicas = k * processes
        outputs = [[None] * len(dests) for _, _, dests in items]

        # dtype groups and packs, in order of first appearance
        packs = []  # [np dtype, [item index], bytes]
        open_pack = {}
        fallback = []
        for index, (tensors, _, _) in enumerate(items):
            dtype = _np_dtype(tensors[0].dtype)
            if dtype is None or dtype not in _SUPPORTED:
                if self._mpi is not None:
                    raise TypeError(f"CollectivesAllReduce cannot reduce dtype {tensors[0].dtype.name} across "
                                    f"processes; supported: {', '.join(str(d) for d in collectives.DTYPES)}")
                fallback.append(index)
                continue
            current = open_pack.get(dtype)
            if current is None:
                current = open_pack[dtype] = [dtype, [], 0]
                packs.append(current)
            current[1].append(index)
            size = _static_size(tensors[0])
            current[2] += (size or 0) * dtype.itemsize
            if pack_limit and current[2] >= pack_limit:
                del open_pack[dtype]

        for index in fallback:  # dtypes our algorithms do not take (bool, complex...): TF ops, locally
            tensors, _, dests = items[index]
            for j, device in enumerate(dests):
                with tf.device(device):
                    total = tf.add_n([tf.identity(t) for t in tensors])
                    if reduce_op == MEAN:
                        total = total / tf.cast(k, total.dtype)
                    outputs[index][j] = total

        # single process, "tf": the plans run as TF ops (every size static); the rest in NumPy
        tf_packs, np_packs = [], []
        for pack in packs:
            static = all(_static_size(items[i][0][0]) is not None for i in pack[1])
            (tf_packs if self._mpi is None and self.implementation == "tf" and static else np_packs).append(pack)
        for dtype, members, _ in tf_packs:
            self._tf_pack(sources, items, members, reduce_op, k, outputs)
        if tf_packs:
            self._count(sources[0], 0 if np_packs else 1, len(tf_packs))
        if np_packs:
            self._numpy_packs(sources, items, np_packs, reduce_op, k, replicas, outputs)
        return [_tfi.mirrored(out) for out in outputs]

    # ------------------------------------------------------------------ "tf": plans as TF ops
    def _tf_pack(self, sources, items, members, reduce_op, k, outputs):
        inputs = []
        for r, device in enumerate(sources):
            with tf.device(device):
                inputs.append([tf.reshape(items[i][0][r], [-1]) for i in members])
        per_rank, _, builder = _tf_plan.allreduce_tf(inputs, sources, self.algorithm, self.options)
        for slot, i in enumerate(members):
            tensors, _, dests = items[i]
            shape = tensors[0].shape
            done = {}  # the result's pieces -> (device, tensor) assembled from them
            for j, device in enumerate(dests):
                r = sources.index(device) if device in sources else 0
                parts = per_rank[r][slot]
                key = tuple((t.ref(), off, n) for n, t, off in parts)
                hit = done.get(key)
                if hit is not None and _tf_plan.share_memory(hit[0], device):
                    # the same values, already assembled in the same memory: hand them over (no copy)
                    with tf.device(device):
                        outputs[i][j] = tf.identity(hit[1])
                    continue
                with tf.device(device):
                    flat = _tf_plan.assemble(builder, parts, device, tensors[0].dtype)
                    out = tf.reshape(flat, shape)
                    if reduce_op == MEAN and k > 1:
                        out = _scale_tf(out, k)
                outputs[i][j] = out
                done.setdefault(key, (device, out))

    def _count(self, device, calls, packs):
        """Count one reduction (calls) of ``packs`` packs when the graph runs."""
        with self._lock:
            if self._counter is None:
                self._counter = _tfi.plain_variable(np.zeros(2, np.int64), device, "collectives_calls")
        with tf.device(self._counter.device):
            self._counter.assign_add(tf.constant([calls, packs], tf.int64))
