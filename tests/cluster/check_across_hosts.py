"""Run on an emulated cluster (tests/test_cluster.py): every algorithm and building block against
comm.Allreduce and the blocks' references, bitwise identical on every rank, with the hosts the
library sees checked against the host names. Prints CLUSTER-OK rank R, or CLUSTER-FAIL with why."""
import os
import socket
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives  # noqa: E402
from collectives import blocks  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
problems = []


def same_everywhere(y):
    digests = WORLD.allgather(np.ascontiguousarray(y).tobytes())
    return all(d == digests[0] for d in digests)


# the hosts: the library's node grouping must be the host names' grouping
hosts = WORLD.allgather(socket.gethostname())
ours = collectives.as_comm(WORLD)
first_rank_of = {}
for rank, host in enumerate(hosts):
    first_rank_of.setdefault(host, rank)
expected_colors = tuple(first_rank_of[h] for h in hosts)
if ours.node_colors() != expected_colors:
    problems.append(f"node colors {ours.node_colors()} != hosts {expected_colors}")
if len(set(hosts)) < 2:
    problems.append(f"every rank on one host: {hosts}")

# shared memory only between ranks of one host: the transport's window spans one host's ranks
from collectives.comm import shm as shm_transport  # noqa: E402

if shm_transport.available(ours) != (hosts.count(hosts[RANK]) > 1):
    problems.append(f"the shm transport is {'' if shm_transport.available(ours) else 'not '}available on host "
                    f"{hosts[RANK]} of {hosts.count(hosts[RANK])} rank(s)")
node = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
node_hosts = node.allgather(socket.gethostname())
if len(set(node_hosts)) != 1:
    problems.append(f"a shared-memory node spans hosts {set(node_hosts)}")

# every algorithm against the MPI library's own all-reduce
for algorithm in collectives.algorithm_names():
    for dtype in (np.int32, np.float64):
        for count in (1, SIZE + 1, 5000):
            x = ((np.arange(count) + RANK) % 7).astype(dtype)
            want = np.empty_like(x)
            WORLD.Allreduce(x, want, op=MPI.SUM)
            # messages within a host over shared memory (where it has peers), across hosts over MPI
            for transport in ("auto", "shm") if count > SIZE + 1 else ("auto",):
                y = collectives.allreduce(x, algorithm=algorithm, transport=transport)
                if not (np.array_equal(y, want) and same_everywhere(y)):
                    problems.append(f"{algorithm}@{transport} {np.dtype(dtype)} count={count}")
# two_level pipelined, every inter algorithm (one chunk where its ranks do not share steps), and
# a message past the default pipelining size: rendezvous-sized messages across hosts in every chunk
for inter in ("ring", "recursive_doubling", "rabenseifner", "double_binary_tree"):
    for chunks in (2, 3):
        for count in (SIZE + 1, 5000, 300000):
            x = ((np.arange(count) + RANK) % 7).astype(np.float32)
            want = np.empty_like(x)
            WORLD.Allreduce(x, want, op=MPI.SUM)
            y = collectives.allreduce(x, algorithm="two_level", inter=inter, chunks=chunks)
            if not (np.array_equal(y, want) and same_everywhere(y)):
                problems.append(f"two_level inter={inter} chunks={chunks} count={count}")
x = (np.arange((4 << 20) // 4) % 7 + RANK).astype(np.float32)  # 4 MiB: the default two chunks
want = np.empty_like(x)
WORLD.Allreduce(x, want, op=MPI.SUM)
y = collectives.allreduce(x, algorithm="two_level")
if not (np.array_equal(y, want) and same_everywhere(y)):
    problems.append("two_level 4 MiB (default chunks)")
# hierarchical algorithms: one group per host (the groups hierarchical_copy resolves by default)
groups = sys.modules["collectives.algorithms"].resolve("hierarchical_copy", {}, ours.hosts())[1]["groups"]
for a in range(SIZE):
    for b in range(SIZE):
        if (groups[a] == groups[b]) != (hosts[a] == hosts[b]):
            problems.append(f"hierarchical_copy groups {groups} do not follow the hosts {hosts}")
            break

# building blocks against their references
count = 1001
x = ((np.arange(count) + RANK) % 5).astype(np.int64)
total = np.empty_like(x)
WORLD.Allreduce(x, total, op=MPI.SUM)
for name in blocks.REDUCE_SCATTER:
    got = collectives.reduce_scatter(x, algorithm=name)
    if not np.array_equal(got, np.array_split(total, SIZE)[RANK]):
        problems.append(f"reduce_scatter {name}")
for name in blocks.ALLGATHER:
    got = collectives.allgather(np.full(RANK + 1, RANK, np.int64), algorithm=name)
    want = np.concatenate([np.full(r + 1, r, np.int64) for r in range(SIZE)])
    if not (np.array_equal(got, want) and same_everywhere(got)):
        problems.append(f"allgather {name}")
for name in blocks.BROADCAST:
    root = SIZE - 1
    buf = np.full(count, RANK, np.int64)
    collectives.broadcast(buf, root=root, algorithm=name)
    if not np.array_equal(buf, np.full(count, root, np.int64)):
        problems.append(f"broadcast {name}")
for name in blocks.REDUCE:
    got = collectives.reduce(x, root=SIZE - 1, algorithm=name)
    if (RANK == SIZE - 1 and not np.array_equal(got, total)) or (RANK != SIZE - 1 and got is not None):
        problems.append(f"reduce {name}")

print(f"CLUSTER-{'OK' if not problems else 'FAIL'} rank {RANK} host {hosts[RANK]}"
      + (f": {'; '.join(problems[:6])}" if problems else ""), flush=True)
sys.exit(0 if not problems else 3)
