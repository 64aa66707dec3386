"""TensorFlow tests: 4 logical CPU devices, configured before any TensorFlow op runs."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")

NUM_DEVICES = 4


def _configure():
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES)
    except RuntimeError:  # TensorFlow already initialised by someone else: use what exists
        pass
    return [d.name for d in tf.config.list_logical_devices("CPU")]


DEVICES = _configure()


@pytest.fixture(scope="session")
def devices():
    if len(DEVICES) < NUM_DEVICES:
        pytest.skip(f"needs {NUM_DEVICES} logical CPU devices, TensorFlow was initialised with {len(DEVICES)}")
    return DEVICES[:NUM_DEVICES]
