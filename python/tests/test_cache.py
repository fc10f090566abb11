"""The fanout cache: identical output on hit and miss, correct keys, safety under
concurrency, crashes, corruption, full disks and unwritable directories."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T
from conftest import run_with_timeout


def write(path: Path, n: int = 300, rg: int = 37, offset: int = 0) -> str:
    rng = np.random.default_rng(offset)
    blobs = []
    for i in range(n):
        b = io.BytesIO()
        np.save(b, rng.standard_normal((4, 2)).astype(np.float32) + offset)
        blobs.append(b.getvalue())
    pq.write_table(pa.table({
        "id": np.arange(offset, offset + n, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 3).astype(np.float32)), 3),
        "s": [f"row-{i}" for i in range(offset, offset + n)],
        "arr": blobs,
        "tok": pa.array([list(range(i % 7)) for i in range(n)], pa.list_(pa.int32())),
    }), path, row_group_size=rg)
    return str(path)


TRANSFORMS = {"arr": [T.DecodeNdarray(), T.Cast("float64")], "tok": [T.PadOrTruncate(5, pad=-1)]}


def epochs(path, cache_dir=None, n=3, **kw):
    kw.setdefault("batch_size", 32)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 4)
    kw.setdefault("transforms", TRANSFORMS)
    loader = pqloader.Loader(path, num_epochs=n, cache_dir=cache_dir, **kw)
    return list(loader), loader.stats()


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k]
            else:
                np.testing.assert_array_equal(x[k], y[k])
                assert x[k].dtype == y[k].dtype


@pytest.fixture()
def data(tmp_path):
    return write(tmp_path / "d.parquet")


@pytest.mark.parametrize("cache", ["disk", ":memory:"])
def test_hit_and_miss_give_identical_batches_over_shuffled_epochs(data, tmp_path, cache):
    cache_dir = str(tmp_path / "cache") if cache == "disk" else cache
    plain, _ = epochs(data)
    cached, stats = epochs(data, cache_dir)
    assert_same(plain, cached)
    splits = 9  # ceil(300 / 37)
    assert stats["cache_misses"] == splits and stats["cache_hits"] == 2 * splits
    assert stats["cache_bytes_saved"] > 0
    if cache == "disk":
        # A second run (new process state) is served entirely from disk.
        again, stats2 = epochs(data, cache_dir)
        assert_same(plain, again)
        assert stats2["cache_misses"] == 0 and stats2["cache_hits"] == 3 * splits
        assert stats2["bytes_read"] == 0


@pytest.mark.parametrize("output", ["numpy", "torch"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("tok", ["padded", "ragged"])
def test_writing_into_batches_leaves_the_memory_cache_and_later_epochs_unchanged(data, output,
                                                                                shuffle, tok):
    # Unshuffled batches were slices of the in-memory entry itself: a training loop
    # normalising a batch in place (x -= mean) changed the entry, and every later epoch.
    if output == "torch":
        pytest.importorskip("torch")
    kw = dict(batch_size=32, shuffle=shuffle, seed=4, columns=["id", "x", "tok"])
    if tok == "ragged":
        kw["lists"] = {"tok": "ragged"}
    else:
        kw["transforms"] = {"tok": [T.PadOrTruncate(5, pad=-1)]}
    plain = list(pqloader.Loader(data, num_epochs=3, **kw))
    loader = pqloader.Loader(data, num_epochs=3, cache_dir=":memory:", output=output, **kw)
    got = []
    for batch in loader:
        got.append({k: (v.numpy() if hasattr(v, "numpy") else v).copy() for k, v in batch.items()})
        for v in batch.values():
            v[...] = -7  # in place, as a normalisation would
    assert_same(plain, got)
    assert loader.stats()["cache_hits"] > 0


@pytest.mark.parametrize("shuffle,batch_size,ops", [
    (False, 4, [T.RandomHorizontalFlip(p=0.0)]),
    (False, 2, [T.RandomHorizontalFlip(p=0.5)]),
    (False, 4, [T.RandomHorizontalFlip(p=0.0), T.Cast("uint8")]),
    (True, 1, [T.RandomHorizontalFlip(p=0.0)]),
])
def test_writing_into_batches_of_rows_a_random_op_left_unchanged_leaves_the_memory_cache_alone(
        tmp_path, shuffle, batch_size, ops):
    # A random op that passed a row through (RandomHorizontalFlip not drawn, a Cast to its
    # own dtype after it) handed out the cache entry's own bytes: consecutive rows were
    # taken as samples the transforms had written into one block, and the batch was a
    # slice of the entry; writing into it changed the rows of every later epoch.
    n = 40
    img = np.random.default_rng(0).integers(0, 255, (n, 4, 4, 3), dtype=np.uint8)
    path = tmp_path / "img.parquet"
    pq.write_table(pa.table({"img": pa.FixedShapeTensorArray.from_numpy_ndarray(img),
                             "id": np.arange(n)}), path, row_group_size=20)
    kw = dict(batch_size=batch_size, shuffle=shuffle, seed=3, transforms={"img": ops})
    plain = list(pqloader.Loader(str(path), num_epochs=3, **kw))
    loader = pqloader.Loader(str(path), num_epochs=3, cache_dir=":memory:", **kw)
    got = []
    for batch in loader:
        got.append({k: v.copy() for k, v in batch.items()})
        batch["img"][...] = 7  # in place, as an augmentation would
    assert_same(plain, got)
    assert loader.stats()["cache_hits"] > 0


@pytest.mark.parametrize("world_size", [1, 3])
def test_shuffled_hits_read_straight_from_entry_files_equal_the_uncached_epochs(data, tmp_path,
                                                                                world_size):
    """Fixed-width columns, shuffled: windows are gathered whole, and from epoch 3 on (an
    entry's first hit in a process checks its checksum, reading it whole) each hit's
    columns are read from the entry file straight into the gather. Sharded, a rank's units
    are row ranges of the entries."""
    kw = dict(columns=["id", "x"], transforms=None, batch_size=20)
    cache_dir = str(tmp_path / "cache")
    for rank in range(world_size):
        shard = dict(rank=rank, world_size=world_size) if world_size > 1 else {}
        plain, plain_stats = epochs(data, None, n=5, **kw, **shard)
        cached, stats = epochs(data, cache_dir, n=5, **kw, **shard)
        assert_same(plain, cached)
        # Columns read from an entry file count as decoded bytes, as the decoded ones do.
        assert stats["bytes_decoded"] == plain_stats["bytes_decoded"] > 0
        assert stats["cache_hits"] > 0 and stats["cache_misses"] <= 9  # each row group once
        assert len({tuple(b["id"][:5]) for b in cached}) == len(cached)  # reshuffled


def test_entries_deleted_after_epochs_of_hits_are_fetched_again_unchanged(data, tmp_path):
    """After an epoch of hits, the next epoch reads nothing ahead (its pipeline gets the
    read-ahead's share of max_inflight_bytes); entries deleted meanwhile are fetched when
    needed, and the batches stay those of the uncached loader."""
    kw = dict(columns=["id", "x"], transforms=None, batch_size=20)
    cache_dir = tmp_path / "cache"
    plain, _ = epochs(data, None, n=6, **kw)
    loader = pqloader.Loader(data, num_epochs=3, cache_dir=str(cache_dir), shuffle=True, seed=4, **kw)
    got = list(loader)  # a miss epoch, then two of hits; nothing started after the third
    assert loader.stats()["cache_misses"] == 9
    for entry in cache_dir.rglob("*.pqc"):
        entry.unlink()
    got += list(loader)  # epochs 4-6: every row group fetched again in the first
    assert_same(plain, got)
    assert loader.stats()["cache_misses"] == 18


def test_sharded_ranks_share_whole_split_entries(data, tmp_path):
    cache_dir = str(tmp_path / "cache")
    for rank in range(3):
        plain, _ = epochs(data, None, n=1, rank=rank, world_size=3)
        cached, _ = epochs(data, cache_dir, n=1, rank=rank, world_size=3)
        assert_same(plain, cached)
    assert pqloader.cache_stats(cache_dir)["entries"] == 9


@pytest.mark.parametrize("bad", ["array", "utf8"])
def test_a_bad_row_no_rank_reads_fails_no_rank_with_a_cache_either(tmp_path, bad):
    # Entries hold whole row groups, so a cached loader decoded the rows of its row groups
    # outside its rank's share too: a bad row that shard_policy="drop" leaves out (row 100
    # of 201 on 2 ranks, inside the middle row group) failed both ranks, where without a
    # cache neither reads it.
    n = 201
    arrays = []
    for i in range(n):
        b = io.BytesIO()
        np.save(b, np.full(2, i, np.float32))
        arrays.append(b"not an array" if bad == "array" and i == 100 else b.getvalue())
    text = pa.array([b"\xff" if bad == "utf8" and i == 100 else b"row %d" % i for i in range(n)])
    text = pa.Array.from_buffers(pa.string(), n, text.buffers())  # (unchecked UTF-8)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(n), "arr": arrays, "s": text}), path,
                   row_group_size=67)
    cache_dir = str(tmp_path / "cache")
    for rank in (0, 1):
        kw = dict(n=1, shuffle=False, rank=rank, world_size=2,
                  transforms={"arr": [T.DecodeNdarray()]})
        plain, _ = epochs(str(path), None, **kw)
        assert sum(len(b["id"]) for b in plain) == 100
        for _ in range(2):
            cached, _ = epochs(str(path), cache_dir, **kw)
            assert_same(plain, cached)
    # The middle row group is not cached (decoded whole, it fails): the first and last are.
    assert pqloader.cache_stats(cache_dir)["entries"] == 2


def test_changed_columns_or_transforms_never_return_old_entries(data, tmp_path):
    cache_dir = str(tmp_path / "cache")
    epochs(data, cache_dir, n=1)
    _, s = epochs(data, cache_dir, n=1, columns=["id", "arr", "tok"])
    assert s["cache_hits"] == 0
    other = {"arr": [T.DecodeNdarray()], "tok": [T.PadOrTruncate(5, pad=-1)]}
    batches, s = epochs(data, cache_dir, n=1, transforms=other)
    assert s["cache_hits"] == 0
    assert batches[0]["arr"].dtype == np.float32


def test_settings_that_differ_past_six_digits_never_share_entries(tmp_path):
    # The key wrote a float fill with std::to_string (6 decimals: 0 and 1e-7 alike) and
    # ops' parameters through a stream (6 digits: Normalize's mean 10 and 10.00001 alike):
    # the second loader got the first one's rows.
    npy = io.BytesIO()
    np.save(npy, np.arange(6, dtype=np.float32).reshape(2, 3))
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0, None]), "img": [npy.getvalue()] * 4}),
                   tmp_path / "p.parquet")
    cache_dir = str(tmp_path / "cache")

    def load(**kw):
        loader = pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=4, cache_dir=cache_dir, **kw)
        return next(iter(loader)), loader.stats()

    assert load(columns=["x"], fill_null={"x": 0.0})[0]["x"].tolist() == [1.0, 0.0, 3.0, 0.0]
    got, s = load(columns=["x"], fill_null={"x": 1e-7})
    assert got["x"].tolist() == [1.0, 1e-7, 3.0, 1e-7] and s["cache_hits"] == 0

    def normalized(mean):
        ops = [T.DecodeNdarray(), T.Normalize([mean], [1.0])]
        return load(columns=["img"], transforms={"img": ops})

    normalized(10.0)
    got, s = normalized(10.00001)
    assert s["cache_hits"] == 0
    np.testing.assert_allclose(got["img"][0].ravel(), np.arange(6) - 10.00001, rtol=1e-6)


def test_changing_only_random_ops_reuses_entries_and_changes_the_output(data, tmp_path):
    # Random ops run after the cache point: loaders whose ops differ only in their random
    # suffix share the entries of the deterministic prefix, yet yield different batches.
    cache_dir = str(tmp_path / "cache")
    plain, s = epochs(data, cache_dir, n=1)
    assert s["cache_misses"] == 9 and s["cache_hits"] == 0

    def with_flip(p):
        return {"arr": [*TRANSFORMS["arr"], T.RandomHorizontalFlip(p=p)], "tok": TRANSFORMS["tok"]}

    flipped, s = epochs(data, cache_dir, n=1, transforms=with_flip(1.0))
    assert s["cache_misses"] == 0 and s["cache_hits"] == 9
    assert len(flipped) == len(plain)
    for a, b in zip(plain, flipped):
        np.testing.assert_array_equal(a["id"], b["id"])
        np.testing.assert_array_equal(b["arr"], a["arr"][:, :, ::-1])  # every (4, 2) sample mirrored
        np.testing.assert_array_equal(a["tok"], b["tok"])
    assert not np.array_equal(plain[0]["arr"], flipped[0]["arr"])

    some, s = epochs(data, cache_dir, n=1, transforms=with_flip(0.5))
    assert s["cache_misses"] == 0 and s["cache_hits"] == 9
    assert len(some) == len(plain)
    mirrored = np.concatenate([[np.array_equal(x, y[:, ::-1]) for x, y in zip(b["arr"], a["arr"])]
                               for a, b in zip(plain, some)])
    kept = np.concatenate([[np.array_equal(x, y) for x, y in zip(b["arr"], a["arr"])]
                           for a, b in zip(plain, some)])
    assert np.all(mirrored | kept) and mirrored.any() and kept.any()


def test_rewritten_source_file_never_returns_old_entries(tmp_path):
    path = tmp_path / "d.parquet"
    write(path, offset=0)
    cache_dir = str(tmp_path / "cache")
    epochs(str(path), cache_dir, n=1)
    write(path, offset=1000)  # same path, new content
    fresh, _ = epochs(str(path), None, n=1)
    cached, s = epochs(str(path), cache_dir, n=1)
    assert s["cache_hits"] == 0
    assert_same(fresh, cached)
    assert cached[0]["id"].min() >= 1000


@pytest.mark.parametrize("shuffle", [False, True])
def test_entries_of_an_unverified_read_never_serve_a_loader_that_verifies_checksums(tmp_path,
                                                                                    shuffle):
    # A page whose bytes no longer match its CRC decodes to other values (uncompressed,
    # plain): verify_checksums=True refuses it, False loads it as it is. The entry a
    # loader without verification made of it was served to one with verification, which
    # then yielded the damaged value instead of the error it gives uncached.
    path = tmp_path / "crc.parquet"
    values = np.arange(1000, dtype=np.int64) + 0x1111111111
    pq.write_table(pa.table({"x": values}), path, compression="none", use_dictionary=False,
                   write_page_checksum=True, write_statistics=False)
    data = bytearray(path.read_bytes())
    at = data.find(int(values[500]).to_bytes(8, "little"))
    assert at > 0
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))

    def load(**kw):
        loader = pqloader.Loader(str(path), batch_size=250, shuffle=shuffle, seed=1, **kw)
        return np.sort(np.concatenate([b["x"] for b in loader]))

    with pytest.raises(pqloader.InvalidDataError, match="crc.parquet.*CRC"):
        load(verify_checksums=True)
    cache_dir = str(tmp_path / "cache")
    damaged = values.copy()
    damaged[500] ^= 0xFF
    damaged.sort()
    # Not verified: the altered value, now cached.
    np.testing.assert_array_equal(load(cache_dir=cache_dir), damaged)
    np.testing.assert_array_equal(load(cache_dir=cache_dir), damaged)  # a hit, as uncached
    with pytest.raises(pqloader.InvalidDataError, match="crc.parquet.*CRC"):
        load(cache_dir=cache_dir, verify_checksums=True)


def test_corrupt_entries_are_detected_dropped_and_refetched(data, tmp_path):
    cache_dir = tmp_path / "cache"
    plain, _ = epochs(data, None, n=1)
    epochs(data, str(cache_dir), n=1)
    entries = sorted(cache_dir.glob("shard-*/*.pqc"))
    assert len(entries) == 9
    # Flip a byte in the middle of one, truncate another, empty a third.
    raw = bytearray(entries[0].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    entries[0].write_bytes(bytes(raw))
    entries[1].write_bytes(entries[1].read_bytes()[:-100])
    entries[2].write_bytes(b"")
    cached, s = epochs(data, str(cache_dir), n=1)
    assert_same(plain, cached)
    assert s["cache_corrupt"] == 3 and s["cache_misses"] == 3
    _, s = epochs(data, str(cache_dir), n=1)
    assert s["cache_corrupt"] == 0 and s["cache_hits"] == 9  # rewritten


def test_entries_copied_over_each_other_while_a_loader_is_paused_are_not_served(tmp_path):
    # A window gather reads a hit's columns from its entry file after the hit (a verified
    # file: its checksum is not checked again). Entries of other keys copied over the
    # files in place meanwhile (`cp` keeps the inode) were served as these entries' rows.
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"i": np.arange(400), "x": np.arange(400) * 2.0}), path,
                   row_group_size=20)
    cache_dir = tmp_path / "cache"
    # A budget that leaves most windows' gathers for when the consumer takes their batches.
    kw = dict(shuffle=True, seed=3, shuffle_window=2, batch_size=10, num_workers=2,
              max_inflight_bytes=3000)
    plain = pqloader.Loader(str(path), **kw)
    expected = list(plain) + list(plain)
    plain.close()
    filling = pqloader.Loader(str(path), cache_dir=str(cache_dir), **kw)
    list(filling)
    filling.close()
    loader = pqloader.Loader(str(path), cache_dir=str(cache_dir), **kw)
    got = list(loader)  # verifies every entry (its cache remembers their versions)
    it = iter(loader)
    got.append(next(it))
    # The next units' hits, read ahead as far as the budget lets them: waited for until
    # the count rests for 0.2 s (at most 10 s; not a condition of the test).
    deadline, hits, still = time.monotonic() + 10, -1, 0
    while still < 20 and time.monotonic() < deadline:
        now = loader.stats()["cache_hits"]
        still = still + 1 if now == hits else 0
        hits = now
        time.sleep(0.01)
    entries = sorted(cache_dir.glob("shard-*/*.pqc"))
    assert len(entries) == 20 and len({e.stat().st_size for e in entries}) == 1
    contents = [e.read_bytes() for e in entries]
    for e, other in zip(entries, contents[1:] + contents[:1]):
        with open(e, "r+b") as f:
            f.write(other)
    got += list(it)
    loader.close()
    assert_same(expected, got)  # the rows of the files changed under the hits: from the source


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_fifo_or_a_link_named_like_an_entry_is_not_opened_as_one(data, tmp_path, shuffle):
    # Entries were opened with a blocking open(2) following links: a FIFO in place of an
    # entry (or a link to one) hung the loader for good.
    cache_dir = tmp_path / "cache"
    plain, _ = epochs(data, None, n=1, shuffle=shuffle)
    epochs(data, str(cache_dir), n=1, shuffle=shuffle)
    entries = sorted(cache_dir.glob("shard-*/*.pqc"))
    entries[0].unlink()
    os.mkfifo(entries[0])
    os.mkfifo(tmp_path / "fifo")
    entries[1].unlink()
    entries[1].symlink_to(tmp_path / "fifo")
    cached, s = run_with_timeout(lambda: epochs(data, str(cache_dir), n=1, shuffle=shuffle), 60)
    assert_same(plain, cached)
    assert s["cache_misses"] == 2 and s["cache_hits"] == 7


FIFO_RUN = textwrap.dedent("""
    import sys, pqloader
    data, cache_dir = sys.argv[1], sys.argv[2]
    loader = pqloader.Loader(data, batch_size=32, cache_dir=cache_dir, filter="id >= 100",
                             columns=["id", "s"])
    print(sum(len(b["id"]) for b in loader))
    loader.close()
""")


@pytest.mark.parametrize("name", ["PQLOADER_CACHE", "records", "shard-*/.usage", "filters/*.sel"])
def test_a_fifo_in_place_of_a_cache_file_that_is_not_an_entry_is_not_opened(data, tmp_path, name):
    # Entries are opened non-blocking and not through links (test above), but the marker,
    # `records`, the shards' `.usage` and the filters' selections were read with a
    # blocking std::ifstream: a FIFO in place of one hung the loader (and `pqloader cache
    # stats` / `clear` at the marker or `records`) for good. Read as missing, it is not.
    cache_dir = tmp_path / "cache"
    run = [sys.executable, "-c", FIFO_RUN, data, str(cache_dir)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    for f in sorted(cache_dir.glob(name)):
        f.unlink()
        os.mkfifo(f)
    if name == "shard-*/.usage":  # inserts read .usage: make every split an insert again
        for e in cache_dir.glob("shard-*/*.pqc"):
            e.unlink()
    assert list(cache_dir.glob(name))
    try:
        again = subprocess.run(run, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a FIFO at {name} in the cache directory hung the loader")
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    for command in ("stats", "clear"):
        try:
            subprocess.run([sys.executable, "-m", "pqloader", "cache", command, str(cache_dir)],
                           capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a FIFO at {name} in the cache directory hung `pqloader cache {command}`")


# (VmHWM, the peak of this process image: a child's ru_maxrss starts at its parent's RSS
# at the fork, the pytest process's hundreds of MB late in a run.)
HUGE_ENTRY_RUN = textwrap.dedent("""
    import resource, sys, pqloader
    loader = pqloader.Loader(sys.argv[1], batch_size=32, cache_dir=sys.argv[2], columns=["id", "s"])
    rows = sum(len(b["id"]) for b in loader)
    s = loader.stats()
    print(rows, s["cache_corrupt"], s["cache_hits"],
          [int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])
""")


def test_an_entry_file_grown_far_past_its_size_is_refused_without_reading_it(data, tmp_path):
    # An entry was read whole into memory before its frame (end magic, stored size) was
    # looked at: a file named like an entry and grown to 1 GB (a sparse tail, a damaged
    # inode, someone's file) took 1 GB of memory and seconds to be found corrupt; larger
    # ones could not be allocated, or killed the process. Its trailer tells at once.
    cache_dir = tmp_path / "cache"
    run = [sys.executable, "-c", HUGE_ENTRY_RUN, data, str(cache_dir)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    entry = sorted(cache_dir.glob("shard-*/*.pqc"))[0]
    os.truncate(entry, 1 << 30)  # sparse: no disk space taken
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    rows, corrupt, hits, rss_mb = map(int, again.stdout.split())
    assert (rows, corrupt, hits) == (300, 1, 8), again.stdout
    assert rss_mb < 512, f"{rss_mb} MB peak: the 1 GB file was read"
    assert not entry.exists() or entry.stat().st_size < 1 << 20  # dropped (and refetched)


SELECTION_RUN = textwrap.dedent("""
    import resource, sys, pqloader
    loader = pqloader.Loader(sys.argv[1], batch_size=32, cache_dir=sys.argv[2], columns=["id"],
                             filter="id >= 100")
    print(sum(len(b["id"]) for b in loader), [int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])
""")


def test_a_selection_file_grown_far_past_its_size_is_not_read_whole(data, tmp_path):
    # A filter's stored selection (filters/<key>.sel) was read whole, whatever its size,
    # and copied twice more: 1.3 GB of memory for a 600 MB file. Now at most the size a
    # selection of this dataset can have: a larger one is evaluated again and replaced.
    cache_dir = tmp_path / "cache"
    run = [sys.executable, "-c", SELECTION_RUN, data, str(cache_dir)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    rows = int(first.stdout.split()[0])
    (sel,) = cache_dir.glob("filters/*.sel")
    os.truncate(sel, 1 << 30)  # sparse: no disk space taken
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    got, rss_mb = map(int, again.stdout.split())
    assert got == rows
    assert rss_mb < 512, f"{rss_mb} MB peak: the 1 GB selection file was read"
    assert sel.stat().st_size < 1 << 20  # replaced


def test_entries_of_one_row_group_are_the_same_bytes_whoever_writes_them(tmp_path):
    # A shuffling loader with lists stores its small fixed-size columns row-major, each
    # row padded to 8 bytes (int64 + float32: 12 bytes of a 16-byte row). The padding was
    # never written: the allocator's leftovers (other data of the process) went to disk,
    # and two caches of the same data differed byte for byte.
    data = tmp_path / "d.parquet"
    n = 2000
    pq.write_table(pa.table({
        "id": np.arange(n, dtype=np.int64),
        "x": np.arange(n, dtype=np.float32),
        "tok": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
    }), data, row_group_size=500)
    caches = []
    for i in range(3):
        noise = [np.full(1 << 16, 0xA5 + i, np.uint8) for _ in range(8)]  # dirty the heap
        del noise
        cache_dir = tmp_path / f"cache{i}"
        loader = pqloader.Loader(str(data), batch_size=64, shuffle=True, seed=i,
                                 lists={"tok": "ragged"}, cache_dir=str(cache_dir))
        for _ in loader:
            pass
        loader.close()
        caches.append({p.name: p.read_bytes() for p in cache_dir.glob("shard-*/*.pqc")})
    assert len(caches[0]) == 4
    assert caches[0] == caches[1] == caches[2]


def test_keep_policy_stops_inserting_and_lru_evicts_within_the_limit(data, tmp_path):
    probe = tmp_path / "probe"
    epochs(data, str(probe), n=1)
    total = pqloader.cache_stats(str(probe))["bytes"]
    limit = total // 2
    plain, _ = epochs(data, None)
    for policy in ("keep", "lru"):
        cache_dir = tmp_path / policy
        # keep warns once that the cache is full (rows it refuses are read again each epoch).
        with pytest.warns(RuntimeWarning, match="is full") if policy == "keep" else contextlib.nullcontext():
            cached, s = epochs(data, str(cache_dir), cache_size_limit=limit, cache_policy=policy, cache_shards=1)
        assert_same(plain, cached)
        stats = pqloader.cache_stats(str(cache_dir))
        assert 0 < stats["bytes"] <= limit
        if policy == "keep":
            assert s["cache_skipped_full"] > 0 and s["cache_evictions"] == 0
        else:
            assert s["cache_evictions"] > 0


def test_cache_stats_and_clear_cli(data, tmp_path):
    cache_dir = tmp_path / "cache"
    epochs(data, str(cache_dir), n=2)
    out = subprocess.run([sys.executable, "-m", "pqloader", "cache", "stats", str(cache_dir)],
                         capture_output=True, text=True, check=True).stdout
    assert "entries: 9" in out and "hits: 9" in out and "misses: 9" in out
    subprocess.run([sys.executable, "-m", "pqloader", "cache", "clear", str(cache_dir)], check=True)
    assert pqloader.cache_stats(str(cache_dir))["entries"] == 0
    assert Path(data).exists()  # the cache never touches the source


def test_unwritable_cache_dir_warns_and_loads_uncached(data):
    plain, _ = epochs(data, None, n=1)
    with pytest.warns(RuntimeWarning, match="cache"):
        cached, s = epochs(data, "/proc/pqloader-cache-cannot-exist", n=1)
    assert_same(plain, cached)
    assert s["cache_write_errors"] > 0


def test_full_disk_warns_and_loads_uncached(data, tmp_path):
    """A cache on a 64 KiB tmpfs (or, where mounting is not allowed, a file size limit)."""
    plain, _ = epochs(data, None, n=2)
    mount = tmp_path / "tiny"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
    try:
        if mounted:
            with pytest.warns(RuntimeWarning, match="cache"):
                cached, s = epochs(data, str(mount / "cache"), n=2)
            assert_same(plain, cached)
            assert s["cache_write_errors"] > 0
        else:
            code = textwrap.dedent(f"""
                import resource, signal, warnings, pqloader, numpy as np
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    loader = pqloader.Loader({data!r}, batch_size=32, cache_dir={str(mount)!r}, num_epochs=2)
                    n = sum(len(b["id"]) for b in loader)
                assert n == 600, n
                assert loader.stats()["cache_write_errors"] > 0
                assert any("cache" in str(x.message) for x in w)
                print("ok")
            """)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert out.stdout.strip() == "ok", out.stderr
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)])


READER = textwrap.dedent("""
    import hashlib, sys, pqloader
    from pqloader import transforms as T
    path, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loader = pqloader.Loader(path, columns=["id", "x", "s", "arr"], batch_size=32, shuffle=True, seed=4,
                             num_epochs=3, cache_dir=cache,
                             cache_size_limit=limit or None, cache_shards=2,
                             transforms={"arr": [T.DecodeNdarray(), T.Cast("float64")]})
    h = hashlib.sha256()
    for b in loader:
        for k in sorted(b):
            v = b[k]
            h.update(v.tobytes() if hasattr(v, "tobytes") else "|".join(v).encode())
    s = loader.stats()
    print(h.hexdigest(), s["cache_corrupt"], s["cache_hits"], s["cache_wait_timeouts"])
""")


def test_two_processes_fill_and_read_one_cache_at_once(data, tmp_path):
    cache_dir = str(tmp_path / "cache")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    probe = tmp_path / "probe"
    ref = subprocess.run([sys.executable, str(script), data, str(probe), "0"], capture_output=True,
                         text=True, check=True).stdout.split()
    limit = pqloader.cache_stats(str(probe))["bytes"] * 2 // 3
    procs = [subprocess.Popen([sys.executable, str(script), data, cache_dir, str(limit)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        digest, corrupt, _hits, _timeouts = out.split()
        assert digest == ref[0] and corrupt == "0"
    stats = pqloader.cache_stats(cache_dir)
    assert 0 < stats["bytes"] <= limit


WRITER = textwrap.dedent("""
    import sys, pqloader
    from pqloader import transforms as T
    path, cache = sys.argv[1], sys.argv[2]
    while True:  # keep inserting (the same entries the reader reads) until killed
        pqloader.cache_clear(cache)
        for b in pqloader.Loader(path, columns=["id", "x", "s", "arr"], batch_size=64, cache_dir=cache,
                                 cache_shards=2, transforms={"arr": [T.DecodeNdarray(), T.Cast("float64")]}):
            pass
""")


def test_writer_killed_mid_write_never_leaves_a_readable_partial_entry(data, tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    reader = tmp_path / "reader.py"
    reader.write_text(READER)
    ref = subprocess.run([sys.executable, str(reader), data, str(tmp_path / "ref"), "0"],
                         capture_output=True, text=True, check=True).stdout.split()[0]
    rng = np.random.default_rng(0)
    found_entries = 0
    for _ in range(8):
        p = subprocess.Popen([sys.executable, str(script), data, str(cache_dir)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3 + rng.uniform(0, 0.7))
        p.send_signal(signal.SIGKILL)
        p.wait()
        found_entries += pqloader.cache_stats(str(cache_dir))["entries"]
        out = subprocess.run([sys.executable, str(reader), data, str(cache_dir), "0"],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == ref
        assert out[1] == "0"  # nothing half-written was ever visible as an entry
        # nor as a claim: a marker naming no process held readers for the wait timeout
        assert out[3] == "0"
    assert found_entries > 0  # the killed writers did publish entries the readers used


def test_local_footers_are_read_from_the_file_not_the_cache_dir(tmp_path):
    """Reading a local footer costs what reading a cached copy would, and is never stale;
    footers of remote files are kept across runs (test_s3.py)."""
    paths = [write(tmp_path / f"f{i}.parquet", n=50, rg=20, offset=100 * i) for i in range(3)]
    cache_dir = str(tmp_path / "cache")
    first = pqloader.Loader(paths, batch_size=16, cache_dir=cache_dir, columns=["id"])
    second = pqloader.Loader(paths, batch_size=16, cache_dir=cache_dir, columns=["id"])
    assert first.stats()["footers_from_cache"] == second.stats()["footers_from_cache"] == 0
    assert [b["id"].tolist() for b in first] == [b["id"].tolist() for b in second]
    assert not (tmp_path / "cache" / "footers").exists()
    write(tmp_path / "f1.parquet", n=70, rg=20, offset=500)
    third = pqloader.Loader(paths, batch_size=16, cache_dir=cache_dir, columns=["id"])
    assert third.num_rows == 170


def test_a_cache_dir_inside_the_dataset_is_not_listed_as_data(tmp_path):
    # Its entries and claim markers come and go as loaders work: listed, each was opened
    # for Parquet's magic bytes (and one that vanished meanwhile failed the Loader).
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.table({"x": np.arange(100)}), d / "p.parquet", row_group_size=10)
    first = pqloader.Loader(str(d), batch_size=50, cache_dir=str(d / "cache"))
    ref = [b["x"].tolist() for b in first]
    assert any((d / "cache").rglob("*.pqc"))
    again = pqloader.Loader(str(d), batch_size=50, cache_dir=str(d / "cache"))
    assert again.skipped_files == [] and [b["x"].tolist() for b in again] == ref
    assert again.stats()["cache_hits"] == 10
    assert pqloader.inspect(str(d))["num_files"] == 1


def test_cache_counters_not_written_are_kept_for_the_next_write(tmp_path):
    # A failed write of the records (a full disk) dropped its counts for good: the
    # loader now keeps them until a write succeeds.
    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "p.parquet", row_group_size=10)
    cache = tmp_path / "cache"
    loader = pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=50, cache_dir=str(cache))
    list(loader)  # fills the cache
    (cache / "records.new" / "x").mkdir(parents=True)  # the records cannot be written meanwhile
    list(loader)  # hits; the epoch switch tried to write the first epoch's counts
    shutil.rmtree(cache / "records.new")
    loader.close()
    records = dict(line.split() for line in (cache / "records").read_text().splitlines())
    s = loader.stats()
    assert int(records["misses"]) == s["cache_misses"] == 10
    assert int(records["inserts"]) == 10 and int(records["hits"]) >= s["cache_hits"] == 10


def test_damaged_counts_in_the_records_saturate_rather_than_overflow(tmp_path):
    # A damaged records file (a count at the int64 maximum, a negative one) overflowed
    # the sum (undefined behaviour) and `cache stats` told negative hits.
    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "p.parquet", row_group_size=10)
    cache = tmp_path / "cache"
    list(pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=50, cache_dir=str(cache)))
    (cache / "records").write_text(f"hits {2**63 - 1}\nmisses -5\n")
    loader = pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=50, cache_dir=str(cache))
    list(loader)
    loader.close()
    records = dict(line.split() for line in (cache / "records").read_text().splitlines())
    assert int(records["hits"]) == 2**63 - 1 and int(records["misses"]) == 0


def test_claims_released_without_the_shard_lock_leave_no_marker_to_wait_on(tmp_path):
    # A shard's .lock this process cannot open (another user's node cache; here a
    # directory in its place): its claim markers were released only under that lock, so
    # they stayed, and its next epoch waited the whole cache_wait_timeout on its own
    # markers (a live pid never counts as abandoned).
    pq.write_table(pa.table({"x": np.arange(2000)}), tmp_path / "p.parquet", row_group_size=200)
    cache = tmp_path / "cache"
    list(pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=100, cache_dir=str(cache)))
    for entry in cache.glob("shard-*/*.pqc"):
        entry.unlink()
    for lock in cache.glob("shard-*/.lock"):
        lock.unlink()
        lock.mkdir()
    loader = pqloader.Loader(str(tmp_path / "p.parquet"), batch_size=100, cache_dir=str(cache),
                             cache_wait_timeout=5, num_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sum(len(b["x"]) for b in loader) == 4000
    assert not list(cache.glob("shard-*/*.fetch"))
    assert loader.stats()["cache_wait_timeouts"] == 0


def test_entries_of_a_shuffled_loader_serve_an_unshuffled_one(tmp_path):
    # A shuffled loader keeps its entries row by row; an unshuffled one sharing the cache
    # got such a hit and its own (column by column) miss in one batch: "units of one batch
    # have different layouts", depending on what the cache held.
    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"id": np.arange(20, dtype=np.int64), "k": np.arange(20, dtype=np.int32),
                             "s": [str(i) for i in range(20)]}), path, row_group_size=10)
    cache = str(tmp_path / "cache")
    list(pqloader.Loader(path, batch_size=4, shuffle=True, seed=1, cache_dir=cache,
                         row_groups={path: [0]}))  # only row group 0 gets an entry
    loader = pqloader.Loader(path, batch_size=4, cache_dir=cache)
    got, want = list(loader), list(pqloader.Loader(path, batch_size=4))
    assert len(got) == len(want) == 5
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x["id"], y["id"])
        np.testing.assert_array_equal(x["k"], y["k"])
        assert list(x["s"]) == list(y["s"])
    assert loader.stats()["cache_hits"] == 1


def test_one_file_below_two_roots_keeps_each_roots_partition_values(tmp_path):
    # d/k=1/k=2/f.parquet: k is 1 below root d (the first value), 2 below root d/k=1 (as
    # pyarrow reads them). The key named the file, not the values its path gives, and the
    # second root was served the first's k=1.
    leaf = tmp_path / "d" / "k=1" / "k=2"
    leaf.mkdir(parents=True)
    pq.write_table(pa.table({"id": np.arange(4)}), leaf / "f.parquet")
    cache = str(tmp_path / "cache")
    for root, k in ((tmp_path / "d", 1), (tmp_path / "d" / "k=1", 2)):
        (batch,) = list(pqloader.Loader(str(root), columns=["id", "k"], batch_size=10, cache_dir=cache))
        assert batch["k"].tolist() == [k] * 4


def test_cache_stats_count_the_hits_of_epochs_that_ran_not_of_a_dropped_read_ahead(tmp_path):
    # One epoch over a fresh cache: the next epoch, read ahead from the entries just
    # written and never begun, was recorded as hits (as many as the epoch's misses).
    pq.write_table(pa.table({"id": np.arange(1800)}), tmp_path / "d.parquet", row_group_size=100)
    cache = str(tmp_path / "cache")
    loader = pqloader.Loader(str(tmp_path / "d.parquet"), batch_size=100, cache_dir=cache)
    list(loader)
    deadline = time.monotonic() + 30
    while loader.stats()["cache_inserts"] < 18:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)  # the next epoch reads ahead meanwhile (hits of the entries)
    s = loader.stats()
    loader.close()
    r = pqloader.cache_stats(cache)
    assert (s["cache_hits"], s["cache_misses"]) == (0, 18)
    assert (r["hits"], r["misses"], r["inserts"]) == (0, 18, 18)
    # A filter's selection loaded from the cache read nothing of the filter's columns.
    first = pqloader.Loader(str(tmp_path / "d.parquet"), filter="id < 950", cache_dir=cache)
    second = pqloader.Loader(str(tmp_path / "d.parquet"), filter="id < 950", cache_dir=cache)
    assert first.stats()["filter_mask_bytes_read"] > 0
    assert second.stats()["filter_from_store"] and second.stats()["filter_mask_bytes_read"] == 0
