"""The "numpy" path of CollectivesAllReduce: packs reduced in one ``tf.numpy_function``.

Without ``comm`` a threaded world of one rank per local device runs ``collectives.allreduce`` on
every pack; with ``comm`` the local replicas' packs (added by TF) are all-reduced across processes
through ``collectives.Bucketer`` (the DDP bucketing code: small packs share a bucket, a large one is
reduced in place; each bucket an ``iallreduce``, with ``compression=`` where the op was given one).
"""
import numpy as np
import tensorflow as tf

import collectives
from collectives.comm.threaded import ThreadedWorld

from . import _tf_plan

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN


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


class NumpyPath:
    """Mixin of CollectivesAllReduce: the numpy_function reductions and the MPI gather."""

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
        bucket_bytes = self.bucket_bytes or 1  # None: every pack a bucket of its own
        wire = {"compression": self.compression, "compression_scope": self.compression_scope} \
            if self.compression is not None and mpi is not None else {}
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
                result[...] = local
                out.append(result)
            across = [r for r in out if r.size]
            if across:  # every pack through the bucketing code: one iallreduce per bucket, in order
                collectives.Bucketer(across, bucket_bytes, comm=mpi, algorithm=algorithm, **wire, **options).reduce()
            return [scale(r) for r in out]

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
