"""Local disks that fail: EIO on a bad sector, ESTALE on an NFS mount, ENOMEM, EMFILE,
short reads. A small LD_PRELOAD library (iofault_shim.c, built here with the system's
gcc) makes pread or open of one path fail or read short; each run is a subprocess. What
must hold: an IOError whose errno is the OS's and whose message names the file (and the
row group mid-epoch), or batches identical to an undisturbed run; never a crash, a hang
or rows dropped."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import subprocess_env

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the shim")

ROWS_PER_FILE = 3000
ROW_GROUP = 1000  # an int64 column of a row group: 8000 bytes in a cache entry


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("iofault") / "iofault.so"
    source = Path(__file__).with_name("iofault_shim.c")
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(source), "-ldl"],
                   check=True, capture_output=True, timeout=120)
    return str(out)


@pytest.fixture
def data(tmp_path) -> str:
    root = tmp_path / "data"
    root.mkdir()
    for f in range(3):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE, dtype=np.int64)
        pq.write_table(pa.table({"x": ids, "s": [str(i) for i in ids]}), root / f"part{f}.parquet",
                       row_group_size=ROW_GROUP)
    return str(root)


RUN = textwrap.dedent("""
    import json, os, sys, pqloader
    source, kwargs, epochs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    out = {"x": []}
    try:
        loader = pqloader.Loader(source, batch_size=500, num_epochs=epochs, **kwargs)
        out["built"] = True
        if len(sys.argv) > 4:
            os.remove(sys.argv[4])  # listed, never read: its row groups come from the cache
        for b in loader:
            out["x"].extend(int(v) for v in b["x"])
        out["stats"] = {k: v for k, v in loader.stats().items() if k.startswith("cache_")}
    except pqloader.Error as e:
        out["error"] = {"type": type(e).__name__, "errno": e.errno if isinstance(e, OSError) else None,
                        "message": str(e)}
    print(json.dumps(out))
""")


def run(source, shim=None, epochs=1, timeout=120, remove=None, **kwargs) -> dict:
    """One loader in a subprocess under the shim (IOFAULT_* settings from `shim`, a dict
    whose "lib" is the library); its rows, stats or error. `remove`: a file deleted once
    the loader is made. The timeout guards hangs."""
    env = subprocess_env()
    if shim is not None:
        settings = dict(shim)
        lib = settings.pop("lib")
        # After any preload already there (ASan's runtime must come first).
        env["LD_PRELOAD"] = " ".join(p for p in (env.get("LD_PRELOAD", ""), lib) if p)
        env.update({f"IOFAULT_{k.upper()}": str(v) for k, v in settings.items()})
    argv = [sys.executable, "-c", RUN, source, json.dumps(kwargs), str(epochs)]
    done = subprocess.run(argv + ([remove] if remove else []), capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ENOMEM])
def test_a_failing_read_of_a_local_file_is_an_ioerror_with_its_errno_naming_file_and_row_group(
        shim, data, code):
    at_footer = run(data, {"lib": shim, "path": "part1.parquet", "errno": code})
    assert not at_footer.get("built"), at_footer
    error = at_footer["error"]
    assert error["type"] == "IOError" and error["errno"] == code, error
    assert "part1.parquet" in error["message"] and "footer" in error["message"], error
    assert os.strerror(code) in error["message"], error

    # The footer read passes; the read of the second row group's first column fails.
    chunk = pq.ParquetFile(Path(data) / "part1.parquet").metadata.row_group(1).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    mid_epoch = run(data, {"lib": shim, "path": "part1.parquet", "errno": code, "at": start,
                            "after": 1})  # the footer's read (the whole small file) passes
    error = mid_epoch["error"]
    assert error["type"] == "IOError" and error["errno"] == code, error
    assert "part1.parquet', row group 1" in error["message"], error
    # The batches before it were delivered, none after it.
    assert mid_epoch["x"] == list(range(ROWS_PER_FILE + ROW_GROUP)), len(mid_epoch["x"])


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EIO])
def test_a_local_file_that_cannot_be_opened_is_an_ioerror_naming_it(shim, data, code):
    # The constructor's open, then one of the row groups' (each read opens the file).
    for after, where in ((0, "part1.parquet'"), (2, "part1.parquet', row group ")):
        got = run(data, {"lib": shim, "calls": "open", "path": "part1.parquet", "errno": code,
                         "after": after})
        error = got["error"]
        assert error["type"] == "IOError" and error["errno"] == code, error
        assert where in error["message"] and os.strerror(code) in error["message"], error


def test_a_directory_that_cannot_be_listed_is_an_ioerror_with_its_errno(shim, data):
    """The listing's error carried no errno (IOError.errno None) and said "cannot list"
    twice; now it carries the OS's error, as every storage error does."""
    got = run(data, {"lib": shim, "calls": "opendir", "path": os.path.basename(data),
                     "errno": errno.ESTALE})
    error = got["error"]
    assert error["type"] == "IOError" and error["errno"] == errno.ESTALE, error
    assert data in error["message"] and os.strerror(errno.ESTALE) in error["message"], error


def test_short_reads_of_local_files_and_cache_entries_give_identical_batches(shim, data, tmp_path):
    expected = run(data)["x"]
    assert sorted(expected) == list(range(3 * ROWS_PER_FILE))
    assert run(data, {"lib": shim, "path": data + "/part", "short": 1})["x"] == expected
    cache = str(tmp_path / "cache")
    for kwargs in ({"cache_dir": cache}, {"cache_dir": cache, "columns": ["x"], "shuffle": True, "seed": 1}):
        plain = run(data, **kwargs)  # fills the cache
        assert sorted(plain["x"]) == list(range(3 * ROWS_PER_FILE))
        short = run(data, {"lib": shim, "path": cache, "short": 1}, epochs=2, **kwargs)
        assert short["x"][:len(plain["x"])] == plain["x"]
        assert sorted(short["x"]) == sorted(expected * 2)
        assert short["stats"]["cache_hits"] == 18 and short["stats"]["cache_corrupt"] == 0, short["stats"]


