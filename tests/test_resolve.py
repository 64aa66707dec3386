"""One resolve: ``collectives.algorithms.resolve(name_or_module, options, topology)`` turns a
call's options into plan parameters for the API, the TensorFlow bridge and the simulator alike,
from the ranks of each host (no communicator needed)."""
import importlib

import numpy as np
import pytest

import collectives
from collectives.comm.base import Communicator
from collectives.comm.threaded import run_threaded
from collectives.flat import build_plans
from collectives.simulator.topology import Topology

algorithms = importlib.import_module("collectives.algorithms")  # the name is shadowed by a function


def never():
    raise AssertionError("the topology was read by an algorithm that needs no hosts")


def test_defaults_checks_and_hooks():
    module, params = algorithms.resolve("two_level", {}, ((0, 1), (2, 3, 4)))
    assert module is algorithms.get("two_level")
    assert params == {"inter": "ring", "groups": (0, 0, 1, 1, 1), "chunks": None}
    assert algorithms.resolve(module, {"groups": (1, 0, 1)}, ((0, 1, 2),))[1]["groups"] == (1, 0, 1)
    assert algorithms.resolve("hierarchical_copy", {}, ((0, 2), (1, 3)))[1] == {"groups": (0, 1, 0, 1)}
    assert algorithms.resolve("hierarchical_copy", {"group_size": 3}, ((0, 1, 2, 3),))[1] == {"groups": (0, 0, 0, 1)}
    assert algorithms.resolve("tree", {}, ((0, 1),))[1] == {"segment_bytes": algorithms.get("tree").DEFAULT_SEGMENT_BYTES}
    with pytest.raises(ValueError, match="takes no option"):
        algorithms.resolve("ring", {"segment_bytes": 4}, ((0,),))
    with pytest.raises(ValueError, match="one entry per rank"):
        algorithms.resolve("two_level", {"groups": (0, 1)}, ((0, 1, 2),))
    with pytest.raises(ValueError, match="root"):
        algorithms.resolve("reduce_to_one", {"root": 5}, ((0, 1),))  # the check hook, with the size


def test_a_lazy_topology_is_read_only_by_hooks_that_need_it():
    for name in ("ring", "tree", "double_binary_tree", "reduce_to_one", "shm"):
        algorithms.resolve(name, {}, never, 4)
    assert algorithms.resolve("two_level", {}, lambda: ((0, 1), (2, 3)), 4)[1]["groups"] == (0, 0, 1, 1)


def test_communicator_hosts_follow_node_colors():
    comm = Communicator()
    comm.size = 5
    assert comm.hosts() == ((0, 1, 2, 3, 4),)
    comm.node_colors = lambda: (7, 3, 7, 3, 9)
    assert comm.hosts() == ((0, 2), (1, 3), (4,))
    assert comm.hosts() is comm.hosts()
    comm.node_colors = lambda: (0, 0, 1, 1, 1)
    assert comm.hosts() == ((0, 1), (2, 3, 4))


def test_the_api_and_the_simulator_resolve_alike():
    """two_level over 2 hosts x 2 ranks: the threaded world's node colours and the simulator's
    topology give the same plans, and the result is exact."""
    x = [np.arange(9, dtype=np.float64) * (r + 1) for r in range(4)]

    def body(comm):
        comm.node_colors = lambda: (0, 0, 1, 1)
        params = algorithms.resolve("two_level", {}, comm.hosts, comm.size)[1]
        got = collectives.allreduce(x[comm.rank], algorithm="two_level", comm=comm)
        return params, got

    results = run_threaded(4, body)
    simulated = build_plans("two_level", 4, 9, 8, Topology(2, (1e-6, 1e-9), (1e-6, 1e-9)))
    params = results[0][0]
    assert params["groups"] == (0, 0, 1, 1)
    module = algorithms.get("two_level")
    for rank, plan in enumerate(simulated):
        assert plan.steps == module.build(rank, 4, 9, itemsize=8, **params).steps
    for _, got in results:
        assert got.tolist() == sum(x).tolist()


def test_tf_bridge_resolves_through_the_registry():
    tf_plan = pytest.importorskip("tf_bridge._tf_plan", exc_type=ImportError)
    name, params = tf_plan.resolve_algorithm("two_level", {}, 4, 1 << 10, np.dtype(np.float32))
    assert (name, params) == ("two_level", algorithms.resolve("two_level", {}, ((0, 1, 2, 3),))[1])
