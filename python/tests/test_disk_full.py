"""Disks that fill up or turn read-only under pqloader's own files: the footers of an S3
dataset kept in cache_dir, the index `write_index` writes beside a dataset, the cache
commands' errors and the command line's output.

Each test mounts a small tmpfs (root only: skipped where mounting is not allowed) and
unmounts it whatever happens. A tmpfs counts whole 4 KiB pages, so "room for N bytes"
below is room for their pages."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env
from test_s3 import Moto, _aws_env  # noqa: F401 (_aws_env: autouse)

PAGE = 4096


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(mount: Path, leave: int = 0) -> None:
    """Fill `mount` up to `leave` bytes of room (whole pages), with a file of zeros."""
    with open(mount / f"filler-{uuid.uuid4().hex}", "wb") as f:
        chunk = b"\0" * (1 << 20)
        while free_bytes(mount) > leave:
            want = min(len(chunk), free_bytes(mount) - leave)
            try:
                f.write(chunk[:want])
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
    assert free_bytes(mount) == leave


def small_files(root: Path, count: int = 3) -> list[Path]:
    """Files of one int64 column: footers of a few hundred bytes (a footer under the
    1 KiB a C++ stream writes through at once stays in its buffer until closed)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        p = root / f"t{i}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}), p,
                       store_schema=False)
        paths.append(p)
    return paths


def test_footers_of_an_s3_dataset_are_not_kept_empty_on_a_full_disk(tmp_path):
    """The footer of a remote file is kept in cache_dir/footers/ by a temp file and a
    rename. A small footer's bytes stayed in the stream's buffer, and the check came
    before the close that wrote them: on a full disk an empty <key>.thrift was published
    (never used: its checksum fails; but left as foreign by `cache clear`)."""
    paths = small_files(tmp_path / "data")
    server = Moto()
    try:
        server.upload("data", "ds", paths, settled=True)  # footers of settled objects are kept
        with tmpfs(tmp_path / "disk", "512k") as mount:
            cache = mount / "cache"
            pqloader.Loader(str(tmp_path / "data"), cache_dir=str(cache))  # makes and marks it
            (cache / "footers").mkdir()
            fill(mount)
            with pytest.warns(RuntimeWarning, match="No space left on device"):
                loader = pqloader.Loader("s3://data/ds/", storage_options=server.options(),
                                         cache_dir=str(cache), batch_size=8)
                ids = sorted(int(i) for b in loader for i in b["id"])
            assert ids == list(range(30))
            kept = {p.name: p.stat().st_size for p in (cache / "footers").iterdir() if p.name != ".lock"}
            assert kept == {}, kept  # neither an empty footer nor a temp file
    finally:
        server.stop()


def blob_files(root: Path, files: int = 3) -> None:
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        pq.write_table(pa.table({"id": np.arange(f * 64, (f + 1) * 64, dtype=np.int64),
                                 "b": pa.FixedSizeListArray.from_arrays(
                                     pa.array(rng.integers(0, 255, 64 * 256, dtype=np.uint8)), 256)}),
                       root / f"part-{f}.parquet", row_group_size=8, compression="NONE")


