"""Behaviour the other tests left unchecked, found by mutating the Python layer
(each test here fails on one hand-made mutant that every other test let through)."""

from __future__ import annotations

import copy
import threading
import time
import warnings

import pytest

import pqloader
from pqloader import _iteration
from conftest import write_dataset

LAST = 2**32 - 1


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("gaps")
    write_dataset(root, [[7, 5], [9]])
    return str(root)


def test_take_back_of_a_move_that_did_not_happen_leaves_the_position():
    # hand_out calls take_back when advance raised (a Ctrl-C before the move ended): a
    # take_back of a move that never happened must not undo the previous batch's move
    # (its batch was handed out: undoing it hands it out twice).
    c = _iteration.Cursor()
    g = c.invalidate()
    c.advance(g, 0, 1)
    c.advance(g, 0, 2)
    c.take_back(g, 0, 3)  # the move to (0, 3) never happened
    assert (c.epoch, c.batch) == (0, 2)
    c.take_back(g, 0, 2)  # the move to (0, 2) happened: undone
    assert (c.epoch, c.batch) == (0, 1)
    stale = c.invalidate()
    c.advance(stale, 0, 2)
    c.take_back(g, 0, 2)  # an older iterator's take_back touches nothing
    assert (c.epoch, c.batch) == (0, 2)


def test_a_loop_that_ends_the_next_to_last_epoch_moves_on_to_the_last(ds):
    # After a completed loop the position is the next epoch's start (epoch 2**32 - 1,
    # batch 0), as after any other epoch; only a loop that ran epoch 2**32 - 1 itself
    # stays at that epoch's end (there is no epoch 2**32).
    loader = pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1, num_epochs=1)
    loader.set_epoch(LAST - 1)
    assert len(list(loader)) == len(loader) > 0
    assert loader.epoch == LAST
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (LAST, 0)
    assert len(list(loader)) == len(loader)  # the last epoch still runs, whole
    assert (loader.epoch, loader.state_dict()["batch"]) == (LAST, len(loader))


def _mixture(ds, seed, source_seeds=(1, 2), **kwargs):
    return pqloader.mix([pqloader.Loader(ds, batch_size=4, shuffle=True, seed=s) for s in source_seeds],
                        weights=[1, 1], batch_size=4, seed=seed, **kwargs)


def test_a_drawn_seed_mixture_with_samples_per_epoch_loads_a_state_near_its_epochs_end(ds):
    # The state's epoch length with samples_per_epoch does not depend on the seed: a
    # position past where the state's seed would have ended a stop="first" epoch is valid.
    m = _mixture(ds, 5, samples_per_epoch=400, stop="first")
    n = len(m)
    assert n == 100
    it = iter(m)
    for _ in range(n - 1):
        next(it)
    state = m.state_dict()
    rest = [b["id"].copy() for b in it]
    fresh = _mixture(ds, None, (None, None), samples_per_epoch=400, stop="first")  # adopts the seeds
    fresh.load_state_dict(state)
    assert fresh.state_dict()["batch"] == n - 1
    got = [b["id"].copy() for b in fresh]
    assert len(got) == len(rest) == 1 and (got[0] == rest[0]).all()


@pytest.mark.parametrize("kind", ["loader", "mixture"])
def test_set_epoch_after_a_state_taken_at_its_epochs_end_drops_nothing_and_warns_not(ds, kind):
    # A loop that took len() batches and stopped: its state is at the epoch's end, so
    # another epoch drops no position (the warning is for a state inside its epoch).
    def make():
        if kind == "loader":
            return pqloader.Loader(ds, batch_size=4, shuffle=True, seed=3)
        return _mixture(ds, 3)
    a = make()
    it = iter(a)
    for _ in range(len(a)):
        next(it)
    state = a.state_dict()
    assert (state["epoch"], state["batch"]) == (0, len(a))
    b = make()
    b.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.set_epoch(2)
    assert b.state_dict()["epoch"] == 2 and b.state_dict()["batch"] == 0


