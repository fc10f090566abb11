"""Elastic resume: a state taken on N ranks resumes on M ranks (and another batch size).

The rest of the interrupted epoch must be exactly the samples no old rank had consumed
(none repeated, none skipped; with shard_policy="drop" at most M - 1 dropped to equalise
the new ranks), dealt so every new rank gets the same number of batches, and the
resumed stream must be a pure function of the state; later epochs are ordinary M-rank
epochs. Also: merged per-rank states, and exact resume of DataLoader workers.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import pqloader
from conftest import ids_of, run_with_timeout, subprocess_env, write_dataset

LAYOUT = [[37, 50, 11], [64, 29], [40, 3, 58, 41]]  # 333 rows, 9 row groups
N = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    write_dataset(root, LAYOUT)
    return str(root)


def make(ds, world, rank, batch_size=8, **kw):
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 11)
    kw.setdefault("shuffle_window", 2)
    kw.setdefault("num_epochs", None)
    return pqloader.Loader(ds, columns=["id", "x"], batch_size=batch_size, rank=rank,
                           world_size=world, **kw)


def take(loader, n):
    """The next n batches (ids), then the loader's state."""
    it = iter(loader)
    out = [next(it)["id"].copy() for _ in range(n)]
    state = loader.state_dict()
    it.close()
    return out, state


def rest_of_epoch(loader):
    """Every batch until the epoch ends (the cursor moves to the next one)."""
    epoch = loader.epoch
    out = []
    it = iter(loader)
    for batch in it:
        if loader.epoch != epoch:  # the cursor moved into the next epoch with this batch
            break
        out.append(batch["id"].copy())
    it.close()
    return out


def by_epoch(loader, n):
    """The batches of the next n epochs, split by the epoch the cursor is in on receipt."""
    first = loader.epoch
    out = [[] for _ in range(n)]
    it = iter(loader)
    for batch in it:
        e = loader.epoch - first
        if e >= n:
            break
        out[e].append(batch["id"].copy())
    it.close()
    return out


def epoch_ids(ds, world, epoch, batch_size=8, **kw):
    """Every sample the ranks of an uninterrupted world hand out in `epoch`."""
    ids = []
    for r in range(world):
        loader = make(ds, world, r, batch_size, **kw)
        loader.set_epoch(epoch)
        ids += [int(i) for b in rest_of_epoch(loader) for i in b]
    return ids


CASES = [(4, 2), (2, 3), (3, 1), (1, 4)]


@pytest.mark.parametrize("old,new", CASES)
@pytest.mark.parametrize("cut", ["start", "one", "middle", "last", "end"])
def test_resume_on_another_world_size_hands_out_the_rest_of_the_epoch_exactly_once(ds, old, new, cut):
    per_rank = len(make(ds, old, 0))
    k = {"start": 0, "one": 1, "middle": per_rank // 2, "last": per_rank - 1, "end": per_rank}[cut]
    consumed, states = [], []
    for r in range(old):
        batches, state = take(make(ds, old, r), k)
        consumed += [int(i) for b in batches for i in b]
        states.append(json.loads(json.dumps(state)))  # states survive JSON
    expected = epoch_ids(ds, old, 0)

    rest, counts = [], []
    for r in range(new):
        loader = make(ds, new, r)
        loader.load_state_dict(states[0])  # lockstep: any rank's state describes all
        assert loader.epoch == 0
        announced = len(loader)
        batches = rest_of_epoch(loader)
        counts.append(len(batches))
        if k < per_rank:
            assert len(batches) == announced
        else:  # nothing of epoch 0 is left: len() counts the epoch the next loop runs, 1
            assert announced == len(make(ds, new, r)) and loader._next_iteration_epoch() == 1
        rest += [int(i) for b in batches for i in b]
        # Every batch but an epoch's last is full.
        assert all(len(b) == 8 for b in batches[:-1])

    assert len(set(counts)) == 1, f"new ranks got different batch counts {counts}"
    got = consumed + rest
    assert len(got) == len(set(got)), "a sample was handed out twice"
    assert set(got) <= set(expected)
    assert len(expected) - len(got) < new  # only what equalising the new ranks drops
    if k == per_rank:
        assert rest == []


def test_resumed_stream_is_deterministic_and_later_epochs_are_ordinary(ds):
    _, state = take(make(ds, 4, 1), 5)

    def resumed(r):
        loader = make(ds, 3, r)
        loader.load_state_dict(state)
        first, second = by_epoch(loader, 2)
        return first, second, loader.state_dict()

    for r in range(3):
        a, b = resumed(r), resumed(r)
        assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and len(a[0]) == len(b[0])
        fresh = make(ds, 3, r)
        fresh.set_epoch(1)
        ordinary = rest_of_epoch(fresh)
        assert [x.tolist() for x in a[1]] == [x.tolist() for x in ordinary]
        assert "elastic" not in a[2]  # past the resumed epoch, states are ordinary again


def test_batch_size_may_change_too(ds):
    consumed, state = [], None
    for r in range(2):
        batches, state = take(make(ds, 2, r, batch_size=8), 6)
        consumed += [int(i) for b in batches for i in b]
    rest = []
    for r in range(3):
        loader = make(ds, 3, r, batch_size=5)
        loader.load_state_dict(state)
        batches = rest_of_epoch(loader)
        assert all(len(b) == 5 for b in batches[:-1])
        rest += [int(i) for b in batches for i in b]
    got = consumed + rest
    assert len(got) == len(set(got))
    expected = epoch_ids(ds, 2, 0)
    assert set(got) <= set(expected) and len(expected) - len(got) < 3


def test_nested_resizes_within_one_epoch(ds):
    """4 ranks -> 3 ranks (which checkpoint mid-remainder) -> 2 ranks."""
    consumed = []
    for r in range(4):
        batches, state4 = take(make(ds, 4, r), 3)
        consumed += [int(i) for b in batches for i in b]
    for r in range(3):
        loader = make(ds, 3, r, batch_size=6)
        loader.load_state_dict(state4)
        batches, state3 = take(loader, 4)
        consumed += [int(i) for b in batches for i in b]
    assert state3["elastic"]["world_size"] == 4 and state3["batch"] == 4
    state3 = json.loads(json.dumps(state3))
    rest = []
    for r in range(2):
        loader = make(ds, 2, r)
        loader.load_state_dict(state3)
        rest += [int(i) for b in rest_of_epoch(loader) for i in b]
    got = consumed + rest
    assert len(got) == len(set(got)), "a sample was handed out twice"
    assert N - len(got) < 3 + 2  # each equalisation drops fewer than its world size


def test_same_world_resume_continues_each_ranks_own_stream(ds):
    """Another rank's state (lockstep) or a merged one: the rest equals the uninterrupted run."""
    for r in range(3):
        whole = rest_of_epoch(make(ds, 3, r))
        _, state0 = take(make(ds, 3, 0), 4)
        loader = make(ds, 3, r)
        loader.load_state_dict(state0)
        assert [b.tolist() for b in rest_of_epoch(loader)] == [b.tolist() for b in whole[4:]]


def test_merged_states_of_ranks_that_stopped_at_different_batches(ds):
    consumed, states = [], []
    for r, k in enumerate([5, 3, 4]):
        batches, state = take(make(ds, 3, r), k)
        consumed.append([int(i) for b in batches for i in b])
        states.append(state)
    merged = pqloader.merge_states(list(reversed(states)))
    assert merged["rank_batches"] == [5, 3, 4]
    # Same world: each rank continues its own stream.
    for r in range(3):
        loader = make(ds, 3, r)
        loader.load_state_dict(merged)
        whole = rest_of_epoch(make(ds, 3, r))
        assert [b.tolist() for b in rest_of_epoch(loader)] == [b.tolist() for b in whole[[5, 3, 4][r]:]]
    # Another world: the rest, exactly once, equal counts.
    rest, counts = [], []
    for r in range(2):
        loader = make(ds, 2, r)
        loader.load_state_dict(merged)
        batches = rest_of_epoch(loader)
        counts.append(len(batches))
        rest += [int(i) for b in batches for i in b]
    got = sum(consumed, []) + rest
    assert len(set(counts)) == 1
    assert len(got) == len(set(got))
    assert len(epoch_ids(ds, 3, 0)) - len(got) < 2


def test_merging_many_ranks_with_an_elastic_base_is_linear(ds, monkeypatch):
    # Each rank's state of a resumed world holds the old world's counts (its elastic
    # base): merge_states normalised every rank's, and rank 0's again per rank, for
    # world x old world work (18 s for 4,096 ranks resumed from 4,096).
    from pqloader import _state

    loader = make(ds, 3, 0)
    next(iter(loader))
    world = 256
    state = loader.state_dict()
    state["elastic"] = {"world_size": world, "batch_size": 2, "batches": [0] * world, "base": None}
    states = []
    for r in range(world):
        s = copy.deepcopy(state)
        s["options"].update(rank=r, world_size=world)
        states.append(s)
    calls = 0
    jsonish = _state._jsonish

    def counting(value):
        nonlocal calls
        calls += 1
        return jsonish(value)

    monkeypatch.setattr(_state, "_jsonish", counting)
    merged = pqloader.merge_states(states)
    assert merged["rank_batches"] == [state["batch"]] * world
    assert merged["elastic"]["batches"] == [0] * world
    assert calls < 20 * world  # was ~ 2 * world * world
    states[7]["elastic"] = dict(states[7]["elastic"], batches=[0] * (world - 1) + [1])
    with pytest.raises(pqloader.InvalidDataError, match="rank 7's state differs"):
        pqloader.merge_states(states)
    # Tuples where a JSON round trip gives lists still merge.
    states[7]["elastic"] = dict(states[7]["elastic"], batches=tuple([0] * world))
    assert pqloader.merge_states(states)["elastic"]["batches"] == [0] * world


def test_a_rank_whose_iterator_took_no_batch_yet_merges_with_the_others(ds):
    # An iterator starts lazily: before its first batch its rank's state has no iteration
    # end, the others' have theirs; the merged state takes it (it was refused).
    loaders = [make(ds, 2, r, num_epochs=1) for r in range(2)]
    iterators = [iter(l) for l in loaders]
    next(iterators[1])
    merged = pqloader.merge_states([l.state_dict() for l in loaders])
    assert merged["rank_batches"] == [0, 1] and merged["iteration_end"] == 1
    for r in range(2):
        loader = make(ds, 2, r, num_epochs=1)
        loader.load_state_dict(merged)
        whole = list(make(ds, 2, r, num_epochs=1))
        assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in whole[r:]]
    other = make(ds, 2, 0, num_epochs=1)
    list(other)  # iteration complete: end None, next epoch
    with pytest.raises(pqloader.InvalidDataError, match="more than its position"):
        pqloader.merge_states([other.state_dict(), loaders[1].state_dict()])


