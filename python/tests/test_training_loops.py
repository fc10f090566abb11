"""Training-loop patterns as scripts write them: len() sizing a loop, loops left early."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import run_with_timeout


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Documents of 1..29 tokens: packed on several ranks, the blocks per epoch differ."""
    d = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(0)
    for f in range(3):
        n = 40
        tokens = [list(range(int(rng.integers(1, 30)))) for _ in range(n)]
        pq.write_table(pa.table({"id": np.arange(f * n, f * n + n),
                                 "tok": pa.array(tokens, pa.list_(pa.int32()))}),
                       d / f"p{f}.parquet", row_group_size=7)
    return d


def _packed(docs, rank=0):
    return pqloader.Loader(docs, columns=["tok"], batch_size=2, shuffle=True, seed=3, rank=rank,
                           world_size=2, pack=pqloader.Pack("tok", seq_len=16, eos=0))


def _mixture(docs):
    a = pqloader.Loader(docs, columns=["id"], batch_size=4, shuffle=True, seed=1)
    b = pqloader.Loader(docs, columns=["id"], batch_size=4, shuffle=True, seed=2)
    return pqloader.mix([a, b], [0.5, 0.5], batch_size=4, seed=9, stop="first")


def _counts(make, epochs):
    loader = make()
    return [sum(1 for _ in loader) for _ in range(epochs)]


@pytest.mark.parametrize("kind", ["packed", "mixture"])
def test_len_between_loops_is_the_next_loops_after_a_loop_left_at_its_last_batch(docs, kind):
    """A loop that takes len() batches and stops without reaching the end (a step-limited
    loop) leaves the position at its epoch's end: the next loop runs the next epoch, and
    len() must count that one. It counted the ended epoch, so with epochs of different
    lengths (packed blocks on several ranks, a mixture's draws) the next loop stopped
    before its epoch's end (its rest then ran as the following 'epoch') or ran past len()."""
    make = (lambda: _packed(docs)) if kind == "packed" else (lambda: _mixture(docs))
    want = _counts(make, 6)
    assert len(set(want)) > 1  # epochs of different lengths, else the test shows nothing
    loader = make()
    got = []
    for _ in range(6):
        n = len(loader)
        taken = 0
        for i, _batch in enumerate(loader):
            taken += 1
            assert len(loader) == n  # inside the loop: its own epoch's, up to its last batch
            if i + 1 == n:
                break
        got.append((n, taken))
    assert got == [(w, w) for w in want]


def test_len_after_a_state_taken_after_the_last_batch_outside_the_loop(docs):
    """A state taken after a loop left at its epoch's last batch (no iteration end
    recorded) resumes into the next epoch: len() of the resumed loader counts it."""
    want = _counts(lambda: _packed(docs), 4)
    loader = _packed(docs)
    list(loader)  # epoch 0
    for i, _ in enumerate(loader):  # epoch 1, left at its last batch
        if i + 1 == want[1]:
            break
    state = loader.state_dict()
    resumed = _packed(docs)
    resumed.load_state_dict(state)
    assert len(resumed) == want[2] == sum(1 for _ in resumed)



