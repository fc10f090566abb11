"""Damaged states: each is refused with an InvalidDataError naming what is wrong, the
loader left as it was, never a bare ValueError/TypeError/OverflowError or a hang
(helper statefuzz)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import pqloader
from conftest import ids_of, run_with_timeout, write_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("damage")
    write_dataset(path, [[7, 5], [9], [3, 6, 4]])
    return path


def _loader(root, **kw):
    return pqloader.Loader(root, **dict(dict(batch_size=4, columns=["id", "v"]), **kw))


def _damaged(state, path, value):
    state = copy.deepcopy(state)
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return state


def _refused_unchanged(loader, state, match):
    it = iter(loader)
    next(it)
    before = loader.state_dict()
    with pytest.raises(pqloader.InvalidDataError, match=match):
        loader.load_state_dict(state)
    assert loader.state_dict() == before
    return before


# NumPy values where a list was: `==` against the loader's list is element-wise, and its
# truth a bare ValueError ("truth value of an array ... is ambiguous").
@pytest.mark.parametrize("path", [("options", "files"), ("options", "columns"), ("options", "sources")])
@pytest.mark.parametrize("value", [np.int64(1), np.array([1]), np.array([1, 2]), np.float64(1.0)],
                         ids=["int64", "array1", "array2", "float64"])
def test_numpy_values_refused_naming_the_key(root, path, value):
    src = _loader(root, shuffle=True, seed=5)
    state = src.state_dict()
    loader = _loader(root, shuffle=True, seed=5)
    _refused_unchanged(loader, _damaged(state, path, value), path[-1])
    expected = _loader(root, shuffle=True, seed=5)
    loader.load_state_dict(state)
    assert ids_of(list(loader)) == ids_of(list(expected))


@pytest.mark.parametrize("value", [np.True_, np.array([1]), 1.0], ids=["np-bool", "array", "float"])
def test_version_not_an_int_refused(root, value):
    state = _loader(root).state_dict()
    _refused_unchanged(_loader(root), _damaged(state, ("version",), value), "version")


def test_numpy_bool_seed_of_a_drawn_seed_refused(root):
    # np.True_ == a drawn seed past 2**63: OverflowError converting the int
    src = _loader(root, shuffle=True, seed=2**63 + 5)
    state = _damaged(src.state_dict(), ("options", "seed"), np.True_)
    _refused_unchanged(_loader(root, shuffle=True, seed=None), state, "seed")


def test_kind_array_is_no_mixture(root):
    # (compared element-wise with "pqloader.mix": a bare ValueError)
    state = _damaged(_loader(root).state_dict(), ("kind",), np.array(["a", "b"]))
    loader = _loader(root)
    loader.load_state_dict(state)
    assert pqloader.merge_states([state])["rank_batches"] == [0]
    mixture = _mixture(root)
    with pytest.raises(pqloader.InvalidDataError, match="not a pqloader.mix state"):
        mixture.load_state_dict(state)


def test_huge_world_loads_its_own_state(root):
    # Every old rank's count was made as a list of world_size ints: 2**31 of them.
    loader = _loader(root, world_size=2**31, rank=5, shard_policy="pad")
    state = loader.state_dict()
    run_with_timeout(lambda: loader.load_state_dict(state), timeout=30)
    assert ids_of(list(loader)) == [5]
    # Resumed on another world, its rest would be dealt per old rank: refused, named.
    other = _loader(root, world_size=1, rank=0, shard_policy="pad")
    with pytest.raises(pqloader.InvalidDataError, match=r"state\['options'\]\['world_size'\] is 2147483648"):
        run_with_timeout(lambda: other.load_state_dict(dict(state, batch=1)), timeout=30)


@pytest.mark.parametrize("end", [2**32 + 1, 2**40, 2**62])
def test_iteration_end_past_the_last_epoch_refused(root, end):
    state = _damaged(_loader(root).state_dict(), ("iteration_end",), end)
    _refused_unchanged(_loader(root), state, "iteration_end")


def _mixture(root):
    return pqloader.mix([_loader(root, shuffle=True, seed=2), _loader(root, shuffle=True, seed=3)],
                        [0.7, 0.3], batch_size=4, seed=1, stop="first")


@pytest.mark.parametrize("path,value", [
    (("config", "weights"), np.float64(1.0)), (("config", "sources"), np.array([1])),
    (("config", "sources"), np.int64(1)), (("end",), 2**40), (("end",), 2**63), (("version",), np.array([1, 2])),
])
def test_mixture_damaged_state_refused(root, path, value):
    src = _mixture(root)
    it = iter(src)
    next(it)
    state = src.state_dict()
    mixture = _mixture(root)
    _refused_unchanged(mixture, _damaged(state, path, value), path[-1])
    if path[-1] == "sources":
        with pytest.raises(pqloader.InvalidDataError):
            pqloader.merge_states([state, _damaged(state, path, value)])


@pytest.mark.parametrize("value", [[1], np.array([1, 2]), "1", 2**63])
def test_merge_states_iteration_end_checked(root, value):
    states = []
    for rank in range(2):
        loader = _loader(root, world_size=2, rank=rank)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
    states[1] = _damaged(states[1], ("iteration_end",), value)
    with pytest.raises(pqloader.InvalidDataError, match=r"rank 1's state\['iteration_end'\]"):
        pqloader.merge_states(states)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 100_000])
def test_checkpoint_entry_nested_too_deep_refused(root, text):
    pt = pytest.importorskip("pqloader.torch")
    loader = _loader(root)
    before = loader.state_dict()
    with pytest.raises(pqloader.InvalidDataError, match="pqloader_state"):
        pt.Checkpoint(loader).load_state_dict({"pqloader_state": text})
    assert loader.state_dict() == before
    state = json.loads(json.dumps(_loader(root).state_dict()))
    pt.Checkpoint(loader).load_state_dict({"pqloader_state": json.dumps(state)})