def test_pad_policy_repeats_rather_than_drops(ds):
    for r in range(2):
        _, state = take(make(ds, 2, r, shard_policy="pad"), 7)
    seen, counts = [], []
    for r in range(3):
        loader = make(ds, 3, r, shard_policy="pad")
        loader.load_state_dict(state)
        batches = rest_of_epoch(loader)
        counts.append(len(batches))
        seen += [int(i) for b in batches for i in b]
    assert len(set(counts)) == 1
    consumed = []
    for r in range(2):
        batches, _ = take(make(ds, 2, r, shard_policy="pad"), 7)
        consumed += [int(i) for b in batches for i in b]
    assert set(seen) | set(consumed) == set(range(N))  # nothing skipped
    assert len(seen) - len(set(seen)) < 3  # at most world - 1 repeats


def test_unshuffled_and_drop_last(ds):
    consumed = []
    for r in range(2):
        batches, state = take(make(ds, 2, r, shuffle=False, drop_last=True), 9)
        consumed += [int(i) for b in batches for i in b]
    rest = []
    for r in range(4):
        loader = make(ds, 4, r, shuffle=False, drop_last=True)
        loader.load_state_dict(state)
        batches = rest_of_epoch(loader)
        assert all(len(b) == 8 for b in batches)
        rest += [int(i) for b in batches for i in b]
    got = consumed + rest
    assert len(got) == len(set(got))
    expected = epoch_ids(ds, 2, 0, shuffle=False, drop_last=True)
    assert set(got) <= set(expected)


def test_refusals(ds):
    _, state = take(make(ds, 2, 0), 3)
    with pytest.raises(pqloader.InvalidDataError, match="shuffle_window"):
        make(ds, 3, 0, shuffle_window=3).load_state_dict(state)
    bad = dict(state, rank_batches=[3, 99])
    with pytest.raises(pqloader.InvalidDataError, match="consumed 99 batches"):
        make(ds, 3, 0).load_state_dict(bad)
    with pytest.raises(pqloader.InvalidDataError, match="rank_batches"):
        make(ds, 3, 0).load_state_dict(dict(state, rank_batches=[1]))
    with pytest.raises(pqloader.InvalidDataError, match="elastic"):
        make(ds, 3, 0).load_state_dict(dict(state, elastic={"world_size": 2}))
    with pytest.raises(pqloader.InvalidDataError, match="one state per rank"):
        pqloader.merge_states([state])
    for not_a_state in [{k: v for k, v in state.items() if k != "version"},
                        {k: v for k, v in state.items() if k != "options"}]:
        with pytest.raises(pqloader.InvalidDataError, match="not a pqloader state"):
            pqloader.merge_states([not_a_state])
    loader = make(ds, 3, 0)
    before = loader.state_dict()
    with pytest.raises(pqloader.InvalidDataError):
        loader.load_state_dict(bad)
    assert loader.state_dict() == before  # a refused state changes nothing


def test_packed_loaders_refuse_a_resize(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = [list(range(i % 7 + 1)) for i in range(200)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=50)

    def packed(world, rank):
        return pqloader.Loader(str(tmp_path), batch_size=2, shuffle=True, seed=1, rank=rank,
                               world_size=world, pack=pqloader.Pack("tokens", seq_len=16, eos=0))

    loader = packed(2, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    with pytest.raises(pqloader.InvalidDataError, match="pack"):
        packed(3, 0).load_state_dict(state)


# -- DataLoader workers -------------------------------------------------------------------

torch = pytest.importorskip("torch")
import pqloader.torch  # noqa: E402


def dl_ids(batches):
    return [int(i) for b in batches for i in b["id"]]


pytestmark_workers = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def run_dataloader(ds, workers, take_n=None, state=None, world=1, rank=0, batch_size=8):
    loader = make(ds, world, rank, batch_size, num_epochs=1)
    dataset = pqloader.torch.IterableDataset(loader)
    dl = pqloader.torch.DataLoader(dataset, num_workers=workers)
    if state is not None:
        dl.load_state_dict(state)
    out = []

    def go():
        for batch in dl:
            out.append({"id": batch["id"].numpy().copy()})
            if take_n is not None and len(out) == take_n:
                break
        return dl.state_dict()

    state_after = run_with_timeout(go, timeout=120)
    return out, state_after


@pytestmark_workers
@pytest.mark.parametrize("workers,cut", [(2, 5), (3, 7), (0, 4)])
def test_dataloader_workers_resume_exactly(ds, workers, cut):
    whole, _ = run_dataloader(ds, workers)
    head, state = run_dataloader(ds, workers, take_n=cut)
    assert dl_ids(head) == dl_ids(whole[:cut])
    if workers:  # "batch" is rank 0's count, as in merge_states' states
        assert state["batch"] == state["rank_batches"][0] and sum(state["rank_batches"]) == cut, state
    state = json.loads(json.dumps(state))
    tail, end_state = run_dataloader(ds, workers, state=state)
    assert [b["id"].tolist() for b in tail] == [b["id"].tolist() for b in whole[cut:]]
    assert end_state["epoch"] == 1 and end_state.get("rank_batches", [0])[0] == 0


@pytestmark_workers
@pytest.mark.parametrize("workers", [2, 3])
def test_dataloader_state_taken_before_the_first_batch_resumes_exactly(ds, workers):
    # Before any batch, a DataLoader's state is its loader's (one rank): loaded, the
    # workers ran the epoch as the rest of a 1-rank epoch dealt anew (another order).
    whole, _ = run_dataloader(ds, workers)
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1)),
                                   num_workers=workers)
    state = json.loads(json.dumps(dl.state_dict()))
    again, _ = run_dataloader(ds, workers, state=state)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in whole]


