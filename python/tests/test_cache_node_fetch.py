"""One fetch per node (issue 18): processes sharing a cache directory fetch each row group
once. A process claims a row group with an in-progress marker before fetching it; another
one that needs it meanwhile waits for its entry (bounded, cancellable) instead."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env

WORKER = r"""
import hashlib, json, sys, pqloader
source, cache_dir, rank, world, epochs, wait, options = (
    sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
    float(sys.argv[6]), json.loads(sys.argv[7]))
loader = pqloader.Loader(source, batch_size=100, shuffle=True, seed=3, num_epochs=epochs,
                         rank=rank, world_size=world, num_workers=1, cache_dir=cache_dir or None,
                         cache_wait_timeout=wait, storage_options=options or None)
h = hashlib.sha256()
for b in loader:
    h.update(b["id"].tobytes())
    h.update(b["x"].tobytes())
s = loader.stats()
print(json.dumps({"hash": h.hexdigest(), **{k: s[k] for k in (
    "bytes_fetched", "cache_hits", "cache_misses", "cache_waits", "cache_wait_timeouts")}}))
"""


def write(root: Path, files: int = 3, groups: int = 6, seed: int = 0) -> list[Path]:
    """Row groups of uneven sizes, so rank shares split row groups."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for i in range(files):
        sizes = [int(s) for s in rng.integers(150, 260, groups)]
        n = sum(sizes)
        table = pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                          "x": rng.standard_normal((n, 8)).astype(np.float32).tolist()})
        path = root / f"part-{i}.parquet"
        with pq.ParquetWriter(path, table.schema) as w:
            offset = 0
            for s in sizes:
                w.write_table(table.slice(offset, s))
                offset += s
        paths.append(path)
        start += n
    return paths


def row_group_bytes(paths) -> int:
    total = 0
    for p in paths:
        md = pq.ParquetFile(p).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
    return total


def ranks(source: str, cache_dir: str, world: int, epochs: int, wait: float = 30.0,
          options: dict | None = None) -> list[dict]:
    """Run `world` ranks at once, as processes; return their reports in rank order."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, source, cache_dir, str(r), str(world),
                               str(epochs), str(wait), json.dumps(options or {})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=subprocess_env()) for r in range(world)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_ranks_sharing_a_cache_fetch_each_row_group_about_once(tmp_path):
    paths = write(tmp_path / "data")
    source = str(tmp_path / "data")
    world, epochs = 3, 3
    uncached = ranks(source, "", world, epochs)
    shared = ranks(source, str(tmp_path / "cache"), world, epochs)
    # The cache never changes what a rank reads.
    assert [r["hash"] for r in shared] == [r["hash"] for r in uncached]
    total = row_group_bytes(paths)
    fetched = sum(r["bytes_fetched"] for r in shared)
    assert total <= fetched <= 1.1 * total, (fetched, total)
    assert sum(r["bytes_fetched"] for r in uncached) > 2.5 * total
    assert sum(r["cache_hits"] for r in shared) > 0


def test_s3_ranks_sharing_a_cache_fetch_each_row_group_about_once(tmp_path):
    from test_s3 import Moto, aws_env

    paths = write(tmp_path / "data", seed=1)
    server = Moto()
    saved = dict(os.environ)
    try:
        os.environ.update({k: v for k, v in aws_env().items() if k.startswith("AWS_")})
        server.upload("data", "ds", paths, settled=True)  # else no entry is kept
        options = server.options()
        shared = ranks("s3://data/ds", str(tmp_path / "cache"), 3, 2, options=options)
        uncached = ranks("s3://data/ds", "", 3, 2, options=options)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()
    assert [r["hash"] for r in shared] == [r["hash"] for r in uncached]
    total = row_group_bytes(paths)
    fetched = sum(r["bytes_fetched"] for r in shared)
    assert total <= fetched <= 1.1 * total, (fetched, total)


def entry_keys(source: str, tmp_path: Path) -> list[str]:
    """The cache keys of a loader's row groups (as `loader` below makes them)."""
    probe = tmp_path / "probe"
    list(loader(source, probe))
    return sorted(p.name[:-4] for p in probe.glob("shard-*/*.pqc"))


def loader(source, cache_dir, **kw) -> pqloader.Loader:
    return pqloader.Loader(source, batch_size=100, cache_dir=str(cache_dir), cache_shards=1,
                           num_workers=1, **kw)


def claim_all(cache_dir: Path, keys: list[str], pid: int, host: str | None = None) -> None:
    """Write an in-progress marker of process `pid` for every key (docs/cache_format.md)."""
    shard = cache_dir / "shard-00"
    shard.mkdir(parents=True, exist_ok=True)
    for key in keys:
        (shard / f"{key}.fetch").write_text(
            f"pqloader fetch\npid {pid}\nhost {host or socket.gethostname()}\ntoken t{pid}\n")


