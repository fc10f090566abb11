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
    import json, sys, pqloader
    source, kwargs, epochs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    out = {"x": []}
    try:
        loader = pqloader.Loader(source, batch_size=500, num_epochs=epochs, **kwargs)
        out["built"] = True
        for b in loader:
            out["x"].extend(int(v) for v in b["x"])
        out["stats"] = {k: v for k, v in loader.stats().items() if k.startswith("cache_")}
    except pqloader.Error as e:
        out["error"] = {"type": type(e).__name__, "errno": e.errno if isinstance(e, OSError) else None,
                        "message": str(e)}
    print(json.dumps(out))
""")


def run(source, shim=None, epochs=1, timeout=120, **kwargs) -> dict:
    """One loader in a subprocess under the shim (IOFAULT_* settings from `shim`, a dict
    whose "lib" is the library); its rows, stats or error. The timeout guards hangs."""
    env = subprocess_env()
    if shim is not None:
        settings = dict(shim)
        lib = settings.pop("lib")
        # After any preload already there (ASan's runtime must come first).
        env["LD_PRELOAD"] = " ".join(p for p in (env.get("LD_PRELOAD", ""), lib) if p)
        env.update({f"IOFAULT_{k.upper()}": str(v) for k, v in settings.items()})
    done = subprocess.run([sys.executable, "-c", RUN, source, json.dumps(kwargs), str(epochs)],
                          capture_output=True, text=True, timeout=timeout, env=env)
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


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ENOMEM])
def test_cache_entries_that_cannot_be_read_are_read_from_the_source(shim, data, tmp_path, code):
    """An entry whose read fails is treated as a damaged one: counted (cache_corrupt),
    deleted, its row group read from the source; the batches are the same."""
    cache = str(tmp_path / "cache")
    warm = run(data, cache_dir=cache)
    assert warm["stats"]["cache_inserts"] == 9
    got = run(data, {"lib": shim, "path": cache + "/shard", "errno": code}, cache_dir=cache)
    assert got["x"] == warm["x"]
    assert got["stats"]["cache_hits"] == 0 and got["stats"]["cache_corrupt"] >= 9, got["stats"]


def test_a_deferred_cache_column_that_cannot_be_read_is_an_ioerror_with_its_errno(shim, data, tmp_path):
    """A shuffled loader's second epoch of hits leaves plain columns in their entry files
    until the window gather reads them (GetDeferred). A read that fails there fails the
    batch naming the entry; its IOError carried no errno (None) before."""
    cache = str(tmp_path / "cache")
    kwargs = {"cache_dir": cache, "columns": ["x"], "shuffle": True, "seed": 1}
    run(data, **kwargs)  # fills the cache
    # Only reads of one column of one row group (8000 bytes) fail: the first epoch's whole
    # entry reads (which verify them) and the second's heads and trailers pass.
    got = run(data, {"lib": shim, "path": cache + "/shard", "errno": errno.EIO, "len": 8 * ROW_GROUP},
              epochs=2, **kwargs)
    error = got["error"]
    assert error["type"] == "IOError" and error["errno"] == errno.EIO, error
    assert "cannot read cache entry '" + cache in error["message"], error
    assert "epoch 1" in error["message"] and os.strerror(errno.EIO) in error["message"], error
    assert sorted(got["x"]) == list(range(3 * ROWS_PER_FILE)), "the first epoch is whole"