@pytestmark_workers
@pytest.mark.parametrize("cut", [0, 5])
def test_dataloader_state_resumes_in_a_loader_whose_seed_was_drawn(ds, cut):
    # A loader built with seed=None takes a state's seed: its DataLoader workers (built
    # from the dataset's recipe) must too. Before the first batch they ran their own drawn
    # seed's order (silently); mid-epoch they refused the state.
    def dl_of(seed):
        return pqloader.torch.DataLoader(pqloader.torch.IterableDataset(
            make(ds, 1, 0, num_epochs=1, seed=seed)), num_workers=2)

    first = dl_of(None)
    it = iter(first)
    head = [next(it)["id"].tolist() for _ in range(cut)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = [b["id"].tolist() for b in it]
    again = dl_of(None)
    again.load_state_dict(state)
    assert [b["id"].tolist() for b in run_with_timeout(lambda: list(again), timeout=120)] == rest
    assert head or rest


def _run_packed_dataloader(path, workers, take_n=None, state=None):
    """Batches (tokens) of a DataLoader of `workers` over a shuffled packed loader of
    `path`, resumed from `state`, stopped after `take_n`; and its state then."""
    loader = pqloader.Loader(str(path), batch_size=2, shuffle=True, seed=1,
                             pack=pqloader.Pack("tokens", seq_len=8, eos=0))
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(loader), num_workers=workers)
    if state is not None:
        dl.load_state_dict(state)
    out = []

    def go():
        for batch in dl:
            out.append(batch["tokens"].numpy().copy())
            if take_n is not None and len(out) == take_n:
                break
        return dl.state_dict()

    return out, run_with_timeout(go, timeout=120)


@pytestmark_workers
def test_dataloader_workers_of_a_packed_loader_resume_and_refuse_other_workers(tmp_path):
    # The state of a packed loader's workers (a world of W) was checked against the main
    # loader (one rank): refused as a resize even with the same workers.
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = [[i] * (i % 7 + 1) for i in range(120)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=30)

    def run(workers, take_n=None, state=None):
        return _run_packed_dataloader(tmp_path, workers, take_n, state)

    whole, _ = run(2)
    head, state = run(2, take_n=3)
    state = json.loads(json.dumps(state))
    tail, _ = run(2, state=state)
    np.testing.assert_array_equal(np.concatenate(head + tail), np.concatenate(whole))
    for workers in (0, 3):
        with pytest.raises(pqloader.InvalidDataError, match="pack"):
            run(workers, state=state)
    # Iterated without pqloader's DataLoader (a plain one, or directly), the state is
    # loaded in this process, and refused for its one rank: not dropped (a fresh epoch).
    loader = pqloader.Loader(str(tmp_path), batch_size=2, shuffle=True, seed=1,
                             pack=pqloader.Pack("tokens", seq_len=8, eos=0))
    dataset = pqloader.torch.IterableDataset(loader)
    dataset.load_state_dict(state)
    with pytest.raises(pqloader.InvalidDataError, match="pack"):
        next(iter(dataset))


@pytestmark_workers
def test_dataloader_workers_of_a_packed_loader_resume_a_state_rebuilt_with_numpy_or_a_mapping(tmp_path):
    # Only a plain dict with a Python int world_size was taken as the workers' state: one
    # rebuilt with NumPy ints, or held in another Mapping, went to the main loader (one
    # rank), which refused it as a resize of a packed loader.
    import types

    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = [[i] * (i % 7 + 1) for i in range(60)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=15)

    def run(take_n=None, state=None):
        return _run_packed_dataloader(tmp_path, 2, take_n, state)

    def numpy_ints(value):
        if isinstance(value, dict):
            return {k: numpy_ints(v) for k, v in value.items()}
        if isinstance(value, list):
            return [numpy_ints(v) for v in value]
        return np.int64(value) if isinstance(value, int) and not isinstance(value, bool) else value

    whole, _ = run()
    head, state = run(take_n=3)
    state = json.loads(json.dumps(state))
    assert state["options"]["world_size"] == 2
    for rebuilt in (numpy_ints(state),
                    types.MappingProxyType(dict(state, options=types.MappingProxyType(state["options"])))):
        tail, _ = run(state=rebuilt)
        np.testing.assert_array_equal(np.concatenate(head + tail), np.concatenate(whole))


@pytestmark_workers
def test_dataloader_workers_of_a_packed_loader_refuse_another_split_of_their_world(tmp_path):
    # 1 rank x 4 workers after 5 batches ([2, 1, 1, 1]) resumed as 2 ranks x 2 workers: a
    # packed state cannot be dealt anew, and continuing each worker's stream gave the
    # ranks 59 and 60 batches left (a collective per step waits forever on the other rank).
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = [[i] * (i % 7 + 1) for i in range(400)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=25)

    def dataloader(workers, rank=0, world=1):
        loader = pqloader.Loader(str(tmp_path), batch_size=2, shuffle=True, seed=1, rank=rank,
                                 world_size=world, pack=pqloader.Pack("tokens", seq_len=8, eos=0))
        return pqloader.torch.DataLoader(pqloader.torch.IterableDataset(loader), num_workers=workers)

    def take(dl, n):
        it = iter(dl)
        for _ in range(n):
            next(it)
        return dl.state_dict()

    state = json.loads(json.dumps(run_with_timeout(lambda: take(dataloader(4), 5), timeout=120)))
    assert state["rank_batches"] == [2, 1, 1, 1]
    for rank in range(2):
        dl = dataloader(2, rank=rank, world=2)
        dl.load_state_dict(state)
        with pytest.raises(pqloader.InvalidDataError, match="another split"):
            run_with_timeout(lambda: list(dl), timeout=120)
    # Counts that are each rank's turns ([2, 2, 2, 2]) continue, with equal rests.
    state = json.loads(json.dumps(run_with_timeout(lambda: take(dataloader(4), 8), timeout=120)))
    rests = []
    for rank in range(2):
        dl = dataloader(2, rank=rank, world=2)
        dl.load_state_dict(state)
        rests.append(len(run_with_timeout(lambda: list(dl), timeout=120)))
    assert rests[0] == rests[1] > 0


@pytestmark_workers
@pytest.mark.parametrize("workers,persistent", [(2, False), (3, False), (2, True)])
def test_dataloader_resumed_in_an_epochs_last_batches_yields_only_their_rest(ds, workers, persistent):
    """A worker that had handed out its share of the epoch yields nothing more (it went
    on into its next epoch: a whole epoch again), also when the state is taken right
    after the epoch's last batch, inside the loop; the next epoch is the ordinary one."""
    def dataloader():
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return dataset, pqloader.torch.DataLoader(dataset, num_workers=workers,
                                                  persistent_workers=persistent)

    dataset, dl = dataloader()
    whole = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        whole.append(run_with_timeout(lambda: dl_ids(dl), timeout=120))
    batches = len(whole[0]) // 8
    for cut in (batches - workers + 1, batches - 1, batches):
        dataset, dl = dataloader()
        it = iter(dl)
        head = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(dl.state_dict()))
        del it
        dataset, dl = dataloader()
        dl.load_state_dict(state)
        rest = run_with_timeout(lambda: dl_ids(dl), timeout=120)
        assert dl_ids(head) + rest == whole[0], cut
        dataset.set_epoch(1)
        assert run_with_timeout(lambda: dl_ids(dl), timeout=120) == whole[1], cut


@pytestmark_workers
def test_persistent_workers_start_the_next_epoch_whole_after_a_loop_left_early(ds):
    """A loop broken off, then set_epoch(e + 1): the next loop is epoch e + 1 whole, as
    with workers made anew (persistent ones went on with the old epoch's rest)."""
    def dataloader(persistent):
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return dataset, pqloader.torch.DataLoader(dataset, num_workers=2, persistent_workers=persistent)

    def epochs(persistent):
        dataset, dl = dataloader(persistent)
        dataset.set_epoch(0)

        def broken():
            for i, _ in enumerate(dl):
                if i == 4:
                    break
        run_with_timeout(broken, timeout=120)
        out = []
        for epoch in (1, 2):
            dataset.set_epoch(epoch)
            out.append(run_with_timeout(lambda: dl_ids(dl), timeout=120))
        return out

    assert epochs(True) == epochs(False)
    dataset, dl = dataloader(False)
    dataset.set_epoch(1)
    assert epochs(True)[0] == run_with_timeout(lambda: dl_ids(dl), timeout=120)


