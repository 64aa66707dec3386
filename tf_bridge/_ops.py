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
   calls ``collectives.allreduce(..., comm=comm)`` across processes (stateful, so
   every rank runs its reductions in program order).
4. The results are split back, reshaped and placed on every destination device.
"""
import threading
import warnings

import numpy as np
import tensorflow as tf

import collectives
from collectives.comm.threaded import ThreadedWorld

from . import _tf_internals as _tfi
from . import _tf_plan

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN

_SUPPORTED = frozenset(collectives.DTYPES)


def _np_dtype(tf_dtype):
    try:
        return np.dtype(tf.as_dtype(tf_dtype).as_numpy_dtype)
    except TypeError:
        return None


def _static_size(tensor):
    shape = tensor.shape
    if shape.is_fully_defined():
        return int(np.prod(shape.as_list(), dtype=np.int64))
    return None


def _aligned_empty(n, dtype, align=64):
    """An empty 1-D array whose data starts on an ``align``-byte boundary (TensorFlow then
    takes it over from a numpy_function without copying, and slices it without copying)."""
    dtype = np.dtype(dtype)
    raw = np.empty(n * dtype.itemsize + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + n * dtype.itemsize].view(dtype)


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


class CollectivesAllReduce(tf.distribute.CrossDeviceOps):
    """A ``tf.distribute.CrossDeviceOps`` running ``collectives.allreduce`` with a chosen algorithm.

    Args:
      algorithm: one of ``collectives.algorithms()`` (or ``"auto"``).
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
      **options: the algorithm's own options (``collectives.algorithm_options(name)``).

    ``calls`` counts reductions executed (numpy_function runs), ``reduced_tensors`` the
    tensors they carried.
    """

    def __init__(self, algorithm="ring", *, comm=None, bytes_per_pack=None, across_processes="average",
                 implementation="tf", **options):
        super().__init__()
        valid = collectives.algorithms()
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
                f"implementation={self.implementation!r}, options={self.options})")

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

    # ------------------------------------------------------------------ "numpy": one numpy_function
    def _numpy_packs(self, sources, items, packs, reduce_op, k, replicas, outputs):
        inputs, layouts, dtypes = [], [], []
        for dtype, members, _ in packs:
            tf_dtype = tf.as_dtype(dtype)
            static = [_static_size(items[i][0][0]) for i in members]
            if all(s is not None for s in static):
                # the layout of the "tf" implementation (so both add in the same order)
                offsets, count = _tf_plan.aligned_layout(static, dtype.itemsize,
                                                         k if self._mpi is None else self._mpi.size)
                layouts.append((offsets, static, count))
            else:
                offsets, count = None, None
                layouts.append((None, [tf.size(items[i][0][0]) if s is None else s
                                       for i, s in zip(members, static)], None))
            dtypes.append(tf_dtype)
            per_device = []
            for r, device in enumerate(sources):
                with tf.device(device):
                    flats, at = [], 0
                    for slot, i in enumerate(members):
                        if offsets is not None and offsets[slot] > at:
                            flats.append(tf.zeros([offsets[slot] - at], tf_dtype))
                        flats.append(tf.reshape(items[i][0][r], [-1]))
                        if offsets is not None:
                            at = offsets[slot] + static[slot]
                    if offsets is not None and count > at:
                        flats.append(tf.zeros([count - at], tf_dtype))
                    per_device.append(flats[0] if len(flats) == 1 else tf.concat(flats, 0))
            if self._mpi is not None and k > 1:
                with tf.device(sources[0]):  # the local replicas: added by TF, then one pack crosses processes
                    per_device = [tf.add_n(per_device)]
            inputs.extend(per_device)
        n_in = k if self._mpi is None else 1
        n_out = k if self._mpi is None else 1
        tout = [d for d in dtypes for _ in range(n_out)]
        runner = self._make_runner(len(packs), n_in, reduce_op, replicas, n_out)
        with tf.device(sources[0]):
            flat_out = tf.numpy_function(runner, inputs, tout, stateful=self._mpi is not None,
                                         name="collectives_allreduce")
        if not isinstance(flat_out, (list, tuple)):
            flat_out = [flat_out]
        for p, (dtype, members, _) in enumerate(packs):
            offsets, sizes, count = layouts[p]
            pieces = {}
            for slot, i in enumerate(members):
                tensors, _, dests = items[i]
                for j, device in enumerate(dests):
                    src = sources.index(device) if (n_out > 1 and device in sources) else 0
                    key = (device, src)
                    if key not in pieces:
                        with tf.device(device):
                            buf = flat_out[p * n_out + src]
                            if offsets is not None:
                                buf.set_shape([count])
                                pieces[key] = [tf.slice(buf, [off], [n]) if len(members) > 1 or off or n != count
                                               else buf for off, n in zip(offsets, sizes)]
                            else:
                                pieces[key] = tf.split(buf, sizes) if len(members) > 1 else [buf]
                    with tf.device(device):
                        outputs[i][j] = tf.reshape(pieces[key][slot], tf.shape(tensors[0]))
                        if tensors[0].shape.is_fully_defined():
                            outputs[i][j].set_shape(tensors[0].shape)

    def _world(self, k):
        with self._lock:
            world = self._worlds.get(k)
            if world is None:
                world = self._worlds[k] = ThreadedWorld(k)
            return world

    def _make_runner(self, npacks, k, reduce_op, replicas, n_out):
        algorithm, options, mpi = self.algorithm, self.options, self._mpi
        average_processes = mpi is not None and self.across_processes == "average" and reduce_op == SUM
        divisor = replicas if reduce_op == MEAN else (mpi.size if average_processes else 1)
        world = self._world(k) if mpi is None and k > 1 else None

        def scale(arr):
            if divisor != 1:
                if arr.dtype.kind in "iu":
                    np.floor_divide(arr, arr.dtype.type(divisor), out=arr)
                else:
                    np.divide(arr, arr.dtype.type(divisor), out=arr)
            return arr

        def threaded(comm, packs):
            out = []
            for pack in packs:
                result = _aligned_empty(pack[comm.rank].size, pack[comm.rank].dtype)
                collectives.allreduce(pack[comm.rank], result, algorithm=algorithm, comm=comm, **options)
                out.append(scale(result))
            return out

        def run(*arrays):
            packs = [arrays[p * k:(p + 1) * k] for p in range(npacks)]
            with self._lock:
                self._py_calls += 1
                self._py_packs += npacks
            if mpi is None:
                if k == 1:
                    results = [[scale(np.array(pack[0], copy=True)) for pack in packs]]
                else:
                    results = world.run(threaded, packs)
                return [results[r][p] for p in range(npacks) for r in range(k)]
            out = []
            for (local,) in packs:
                result = _aligned_empty(local.size, local.dtype)
                if local.size:
                    collectives.allreduce(local, result, algorithm=algorithm, comm=mpi, **options)
                out.append(scale(result))
            return out

        return run

    def _mpi_gather(self, parts, axis):
        mpi = self._mpi
        dtype = parts[0].dtype

        def run(*arrays):
            local = np.concatenate(arrays, axis=axis) if len(arrays) > 1 else np.asarray(arrays[0])
            moved = np.ascontiguousarray(np.moveaxis(local, axis, 0))
            view = moved.view(np.uint8) if moved.dtype == np.bool_ else moved
            shapes = collectives.allgather(np.array(moved.shape, dtype=np.int64), comm=mpi)
            shapes = shapes.reshape(mpi.size, moved.ndim)
            flat = collectives.allgather(view.reshape(-1), comm=mpi)
            if moved.dtype == np.bool_:
                flat = flat.view(np.bool_)
            pieces, offset = [], 0
            for shape in shapes:
                n = int(np.prod(shape))
                pieces.append(flat[offset:offset + n].reshape(tuple(int(s) for s in shape)))
                offset += n
            with self._lock:
                self._py_calls += 1
            return np.moveaxis(np.concatenate(pieces, axis=0), 0, axis)

        with tf.device(parts[0].device or "/cpu:0"):
            inputs = [tf.identity(p) for p in parts]
            out = tf.numpy_function(run, inputs, dtype, stateful=True, name="collectives_allgather")
        shape = parts[0].shape.as_list() if parts[0].shape.rank is not None else None
        if shape is not None:
            shape[axis] = None
            out.set_shape(shape)
        return out