@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    for f, n in enumerate((37, 50, 23)):
        start = sum((37, 50, 23)[:f])
        pq.write_table(pa.table({"id": np.arange(start, start + n)}), d / f"p{f}.parquet", row_group_size=10)
    return d


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_dataloader_state_after_a_loop_left_at_its_last_batch_resumes_the_next_epoch(rows, workers, persistent):
    """A loop that takes len(dl) batches and stops without reaching the end: the next loop
    runs the next epoch, and so must a resume from the state taken between the loops.
    With workers the state recorded the rest of the epoch with its end: the resumed
    first loop was empty (an epoch of the training loop lost), the next one epoch 1."""

    import pqloader.torch as pt

    def dataloader():
        loader = pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4)
        return pt.DataLoader(pt.IterableDataset(loader), num_workers=workers,
                             persistent_workers=persistent)

    def ids(batches):
        return [int(i) for b in batches for i in b["id"]]

    def go():
        dl = dataloader()
        n = len(dl)
        for i, _ in enumerate(dl):
            if i + 1 == n:
                break
        state = json.loads(json.dumps(dl.state_dict()))
        uninterrupted = ids(list(dl))
        resumed = dataloader()
        resumed.load_state_dict(state)
        assert ids(list(resumed)) == uninterrupted and len(uninterrupted) == 110  # epoch 1, whole
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_state_after_a_loop_left_at_its_last_batch_resumes_with_set_epoch_of_that_epoch(rows, workers):
    """The same state, resumed by the documented loop ``for e in range(saved, n):
    set_epoch(e)`` with the loop's epoch saved beside it: epoch 0's rest is empty and
    epoch 1 follows, with workers as without. With workers the state named epoch 1's
    start, so set_epoch(0) dropped it and ran epoch 0 again whole (110 rows twice)."""

    import pqloader.torch as pt

    def dataloader():
        loader = pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4)
        return pt.DataLoader(pt.IterableDataset(loader), num_workers=workers)

    def ids(batches):
        return [int(i) for b in batches for i in b["id"]]

    def go():
        dl = dataloader()
        dl.dataset.set_epoch(0)
        n = len(dl)
        for i, _ in enumerate(dl):
            if i + 1 == n:  # a step budget met at the epoch's last batch
                break
        state = json.loads(json.dumps(dl.state_dict()))
        dl.dataset.set_epoch(1)
        epoch1 = ids(list(dl))
        resumed = dataloader()
        resumed.load_state_dict(state)
        loops = []
        for e in (0, 1):  # the epoch counter saved beside the state is 0
            resumed.dataset.set_epoch(e)
            loops.append(ids(list(resumed)))
        assert loops == [[], epoch1] and len(epoch1) == 110
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 2, "plain"])
def test_dataset_state_taken_after_set_epoch_names_that_epochs_start(rows, workers):
    """A checkpoint at an epoch's start: set_epoch(e), then state_dict() before its first
    batch. As Loader.set_epoch moves the loader's state, the state names (e, 0), and a
    resume from it runs epoch e as the uninterrupted run does. It named the wrapped
    loader's position (epoch 0), or the last iteration's (epoch 1 after epoch 0): the
    resumed run read another epoch."""

    import torch.utils.data
    import pqloader.torch as pt

    def dataloader():
        dataset = pt.IterableDataset(pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4))
        if workers == "plain":
            return dataset, torch.utils.data.DataLoader(dataset, batch_size=None)
        return dataset, pt.DataLoader(dataset, num_workers=workers)

    def ids(batches):
        return [int(i) for b in batches for i in b["id"]]

    def go():
        for before in (0, 1):  # epochs run before the checkpoint
            dataset, dl = dataloader()
            for _ in range(before):
                list(dl)
            dataset.set_epoch(3)
            state = json.loads(json.dumps(dataset.state_dict()))
            assert (state["epoch"], state["batch"]) == (3, 0)
            uninterrupted = ids(list(dl))
            resumed_ds, resumed = dataloader()
            resumed_ds.load_state_dict(state)
            assert ids(list(resumed)) == uninterrupted
            assert dataset.state_dict()["epoch"] == 4  # after the epoch: as before
    run_with_timeout(go, timeout=300)


def _rows_loader(rows):
    return pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4)


def _ids(batches):
    return [int(i) for b in batches for i in b["id"]]