def test_persistent_workers_without_set_epoch_rerun_the_epoch_they_had_reached(ds):
    """Persistent workers go on to the next epoch on their own; a loop of that epoch
    broken off reruns it from its start, not the epoch set before the workers went on."""
    dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    dl = pqloader.torch.DataLoader(dataset, num_workers=2, persistent_workers=True)
    run_with_timeout(lambda: dl_ids(dl), timeout=120)  # epoch 0, whole

    def broken():  # epoch 1, by the workers' own count
        for i, _ in enumerate(dl):
            if i == 4:
                break
    run_with_timeout(broken, timeout=120)
    again = run_with_timeout(lambda: dl_ids(dl), timeout=120)
    fresh_ds = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    fresh_ds.set_epoch(1)
    fresh = pqloader.torch.DataLoader(fresh_ds, num_workers=2)
    assert again == run_with_timeout(lambda: dl_ids(fresh), timeout=120)


@pytestmark_workers
@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_set_epoch_of_another_epoch_warns_when_it_drops_a_loaded_state(ds, workers):
    """The wrapper's set_epoch keeps a loaded state of its epoch and drops one of
    another; dropping one inside its epoch (the rest of it not run) warns, as a
    Loader's set_epoch does, once (the wrapped loader's set_epoch, run when iterating
    without workers, does not warn again)."""
    loader = make(ds, 1, 0, num_epochs=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    dl = pqloader.torch.DataLoader(dataset, num_workers=workers)
    dl.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(1\) drops the position load_state_dict "
                      r"restored in the middle of epoch 0") as caught:
        dataset.set_epoch(1)
        got = run_with_timeout(lambda: dl_ids(dl), timeout=120)
    assert sum("drops the position" in str(w.message) for w in caught) == 1
    plain = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    plain.set_epoch(1)
    assert got == run_with_timeout(lambda: dl_ids(pqloader.torch.DataLoader(plain, num_workers=workers)),
                                   timeout=120)


@pytestmark_workers
def test_dataset_set_epoch_of_the_next_epoch_after_a_workers_state_at_its_epochs_end_does_not_warn(ds):
    """A state of DataLoader workers (a world of world_size x W) taken after the epoch's
    last batch, inside the loop: set_epoch(e + 1) drops no rest of e, so it does not warn
    (it said "drops the position ... in the middle of epoch 0"); one taken before the last
    batch still warns."""
    def dataloader():
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return dataset, pqloader.torch.DataLoader(dataset, num_workers=2)

    dataset, dl = dataloader()
    n = len(dl)

    def states():
        out = {}
        for i, _ in enumerate(dl):
            if i + 1 in (n - 1, n):
                out[i + 1] = json.loads(json.dumps(dl.state_dict()))
        return out
    taken = run_with_timeout(states, timeout=120)
    for cut, warns in ((n, False), (n - 1, True)):
        dataset, dl = dataloader()
        dl.load_state_dict(taken[cut])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset.set_epoch(1)
        assert any("drops the position" in str(w.message) for w in caught) == warns, cut


@pytestmark_workers
def test_persistent_workers_run_the_epoch_set_epoch_names(ds):
    """set_epoch(e) names the epoch the next loop runs, also to run an epoch again or to
    skip ahead: persistent workers went on to the next epoch whatever was set (their
    loaders are in their processes), and are started anew for another."""
    dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    dl = pqloader.torch.DataLoader(dataset, num_workers=2, persistent_workers=True)
    runs = []
    for epoch in (0, 0, 1, 3, 4):
        dataset.set_epoch(epoch)
        runs.append(run_with_timeout(lambda: dl_ids(dl), timeout=120))
    plain = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    plain_dl = pqloader.torch.DataLoader(plain, num_workers=2)
    want = {}
    for epoch in (0, 1, 3, 4):
        plain.set_epoch(epoch)
        want[epoch] = run_with_timeout(lambda: dl_ids(plain_dl), timeout=120)
    assert runs == [want[0], want[0], want[1], want[3], want[4]]


@pytestmark_workers
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_dataloader_without_set_epoch_runs_the_epoch_its_state_names(ds, workers, persistent):
    """No set_epoch between loops: the loop after a whole epoch runs the next epoch,
    whatever persistent_workers, and that is the epoch the state taken between them
    resumes. (Workers made anew reran epoch 0, though the state named epoch 1: a resumed
    run read another stream than the uninterrupted one.)"""
    def dataloader():
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return pqloader.torch.DataLoader(dataset, num_workers=workers, persistent_workers=persistent)

    dl = dataloader()
    first = run_with_timeout(lambda: dl_ids(dl), timeout=120)
    state = json.loads(json.dumps(dl.state_dict()))
    second = run_with_timeout(lambda: dl_ids(dl), timeout=120)
    assert state["epoch"] == 1 and second != first
    resumed = dataloader()
    resumed.load_state_dict(state)
    assert run_with_timeout(lambda: dl_ids(resumed), timeout=120) == second
    dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    dataset.set_epoch(1)
    fresh = pqloader.torch.DataLoader(dataset, num_workers=workers)
    assert run_with_timeout(lambda: dl_ids(fresh), timeout=120) == second


@pytestmark_workers
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_loop_that_took_len_batches_is_followed_by_the_next_epoch(ds, workers, persistent):
    """A loop of ``len(dl)`` steps (``next`` that many times, never past the end) has run
    the whole epoch: without set_epoch the next loop runs the next epoch, as after a loop
    that reached the end and as the state taken then resumes. (With workers it ran the
    same epoch again, and again: the resumed run read another stream.)"""
    def dataloader():
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return pqloader.torch.DataLoader(dataset, num_workers=workers, persistent_workers=persistent)

    def steps(dl):
        it = iter(dl)
        return [next(it) for _ in range(len(dl))]

    dl = dataloader()
    first = dl_ids(run_with_timeout(lambda: steps(dl), timeout=120))
    state = json.loads(json.dumps(dl.state_dict()))
    second = dl_ids(run_with_timeout(lambda: steps(dl), timeout=120))
    whole = dataloader()
    assert run_with_timeout(lambda: [dl_ids(whole), dl_ids(whole)], timeout=120) == [first, second]
    resumed = dataloader()
    resumed.load_state_dict(state)
    rest = run_with_timeout(lambda: dl_ids(resumed), timeout=120)  # (workers: the empty rest of epoch 0)
    assert (rest or run_with_timeout(lambda: dl_ids(resumed), timeout=120)) == second


@pytestmark_workers
@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_iterated_again_inside_a_loop_keeps_the_loops_position(ds, persistent):
    """`next(iter(dl))` inside a loop (a batch to log): the loop's state counts the loop's
    batches (the new iteration's position took them: a resume repeated 4 batches), and a
    loop whose persistent workers the new iteration stopped says so (it ended silently,
    as if its epoch had)."""
    def dataloader():
        dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
        return pqloader.torch.DataLoader(dataset, num_workers=2, persistent_workers=persistent)

    whole = run_with_timeout(lambda: dl_ids(dataloader()), timeout=120)
    dl = dataloader()

    def loop():
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        next(iter(dl))
        if persistent:
            with pytest.raises(RuntimeError, match="iterated again while this loop ran"):
                next(it)
            return None, None
        head += [next(it) for _ in range(5)]
        return head, json.loads(json.dumps(dl.state_dict()))

    head, state = run_with_timeout(loop, timeout=120)
    if not persistent:
        assert state["rank_batches"] == [5, 5]
        resumed = dataloader()
        resumed.load_state_dict(state)
        assert dl_ids(head) + run_with_timeout(lambda: dl_ids(resumed), timeout=120) == whole