def test_write_index_with_room_for_the_summary_only_leaves_neither_file(tmp_path):
    """`write_index` writes _metadata, then _pqloader_index. With room for the first
    only, it raised ENOSPC naming _pqloader_index but left the new _metadata in place,
    and loaders took every file's layout from it without the index's check of each
    file's size, time and footer hash. Both are written before either is moved now."""
    probe = tmp_path / "probe"
    blob_files(probe)
    summary_bytes = pqloader.write_index(str(probe))["bytes"]
    with tmpfs(tmp_path / "disk", "2m") as mount:
        data = mount / "data"
        blob_files(data)
        fill(mount, leave=-(-summary_bytes // PAGE) * PAGE)  # room for _metadata's pages only
        with pytest.raises(pqloader.IOError, match="_pqloader_index.*No space left") as e:
            pqloader.write_index(str(data))
        assert e.value.errno == errno.ENOSPC
        assert sorted(p.name for p in data.iterdir()) == [f"part-{f}.parquet" for f in range(3)]
        loader = pqloader.Loader(str(data), batch_size=64)
        assert loader.stats()["footers_from_summary"] == 0
        assert sorted(int(i) for b in loader for i in b["id"]) == list(range(192))


def test_cache_commands_on_a_read_only_cache_raise_with_the_os_error_number(tmp_path):
    """On a cache remounted read-only, `cache prune` (with a stale entry to delete) and
    `cache clear` fail naming the path and the problem; their IOError carries errno as
    every storage error does (docs/reliability.md), where it was None."""
    data = tmp_path / "data"
    blob_files(data)
    with tmpfs(tmp_path / "disk", "2m") as mount:
        cache = mount / "cache"
        list(pqloader.Loader(str(data), batch_size=64, cache_dir=str(cache)))
        os.utime(data / "part-0.parquet", ns=(1, 1))  # its entries are stale now
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        try:
            for call in (pqloader.cache_prune, pqloader.cache_clear):
                with pytest.raises(pqloader.IOError, match=str(cache).replace("/", ".") + ".*Read-only") as e:
                    call(str(cache))
                assert e.value.errno == errno.EROFS, (call.__name__, e.value)
            assert pqloader.cache_stats(str(cache))["stale_entries"] == 8  # stats reads on
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)


def test_a_command_whose_output_fills_the_disk_names_the_output(tmp_path):
    """`pqloader bench --json DATA > out.json` on a full disk: exit status 1 and an error
    that says the output could not be written, where it said only "[Errno 28] No space
    left on device"."""
    data = tmp_path / "data"
    blob_files(data, files=1)
    with tmpfs(tmp_path / "disk", "64k") as mount:
        fill(mount)
        for unbuffered in ("1", ""):  # the failure comes at the print, or at the last flush
            env = {**subprocess_env(), "PYTHONUNBUFFERED": unbuffered}
            if not unbuffered:
                del env["PYTHONUNBUFFERED"]
            with open(mount / "out.json", "w") as out:
                done = subprocess.run([sys.executable, "-m", "pqloader", "bench", "--json", str(data)],
                                      stdout=out, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
            assert done.returncode == 1
            assert done.stderr.strip().endswith(
                "cannot write the output (stdout): No space left on device"), done.stderr
            assert "Traceback" not in done.stderr


def test_a_shard_usage_that_does_not_fit_is_not_published_empty(tmp_path):
    """Room for a cache entry's pages and no more: the entry goes in, its shard's .usage
    (written to .usage.new, then renamed) does not fit. The write was not checked, and an
    empty .usage was published; now there is none, and the next insert recounts."""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": np.arange(64, dtype=np.int64),
                             "b": pa.FixedSizeListArray.from_arrays(
                                 pa.array(np.random.default_rng(2).integers(0, 255, 64 * 256, dtype=np.uint8)),
                                 256)}),
                   data / "one.parquet", compression="NONE")  # one row group: one entry
    kw = dict(batch_size=64, cache_dir=None, cache_wait_timeout=0)  # no claim marker's page
    probe = tmp_path / "probe"
    list(pqloader.Loader(str(data), **{**kw, "cache_dir": str(probe)}))
    entry_bytes = pqloader.cache_stats(str(probe))["bytes"]
    with tmpfs(tmp_path / "disk", "1m") as mount:
        cache = mount / "cache"
        pqloader.Loader(str(data), **{**kw, "cache_dir": str(cache)})  # makes and marks it
        fill(mount, leave=-(-entry_bytes // PAGE) * PAGE)
        loader = pqloader.Loader(str(data), **{**kw, "cache_dir": str(cache)})
        assert sorted(int(i) for b in loader for i in b["id"]) == list(range(64))
        assert loader.stats()["cache_inserts"] == 1
        usage = [p for p in cache.glob("shard-*/.usage*")]
        assert all(p.name == ".usage" and int(p.read_text()) == entry_bytes for p in usage), \
            [(p.name, p.read_bytes()) for p in usage]
