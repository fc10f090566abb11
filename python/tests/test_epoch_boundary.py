"""The next epoch is read while one ends, also with one `for` loop per epoch.

Speed is not asserted here (bench/epoch_boundary.py measures the gap on a throttled
link); these tests check that the read-ahead is used when the loop continues with the
next epoch, dropped when it does not, and never changes a batch.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_batch_streams_equal, subprocess_env, write_dataset

LAYOUT = [[40, 40, 40], [40, 40]]


def make(root, **kw):
    kw.setdefault("num_epochs", 1)
    return pqloader.Loader(str(root), batch_size=16, shuffle=True, seed=5, num_workers=2, **kw)


def test_one_for_loop_per_epoch_starts_each_next_epoch_ahead(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    loader = make(tmp_path)
    got = []
    for _ in range(3):
        got += list(loader)
    assert loader.stats()["epochs_started_ahead"] == 2
    assert_batch_streams_equal(got, list(make(tmp_path, num_epochs=3)))


def test_set_epoch_to_the_next_epoch_keeps_the_read_ahead(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    loader = make(tmp_path)
    got = []
    for epoch in range(3):
        loader.set_epoch(epoch)  # as with DistributedSampler
        got += list(loader)
    assert loader.stats()["epochs_started_ahead"] == 2
    assert_batch_streams_equal(got, list(make(tmp_path, num_epochs=3)))


def test_an_unused_read_ahead_is_dropped(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    loader = make(tmp_path)
    list(loader)  # epoch 0; epoch 1 starts ahead
    loader.set_epoch(5)
    got = list(loader)
    assert loader.stats()["epochs_started_ahead"] == 0
    ref = make(tmp_path)
    ref.set_epoch(5)
    assert_batch_streams_equal(got, list(ref))
    # A break mid-epoch stops the workers; the next iteration resumes after the break.
    loader = make(tmp_path)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    it.close()
    assert_batch_streams_equal(head + list(loader), list(make(tmp_path)))


def test_work_started_ahead_counts_only_once_its_epoch_begins(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    loader = make(tmp_path)
    list(loader)  # epoch 0; epoch 1 is read ahead meanwhile
    time.sleep(0.3)  # let the read-ahead produce what it may
    first = loader.stats()
    assert first["units_read"] == 5 and first["bytes_read"] > 0
    list(loader)  # epoch 1, begun ahead
    time.sleep(0.3)
    second = loader.stats()
    assert second["units_read"] == 10 and second["bytes_read"] == 2 * first["bytes_read"]
    assert second["epochs_started_ahead"] == 1
    loader.set_epoch(7)  # the read-ahead of epoch 2 is dropped
    list(loader)
    third = loader.stats()
    assert third["units_read"] == 15 and third["bytes_read"] == 3 * first["bytes_read"]
    assert 0 <= third["units_dropped_ahead"] <= 5



def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_close_joins_the_read_ahead_so_the_cache_dir_can_be_deleted(tmp_path):
    # The next epoch keeps being read after a `for` loop ends: its workers decode,
    # claim and write cache entries. close() (or leaving `with`) ends that: the workers
    # are joined before it returns, so nothing writes into cache_dir afterwards (a
    # smoke check once failed deleting its cache directory while they still ran).
    data, cache = tmp_path / "data", tmp_path / "cache"
    write_dataset(data, LAYOUT)
    with make(data, cache_dir=str(cache)) as loader:  # 2 workers
        first = list(loader)  # epoch 0; epoch 1 is decoded meanwhile
        it = iter(loader)
        head = next(it)  # epoch 1 begins
        running = _threads()
    assert running - _threads() >= 2  # joined when `with` left
    with pytest.raises(RuntimeError, match="closed"):
        next(it)  # the iterator made before close() stopped
    shutil.rmtree(cache)
    # The loader stays usable: iterating again goes on from where it was (without a
    # cache now that its directory is gone, and saying so).
    with pytest.warns(RuntimeWarning, match="continuing without caching"):
        rest = list(loader)
    assert_batch_streams_equal(first + [head] + rest, list(make(data, num_epochs=2)))


CLOSE_PROBE = r"""
import json, os, sys, time, pqloader
def threads():
    return len(os.listdir("/proc/self/task"))
base = threads()
loader = pqloader.Loader(sys.argv[1], batch_size=4096, shuffle=True, seed=1, io_threads=8)
for _ in loader:
    pass
loader.close()
cached = loader.stats()["pool_cached_bytes"]
deadline = time.monotonic() + 30
while threads() > base + 1 and time.monotonic() < deadline:  # idle threads go at once
    time.sleep(0.05)
print(json.dumps({"cached": cached, "base": base, "threads": threads(),
                  "rows_again": sum(len(b["x"]) for b in loader)}))
"""


def test_close_lets_go_of_the_idle_storage_threads_and_the_pools_share(tmp_path):
    # A closed loader kept referenced (for its stats(), or in a list of them) kept its
    # 8 storage threads and 2 x max_inflight_bytes of freed blocks resident (145 MB here).
    import json
    import subprocess
    import sys

    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"x": np.random.default_rng(0).random(4_000_000)}), path,
                   row_group_size=250_000)
    done = subprocess.run([sys.executable, "-c", CLOSE_PROBE, str(path)], capture_output=True,
                          text=True, timeout=120, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    assert r["cached"] <= 32 << 20, r  # the pool's own floor, no loader's share
    assert r["threads"] <= r["base"] + 1, r  # one storage thread stays (Arrow's minimum)
    assert r["rows_again"] == 4_000_000  # and it is still usable


def _write_ids(path, ids):
    # Plain, uncompressed, no statistics: other values of the same count keep every size
    # and offset, so the loader's listed footer still decodes the rewritten file.
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path, row_group_size=300,
                   compression="none", use_dictionary=False, write_statistics=False)


@pytest.mark.parametrize("cache", [None, "disk", ":memory:"])
def test_files_changed_between_loops_after_close_or_in_a_new_loader_read_as_they_are_now(tmp_path, cache):
    # What reliability.md tells to do after changing files under a loader: close() drops
    # the epoch read ahead (whose rows were read before the change), and a new Loader
    # lists the files anew (a loader's cached row groups keep their listed version).
    data = tmp_path / "data"
    data.mkdir()
    _write_ids(data / "p.parquet", np.arange(1000))
    cache_dir = None if cache is None else str(tmp_path / "cache") if cache == "disk" else ":memory:"

    def ids(loader):
        return [int(i) for b in loader for i in b["id"]]

    loader = pqloader.Loader(str(data), batch_size=100, cache_dir=cache_dir)
    assert ids(loader) == list(range(1000))
    loader.close()
    _write_ids(data / "p.parquet", -np.arange(1000))  # same size, another mtime
    if cache is None:
        assert ids(loader) == [-i for i in range(1000)]
    assert ids(pqloader.Loader(str(data), batch_size=100, cache_dir=cache_dir)) == [-i for i in range(1000)]
    loader.close()
    (data / "p.parquet").unlink()
    if cache is None:
        with pytest.raises(FileNotFoundError, match=r"p\.parquet' is gone: make a new Loader"):
            ids(loader)