def test_dataloader_refuses_in_order_false_with_workers(ds):
    # Batches taken as they come, not in turns: the counted position was wrong and a
    # resume repeated some rows and skipped others, silently.
    if "in_order" not in torch.utils.data.DataLoader.__init__.__code__.co_varnames:
        pytest.skip("this torch has no in_order")
    dataset = pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1))
    with pytest.raises(ValueError, match="in_order=False"):
        pqloader.torch.DataLoader(dataset, num_workers=2, in_order=False)
    assert len(dl_ids(pqloader.torch.DataLoader(dataset, num_workers=0, in_order=False))) > 0


def test_dataloader_checkpoints_need_one_epoch_per_iteration(ds):
    # With num_epochs=2 the counted position would name the wrong epoch: refused.
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=2)),
                                   num_workers=2)
    it = iter(dl)
    next(it)
    with pytest.raises(ValueError, match="num_epochs=1"):
        dl.state_dict()
    del it


@pytestmark_workers
@pytest.mark.parametrize("old,new", [(2, 3), (3, 0), (0, 2)])
def test_dataloader_resume_with_another_number_of_workers(ds, old, new):
    head, state = run_dataloader(ds, old, take_n=6)
    tail, _ = run_dataloader(ds, new, state=state)
    got = dl_ids(head) + dl_ids(tail)
    assert len(got) == len(set(got))
    assert N - len(got) < max(old, 1) + max(new, 1)  # what equalising each world drops
    again, _ = run_dataloader(ds, new, state=state)
    assert dl_ids(again) == dl_ids(tail)  # deterministic


@pytestmark_workers
def test_dataloader_resume_on_another_split_of_the_same_worker_world(ds):
    # 2 ranks x 2 workers and 1 rank x 4 workers are both worlds of 4 worker loaders, but
    # the first's counts ([k0, k1] per rank) are not the turns of one 4-worker DataLoader:
    # continuing them, the next state counted the workers wrongly (a batch handed out
    # twice and one never on the following resume).
    head, states = [], []
    for rank in range(2):
        batches, state = run_dataloader(ds, 2, take_n=3, world=2, rank=rank)
        head += dl_ids(batches)
        states.append(json.loads(json.dumps(state)))
    assert states[0]["rank_batches"] == [2, 1, 2, 1]
    middle, state = run_dataloader(ds, 4, take_n=5, state=states[0])
    tail, _ = run_dataloader(ds, 4, state=json.loads(json.dumps(state)))
    got = head + dl_ids(middle) + dl_ids(tail)
    assert len(got) == len(set(got)), "a sample was handed out twice"
    assert N - len(got) < 4 + 4  # what equalising each world drops


@pytestmark_workers
def test_dataloader_ranks_resumed_from_one_ranks_workers_get_equal_rests(ds):
    # 1 rank x 4 workers after 5 batches ([2, 1, 1, 1]) resumed as 2 ranks x 2 workers:
    # continuing each worker's stream gave the ranks 3 and 2 batches consumed, so unequal
    # rests (a collective per step would wait forever on the rank that ran out).
    head, state = run_dataloader(ds, 4, take_n=5)
    assert state["rank_batches"] == [2, 1, 1, 1]
    rest, counts = [], []
    for rank in range(2):
        batches, _ = run_dataloader(ds, 2, state=json.loads(json.dumps(state)), world=2, rank=rank)
        counts.append(len(batches))
        rest += dl_ids(batches)
    assert counts[0] == counts[1], f"ranks got {counts} batches"
    got = dl_ids(head) + rest
    assert len(got) == len(set(got)) and N - len(got) < 4 + 4


@pytestmark_workers
@pytest.mark.parametrize("how", ["loaded", "partly-iterated", "dataset-loaded-plain-dataloader"])
@pytest.mark.parametrize("workers", [1, 2])
def test_dataloader_workers_continue_a_loader_wrapped_mid_epoch(ds, workers, how):
    # The wrapped loader's own position (or a state loaded into the dataset) is where the
    # workers start, as the loader itself continues without workers; they restarted the
    # epoch, repeating the batches handed out before, also under a plain DataLoader.
    import torch.utils.data

    source = make(ds, 1, 0, num_epochs=1)
    head, state = take(source, 5)
    state = json.loads(json.dumps(state))
    loader = make(ds, 1, 0, num_epochs=1)
    if how == "loaded":
        loader.load_state_dict(state)
    elif how == "partly-iterated":
        take(loader, 5)
    dataset = pqloader.torch.IterableDataset(loader)
    if how == "dataset-loaded-plain-dataloader":
        dataset.load_state_dict(state)
        dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    else:
        dl = pqloader.torch.DataLoader(dataset, num_workers=workers)
    tail = run_with_timeout(lambda: [b["id"].numpy().copy() for b in dl], timeout=120)
    got = [int(i) for b in head for i in b] + dl_ids([{"id": b} for b in tail])
    assert len(got) == len(set(got)), "rows handed out before the loader was wrapped came again"
    assert N - len(got) < 1 + workers  # what equalising the workers' world drops
    if workers == 1:  # the same world: exactly the rest of the loader's own stream
        rest = [b["id"].tolist() for b in make(ds, 1, 0, num_epochs=1)][5:]
        assert [b.tolist() for b in tail] == rest