def test_endless_mixture_epochs_of_samples_per_epoch_with_no_batch_raise_at_the_first(ds):
    # With samples_per_epoch every epoch is as long: an empty first one means all are,
    # so it raises there, not after the 1000 epochs of no batch a drawn length may have.
    m = pqloader.mix([pqloader.Loader(ds, batch_size=4, seed=s, world_size=4, rank=0) for s in (1, 2)],
                     [0.5, 0.5], seed=0, samples_per_epoch=3, num_epochs=None)
    with pytest.raises(pqloader.InvalidDataError, match=r"^mixture epoch 0 has no batch \(samples_per_epoch"):
        next(iter(m))


def _ranked(ds, world, rank, **kw):
    return pqloader.Loader(ds, batch_size=2, shuffle=True, seed=7, world_size=world, rank=rank, **kw)


def _states_after(loaders, taken):
    states = []
    for loader in loaders:
        it = iter(loader)
        for _ in range(taken(loader)):
            next(it)
        it.close()  # (a loop left: the state records no end, the next loop runs num_epochs)
        states.append(loader.state_dict())
    return states


def test_an_ended_rest_resumed_twice_on_other_worlds_moves_on_to_the_next_epoch(ds):
    # 2 ranks hand out all of epoch 0; 3 ranks resume its (empty) rest and checkpoint at
    # once; 1 rank resumes that nested state: epoch 0 ended (the first world consumed it),
    # so its loop runs epoch 1, not the empty rest as one more epoch.
    merged2 = pqloader.merge_states(_states_after([_ranked(ds, 2, r) for r in range(2)], len))
    threes = [_ranked(ds, 3, r) for r in range(3)]
    for loader in threes:
        loader.load_state_dict(merged2)
    merged3 = pqloader.merge_states([loader.state_dict() for loader in threes])
    assert merged3["rank_batches"] == [0, 0, 0] and merged3["elastic"]["batches"] == [5, 5]
    loader = _ranked(ds, 1, 0)
    loader.load_state_dict(merged3)
    fresh = _ranked(ds, 1, 0)
    fresh.set_epoch(1)
    want = [b["id"].tolist() for b in fresh]
    assert len(loader) == len(want) > 0
    assert [b["id"].tolist() for b in loader] == want


def test_set_epoch_warns_when_it_drops_a_rest_resumed_on_another_world(ds):
    # The rest of an epoch the old world had begun is inside that epoch at batch 0.
    merged = pqloader.merge_states(_states_after([_ranked(ds, 2, r) for r in range(2)], lambda _: 1))
    loader = _ranked(ds, 1, 0)
    loader.load_state_dict(merged)
    assert 0 < len(loader)
    with pytest.warns(UserWarning, match=r"set_epoch\(3\) drops the position"):
        loader.set_epoch(3)


def test_the_loop_after_a_resumed_one_runs_a_whole_epoch_without_set_epoch(ds):
    # The restored end bounds only the iteration that resumes: the next `for` loop runs
    # num_epochs from there (it had stopped at once, yielding nothing).
    a = _ranked(ds, 1, 0)
    it = iter(a)
    next(it), next(it)
    state = a.state_dict()
    b = _ranked(ds, 1, 0)
    b.load_state_dict(state)
    assert len(list(b)) == len(b) - 2
    fresh = _ranked(ds, 1, 0)
    fresh.set_epoch(1)
    assert [x["id"].tolist() for x in b] == [x["id"].tolist() for x in fresh]


def test_len_after_a_loop_left_at_an_elastic_rests_last_batch_is_the_next_epochs(ds):
    # A loop over the rest of an epoch resumed on another world, left (break) at its
    # last batch: the next loop runs epoch 1, whole, and len() says so.
    merged = pqloader.merge_states(_states_after([_ranked(ds, 2, r) for r in range(2)], lambda _: 2))
    loader = _ranked(ds, 1, 0)
    loader.load_state_dict(merged)
    rest = len(loader)
    assert 0 < rest < len(_ranked(ds, 1, 0))
    for i, _ in enumerate(loader):
        if i == rest - 1:
            break
    assert len(loader) == len(_ranked(ds, 1, 0))
    assert len(list(loader)) == len(loader)