def test_claims_of_a_dead_process_are_broken_at_once(tmp_path):
    source = str(write(tmp_path / "data", files=1)[0])
    keys = entry_keys(source, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cache = tmp_path / "cache"
    claim_all(cache, keys, dead.pid)
    t0 = time.monotonic()
    ld = loader(source, cache, cache_wait_timeout=60)
    assert len([b for b in ld]) > 0
    assert time.monotonic() - t0 < 30
    s = ld.stats()
    assert s["cache_inserts"] == len(keys) and s["cache_wait_timeouts"] == 0
    assert not list(cache.glob("shard-*/*.fetch"))


def test_a_claim_held_too_long_is_taken_over_after_the_wait_timeout(tmp_path):
    source = str(write(tmp_path / "data", files=1, groups=2)[0])
    keys = entry_keys(source, tmp_path)
    cache = tmp_path / "cache"
    claim_all(cache, keys, os.getpid())  # a live process that never inserts
    t0 = time.monotonic()
    ld = loader(source, cache, cache_wait_timeout=0.5)
    rows = sum(len(b["id"]) for b in ld)
    assert rows == pq.ParquetFile(source).metadata.num_rows
    assert 0.5 <= time.monotonic() - t0 < 30
    s = ld.stats()
    assert s["cache_waits"] >= 1 and s["cache_wait_timeouts"] >= 1
    assert s["cache_inserts"] == len(keys)


def test_a_wait_for_another_process_ends_when_the_loader_stops(tmp_path):
    source = str(write(tmp_path / "data", files=1, groups=2)[0])
    keys = entry_keys(source, tmp_path)
    cache = tmp_path / "cache"
    claim_all(cache, keys, os.getpid())
    ld = loader(source, cache, cache_wait_timeout=600)
    done = threading.Event()
    errors = []

    def consume():
        try:
            for _ in ld:
                pass
        except Exception as e:  # the newer iterator below makes this one stale
            errors.append(e)
        done.set()

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set()  # waiting for the (never finishing) claim holder
    t0 = time.monotonic()
    ld.load_state_dict(ld.state_dict())  # stops the epoch in progress (joins its workers)
    assert time.monotonic() - t0 < 60, "the waiting worker did not notice the stop"  # (600 s)
    assert done.wait(60)
    thread.join()
    assert errors and isinstance(errors[0], RuntimeError)  # that iterator is stale now
    assert list(cache.glob("shard-*/*.fetch"))  # the other process's claims are untouched
    for marker in cache.glob("shard-*/*.fetch"):  # it finishes: the next iterator goes on
        marker.unlink()
    assert sum(len(b["id"]) for b in ld) == pq.ParquetFile(source).metadata.num_rows


def test_stats_and_clear_know_in_progress_markers(tmp_path):
    source = str(write(tmp_path / "data", files=1, groups=2)[0])
    keys = entry_keys(source, tmp_path)
    cache = tmp_path / "cache"
    list(loader(source, cache))
    (cache / "shard-00" / f"{keys[0]}.pqc").unlink()  # being fetched again
    claim_all(cache, keys[:2], 1)  # keys[1]'s entry is published: not in progress
    assert pqloader.cache_stats(cache)["fetch_markers"] == 1
    report = pqloader.cache_clear(cache)
    assert report["foreign_count"] == 0 and not list(cache.glob("shard-*/*.fetch"))


def test_a_loader_never_waits_for_a_paused_loader_of_its_own_process(tmp_path):
    # A paused iterator's read-ahead holds claims of row groups it fetched but has not
    # decoded (its consumer does not drain it). Another loader of the same process on the
    # same cache directory waited for them the whole cache_wait_timeout (8 s here); claims
    # are now shared within a process, so it fetches them too.
    table = pa.table({f"x{i}": np.arange(400_000, dtype=np.float64) for i in range(4)})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=20_000)
    options = dict(batch_size=1000, cache_dir=str(tmp_path / "cache"), cache_wait_timeout=60,
                   max_inflight_bytes=4 << 20)
    paused = pqloader.Loader(str(tmp_path / "p.parquet"), **options)
    it = iter(paused)
    next(it)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "cache").glob("shard-*/*.fetch")):  # its read-ahead's claims
        assert time.monotonic() < deadline
        time.sleep(0.01)
    other = pqloader.Loader(str(tmp_path / "p.parquet"), **options)
    got = np.concatenate([b["x3"] for b in other])
    np.testing.assert_array_equal(got, table["x3"].to_numpy())
    s = other.stats()
    assert s["cache_waits"] == 0 and s["cache_wait_timeouts"] == 0
    assert next(it)["x0"][0] == 1000  # the paused one goes on
    paused.close()


