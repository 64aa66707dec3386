"""TensorFlow start-up faults for tests/test_tf_startup.py, on one node.

Run as ``mpiexec -n 2 python tests/faults/tf_startup.py CASE`` with COLLECTIVES_TIMEOUT small.
Every rank prints ``STARTUP-BEGIN rank R at T`` (time.time()) as the start-up it tests begins,
then ``STARTUP-OK rank R workers [...]`` where it returned, or ``STARTUP-ERROR rank R after S s:
Type: message`` where it raised (the job then ends nonzero).

Cases:
  ok         nothing wrong: the control case (COLLECTIVES_TF_ADDRESS applies)
  stuck      TF_CONFIG set by hand (set_tf_config=False), rank 1's copy naming a port where
             nothing listens as worker 0's: rank 1 never registers with the coordination service
             and TensorFlow's start-up waits on every rank
  refused    tf_config_from_mpi with rank 1 offering ::1, where the check does not listen:
             every rank raises the CollectiveError naming worker 1 (nothing aborts)
"""
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from mpi4py import MPI  # noqa: E402

import tf_bridge  # noqa: E402  (imports TensorFlow)

CASE = sys.argv[1]
WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def dead_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def begin():
    print(f"STARTUP-BEGIN rank {RANK} at {time.time():.3f}", flush=True)
    return time.monotonic()


try:
    if CASE == "stuck":
        config = tf_bridge.tf_config_from_mpi()
        if RANK == 1:
            config["cluster"]["worker"][0] = f"127.0.0.1:{dead_port()}"
        os.environ["TF_CONFIG"] = json.dumps(config)
        start = begin()
        tf_bridge.multi_worker_strategy(set_tf_config=False)
    elif CASE == "refused":
        start = begin()
        tf_bridge.tf_config_from_mpi(address="::1" if RANK == 1 else None)
    else:
        start = begin()
        tf_bridge.multi_worker_strategy()
except Exception as exc:  # noqa: BLE001 - reported, and the job ends nonzero
    print(f"STARTUP-ERROR rank {RANK} after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}",
          flush=True)
    sys.exit(1)
print(f"STARTUP-OK rank {RANK} workers {json.loads(os.environ.get('TF_CONFIG', '{}'))['cluster']['worker']}",
      flush=True)