def test_a_mixture_state_whose_end_is_before_its_epoch_is_refused(ds):
    m = _mixture(ds, 3)
    m.set_epoch(2)
    it = iter(m)
    next(it)
    state = m.state_dict()
    assert (state["epoch"], state["end"]) == (2, 3)
    fresh = _mixture(ds, 3)
    with pytest.raises(pqloader.InvalidDataError, match=r"\['end'\] 1 is not an epoch after 2"):
        fresh.load_state_dict(dict(state, end=1))
    fresh.load_state_dict(dict(state, end=2))  # (an end at its own epoch: nothing more to run)


@pytest.mark.parametrize("bad", [2**64, -1])
def test_a_mixture_state_with_a_seed_out_of_range_is_refused_naming_the_seed(ds, bad):
    # A drawn-seed mixture adopts a state's seeds only when they are seeds (0 to 2**64 - 1):
    # another one is a differing option, not the binding's TypeError.
    m = _mixture(ds, None)
    next(iter(m))
    state = copy.deepcopy(m.state_dict())
    state["config"]["seed"] = bad
    state["config"]["source_fingerprints"][0]["seed"] = bad
    fresh = _mixture(ds, None, (None, None))
    with pytest.raises(pqloader.InvalidDataError, match=f"seed: state has {bad}"):
        fresh.load_state_dict(state)


def test_stats_count_only_the_batches_handed_out_with_torch_staging_ahead(ds):
    torch = pytest.importorskip("torch")
    loader = pqloader.Loader(ds, batch_size=2, seed=1, output="torch", device="cpu", device_prefetch=3)
    it = iter(loader)
    first = next(it)
    assert isinstance(first["id"], torch.Tensor)
    it.close()  # the staged batches after it were never handed out
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (1, 2)


def test_an_unshuffled_loader_without_a_seed_does_not_adopt_a_states_seed(ds):
    # Without shuffle a missing seed is 0, not drawn: a state of another seed (whose random
    # transforms differ) is refused, naming it, not adopted.
    a = pqloader.Loader(ds, batch_size=4, seed=5)
    next(iter(a))
    b = pqloader.Loader(ds, batch_size=4)
    assert b.seed == 0
    with pytest.raises(pqloader.InvalidDataError, match="seed: state has 5, loader has 0"):
        b.load_state_dict(a.state_dict())
    assert b.seed == 0


def test_closing_a_stale_batch_transform_iterator_leaves_the_newer_ones_run_alone(ds):
    # A's thread is busy in batch_transform when A is closed, after B replaced it: A's
    # wake-up must not stop the engine, whose run is B's now.
    gate = threading.Event()
    calls = []

    def slow_second(b):
        calls.append(1)
        if len(calls) == 2:
            gate.wait(30)  # A's second batch: its thread stays alive until released
        return b

    loader = pqloader.Loader(ds, batch_size=2, seed=1, batch_transform=slow_second, prefetch_batches=1)
    n = len(loader)
    a = iter(loader)
    next(a)
    while len(calls) < 2:  # A's thread is in its second call
        time.sleep(0.01)
    b = iter(loader)
    got = [next(b)["id"].tolist()]
    releaser = threading.Timer(0.2, gate.set)  # (only ends A's wait; close() wakes first)
    releaser.start()
    a.close()
    releaser.join()
    got += [x["id"].tolist() for x in b]
    assert len(got) == n - 1  # B runs on after A's one batch
    assert sorted(i for x in got for i in x) == list(range(2, 21))