def _state_at_epoch_1s_end(rows, world=1, merged=False):
    """A state after epoch 1's last batch, taken inside its loop (no iteration end): rank
    0's of `world` ranks in lockstep, or every rank's merged."""
    states = []
    for rank in range(world if merged else 1):
        first = pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4, rank=rank,
                                world_size=world)
        first.set_epoch(1)
        for _ in itertools.islice(first, len(first)):
            pass
        states.append(first.state_dict())
    state = json.loads(json.dumps(pqloader.merge_states(states) if merged else states[0]))
    assert (state["epoch"], state["iteration_end"]) == (1, None)
    return state


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [None, 0, 2])
def test_dataset_resume_loop_from_a_state_at_its_epochs_end_runs_no_epoch_twice(rows, workers):
    """The resume loop ``for e in range(state_epoch, n): ds.set_epoch(e)`` from a state at
    its epoch's end with no iteration end (taken after a loop left at its last batch):
    the first loop is the rest of that epoch (nothing), as for a Loader. It ran the next
    epoch, which the loop's next set_epoch ran again (a whole epoch handed out twice).
    `workers` None: the dataset iterated directly."""
    import pqloader.torch as pt

    loader, ids = (lambda: _rows_loader(rows)), _ids

    def iterable(ds):
        return ds if workers is None else pt.DataLoader(ds, num_workers=workers)

    def go():
        state = _state_at_epoch_1s_end(rows)
        reference = pt.IterableDataset(loader())
        reference.set_epoch(2)
        epoch2 = ids(iterable(reference))
        ds = pt.IterableDataset(loader())
        it = iterable(ds)
        it.load_state_dict(state)
        got = {}
        for e in (1, 2):
            ds.set_epoch(e)
            got[e] = ids(it)
        assert got[1] == [] and got[2] == epoch2 and len(epoch2) == 110, {e: len(v) for e, v in got.items()}
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_resumed_from_a_state_at_its_epochs_end_runs_the_next_epochs_once(rows, workers):
    """A state at its epoch's end with no iteration end (taken after a loop left at its
    last batch), loaded without set_epoch: the loader runs the next epoch, then the one
    after (as a Loader does). With workers the position counted the state's epoch while
    the workers ran the next: the second loop ran that epoch again, and state_dict()
    inside the first loop named a batch of the state's epoch."""
    import pqloader.torch as pt

    loader, ids = (lambda: _rows_loader(rows)), _ids

    def go():
        state = _state_at_epoch_1s_end(rows)
        want = {}
        for e in (2, 3):
            reference = pt.IterableDataset(loader())
            reference.set_epoch(e)
            want[e] = ids(pt.DataLoader(reference, num_workers=workers))
        reference = pt.IterableDataset(loader())
        reference.set_epoch(2)
        ref_dl = pt.DataLoader(reference, num_workers=workers)
        ref_it = iter(ref_dl)
        for _ in range(3):
            next(ref_it)
        ds = pt.IterableDataset(loader())
        dl = pt.DataLoader(ds, num_workers=workers)
        dl.load_state_dict(state)
        it = iter(dl)
        got2 = ids(itertools.islice(it, 3))
        assert dl.state_dict() == ref_dl.state_dict()
        got2 += ids(it)
        got3 = ids(dl)
        assert got2 == want[2] and got3 == want[3]
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("world,merged", [(2, False), (2, True), (3, False)])
def test_dataloader_workers_resumed_from_another_worlds_state_at_its_epochs_end_run_the_next_epochs_once(
        rows, world, merged):
    """As above, from a state of `world` ranks (rank 0's, or all merged) loaded into one
    rank's 2 DataLoader workers: the same world of worker loaders, or another. Only a
    state of the ranks' own world was seen to be at its end: the workers ran epoch 2
    while the position counted epoch 1, so the next loop ran epoch 2 again, and a
    state_dict() inside the first named batches of epoch 1 that its resume refused."""
    import pqloader.torch as pt

    loader, ids = (lambda: _rows_loader(rows)), _ids

    def go():
        state = _state_at_epoch_1s_end(rows, world, merged)
        want = {}
        for e in (2, 3):
            reference = pt.IterableDataset(loader())
            reference.set_epoch(e)
            want[e] = ids(pt.DataLoader(reference, num_workers=2))
        dl = pt.DataLoader(pt.IterableDataset(loader()), num_workers=2)
        dl.load_state_dict(state)
        it = iter(dl)
        got2 = ids(itertools.islice(it, 3))
        inside = json.loads(json.dumps(dl.state_dict()))
        assert (inside["epoch"], inside["rank_batches"]) == (2, [2, 1])
        got2 += ids(it)
        got3 = ids(dl)
        assert got2 == want[2] and got3 == want[3]
        resumed = pt.DataLoader(pt.IterableDataset(loader()), num_workers=2)
        resumed.load_state_dict(inside)
        assert ids(resumed) == want[2][3 * 7:]
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_dataloader_workers_resumed_from_ranks_stopped_at_other_batches_end_with_the_epoch(rows):
    """A merged state of 2 ranks, rank 0 left after epoch 1's last batch and rank 1 one
    batch before it (no iteration end), loaded into one rank's 2 DataLoader workers: the
    first loop is the rest of epoch 1 (rank 1's last batch), the next one epoch 2. Worker
    0 ran epoch 2 in the first loop, counted as epoch 1's, and the next loop ran it again."""
    import pqloader.torch as pt

    def rank(r):
        loader = pqloader.Loader(rows, columns=["id"], batch_size=7, shuffle=True, seed=4, rank=r,
                                 world_size=2)
        loader.set_epoch(1)
        return loader

    def go():
        states = []
        for r, left in enumerate((0, 1)):
            loader = rank(r)
            n = len(loader)
            for _ in itertools.islice(loader, n - left):
                pass
            states.append(loader.state_dict())
            last = _ids(list(rank(r))[n - left:])
        state = json.loads(json.dumps(pqloader.merge_states(states)))
        reference = pt.IterableDataset(_rows_loader(rows))
        reference.set_epoch(2)
        epoch2 = _ids(pt.DataLoader(reference, num_workers=2))
        dl = pt.DataLoader(pt.IterableDataset(_rows_loader(rows)), num_workers=2)
        dl.load_state_dict(state)
        first = _ids(dl)
        assert first == last and len(last) == 6
        assert (dl.state_dict()["epoch"], dl.state_dict()["batch"]) == (2, 0)
        assert _ids(dl) == epoch2
    run_with_timeout(go, timeout=300)