def entries(cache) -> int:
    return len(list(Path(cache).rglob("*.pqc")))


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ENOMEM])
def test_cache_entries_that_cannot_be_read_are_kept_and_read_from_the_source(shim, data, tmp_path,
                                                                           code):
    """An entry whose read fails is not a damaged one: nothing says its bytes are bad. It
    was counted cache_corrupt and deleted (rewritten by the next insert); now it is counted
    in cache_read_errors and kept, and its row group is read from the source. The batches
    are the same, and a later run hits every entry."""
    cache = str(tmp_path / "cache")
    warm = run(data, cache_dir=cache)
    assert warm["stats"]["cache_inserts"] == 9
    got = run(data, {"lib": shim, "path": cache + "/shard", "errno": code}, cache_dir=cache)
    assert got["x"] == warm["x"]
    s = got["stats"]
    assert s["cache_hits"] == 0 and s["cache_read_errors"] >= 9, s
    assert s["cache_corrupt"] == 0 and s["cache_inserts"] == 0, s
    assert entries(cache) == 9
    again = run(data, cache_dir=cache)
    assert again["x"] == warm["x"]
    assert again["stats"]["cache_hits"] == 9 and again["stats"]["cache_read_errors"] == 0


SHUFFLED = {"columns": ["x"], "shuffle": True, "seed": 1}


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ENOMEM])
def test_a_deferred_cache_column_that_cannot_be_read_is_read_from_the_source(shim, data, tmp_path,
                                                                           code):
    """A shuffled loader's second epoch of hits leaves plain columns in their entry files
    until the window gather reads them (GetDeferred). A read that fails there failed the
    batch, naming only the entry; now the gather takes the row group from its source: the
    epochs are those of an uncached run, each failed hit is counted once, the entries kept."""
    cache = str(tmp_path / "cache")
    uncached = run(data, epochs=2, **SHUFFLED)
    assert sorted(uncached["x"]) == sorted(list(range(3 * ROWS_PER_FILE)) * 2)
    run(data, cache_dir=cache, **SHUFFLED)  # fills the cache
    # Only reads of one column of one row group (8000 bytes) fail: the first epoch's whole
    # entry reads (which verify them) and the second's heads and trailers pass.
    got = run(data, {"lib": shim, "path": cache + "/shard", "errno": code, "len": 8 * ROW_GROUP},
              epochs=2, cache_dir=cache, **SHUFFLED)
    assert "error" not in got, got["error"]
    assert got["x"] == uncached["x"]
    s = got["stats"]
    assert s["cache_hits"] == 18 and s["cache_read_errors"] == 9, s
    assert s["cache_corrupt"] == 0 and s["cache_inserts"] == 0, s
    assert entries(cache) == 9


def test_a_deferred_cache_column_unreadable_at_both_ends_names_column_file_row_group_and_entry(
        shim, data, tmp_path):
    """When the source cannot be read either (here: deleted once listed), the batch fails,
    and the error says where: the column, the file and row group, and the entry that could
    not be read and why. The IOError named only the entry before."""
    cache = str(tmp_path / "cache")
    run(data, cache_dir=cache, **SHUFFLED)  # fills the cache
    part1 = str(Path(data) / "part1.parquet")
    got = run(data, {"lib": shim, "path": cache + "/shard", "errno": errno.EIO,
                     "len": 8 * ROW_GROUP}, epochs=2, remove=part1, cache_dir=cache, **SHUFFLED)
    error = got["error"]
    message = error["message"]
    assert re.search(r"column 'x' of '[^']*part1\.parquet', row group \d", message), error
    assert "cannot read cache entry '" + cache in message, error
    assert os.strerror(errno.EIO) in message and "epoch 1" in message, error
    # The first epoch (whole entry reads) needed no source.
    assert sorted(got["x"][:3 * ROWS_PER_FILE]) == list(range(3 * ROWS_PER_FILE))


@pytest.mark.parametrize("command", ["stats", "prune", "clear"])
def test_a_cache_shard_that_cannot_be_listed_fails_every_cache_command_naming_it(
        shim, data, tmp_path, command):
    """`cache prune` passed over a shard it could not list (another user's, made 0700):
    status 0, "0 stale entries deleted", its stale entries left unseen; stats and clear
    failed naming it. Now all three do."""
    cache = str(tmp_path / "cache")
    run(data, cache_dir=cache)  # fills the cache
    part1 = Path(data) / "part1.parquet"
    pq.write_table(pa.table({"x": np.arange(5)}), part1)  # its 3 entries are stale now
    shard = str(sorted(Path(cache).glob("shard-*/*.pqc"))[0].parent)
    env = subprocess_env()
    env.update(LD_PRELOAD=" ".join(p for p in (env.get("LD_PRELOAD", ""), shim) if p),
               IOFAULT_PATH=shard, IOFAULT_CALLS="opendir", IOFAULT_ERRNO=str(errno.EACCES))
    done = subprocess.run([sys.executable, "-m", "pqloader", "cache", command, cache],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"cannot list cache shard '{shard}'" in done.stderr or \
        f"cannot list '{shard}'" in done.stderr, done.stderr
    assert os.strerror(errno.EACCES) in done.stderr, done.stderr
    assert len(list(Path(shard).glob("*.pqc"))) >= 1  # what it could not list is still there