def _run_ranks_script(script, tmp_path, base_port: int):
    """Run a script that starts gloo ranks (torch.multiprocessing), with (out prefix, port);
    a reader of the JSON files it wrote as f"{out}.{name}"."""
    out = tmp_path / "ckpt"
    port = base_port + (hash(str(tmp_path)) % 1000) * 2
    proc = subprocess.run([sys.executable, str(script), str(out), str(port)], capture_output=True,
                          text=True, timeout=300, env=subprocess_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def read(name):
        with open(f"{out}.{name}") as f:
            return json.load(f)
    return read


def test_gather_state_dict_and_distributed_checkpoint(ds, tmp_path):
    """2 gloo ranks save a merged state with torch.distributed.checkpoint; 3 ranks resume."""
    script = tmp_path / "dcp.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import torch.distributed as dist, torch.distributed.checkpoint as dcp
        import torch.multiprocessing as mp
        import pqloader, pqloader.torch

        def loader(rank, world):
            return pqloader.Loader({ds!r}, columns=["id"], batch_size=8, shuffle=True, seed=11,
                                   shuffle_window=2, rank=rank, world_size=world, num_epochs=1)

        def save(rank, world, out):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
            dist.init_process_group("gloo", rank=rank, world_size=world)
            l = loader(rank, world)
            it = iter(l)
            ids = [int(i) for _ in range(3 + rank) for i in next(it)["id"]]  # ranks out of step
            merged = pqloader.torch.gather_state_dict(l)
            assert merged["rank_batches"] == [3, 4], merged
            dcp.save({{"loader": pqloader.torch.Checkpoint(l)}}, checkpoint_id=out)
            with open(f"{{out}}.ids{{rank}}", "w") as f:
                json.dump(ids, f)
            dist.destroy_process_group()

        def load(rank, world, out):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(int(sys.argv[2]) + 1))
            dist.init_process_group("gloo", rank=rank, world_size=world)
            l = loader(rank, world)
            dcp.load({{"loader": pqloader.torch.Checkpoint(l)}}, checkpoint_id=out)
            with open(f"{{out}}.rest{{rank}}", "w") as f:
                json.dump([int(i) for b in l for i in b["id"]], f)
            dist.destroy_process_group()

        if __name__ == "__main__":
            out = sys.argv[1]
            # fork: the ranks do not import torch again (what is checked is the gather and
            # the checkpoint, not how the ranks start)
            mp.start_processes(save, args=(2, out), nprocs=2, start_method="fork")
            mp.start_processes(load, args=(3, out), nprocs=3, start_method="fork")
    """))
    read = _run_ranks_script(script, tmp_path, 29500)

    consumed = sum((read(f"ids{r}") for r in range(2)), [])
    rests = [read(f"rest{r}") for r in range(3)]
    assert len(consumed) == (3 + 4) * 8
    assert len({len(r) for r in rests}) == 1  # equal shares
    got = consumed + sum(rests, [])
    assert len(got) == len(set(got))
    assert N - len(got) < 3


@pytestmark_workers
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_checkpoint_keeps_the_keys_a_state_has_only_sometimes_through_dcp(ds, tmp_path):
    """torch.distributed.checkpoint loads a Stateful in place into its fresh state_dict(),
    so a DataLoader's or Loader's own state lost `rank_batches` (workers out of step) and
    `elastic` (after an elastic resume) without an error: 5 of 300 rows skipped, or a
    consumed batch repeated. pqloader.torch.Checkpoint (one JSON string) keeps them."""
    import torch.distributed.checkpoint as dcp

    whole, _ = run_dataloader(ds, 2)
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1)),
                                   num_workers=2)
    it = iter(dl)
    head = [next(it)["id"].numpy().copy() for _ in range(3)]
    assert "rank_batches" in dl.state_dict()  # its workers are out of step
    dcp.save({"loader": pqloader.torch.Checkpoint(dl)}, checkpoint_id=str(tmp_path / "dl"))
    del it
    fresh = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1)),
                                      num_workers=2)
    dcp.load({"loader": pqloader.torch.Checkpoint(fresh)}, checkpoint_id=str(tmp_path / "dl"))
    rest = run_with_timeout(lambda: [b["id"].numpy().copy() for b in fresh], timeout=120)
    assert dl_ids([{"id": b} for b in head + rest]) == dl_ids(whole)

    # a Loader resumed elastically (2 ranks -> 1), saved mid-epoch, resumed on 1 rank
    old = make(ds, 2, 0, num_epochs=1)
    take(old, 3)
    loader = make(ds, 1, 0, num_epochs=1)
    loader.load_state_dict(old.state_dict())
    _, state = take(loader, 2)
    assert state["elastic"] is not None
    dcp.save({"loader": pqloader.torch.Checkpoint(loader)}, checkpoint_id=str(tmp_path / "elastic"))
    via_json, via_dcp = make(ds, 1, 0, num_epochs=1), make(ds, 1, 0, num_epochs=1)
    via_json.load_state_dict(json.loads(json.dumps(state)))
    dcp.load({"loader": pqloader.torch.Checkpoint(via_dcp)}, checkpoint_id=str(tmp_path / "elastic"))
    assert ids_of(via_dcp) == ids_of(via_json)


@pytestmark_workers
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_loader_given_to_dcp_itself_refuses_a_state_that_lost_keys(ds, tmp_path):
    """Given to DCP directly, a DataLoader's and an elastic Loader's states lost
    `rank_batches` and `elastic` without a word (rows skipped or repeated): now the
    state lists them (`optional_keys`) and the load is refused, naming Checkpoint."""
    import torch.distributed.checkpoint as dcp

    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1)),
                                   num_workers=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    assert dl.state_dict()["optional_keys"] == ["rank_batches"]
    dcp.save({"dl": dl}, checkpoint_id=str(tmp_path / "dl"))
    del it
    fresh = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 1, 0, num_epochs=1)),
                                      num_workers=2)
    with pytest.raises(pqloader.InvalidDataError, match=r"lost 'rank_batches'.*pqloader.torch.Checkpoint"):
        dcp.load({"dl": fresh}, checkpoint_id=str(tmp_path / "dl"))

    old = make(ds, 2, 0, num_epochs=1)
    take(old, 3)
    loader = make(ds, 1, 0, num_epochs=1)
    loader.load_state_dict(old.state_dict())
    take(loader, 2)
    assert loader.state_dict()["optional_keys"] == ["elastic"]
    dcp.save({"loader": loader}, checkpoint_id=str(tmp_path / "elastic"))
    with pytest.raises(pqloader.InvalidDataError, match=r"lost 'elastic'"):
        dcp.load({"loader": make(ds, 1, 0, num_epochs=1)}, checkpoint_id=str(tmp_path / "elastic"))
    # a state without optional keys goes through DCP as it is
    plain = make(ds, 1, 0, num_epochs=1)
    take(plain, 2)
    dcp.save({"loader": plain}, checkpoint_id=str(tmp_path / "plain"))
    again = make(ds, 1, 0, num_epochs=1)
    dcp.load({"loader": again}, checkpoint_id=str(tmp_path / "plain"))
    assert ids_of(again) == ids_of(plain)


def test_a_checkpoint_entry_that_is_not_one_is_refused_naming_it(ds):
    """Checkpoint.load_state_dict raised KeyError 'pqloader_state' or a JSONDecodeError."""
    checkpoint = pqloader.torch.Checkpoint(make(ds, 1, 0, num_epochs=1))
    with pytest.raises(pqloader.InvalidDataError, match="not a pqloader.torch.Checkpoint entry"):
        checkpoint.load_state_dict({"step": 1})
    with pytest.raises(pqloader.InvalidDataError, match="a loader's own state_dict"):
        checkpoint.load_state_dict(make(ds, 1, 0).state_dict())
    with pytest.raises(pqloader.InvalidDataError, match="'pqloader_state' is not JSON"):
        checkpoint.load_state_dict({"pqloader_state": "{"})


@pytest.mark.parametrize("old,new", [(4, 2), (2, 3)])
def test_a_filtered_epoch_resumes_on_another_world_size(ds, old, new):
    """The plan is over the kept rows, so an elastic resume of a filtered loader hands
    out the rest of the filtered epoch once."""
    import pyarrow.compute as pc

    flt = pc.not_equal(pc.bit_wise_and(pc.field("id"), 3), 1)
    per_rank = len(make(ds, old, 0, filter=flt))
    consumed, states = [], []
    for r in range(old):
        batches, state = take(make(ds, old, r, filter=flt), per_rank // 2)
        consumed += [int(i) for b in batches for i in b]
        states.append(state)
    rest, counts = [], []
    for r in range(new):
        loader = make(ds, new, r, filter=flt)
        loader.load_state_dict(states[0])
        batches = rest_of_epoch(loader)
        counts.append(len(batches))
        rest += [int(i) for b in batches for i in b]
    assert len(set(counts)) == 1
    got = consumed + rest
    assert len(got) == len(set(got))
    assert all(i & 3 != 1 for i in got)
    expected = epoch_ids(ds, old, 0, filter=flt)
    assert set(got) <= set(expected) and len(expected) - len(got) < new


@pytestmark_workers
def test_gather_state_dict_of_a_dataloader_without_a_process_group(ds):
    """One process, no torch.distributed group: the DataLoader's own state (merging it as a
    Loader's refused it: its workers are ranks 0..W-1)."""
    loader = make(ds, 1, 0, num_epochs=1)
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(loader), num_workers=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    assert pqloader.torch.gather_state_dict(dl) == dl.state_dict()
    assert json.loads(pqloader.torch.Checkpoint(dl).state_dict()["pqloader_state"]) == dl.state_dict()
    del it


def test_gather_state_dict_of_another_world_than_its_group_is_refused_naming_both(ds, tmp_path):
    """A loader of 2 ranks gathered without a process group, or over a group of another
    size (a data-parallel loader over the whole world, or a world_size=1 loader on every
    process): merge_states refused it as "needs one state per rank 0..1, got ranks [0]",
    naming neither gather_state_dict, the group nor the remedy (group=)."""
    import torch.distributed as dist

    loader = make(ds, 2, 0, num_epochs=1)
    take(loader, 2)
    with pytest.raises(ValueError, match="rank 0 of 2, but no torch.distributed process group"):
        pqloader.torch.gather_state_dict(loader)
    assert pqloader.torch.gather_state_dict(make(ds, 1, 0))["rank_batches"] == [0]  # one rank: as before
    dist.init_process_group("gloo", init_method=(tmp_path / "group").as_uri(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"rank 0 of 2, but the process group it gathers over has "
                                             r"1 processes: pass group="):
            pqloader.torch.gather_state_dict(loader)
        with pytest.raises(ValueError, match="gathers over has 1 processes"):
            pqloader.torch.Checkpoint(loader).state_dict()
        dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(make(ds, 2, 0, num_epochs=1)),
                                       num_workers=0)
        with pytest.raises(ValueError, match="rank 0 of 2, but the process group"):
            pqloader.torch.gather_state_dict(dl)
        one = make(ds, 1, 0, num_epochs=1)
        take(one, 2)
        assert pqloader.torch.gather_state_dict(one)["rank_batches"] == [2]  # the group's world
    finally:
        dist.destroy_process_group()