def _copies():
    import copy
    import pickle
    return {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda o: pickle.loads(pickle.dumps(o))}


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_copy_of_the_dataset_checkpoints_where_it_was_made(rows, workers, how):
    """Frameworks copy datasets (deepcopy, pickle; Lightning and Accelerate): a checkpoint
    from a copy made inside a loop, after an epoch's loop or after a break is the position
    then, and a resume from it gives exactly the rest of the uninterrupted run. A copy's
    state_dict() named the rebuilt loader's start (epoch 0, batch 0): such a checkpoint
    resumed at the start of the run, silently."""
    import pqloader.torch as pt

    copy_of = _copies()[how]

    def dataloader():
        dataset = pt.IterableDataset(_rows_loader(rows))
        return dataset, pt.DataLoader(dataset, num_workers=workers)

    def batches(dl):
        return [[int(i) for i in b["id"]] for b in dl]

    def go():
        dataset, dl = dataloader()
        full = []
        for e in range(2):
            dataset.set_epoch(e)
            full.append(batches(dl))
        per_epoch = len(full[0])
        full = full[0] + full[1]

        dataset, dl = dataloader()
        snaps = []  # (copy, its original's state then, batches consumed then)
        dataset.set_epoch(0)
        for i, _ in enumerate(dl):
            if i == 2:  # inside the loop
                snaps.append((copy_of(dataset), json.dumps(dataset.state_dict()), 3))
        snaps.append((copy_of(dataset), json.dumps(dataset.state_dict()), per_epoch))  # after it
        dataset.set_epoch(1)
        for i, _ in enumerate(dl):
            if i == 4:
                break
        snaps.append((copy_of(dataset), json.dumps(dataset.state_dict()), per_epoch + 5))  # after a break
        for snap, then, consumed in snaps:
            state = snap.state_dict()
            assert json.dumps(state) == then, consumed  # (also after the original went on)
            resumed_ds, resumed = dataloader()
            resumed.load_state_dict(json.loads(json.dumps(state)))
            rest = []
            for e in range(state["epoch"], 2):
                resumed_ds.set_epoch(e)
                rest += batches(resumed)
            assert full[:consumed] + rest == full, (consumed, state["epoch"], state["batch"])
    run_with_timeout(go, timeout=300)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_from_state_dict_before_the_resume_is_the_callers_own(rows, workers):
    """state_dict() between load_state_dict() and the next loop returns the loaded state:
    a caller changing what it got (a checkpoint tool rewriting its options) changed what
    the dataset resumes. It shared the options dict: batch_size changed there dealt the
    rest of the epoch anew, as an elastic resume of another batch size."""
    import pqloader.torch as pt

    def dataloader():
        dataset = pt.IterableDataset(_rows_loader(rows))
        return dataset, pt.DataLoader(dataset, num_workers=workers)

    def go():
        _, dl = dataloader()
        it = iter(dl)
        for _ in range(4):
            next(it)
        state = json.loads(json.dumps(dl.state_dict()))
        want = [int(i) for b in it for i in b["id"]]
        dataset, resumed = dataloader()
        resumed.load_state_dict(state)
        mine = dataset.state_dict()
        mine["options"]["batch_size"] = 5
        mine.setdefault("rank_batches", []).append(1)
        assert dataset.state_dict() == state
        assert [int(i) for b in resumed for i in b["id"]] == want
    run_with_timeout(go, timeout=300)
