"""Bad input is rejected before any communication, with the valid choices listed."""
import numpy as np
import pytest

import collectives
import importlib

registry = importlib.import_module("collectives.algorithms")


def _rank0_only(comm, call):
    # Only rank 0 calls: an error raised before communicating returns at once;
    # one raised after would time out instead.
    if comm.rank == 0:
        call(comm)


def _expect_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        collectives.run_threaded(2, _rank0_only, call)


def test_unknown_algorithm_lists_choices():
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4), algorithm="nope", comm=c),
                        "valid algorithms: auto, ring")


def test_unknown_op_lists_choices():
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4), op="xor", comm=c),
                        "valid ops: sum, prod, min, max, avg")


def test_unsupported_dtype_lists_choices():
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4, complex), comm=c), "supported dtypes: int8")
    _expect_value_error(lambda c: collectives.allreduce(np.array(["a"]), comm=c), "unsupported dtype")


def test_avg_needs_floats():
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4, np.int32), op="avg", comm=c),
                        "needs a floating dtype")


def test_recvbuf_must_match():
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4), np.ones(5), comm=c), "recvbuf must match")
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4), np.ones(4, np.float32), comm=c),
                        "recvbuf must match")


@pytest.mark.parametrize("algorithm, options, match", [
    ("ring", {"segment_bytes": 4}, "takes no option"),
    ("tree", {"segment_bytes": 0}, "positive integer"),
    ("tree", {"segment_bytes": "big"}, "positive integer"),
    ("double_binary_tree", {"fanout": 3}, "valid options: segment_bytes"),
    ("hierarchical_copy", {"group_size": -1}, "positive integer"),
    ("reduce_to_one", {"root": 5}, "not a rank"),
    ("reduce_to_one", {"root": -1}, "rank"),
])
def test_invalid_options(algorithm, options, match):
    _expect_value_error(lambda c: collectives.allreduce(np.ones(4), algorithm=algorithm, comm=c, **options), match)


def test_block_errors():
    _expect_value_error(lambda c: collectives.broadcast(np.ones(3), root=2, comm=c), "root must be a rank")
    _expect_value_error(lambda c: collectives.reduce_scatter(np.ones(3), algorithm="x", comm=c), "valid: ring")
    _expect_value_error(lambda c: collectives.reduce(np.ones(3), op="bad", comm=c), "valid ops")


def test_every_algorithm_documents_itself():
    for name in collectives.algorithm_names():
        module = registry.get(name)
        assert module.__name__.endswith("." + name)
        doc = module.__doc__ or ""
        for word in ("Steps", "Bytes sent per rank", "Cost", "Limits", "Reference"):
            assert word in doc, f"{name} docstring lacks {word}"
        assert set(collectives.algorithm_options(name)) == set(module.OPTIONS)


def test_run_threaded_releases_others_and_reraises_first():
    def body(comm):
        if comm.rank == 1:
            raise KeyError("rank 1 broke")
        return collectives.allreduce(np.ones(1000), comm=comm)

    with pytest.raises(KeyError, match="rank 1 broke"):
        collectives.run_threaded(4, body)


def test_run_threaded_rejects_bad_size():
    with pytest.raises(ValueError):
        collectives.run_threaded(0, lambda c: None)


def test_threaded_split_and_successive_calls_do_not_mix():
    def body(comm):
        sub = comm.split(comm.rank % 2, key=-comm.rank)
        results = []
        for i in range(5):
            results.append(collectives.allreduce(np.full(7, comm.rank + i, np.int64), comm=sub)[0])
            results.append(collectives.allreduce(np.full(3, 1, np.int64), comm=comm)[0])
        return sub.rank, sub.size, results

    results = collectives.run_threaded(5, body)
    for rank, (sub_rank, sub_size, values) in enumerate(results):
        members = [r for r in range(5) if r % 2 == rank % 2]
        assert sub_size == len(members)
        assert sub_rank == sorted(members, reverse=True).index(rank)
        for i in range(5):
            assert values[2 * i] == sum(m + i for m in members)
            assert values[2 * i + 1] == 5


@pytest.mark.parametrize("field, call", [
    # int32 and float32 blocks have the same size: without the check the bytes are gathered as is
    ("dtype", lambda c: collectives.allgather(np.ones(4, np.int32 if c.rank == 2 else np.float32), comm=c)),
    ("algorithm", lambda c: collectives.allgather(np.ones(4), comm=c,
                                                  algorithm="recursive_doubling" if c.rank == 2 else "ring")),
    ("call", lambda c: (collectives.allgather if c.rank == 2 else collectives.reduce_scatter)(np.ones(4), comm=c)),
])
def test_check_covers_allgather(monkeypatch, field, call):
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "10")

    def body(comm):
        try:
            call(comm)
        except collectives.MismatchError as exc:
            return str(exc)
        return None

    messages = collectives.run_threaded(4, body)
    assert all(m is not None for m in messages), f"a rank did not raise: {messages}"
    assert len(set(messages)) == 1, messages
    assert f"ranks disagree on {field} (ranks 2 differ from rank 0)" in messages[0], messages[0]


def test_check_lets_allgather_blocks_differ_in_size(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_CHECK", "1")
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "10")
    results = collectives.run_threaded(
        3, lambda c: collectives.allgather(np.full(c.rank + 1, c.rank, np.int64), comm=c))
    assert all(r.tolist() == [0, 1, 1, 2, 2, 2] for r in results), results


def test_algorithms_is_the_deprecated_name_of_algorithm_names():
    """``collectives.algorithms`` is the registry subpackage (no function shadows it); calling it
    still gives the names, with a DeprecationWarning."""
    import types

    import collectives.algorithms.ring as ring_module

    assert isinstance(collectives.algorithms, types.ModuleType)
    assert collectives.algorithms.ring is ring_module
    with pytest.warns(DeprecationWarning, match="algorithm_names"):
        assert collectives.algorithms() == collectives.algorithm_names()
