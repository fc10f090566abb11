"""Housekeeping of a cache directory shared by loaders and processes over time: one shard
count per directory, claim markers and temp files of killed processes, and a directory
left unmarked by a process killed before it marked it (docs/cache_format.md)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env

MARKER = "PQLOADER_CACHE"
OLD_MARKER = ("pqloader cache\nformat 3\nThis directory is a pqloader cache "
              "(docs/cache_format.md); `pqloader cache clear DIR` deletes its entries.\n")


def source(path: Path, n: int = 2000, rg: int = 100, offset: int = 0) -> str:
    pq.write_table(pa.table({"x": np.arange(offset, offset + n)}), path, row_group_size=rg)
    return str(path)


def load(src: str, cache: Path, shards: int = 8, **kw) -> tuple[list[int], dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = pqloader.Loader(src, batch_size=100, cache_dir=str(cache), num_workers=1,
                                 cache_shards=shards, **kw)
        rows = [int(v) for b in loader for v in b["x"]]
    return rows, loader.stats(), [str(w.message) for w in caught]


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("shard-*/*.pqc"))


def aged(path: Path, minutes: float = 11) -> None:
    then = time.time() - minutes * 60
    os.utime(path, (then, then))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_loader_with_another_cache_shards_uses_the_directorys_count_and_warns(tmp_path):
    src = source(tmp_path / "d.parquet")  # 20 row groups
    cache = tmp_path / "cache"
    rows, s, _ = load(src, cache, shards=8)
    assert s["cache_inserts"] == 20
    assert "shards 8" in (cache / MARKER).read_text().splitlines()
    # Before, a loader with cache_shards=3 looked for every entry in other shard
    # directories: 20 misses, each entry stored twice (the disk past cache_size_limit).
    again, s, warned = load(src, cache, shards=3)
    assert again == rows
    assert (s["cache_hits"], s["cache_misses"], s["cache_inserts"]) == (20, 0, 0)
    assert len(entries(cache)) == 20
    assert any("cache_shards=3" in w and "8" in w for w in warned), warned
    assert not (cache / "shard-08").exists()


def test_a_marker_without_a_shard_count_gets_the_count_its_shards_show(tmp_path):
    src = source(tmp_path / "d.parquet")
    cache = tmp_path / "cache"
    rows, s, _ = load(src, cache, shards=4)
    (cache / MARKER).write_text(OLD_MARKER)  # a cache made before the count was recorded
    again, s, warned = load(src, cache, shards=8)  # the default count
    assert again == rows and (s["cache_hits"], s["cache_inserts"]) == (20, 0)
    assert "shards 4" in (cache / MARKER).read_text().splitlines()
    assert sorted(p.name for p in cache.glob("shard-*")) == [f"shard-0{i}" for i in range(4)]


def test_a_dead_processs_claim_of_a_published_entry_is_not_reported_and_is_swept(tmp_path):
    src = source(tmp_path / "d.parquet", n=200)  # two row groups
    cache = tmp_path / "cache"
    load(src, cache, shards=1)
    shard = cache / "shard-00"
    (entry, _) = entries(cache)
    # A process killed after publishing its entry, before deleting its claim marker.
    marker = shard / (entry.stem + ".fetch")
    marker.write_text(f"pqloader fetch\npid {dead_pid()}\nhost {socket.gethostname()}\n"
                      f"token 1-1-1\n")
    assert pqloader.cache_stats(str(cache))["fetch_markers"] == 0
    # The next insert into the shard deletes it.
    load(source(tmp_path / "e.parquet", n=100, offset=5000), cache, shards=1)
    assert not marker.exists()
    assert pqloader.cache_stats(str(cache))["fetch_markers"] == 0


def test_temp_files_of_killed_writers_go_in_a_cache_that_never_fills(tmp_path):
    src = source(tmp_path / "d.parquet", n=100)
    cache = tmp_path / "cache"
    load(src, cache, shards=1)
    shard = cache / "shard-00"
    old = shard / (".tmp-999999-1-" + "ab" * 16)
    old.write_bytes(b"x" * 4096)
    aged(old)
    fresh = shard / (".tmp-999999-2-" + "cd" * 16)  # maybe being written now: kept
    fresh.write_bytes(b"x")
    old_mark = cache / (MARKER + ".tmp-999999-1")
    old_mark.write_text("pqloader cache\n")
    aged(old_mark)
    fresh_mark = cache / (MARKER + ".tmp-999999-2")
    fresh_mark.write_text("pqloader cache\n")
    # No size limit: no insert ever recounts the shard.
    load(source(tmp_path / "e.parquet", n=100, offset=5000), cache, shards=1)
    assert not old.exists() and fresh.exists()
    assert not old_mark.exists() and fresh_mark.exists()


def test_a_directory_left_unmarked_with_only_cache_files_is_a_cache_for_stats_clear_prune(
        tmp_path):
    # A process killed after making filters/ or footers/ (their locks, a selection) and
    # before marking the directory: stats, clear and prune refused it as no cache.
    cache = tmp_path / "cache"
    (cache / "filters").mkdir(parents=True)
    (cache / "filters" / ".lock").write_bytes(b"")
    (cache / "filters" / ("ab" * 16 + ".sel")).write_bytes(b"PQSEL002")
    (cache / "footers").mkdir()
    (cache / "footers" / ".lock").write_bytes(b"")
    assert pqloader.cache_stats(str(cache))["selections"] == 1
    assert pqloader.cache_prune(str(cache))["entries"] == 0
    cleared = pqloader.cache_clear(str(cache))
    assert cleared["foreign_count"] == 0 and cleared["other_files"] >= 1
    assert not (cache / "filters" / ("ab" * 16 + ".sel")).exists()


def test_a_filtered_loader_marks_the_directory_before_it_stores_its_selection(tmp_path):
    src = source(tmp_path / "d.parquet", n=1000)
    cache = tmp_path / "cache"
    # Killed at its second rename or link: the selection's rename, which came before the
    # marker's (left unmarked, with the marker's temp file); now after the marker's link.
    script = ("import sys, pqloader\n"
              "l = pqloader.Loader(sys.argv[1], batch_size=100, cache_dir=sys.argv[2],"
              " num_workers=1, filter='x >= 150')\n"
              "print(sum(len(b['x']) for b in l))\n")
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename,renameat,renameat2,link,linkat",
           "-e", "inject=rename,renameat,renameat2,link,linkat:signal=KILL:when=2",
           sys.executable, "-c", script, src, str(cache)]
    killed = subprocess.run(cmd, capture_output=True, timeout=120, env=subprocess_env())
    assert killed.returncode in (-9, 137), killed.stderr
    assert pqloader.cache_stats(str(cache))["entries"] == 0
    assert pqloader.cache_clear(str(cache))["foreign_count"] == 0