@pytestmark_workers
def test_gather_state_dict_of_dataloaders_whose_ranks_stopped_at_different_batches(ds, tmp_path):
    """2 gloo ranks x 2 DataLoader workers, out of step (3 and 4 batches): the merged state
    is the same on both ranks and counts each rank's own workers, so the resumed ranks
    hand out no batch twice (rank 0's state alone said rank 1 had taken 3)."""
    script = tmp_path / "dl_gather.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import torch.distributed as dist, torch.multiprocessing as mp
        import pqloader, pqloader.torch

        def dataloader(rank, world):
            l = pqloader.Loader({ds!r}, columns=["id"], batch_size=8, shuffle=True, seed=11,
                                shuffle_window=2, rank=rank, world_size=world, num_epochs=1)
            return pqloader.torch.DataLoader(pqloader.torch.IterableDataset(l), num_workers=2)

        def run(rank, world, out, port, role):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            dist.init_process_group("gloo", rank=rank, world_size=world)
            dl = dataloader(rank, world)
            if role == "save":
                it = iter(dl)
                ids = [int(i) for _ in range(3 + rank) for i in next(it)["id"]]  # out of step
                merged = pqloader.torch.gather_state_dict(dl)
                everyone = [None] * world
                dist.all_gather_object(everyone, merged)
                assert all(m == everyone[0] for m in everyone), everyone
                del it
            else:
                with open(f"{{out}}.state") as f:
                    state = json.load(f)
                dl.load_state_dict(state)
                assert pqloader.torch.gather_state_dict(dl) == state  # loaded, not iterated yet
                ids = [int(i) for b in dl for i in b["id"]]
            if role == "save" and rank == 0:
                with open(f"{{out}}.state", "w") as f:
                    json.dump(merged, f)
            with open(f"{{out}}.{{role}}{{rank}}", "w") as f:
                json.dump(ids, f)
            dist.barrier()
            dist.destroy_process_group()

        if __name__ == "__main__":
            out, port = sys.argv[1], int(sys.argv[2])
            # fork: the ranks do not import torch again (see test_gather_state_dict_and_distributed_checkpoint)
            mp.start_processes(run, args=(2, out, str(port), "save"), nprocs=2, start_method="fork")
            mp.start_processes(run, args=(2, out, str(port + 1), "load"), nprocs=2, start_method="fork")
    """))
    read = _run_ranks_script(script, tmp_path, 31500)

    assert read("state")["rank_batches"] == [2, 1, 2, 2]
    consumed = read("save0") + read("save1")
    rests = [read("load0"), read("load1")]
    assert len(consumed) == (3 + 4) * 8 and len(rests[0]) == len(rests[1])
    got = consumed + sum(rests, [])
    assert len(got) == len(set(got)), "a batch was handed out twice"
    assert N - len(got) < 4 + 4  # what equalising each world drops


def test_a_shuffled_state_of_several_ranks_saved_before_windows_per_rank_is_refused(ds):
    """Each rank now shuffles its windows with its own stream (every rank's window w took
    its rows at the same offsets before): a shuffled state of several ranks saved before
    (version 1) would resume other orders on ranks past 0, and is refused; one of
    one rank, or unshuffled, is the same order and loads."""
    _, state = take(make(ds, 2, 1), 2)
    assert state["version"] == 2
    old = dict(state, version=1)
    with pytest.raises(pqloader.InvalidDataError, match=r"state of 2 ranks .* before 2026-12-06"):
        make(ds, 2, 1).load_state_dict(old)
    with pytest.raises(pqloader.InvalidDataError, match="before 2026-12-06"):
        make(ds, 1, 0).load_state_dict(old)  # elastic: the old ranks' orders changed too
    for world, kw in ((1, {}), (2, {"shuffle": False})):
        loader, again = make(ds, world, 0, **kw), make(ds, world, 0, **kw)
        head, state = take(loader, 2)
        again.load_state_dict(dict(state, version=1))
        assert [b.tolist() for b in take(again, 2)[0]] == [b.tolist() for b in take(loader, 2)[0]]
    # a state resumed elastically from 2 ranks to 1 keeps the old world in its chain
    one = make(ds, 1, 0)
    one.load_state_dict(take(make(ds, 2, 0), 3)[1])
    _, chained = take(one, 1)
    with pytest.raises(pqloader.InvalidDataError, match="state of 2 ranks"):
        make(ds, 1, 0).load_state_dict(dict(chained, version=1))


def test_a_mixture_state_of_shuffled_ranks_saved_before_windows_per_rank_is_refused(ds):
    def mixture(world, rank):
        return pqloader.mix({"a": make(ds, world, rank, num_epochs=1), "b": make(ds, world, rank, num_epochs=1)},
                            [0.5, 0.5], seed=0, batch_size=8)

    m = mixture(2, 0)
    it = iter(m)
    next(it)
    state = m.state_dict()
    assert state["version"] == 2
    old = dict(state, version=1)
    with pytest.raises(pqloader.InvalidDataError, match="before 2026-12-06"):
        mixture(2, 0).load_state_dict(old)
    mixture(2, 0).load_state_dict(state)
    single = mixture(1, 0)
    next(iter(single))
    mixture(1, 0).load_state_dict(dict(single.state_dict(), version=1))


def test_a_state_of_shuffled_ranks_saved_before_windows_per_rank_at_an_epoch_start_loads(ds):
    """A state at an epoch's start (saved after a whole epoch, or before any batch) names
    no consumed row of its epoch, so the new per-rank orders resume it without skipping or
    repeating rows: the most common checkpoint of all was refused ('start epoch 1 over',
    which is what loading it does)."""
    done = make(ds, 2, 1, num_epochs=1)
    assert sum(1 for _ in done) > 0
    for state in (done.state_dict(), make(ds, 2, 1, num_epochs=1).state_dict()):
        assert state["batch"] == 0 and state.get("elastic") is None
        old = dict(state, version=1)
        loaded, fresh = make(ds, 2, 1, num_epochs=1), make(ds, 2, 1, num_epochs=1)
        loaded.load_state_dict(old)
        fresh.set_epoch(state["epoch"])
        assert [b["id"].tolist() for b in loaded] == [b["id"].tolist() for b in fresh]
        one, new = make(ds, 1, 0, num_epochs=1), make(ds, 1, 0, num_epochs=1)  # elastic
        one.load_state_dict(old)
        new.load_state_dict(state)
        assert [b["id"].tolist() for b in one] == [b["id"].tolist() for b in new]
    # one batch into the epoch it is refused, as before
    _, state = take(make(ds, 2, 1, num_epochs=1), 1)
    with pytest.raises(pqloader.InvalidDataError, match="before 2026-12-06"):
        make(ds, 2, 1).load_state_dict(dict(state, version=1))


def test_a_state_of_shuffled_ranks_saved_before_windows_per_rank_after_an_epochs_last_batch_loads(ds):
    """A state taken after the last batch of an epoch, before its iterator stopped
    (batch == the epoch's batches: a loop of len(loader) steps, or num_epochs > 1) has no
    rest of that epoch either: it loads, and the next epoch runs in the new order. It was
    refused, advising to start the whole epoch over."""
    for num_epochs in (1, 2):
        n = len(make(ds, 2, 1, num_epochs=1))
        _, state = take(make(ds, 2, 1, num_epochs=num_epochs), n)
        assert state["epoch"] == 0 and state["batch"] == n
        loaded, resumed = make(ds, 2, 1, num_epochs=num_epochs), make(ds, 2, 1, num_epochs=num_epochs)
        loaded.load_state_dict(dict(state, version=1))
        resumed.load_state_dict(state)
        assert [b["id"].tolist() for b in loaded] == [b["id"].tolist() for b in resumed]
    # one batch before the end it is refused, as before
    _, state = take(make(ds, 2, 1, num_epochs=1), n - 1)
    with pytest.raises(pqloader.InvalidDataError, match="before 2026-12-06"):
        make(ds, 2, 1, num_epochs=1).load_state_dict(dict(state, version=1))


def test_a_mixture_state_of_shuffled_ranks_saved_before_windows_per_rank_at_an_epoch_start_loads(ds):
    """As a Loader's: a mixture state at an epoch's start (batch 0: saved before any batch,
    or after a whole epoch) consumed no row of its epoch and loads; ranks' states of other
    versions are not merged."""
    def mixture(world, rank):
        return pqloader.mix({"a": make(ds, world, rank, num_epochs=1), "b": make(ds, world, rank, num_epochs=1)},
                            [0.5, 0.5], seed=0, batch_size=8)

    done = mixture(2, 1)
    assert sum(1 for _ in done) > 0
    for state in (done.state_dict(), mixture(2, 1).state_dict()):
        assert state["batch"] == 0 and state["version"] == 2
        loaded, fresh = mixture(2, 1), mixture(2, 1)
        loaded.load_state_dict(dict(state, version=1))
        fresh.load_state_dict(state)
        assert [b["id"].tolist() for b in loaded] == [b["id"].tolist() for b in fresh]
    s0, s1 = mixture(2, 0).state_dict(), mixture(2, 1).state_dict()
    with pytest.raises(pqloader.InvalidDataError, match="other state versions"):
        pqloader.merge_states([s0, dict(s1, version=1)])


def test_a_mixture_state_of_shuffled_ranks_saved_before_windows_per_rank_after_an_epochs_last_batch_loads(ds):
    """As a Loader's: a mixture state taken after its epoch's last batch (batch == the
    epoch's batches, each source started over in the next epoch) left no rest of the
    epoch, and loads; it was refused, advising to start the epoch over."""
    def mixture(world, rank, num_epochs=1):
        return pqloader.mix({"a": make(ds, world, rank, num_epochs=num_epochs),
                             "b": make(ds, world, rank, num_epochs=num_epochs)},
                            [0.5, 0.5], seed=0, batch_size=8)

    for num_epochs in (1, 2):
        m = mixture(2, 1, num_epochs)
        n = m.num_batches(0)
        it = iter(m)
        for _ in range(n):
            next(it)
        state = m.state_dict()
        assert (state["epoch"], state["batch"]) == (0, n)
        loaded, resumed = mixture(2, 1, num_epochs), mixture(2, 1, num_epochs)
        loaded.load_state_dict(dict(state, version=1))
        resumed.load_state_dict(state)
        assert [b["id"].tolist() for b in loaded] == [b["id"].tolist() for b in resumed]
    # one batch before the end it is refused, as before
    m = mixture(2, 1)
    it = iter(m)
    for _ in range(n - 1):
        next(it)
    with pytest.raises(pqloader.InvalidDataError, match="before 2026-12-06"):
        mixture(2, 1).load_state_dict(dict(m.state_dict(), version=1))


@pytest.mark.parametrize("old,new", [(3, 1), (2, 3)])
def test_an_epoch_of_no_batch_resumed_on_another_world_is_still_one_epoch_of_a_loop(ds, old, new):
    # batch_size 200 with drop_last: no rank of the old world has a batch in an epoch (333
    # rows). Its state at epoch 0's start, resumed on another world, is that empty epoch
    # still to run (its rest holds no batch), as the old world's next loop would run it;
    # the resumed loader ran epoch 1 in that loop instead (and its state named epoch 2).
    kw = dict(batch_size=200, drop_last=True, num_epochs=1)
    olds = [make(ds, old, r, **kw) for r in range(old)]
    assert all(len(loader) == 0 for loader in olds)
    assert [list(loader) for loader in olds] == [[]] * old  # the old world: one empty loop
    assert all(loader.state_dict()["epoch"] == 1 for loader in olds)
    states = [make(ds, old, r, **kw).state_dict() for r in range(old)]  # at epoch 0's start
    merged = pqloader.merge_states(states)
    for r in range(new):
        loader = make(ds, new, r, batch_size=10, drop_last=True, num_epochs=1)
        loader.load_state_dict(merged)
        assert len(loader) == 0
        assert list(loader) == []  # the rest of epoch 0: no batch
        assert loader.state_dict()["epoch"] == 1
        fresh = make(ds, new, r, batch_size=10, drop_last=True, num_epochs=1)
        fresh.set_epoch(1)
        assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in fresh]  # then epoch 1


@pytestmark_workers
def test_dataloader_workers_state_resumes_with_another_batch_size_in_turns_from_worker_0(ds):
    # Same workers, another batch_size: the rest is dealt anew to the worker loaders
    # (ranks w of W loading the state), which DataLoader takes in turns from worker 0;
    # no old worker's turn carries over (a mutant that took the state's layout as
    # unchanged when only its world matched started at worker 1, and survived).
    head, state = run_dataloader(ds, 2, take_n=5, batch_size=8)
    state = json.loads(json.dumps(state))
    tail, _ = run_dataloader(ds, 2, state=state, batch_size=16)
    shards = []
    for w in range(2):
        shard = make(ds, 2, w, 16, num_epochs=1)
        shard.load_state_dict(state)
        shards.append([b["id"].tolist() for b in shard])
    want = [s[k] for k in range(max(map(len, shards))) for s in shards if k < len(s)]
    assert [b["id"].tolist() for b in tail] == want
    # (the rows 2 workers read: shards of 2 with the default shard_policy="drop")
    assert sorted(dl_ids(head) + dl_ids(tail)) == sorted(dl_ids(run_dataloader(ds, 2)[0]))


def test_worker_states_gathered_in_any_rank_order_merge_each_ranks_own_workers():
    # What gather_state_dict does with every rank's DataLoader (2 workers each) state; the
    # gloo run (test_distributed) gathers them in rank order, all_gather_object need not.
    pytest.importorskip("torch")
    from pqloader._torch_checkpoint import _merge_worker_states

    def state(counts):
        return {"epoch": 0, "iteration_end": 1, "seed": 5, "options": {"world_size": 4},
                "elastic": None, "batch": counts[0], "rank_batches": counts}

    merged = _merge_worker_states([(1, state([0, 0, 7, 8])), (0, state([3, 4, 0, 0]))])
    assert merged["rank_batches"] == [3, 4, 7, 8] and merged["batch"] == 3
    with pytest.raises(pqloader.InvalidDataError, match=r"one DataLoader state per rank 0..1, got ranks \[0, 0\]"):
        _merge_worker_states([(0, state([3, 4, 0, 0])), (0, state([3, 4, 0, 0]))])
    other = dict(state([0, 0, 7, 8]), seed=6)
    with pytest.raises(pqloader.InvalidDataError, match="rank 1's DataLoader state differs"):
        _merge_worker_states([(0, state([3, 4, 0, 0])), (1, other)])


def test_a_resumed_rest_is_not_taken_for_the_whole_epochs_length(tmp_path):
    # len() of a DataLoader with workers counts the rest of a resumed epoch (an elastic
    # base) and whole epochs from worker 0's loader; only whole epochs' counts are kept.
    pytest.importorskip("torch")
    import pqloader.torch

    write_dataset(tmp_path / "d", [[40, 40], [40]])
    ds = pqloader.torch.IterableDataset(pqloader.Loader(str(tmp_path / "d"), batch_size=4, num_epochs=1))
    base = {"world_size": 2, "batch_size": 4, "batches": [3, 2], "base": None}
    rest = ds._workers_batches(2, 0, base)
    full = ds._workers_batches(2, 0)
    assert rest < full == 30
    assert ds._workers_batches(2, 0, base) == rest and ds._workers_batches(2, 0) == full


def test_merge_states_takes_numpy_ranks_and_refuses_a_rank_that_is_no_int(ds):
    # States rebuilt with NumPy (np.int64 rank and world size) merge as the plain ones; a
    # rank that is no int was a bare TypeError of sorted() (None beside ints), a NumPy
    # world size "needs one state per rank 0..?".
    states = [take(make(ds, 2, r), 3)[1] for r in range(2)]
    plain = pqloader.merge_states(copy.deepcopy(states))
    numpy_states = copy.deepcopy(states)
    for s in numpy_states:
        s["options"]["rank"] = np.int64(s["options"]["rank"])
        s["options"]["world_size"] = np.int64(2)
    assert json.dumps(pqloader.merge_states(numpy_states), default=int) == json.dumps(plain)
    broken = copy.deepcopy(states)
    broken[1]["options"]["rank"] = None
    with pytest.raises(pqloader.InvalidDataError, match=r"one state per rank 0\.\.1, got ranks \[0, None\]"):
        pqloader.merge_states(broken)
