"""CollectivesAllReduce(compression=) under mpiexec: packs cross processes as bf16 through the
bucketing code; every rank ends with the same values, the bf16-rounded sum."""
import numpy as np
import pytest

from tests.helpers import under_mpiexec

if under_mpiexec():
    import tensorflow as tf

    import tf_bridge

SUM = None if not under_mpiexec() else tf.distribute.ReduceOp.SUM


def _bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("bucket_bytes", [None, 1, 25 << 20])
def test_compressed_packs_are_rounded_alike_on_every_rank(comm, local_devices, bucket_bytes):
    rank, size = comm.Get_rank(), comm.Get_size()
    ops = tf_bridge.CollectivesAllReduce("ring", comm=comm, across_processes="sum", implementation="numpy",
                                         compression="bf16", compression_scope="all", bucket_bytes=bucket_bytes)
    local = tf.distribute.MirroredStrategy(local_devices, cross_device_ops=ops)
    base = 1 + 2.0 ** -12  # not a bf16 value: compression shows
    first = local.experimental_distribute_values_from_function(lambda ctx: tf.fill([300], base * (rank + 1)))
    second = local.experimental_distribute_values_from_function(lambda ctx: tf.fill([7, 3], 2.0 * (rank + 1)))
    reduced = local.extended.batch_reduce_to(SUM, [(first, first), (second, second)])
    k = len(local_devices)
    got_first = local.experimental_local_results(reduced[0])[0].numpy()
    got_second = local.experimental_local_results(reduced[1])[0].numpy()
    exact = sum(k * base * (r + 1) for r in range(size))
    assert np.abs(got_first - exact).max() <= (size + 2) * 2.0 ** -8 * exact
    assert np.array_equal(got_first, _bf16(got_first))  # the result is a bf16 value
    assert np.array_equal(got_second, np.full((7, 3), sum(2.0 * k * (r + 1) for r in range(size)), np.float32))
    everyone = comm.allgather(got_first.tobytes() + got_second.tobytes())
    assert all(e == everyone[0] for e in everyone)
    exact_ops = tf_bridge.CollectivesAllReduce("ring", comm=comm, across_processes="sum", implementation="numpy")
    plain = tf.distribute.MirroredStrategy(local_devices, cross_device_ops=exact_ops)
    value = plain.experimental_distribute_values_from_function(lambda ctx: tf.fill([300], base * (rank + 1)))
    unrounded = plain.experimental_local_results(plain.extended.batch_reduce_to(SUM, [(value, value)])[0])[0]
    if size > 1:
        assert not np.array_equal(unrounded.numpy(), got_first)  # the same call without compression differs


def test_bad_compression_is_a_value_error(comm):
    with pytest.raises(ValueError, match="compression must be one of"):
        tf_bridge.CollectivesAllReduce("ring", comm=comm, compression="int8")
    with pytest.raises(ValueError, match="compression_scope must be one of"):
        tf_bridge.CollectivesAllReduce("ring", comm=comm, compression="bf16", compression_scope="rack")
    with pytest.raises(ValueError, match="bucket_bytes"):
        tf_bridge.CollectivesAllReduce("ring", comm=comm, bucket_bytes=0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        tf_bridge.CollectivesAllReduce("ring", comm=comm, bucket_bytes=2.5)
