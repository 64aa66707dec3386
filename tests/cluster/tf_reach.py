"""Run on an emulated cluster (tests/test_tf_cluster.py): the workers' addresses, and a worker whose
address is made unreachable.

0. With the argument ``names``: every host's name resolves, to its address on the emulated network,
   on every host (a hosts file bind-mounted over /etc/hosts in the host's own mount namespace, from
   its private /dev/shm: both vanish with the job). Without it host names do not resolve there.
1. ``tf_bridge.tf_config_from_mpi()``: prints ``ADDRESSES rank R host H: [...]``, every worker's.
2. Host 1's address is made unreachable for new TCP connections to the ports its workers take:
   first every pair of ranks exchanges a message (MPI's connections between hosts are made now),
   then the first rank on host 1 narrows the host's port range (REACH_PORTS: where the free ports
   that follow come from) and drops, on the host's link, its answers (SYN-ACK) to connections to
   those ports. Host 1 still reaches its own workers (over loopback), and MPI goes on.
3. ``tf_bridge.multi_worker_strategy()``, as a user calls it: prints ``REACH-ERROR rank R after S
   s: Type: message`` for the error it raises (or ``REACH-NOERROR rank R``), then exits 0.
"""
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
import tf_bridge  # noqa: E402  (imports TensorFlow)
from tf_bridge import _addresses  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
REACH_PORTS = (39936, 0xFF80)  # 39936-40063: a port block one u32 match covers
HOST = socket.gethostname()


def drop_answers_from(ports):
    """Drop, on eth0's way out, SYN-ACKs from the ports ``ports`` (first, mask): an htb whose
    filter sends them to a class with a queue of no bytes."""
    first, mask = ports
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write(f"{first} {first + (~mask & 0xFFFF)}")
    for command in ("qdisc add dev eth0 root handle 1: htb default 1",
                    "class add dev eth0 parent 1: classid 1:1 htb rate 10gbit",
                    "class add dev eth0 parent 1: classid 1:2 htb rate 10gbit",
                    "qdisc add dev eth0 parent 1:2 handle 20: bfifo limit 0",
                    # IPv4, TCP, source port in the block, flags SYN and ACK
                    f"filter add dev eth0 parent 1: protocol ip prio 1 u32 match u8 6 0xff at 9 "
                    f"match u16 {first:#x} {mask:#x} at 20 match u8 0x12 0x12 at 33 flowid 1:2"):
        subprocess.run(["tc", *command.split()], check=True, capture_output=True, text=True)


def resolve_host_names():
    own = [address for name, address, _ in _addresses.interfaces() if name == "eth0"]
    table = dict(WORLD.allgather((HOST, own[0])))
    if WORLD.allgather(HOST).index(HOST) == RANK:
        with open("/dev/shm/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for h, a in table.items()))
        subprocess.run(["mount", "--bind", "/dev/shm/hosts", "/etc/hosts"], check=True)
    collectives.barrier(WORLD)


if sys.argv[1:] == ["names"]:
    resolve_host_names()
config = tf_bridge.tf_config_from_mpi()
print(f"ADDRESSES rank {RANK} host {HOST}: {config['cluster']['worker']}", flush=True)

hosts = WORLD.allgather(HOST)
token = np.zeros(1)
for peer in range(SIZE):  # every pair's connection, both ways, before the drop
    if peer != RANK:
        WORLD.Sendrecv(token, dest=peer, recvbuf=np.zeros(1), source=peer)
if hosts.index(HOST) == RANK and HOST.endswith("h1"):
    drop_answers_from(REACH_PORTS)
collectives.barrier(WORLD)

start = time.monotonic()
try:
    tf_bridge.multi_worker_strategy()
    print(f"REACH-NOERROR rank {RANK}", flush=True)
except Exception as exc:  # noqa: BLE001 - reported for the test
    print(f"REACH-ERROR rank {RANK} after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}",
          flush=True)
collectives.barrier(WORLD)
