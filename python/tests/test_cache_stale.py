"""A full or stale cache speaks (issue 18): refused inserts are counted by reason and
warned about once; entries of changed files are told apart (`cache stats`), deleted by
`cache prune`, and deleted first by a loader whose cache is full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env


def write(path: Path, n: int = 200, rg: int = 25, offset: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(offset, offset + n, dtype=np.int64),
                             "x": np.arange(n * 4, dtype=np.float32).reshape(n, 4).tolist()}),
                   path, row_group_size=rg, compression="NONE", use_dictionary=False)
    return str(path)


def run(source, cache_dir, n=1, **kw) -> tuple[list[dict], dict]:
    kw.setdefault("batch_size", 32)
    loader = pqloader.Loader(source, cache_dir=str(cache_dir), num_epochs=n, **kw)
    return list(loader), loader.stats()


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pqloader", *args], capture_output=True,
                          text=True, env=subprocess_env(), timeout=120)


def entry_bytes(source, tmp_path) -> int:
    probe = tmp_path / "probe"
    run(source, probe)
    return pqloader.cache_stats(probe)["bytes"]


def test_a_full_cache_warns_once_and_counts_the_refused_inserts(tmp_path):
    data = write(tmp_path / "d.parquet")
    limit = entry_bytes(data, tmp_path) // 2
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches, s = run(data, cache, n=3, shuffle=True, seed=1, cache_size_limit=limit,
                         cache_shards=1)
    full = [w for w in caught if "is full" in str(w.message)]
    assert len(full) == 1 and full[0].category is RuntimeWarning
    assert "cache_policy='plan'" in str(full[0].message)
    assert sorted(ids(batches)) == sorted(list(range(200)) * 3)
    assert s["cache_refused_full"] > 0 and s["cache_refused_full"] == s["cache_skipped_full"]
    assert s["cache_refused_too_large"] == 0 and s["cache_refused_stale"] == 0
    assert s["cache_inserts"] + s["cache_refused_full"] == s["cache_misses"]
    stats = pqloader.cache_stats(cache)
    assert stats["refused_full"] == s["cache_refused_full"]
    out = cli("cache", "stats", str(cache))
    assert out.returncode == 0, out.stderr
    assert f"refused_full: {s['cache_refused_full']}" in out.stdout
    assert "stale entries (source changed or gone" in out.stdout


def test_an_entry_larger_than_a_shard_is_refused_as_too_large(tmp_path):
    data = write(tmp_path / "d.parquet", n=50, rg=50)
    size = entry_bytes(data, tmp_path)
    with pytest.warns(RuntimeWarning, match="more than one shard"):
        _, s = run(data, tmp_path / "cache", cache_size_limit=size * 4, cache_shards=8)
    # (>= 1: with num_epochs=1 the next epoch is read ahead too, into the same cache)
    assert s["cache_refused_too_large"] >= 1 and s["cache_inserts"] == 0


def test_stats_and_prune_tell_and_delete_entries_of_changed_and_deleted_files(tmp_path):
    a = write(tmp_path / "ds" / "a.parquet")
    b = write(tmp_path / "ds" / "b.parquet", offset=1000)
    c = write(tmp_path / "ds" / "c.parquet", offset=2000)
    cache = tmp_path / "cache"
    run(str(tmp_path / "ds"), cache)
    before = pqloader.cache_stats(cache)
    assert before["entries"] == 24 and before["stale_entries"] == 0
    # a is rewritten (new content, new mtime), c is deleted, b stays.
    write(Path(a), offset=5000)
    st = os.stat(a)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    os.remove(c)
    stats = pqloader.cache_stats(cache)
    assert stats["stale_entries"] == 16 and stats["unverified_entries"] == 0
    assert stats["stale_bytes"] == pytest.approx(before["bytes"] * 2 / 3, rel=0.01)
    # Limited to another dataset, nothing is known to be stale: all unverified.
    other = write(tmp_path / "other" / "o.parquet")
    scoped = pqloader.cache_stats(cache, dataset=other)
    assert scoped["stale_entries"] == 0 and scoped["unverified_entries"] == 24
    assert pqloader.cache_prune(cache, dataset=other)["entries"] == 0
    out = cli("cache", "prune", str(cache), "--dataset", str(tmp_path / "ds"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["entries"] == 16 and report["kept"] == 8
    assert report["bytes"] == stats["stale_bytes"]
    after = pqloader.cache_stats(cache)
    assert after["entries"] == 8 and after["stale_entries"] == 0
    # b's entries still serve; a's new version is read and cached.
    batches, s = run(str(tmp_path / "ds"), cache)
    assert ids(batches) == list(range(5000, 5200)) + list(range(1000, 1200))
    assert s["cache_hits"] == 8 and s["cache_misses"] == 8
    assert pqloader.cache_prune(cache)["entries"] == 0
    human = cli("cache", "prune", str(cache))
    assert "0 stale entries deleted" in human.stdout, human.stdout


def test_prune_of_a_dataset_keeps_entries_of_files_its_listing_skips(tmp_path):
    # A file in a hidden folder of the dataset, given to a Loader by name: the dataset's
    # listing skips it, so prune --dataset took it for gone and deleted its entries.
    hidden = write(tmp_path / "ds" / ".staging" / "h.parquet")
    write(tmp_path / "ds" / "a.parquet", offset=1000)
    gone = write(tmp_path / "ds" / "g.parquet", offset=2000)
    cache = tmp_path / "cache"
    run(hidden, cache)
    run(str(tmp_path / "ds"), cache)
    os.remove(gone)
    stats = pqloader.cache_stats(cache, dataset=str(tmp_path / "ds"))
    assert stats["entries"] == 24 and stats["stale_entries"] == 8  # g's only
    report = pqloader.cache_prune(cache, dataset=str(tmp_path / "ds"))
    assert report["entries"] == 8 and report["kept"] == 16
    _, s = run(hidden, cache)
    assert s["cache_hits"] == 8


def test_a_file_rewritten_with_the_same_size_and_mtime_is_stale_by_its_footer(tmp_path):
    path = tmp_path / "d.parquet"
    write(path)
    st = path.stat()
    cache = tmp_path / "cache"
    run(str(path), cache)
    write(path, offset=7)  # same layout and size, other values (and footer statistics)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert pqloader.cache_stats(cache)["stale_entries"] == 8
    assert pqloader.cache_prune(cache)["entries"] == 8


def test_a_full_cache_deletes_stale_entries_of_its_own_files_first(tmp_path):
    data = write(tmp_path / "d.parquet")
    size = entry_bytes(data, tmp_path)
    cache = tmp_path / "cache"
    keep = dict(cache_size_limit=size + size // 4, cache_shards=1)  # one version fits
    run(data, cache, **keep)
    write(Path(data), offset=300)
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal: the stale entries made room
        batches, s = run(data, cache, **keep)
    assert ids(batches) == list(range(300, 500))
    assert s["cache_evicted_stale"] == 8 and s["cache_evictions"] == 8
    assert s["cache_inserts"] == 8 and s["cache_refused_full"] == 0
    _, s = run(data, cache, **keep)
    assert s["cache_hits"] == 8
    assert pqloader.cache_stats(cache)["evicted_stale"] == 8


def test_a_file_changed_while_it_is_read_is_not_cached(tmp_path):
    data = write(tmp_path / "d.parquet")
    cache = tmp_path / "cache"
    loader = pqloader.Loader(data, batch_size=25, cache_dir=str(cache), num_workers=1,
                             max_inflight_bytes=1, prefetch_batches=1)
    # Changed after the listing, before its row groups are read (a change while a row
    # group's bytes are read refuses that read: read_unit_test.cc's WaitForBytes test).
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    with pytest.warns(RuntimeWarning, match="changed while the loader read it"):
        got = list(loader)
    assert ids(got) == list(range(200))
    s = loader.stats()
    # every row group refused (9 where the next epoch's first one was read ahead in time)
    assert s["cache_inserts"] == 0 and s["cache_refused_stale"] >= 8


def test_prune_refuses_a_directory_that_is_not_a_cache(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(pqloader.InvalidDataError, match="not a pqloader cache"):
        pqloader.cache_prune(tmp_path)
    assert (tmp_path / "notes.txt").exists()
    out = cli("cache", "prune", str(tmp_path))
    assert out.returncode == 1 and "not a pqloader cache" in out.stderr


@pytest.mark.parametrize("with_dataset", [False, True])
def test_entries_of_a_file_now_a_directory_of_that_name_are_stale(tmp_path, with_dataset):
    # A file replaced by a directory of its name (`x.parquet/part-*.parquet`, as Spark
    # writes one) is gone: its entries were counted unverified, looked up by listing the
    # directory (more than one file, none of them the entry's), and never pruned; with
    # --dataset also, though the file lay below the dataset and is no longer listed.
    data = tmp_path / "d"
    f = write(data / "x.parquet")
    cache_dir = str(tmp_path / "cache")
    for _ in pqloader.Loader(f, batch_size=50, cache_dir=cache_dir):
        pass
    os.unlink(f)
    for k in range(2):
        write(Path(f) / f"part-{k}.parquet")
    kw = {"dataset": str(data)} if with_dataset else {}
    stats = pqloader.cache_stats(cache_dir, **kw)
    assert stats["entries"] == 8
    assert (stats["stale_entries"], stats["unverified_entries"]) == (8, 0)
    report = pqloader.cache_prune(cache_dir, **kw)
    assert report["entries"] == 8 and report["kept"] == 0
