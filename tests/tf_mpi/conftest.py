"""TensorFlow under mpiexec: one MultiWorkerMirroredStrategy per process, built at start-up.

TensorFlow only accepts the collective configuration of a MultiWorkerMirroredStrategy
before it has run anything, so the strategy is made here, when pytest imports this
file, and shared by every test. Each process also gets 2 logical CPUs for the
one-MirroredStrategy-per-process tests (those use "/cpu:0" and "/cpu:1").
"""
import os

import pytest

from tests.helpers import under_mpiexec

if under_mpiexec():  # a plain pytest run skips these files (tests/conftest.py): no MPI start-up, and
    # TensorFlow's devices stay as tests/tf configured them
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py not installed")

    LOCAL_DEVICES = ["/cpu:0", "/cpu:1"]

    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * len(LOCAL_DEVICES))

    import tf_bridge  # noqa: E402



    class CountingAllReduce(tf_bridge.CollectivesAllReduce):
        """What a user writes to count the strategy's reductions: a subclass built without comm=."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.batches = 0

        def reduce_implementation(self, *args, **kwargs):
            self.batches += 1
            return super().reduce_implementation(*args, **kwargs)

        def batch_reduce_implementation(self, *args, **kwargs):
            self.batches += 1
            return super().batch_reduce_implementation(*args, **kwargs)


    # the given instance, built without comm=, is bound to the MPI world and used as is
    OPS = CountingAllReduce("ring")
    STRATEGY = tf_bridge.multi_worker_strategy(cross_device_ops=OPS) if MPI.COMM_WORLD.Get_size() > 1 else None


    @pytest.fixture(scope="session")
    def comm():
        if MPI.COMM_WORLD.Get_size() < 2:
            pytest.skip("run under mpiexec -n 2 (or more)")
        return MPI.COMM_WORLD


    @pytest.fixture(scope="session")
    def strategy(comm):
        return STRATEGY


    @pytest.fixture(scope="session")
    def given_ops(comm):
        return OPS


    @pytest.fixture(scope="session")
    def local_devices():
        return list(LOCAL_DEVICES)
