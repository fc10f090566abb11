"""stats() counts batches handed out; iterations that would pass the last epoch (2**32 - 1)."""

import itertools
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader

LAST = 2**32 - 1


@pytest.fixture
def data(tmp_path):
    for i in range(2):
        pq.write_table(pa.table({"x": np.arange(i * 100, (i + 1) * 100, dtype=np.int64)}),
                       tmp_path / f"f{i}.parquet", row_group_size=25)
    return str(tmp_path)


def test_batches_and_rows_count_those_handed_out_with_a_batch_transform(data):
    # The transform thread's read-ahead, dropped by a restarted iter(), was counted at
    # the engine and again when read anew (10 batches for 6 handed out).
    loader = pqloader.Loader(data, batch_size=8, num_epochs=2, batch_transform=lambda b: b,
                             prefetch_batches=4)
    for _ in range(2):
        it = iter(loader)
        assert len(list(itertools.islice(it, 3))) == 3
        del it
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (6, 48)
    n = 6 + sum(1 for _ in loader)
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (n, 400) == (50, 400)


def test_batches_and_rows_count_only_those_handed_out_while_a_batch_transform_reads_ahead(data):
    # stats() mid-loop counted the batches the transform thread held ahead of the consumer
    # (3 handed out, 6 to 8 counted): a throughput log every N steps was off by them.
    loader = pqloader.Loader(data, batch_size=8, num_epochs=1, batch_transform=lambda b: b,
                             prefetch_batches=4)
    it = iter(loader)
    assert len(list(itertools.islice(it, 3))) == 3
    deadline = time.monotonic() + 5
    while loader._engine.stats()["batches"] <= 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # (the thread reads ahead of the consumer)
    assert loader._engine.stats()["batches"] > 3
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (3, 24)
    it.close()
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (3, 24)


def test_a_batch_taken_as_set_epoch_stops_the_transform_thread_is_not_counted(data):
    # The thread took a batch from the engine, then found the iterator stale and dropped
    # it before recording it as read ahead: stats() counted it for good (8 batches for 7
    # handed out in about half the runs).
    for _ in range(20):
        loader = pqloader.Loader(data, batch_size=8, num_epochs=3, batch_transform=lambda b: b)
        it = iter(loader)
        assert len(list(itertools.islice(it, 7))) == 7
        loader.set_epoch(2)
        with pytest.raises(RuntimeError, match="older iterator stopped"):
            next(it)
        del it
        s = loader.stats()
        assert (s["batches"], s["rows"]) == (7, 56)
        rest = [len(b["x"]) for b in loader]  # epochs 2, 3 and 4
        s = loader.stats()
        assert (s["batches"], s["rows"]) == (7 + len(rest), 56 + sum(rest)) == (82, 656)


@pytest.mark.parametrize("num_epochs", [None, 2])
def test_running_into_the_last_epoch_ends_there(data, num_epochs):
    loader = pqloader.Loader(data, batch_size=32, num_epochs=num_epochs)
    loader.set_epoch(LAST - 1)
    assert sum(1 for _ in loader) == 2 * len(loader)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (LAST, len(loader))


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_an_iteration_past_the_last_epoch_is_refused_before_its_first_batch(data, transform):
    # It failed after 2 epochs, with the engine's bare "epoch must be below 2^32".
    loader = pqloader.Loader(data, batch_size=32, num_epochs=3, batch_transform=transform)
    loader.set_epoch(LAST - 1)
    it = iter(loader)
    with pytest.raises(pqloader.InvalidDataError, match="would repeat.*num_epochs <= 2"):
        next(it)
    assert loader.state_dict()["epoch"] == LAST - 1


def test_a_mixture_runs_into_the_last_epoch(data):
    def mixture(n):
        return pqloader.mix([pqloader.Loader(data, batch_size=32, seed=s) for s in (1, 2)],
                            [1, 1], num_epochs=n)
    m = mixture(None)  # failed half way through the last epoch (its next one's length)
    m.set_epoch(LAST - 1)
    assert sum(1 for _ in m) == m.num_batches(LAST - 1) + m.num_batches(LAST)
    assert m.state_dict()["epoch"] == LAST
    m = mixture(3)
    m.set_epoch(LAST - 1)
    with pytest.raises(pqloader.InvalidDataError, match="num_epochs <= 2"):
        next(iter(m))


def test_torch_dataset_set_epoch_is_checked(data):
    torch_mod = pytest.importorskip("pqloader.torch")
    ds = torch_mod.IterableDataset(pqloader.Loader(data, batch_size=32))
    for bad, err in ((2**32, ValueError), (-1, ValueError), (2.5, TypeError)):
        with pytest.raises(err, match="epoch"):
            ds.set_epoch(bad)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_childs_counts_do_not_subtract_the_parents_drops(data):
    # The child's engine counts from 0: subtracting the parent's dropped read-ahead gave
    # it negative batches and rows; an iterator of the parent closed in the child too.
    import os
    loader = pqloader.Loader(data, batch_size=8, num_epochs=1, batch_transform=lambda b: b,
                             prefetch_batches=4)
    it = iter(loader)
    list(itertools.islice(it, 3))
    del it
    kept = iter(loader)
    next(kept)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            kept.close()
            s = loader.stats()
            os.write(w, f"{s['batches']} {s['rows']}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert got == "0 0"
    kept.close()
    s = loader.stats()
    assert (s["batches"], s["rows"]) == (4, 32)
