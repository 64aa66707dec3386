"""``build_all`` (every rank's plan as columns, collectives/algorithms/_bulk.py) flattens to exactly
what the algorithm's own plans do: the simulator reads one in place of the other."""
import numpy as np
import pytest

import collectives
from collectives.flat import Plans, _Flat, _params, algorithm_module, build_plans

BULK = [name for name in collectives.algorithms() if hasattr(algorithm_module(name), "build_all")]
OPTIONS = {"tree": ({}, {"segment_bytes": 4 * 5}), "double_binary_tree": ({}, {"segment_bytes": 4 * 5})}


def assert_same(a, b, where):
    assert set(vars(a)) == set(vars(b)), where
    for key, x in vars(a).items():
        y = getattr(b, key)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), (where, key)
        else:
            assert x == y, (where, key)


def test_the_built_ins_that_simulate_slowest_have_a_bulk_path():
    assert {"ring", "tree", "double_binary_tree", "hierarchical_copy", "shm", "two_level"} <= set(BULK)


@pytest.mark.parametrize("name", BULK)
def test_columns_flatten_as_the_plans_do(name):
    used = 0
    for p in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31):
        for count in sorted({0, 1, 2, p - 1, p, p + 1, 3 * p + 2, 1000}):
            for options in OPTIONS.get(name, ({},)):
                module = algorithm_module(name)
                columns = module.build_all(p, max(count, 0), 4, **_params(module, p, options, None))
                if columns is None:
                    continue
                used += 1
                for ops in (False, True):
                    plans = build_plans(name, p, max(count, 0), 4, **options)
                    assert_same(Plans(name, p, 4, **options).flat(max(count, 0), ops), _Flat(plans, ops),
                                (p, count, options, ops))
    assert used >= 30


def test_several_hosts_and_small_cases_build_every_plan():
    assert algorithm_module("two_level").build_all(6, 100, 4, groups=(0, 0, 1, 1, 2, 2)) is None
    assert algorithm_module("hierarchical_copy").build_all(6, 100, 4, groups=(0, 0, 1, 1, 2, 2)) is None
    assert algorithm_module("ring").build_all(8, 7, 4) is None  # an empty chunk
    for name, options in (("two_level", {"groups": (0, 0, 1, 1, 2, 2)}), ("hierarchical_copy", {"group_size": 2})):
        assert_same(Plans(name, 6, 4, **options).flat(100), _Flat(build_plans(name, 6, 100, 4, **options)), name)


def test_a_bulk_path_that_drifts_from_build_is_caught(monkeypatch):
    module = algorithm_module("ring")
    real = module.build_all

    def drifted(size, count, itemsize=1):
        columns = real(size, count, itemsize)
        columns.recvs[2][-1] += 1  # the last rank's last receive one element off
        return columns

    monkeypatch.setattr(module, "build_all", drifted)
    with pytest.raises(RuntimeError, match="build_all differs from build at rank 7"):
        collectives.simulate("ring", ranks=8, nbytes=4000)