def test_a_state_whose_elastic_bases_nest_too_deep_is_refused_naming_the_field(ds):
    a = pqloader.Loader(ds, batch_size=4, seed=1)
    next(iter(a))
    state = a.state_dict()
    nested = None
    for _ in range(100):
        nested = {"world_size": 1, "batch_size": 4, "batches": [0], "base": nested}
    with pytest.raises(pqloader.InvalidDataError, match=r"state\['elastic'\] must be None or a dict"):
        pqloader.Loader(ds, batch_size=4, seed=1).load_state_dict(dict(state, elastic=nested))


@pytest.mark.parametrize("field, value", [("epoch", 2**32), ("batch", 2**70), ("iteration_end", 2**70)])
def test_a_state_field_past_its_maximum_is_refused_naming_it(ds, field, value):
    a = pqloader.Loader(ds, batch_size=4, seed=1)
    next(iter(a))
    b = pqloader.Loader(ds, batch_size=4, seed=1)
    with pytest.raises(pqloader.InvalidDataError, match=rf"state\['{field}'\] must be in \[0, \d+\], got {value}"):
        b.load_state_dict(dict(a.state_dict(), **{field: value}))
    assert (b.epoch, b.state_dict()["batch"]) == (0, 0)


def _taken_state(ds, n, **kw):
    a = pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1, **kw)
    it = iter(a)
    ids = [i for _ in range(n) for i in next(it)["id"].tolist()]
    return a.state_dict(), ids


def test_a_state_whose_rank_batches_hold_a_negative_count_is_refused_naming_them(ds):
    state, _ = _taken_state(ds, 1)
    with pytest.raises(pqloader.InvalidDataError, match=r"state\['rank_batches'\] must be a list of 1 ints >= 0"):
        pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1).load_state_dict(dict(state, rank_batches=[-1]))


def test_a_state_one_batch_past_the_epochs_end_is_refused(ds):
    state, _ = _taken_state(ds, 1)
    b = pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1)
    n = len(b)
    b.load_state_dict(dict(state, batch=n))  # the epoch's end: a position
    with pytest.raises(pqloader.InvalidDataError, match=rf"state\['batch'\] is {n + 1}, past the {n} batches"):
        b.load_state_dict(dict(state, batch=n + 1))


def test_a_state_resumed_with_another_batch_size_alone_hands_out_the_rest_once(ds):
    state, seen = _taken_state(ds, 2)
    b = pqloader.Loader(ds, batch_size=2, shuffle=True, seed=1)
    b.load_state_dict(state)
    rest = [i for x in b for i in x["id"].tolist()]
    assert sorted(seen + rest) == list(range(21))


def test_a_state_whose_seed_disagrees_with_its_options_seed_is_refused(ds):
    state, _ = _taken_state(ds, 1)
    with pytest.raises(pqloader.InvalidDataError, match="seed: state has 99, loader has 1"):
        pqloader.Loader(ds, batch_size=4, shuffle=True, seed=1).load_state_dict(dict(state, seed=99))


def test_a_schema_of_no_field_is_refused_when_made(ds):
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match="schema= declares no column"):
        pqloader.Loader(ds, batch_size=4, schema=pa.schema([]))


def test_normalize_refuses_a_mean_whose_quotient_overflows_float32():
    from pqloader import transforms as T
    with pytest.raises(ValueError, match="do not fit float32"):
        T.Normalize(mean=[1e39], std=[1.0])
    T.Normalize(mean=[1e30], std=[1.0])  # (fits)


@pytest.mark.parametrize("arg", ["batch_size", "shuffle_window", "max_inflight_bytes", "cache_shards"])
def test_an_int_argument_refuses_a_bool(ds, arg):
    with pytest.raises(TypeError, match=rf"{arg} must be an int, got bool"):
        pqloader.Loader(ds, **{arg: True})
    with pytest.raises(TypeError, match=r"epoch must be an int, got bool"):
        pqloader.Loader(ds).set_epoch(True)