def test_a_marker_dated_in_the_future_is_abandoned_as_an_old_one_is(tmp_path):
    # A marker is abandoned when its process is dead on this host or it is older than
    # cache_wait_timeout. One whose modification time lies in the future (another host's
    # clock ahead on a shared directory, this host's clock set back) was never old: every
    # read of its split waited the whole timeout (every epoch while the cache refused its
    # insert), and the marker was never deleted.
    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(200, dtype=np.int64)}), data, row_group_size=50)
    cache_dir = tmp_path / "cache"
    for _ in pqloader.Loader(str(data), batch_size=50, cache_dir=str(cache_dir)):
        pass
    entries = sorted(cache_dir.glob("shard-*/*.pqc"))
    assert len(entries) == 4
    future = time.time() + 3600
    for e in entries:
        e.unlink()
    for e in entries[:2]:
        marker = e.with_suffix(".fetch")
        marker.write_text("pqloader fetch\npid 999999\nhost another-host\ntoken 1-1-1\n")
        os.utime(marker, (future, future))
    loader = pqloader.Loader(str(data), batch_size=50, cache_dir=str(cache_dir), cache_wait_timeout=2.0)
    ids = [int(i) for b in loader for i in b["id"]]
    assert sorted(ids) == list(range(200))
    s = loader.stats()
    assert s["cache_wait_seconds"] < 1.0, s  # 2 s or more: each split waited the timeout
    assert not list(cache_dir.glob("shard-*/*.fetch"))  # broken, and the splits cached
    assert sorted(cache_dir.glob("shard-*/*.pqc")) == entries


@pytest.mark.parametrize("limit", [20_000, 200_000], ids=["too_large", "full"])
def test_a_process_claims_no_row_group_whose_entry_its_cache_refuses(tmp_path, limit):
    # A claim tells the other processes sharing the cache directory to wait for the entry.
    # A loader whose cache refuses its entries (each larger than the shard's budget, or the
    # shard full under policy 'keep') still claimed every row group it read ahead, held each
    # claim until its consumer reached the row group, then dropped it unwritten: the others
    # waited for nothing, up to cache_wait_timeout (wait_timeouts counted) while it was
    # slow or paused. It now claims none of those; the others read them at once.
    table = pa.table({"id": np.arange(40_000, dtype=np.int64),
                      "x": np.ones((40_000, 8), np.float32).tolist()})
    source = tmp_path / "p.parquet"
    pq.write_table(table, source, row_group_size=1000)
    cache = tmp_path / "cache"
    options = dict(batch_size=100, cache_dir=str(cache), cache_shards=1, cache_size_limit=limit,
                   num_workers=1, prefetch_batches=1, max_inflight_bytes=1 << 20)
    slow = pqloader.Loader(str(source), num_epochs=2, **options)
    it = iter(slow)
    with pytest.warns(RuntimeWarning):
        for _ in range(401):  # its first epoch (which learns that its inserts are refused) and a batch
            next(it)
    # Its first epoch fetched the 40 row groups; its read-ahead goes on into the second (about
    # 25 row groups here, within max_inflight_bytes) while its consumer stays in the first.
    # The threshold is absolute: sampled first, a relative one raced the read-ahead, which on
    # a loaded machine had fetched all it would before the sample (a CI failure).
    deadline = time.monotonic() + 60
    while slow.stats()["bytes_fetched"] < row_group_bytes([source]) * (40 + 10) // 40:
        assert time.monotonic() < deadline, "the paused loader's read-ahead fetched nothing"
        time.sleep(0.01)
    # Its read-ahead has fetched row groups it has not decoded; none is claimed.
    assert not list(cache.glob("shard-*/*.fetch"))
    other = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", r"""
import json, sys, pqloader
ld = pqloader.Loader(sys.argv[1], cache_wait_timeout=5, **json.loads(sys.argv[2]))
n = sum(len(b["id"]) for b in ld)
print(json.dumps({"rows": n, **ld.stats()}))
""", str(source), json.dumps(options)], capture_output=True, text=True, timeout=120,
        env=subprocess_env())
    assert other.returncode == 0, other.stderr
    s = json.loads(other.stdout.strip().splitlines()[-1])
    assert s["rows"] == 40_000
    assert s["cache_waits"] == 0 and s["cache_wait_timeouts"] == 0, s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert 100 * 401 + sum(len(b["id"]) for b in it) == 80_000
    slow.close()


def test_each_claim_the_worker_takes_over_after_the_wait_timeout_counts(tmp_path):
    """Claims a live process's read-ahead holds while its consumer is slow (or paused):
    fresh when this loader's read-ahead meets them (it does not fetch them ahead), older
    than the wait timeout when its worker needs them. Each one the worker takes over
    counts as a wait that timed out: before, only the first (waited on) did; the others,
    found already too old, were taken over (fetched a second time) unrecorded."""
    source = str(write(tmp_path / "data", files=1, groups=4)[0])
    keys = entry_keys(source, tmp_path)
    cache = tmp_path / "cache"
    ld = loader(source, cache, cache_wait_timeout=2, readahead=64)
    claim_all(cache, keys, os.getpid())  # a live process that never inserts
    ids = np.concatenate([b["id"] for b in ld])
    assert np.array_equal(np.sort(ids), np.arange(pq.ParquetFile(source).metadata.num_rows))
    s = ld.stats()
    assert s["cache_inserts"] == len(keys)
    assert s["cache_waits"] == s["cache_wait_timeouts"] == len(keys), s
