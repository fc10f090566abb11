"""Dataset summaries (``_metadata``): the row-group layout of every file in one object.

A loader takes a file's layout from its directory's summary instead of its footer when
the summary holds the file and (with ``_pqloader_index``) the file's listed size and
time are those indexed. Checked against the same loader with ``use_summary=False``
(every footer read) and against pyarrow; that footers are really not read is shown by
files whose footers are damaged after indexing (with the data pages intact).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import collect, subprocess_env


def _write_dataset(root, files=6, rows=500, partitioned=True):
    """`files` Parquet files (two row groups each) under hive partitions, and pyarrow's
    own summary of them (``pq.write_metadata`` with a metadata collector)."""
    collector = []
    for i in range(files):
        rng = np.random.default_rng(i)
        table = pa.table({"x": rng.standard_normal(rows).astype(np.float32),
                          "y": np.arange(i * rows, (i + 1) * rows, dtype=np.int64)})
        rel = f"part={i % 2}/f{i:02d}.parquet" if partitioned else f"f{i:02d}.parquet"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=rows // 2, metadata_collector=collector)
        collector[-1].set_file_path(rel)
    return collector, table.schema


def _values(loader):
    return collect(loader)


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def _damage_footers(root):
    """Overwrite each file's footer bytes (keeping its size) and its time: a loader that
    reads a footer fails, one that does not reads the data pages as before."""
    for path in sorted(root.rglob("*.parquet")):
        data = bytearray(path.read_bytes())
        length = int.from_bytes(data[-8:-4], "little")
        data[-8 - length:-8] = b"\x00" * length
        stat = path.stat()
        path.write_bytes(bytes(data))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same identity as indexed


def test_pyarrows_summary_replaces_every_footer_read(tmp_path):
    collector, schema = _write_dataset(tmp_path)
    pq.write_metadata(schema, tmp_path / "_metadata", metadata_collector=collector)
    with_summary = pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=3)
    without = pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=3, use_summary=False)
    _equal(_values(with_summary), _values(without))
    assert with_summary.stats()["footers_from_summary"] == 6
    assert without.stats()["footers_from_summary"] == 0
    expected = pq.read_table(tmp_path, columns=["x", "y"]).sort_by("y")
    got = _values(pqloader.Loader(str(tmp_path), batch_size=1000))
    order = np.argsort(got["y"])
    np.testing.assert_array_equal(got["y"][order], expected["y"].to_numpy())
    np.testing.assert_array_equal(got["x"][order], expected["x"].to_numpy())
    # The footers are not read at all: damaged ones do not matter with the summary.
    reference = _values(pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=3))
    _damage_footers(tmp_path)
    _equal(_values(pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=3)), reference)
    with pytest.raises(pqloader.InvalidDataError):
        pqloader.Loader(str(tmp_path), batch_size=64, use_summary=False)


def test_write_index_writes_a_summary_pyarrow_reads_and_loaders_use(tmp_path):
    _write_dataset(tmp_path)
    before = _values(pqloader.Loader(str(tmp_path), batch_size=50, shuffle=True, seed=1))
    r = pqloader.write_index(str(tmp_path))
    assert (r["files"], r["row_groups"], r["rows"]) == (6, 12, 3000)
    assert r["metadata_path"] == str(tmp_path / "_metadata")
    assert r["bytes"] == (tmp_path / "_metadata").stat().st_size
    md = pq.read_metadata(tmp_path / "_metadata")
    assert (md.num_rows, md.num_row_groups) == (3000, 12)
    assert {md.row_group(i).column(0).file_path for i in range(12)} == {
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet")}
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    loader = pqloader.Loader(str(tmp_path), batch_size=50, shuffle=True, seed=1)
    _equal(_values(loader), before)
    assert loader.stats()["footers_from_summary"] == 6
    # The index records each file's identity; footers damaged afterwards (same size and
    # time) are not read.
    _damage_footers(tmp_path)
    _equal(_values(pqloader.Loader(str(tmp_path), batch_size=50, shuffle=True, seed=1)), before)


def test_cache_entries_are_shared_with_and_without_the_index(tmp_path):
    data = tmp_path / "data"
    _write_dataset(data)
    cache = tmp_path / "cache"
    first = pqloader.Loader(str(data), batch_size=100, cache_dir=str(cache))
    reference = _values(first)
    assert first.stats()["cache_misses"] > 0
    pqloader.write_index(str(data))
    second = pqloader.Loader(str(data), batch_size=100, cache_dir=str(cache))
    _equal(_values(second), reference)
    s = second.stats()
    assert s["footers_from_summary"] == 6
    assert s["cache_misses"] == 0 and s["cache_hits"] == 12  # same keys: the footer hashes


def test_a_file_changed_or_added_since_the_index_is_read_from_its_footer(tmp_path):
    _write_dataset(tmp_path)
    pqloader.write_index(str(tmp_path))
    changed = tmp_path / "part=0" / "f00.parquet"
    pq.write_table(pa.table({"x": np.ones(700, np.float32), "y": np.arange(700, dtype=np.int64)}),
                   changed, row_group_size=100)
    added = tmp_path / "part=1" / "f99.parquet"
    pq.write_table(pa.table({"x": np.zeros(30, np.float32), "y": -np.arange(1, 31, dtype=np.int64)}),
                   added)
    loader = pqloader.Loader(str(tmp_path), batch_size=64)
    got = _values(loader)
    assert loader.stats()["footers_from_summary"] == 5
    _equal(got, _values(pqloader.Loader(str(tmp_path), batch_size=64, use_summary=False)))
    assert len(got["y"]) == 5 * 500 + 700 + 30


def test_a_deleted_file_is_not_read_and_a_foreign_summary_is_trusted_by_path(tmp_path):
    collector, schema = _write_dataset(tmp_path, partitioned=False)
    pq.write_metadata(schema, tmp_path / "_metadata", metadata_collector=collector)
    (tmp_path / "f03.parquet").unlink()
    loader = pqloader.Loader(str(tmp_path), batch_size=100)
    got = _values(loader)
    assert loader.stats()["footers_from_summary"] == 5
    assert len(got["y"]) == 5 * 500 and not np.isin(np.arange(1500, 2000), got["y"]).any()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "absolute_path", "no_file_path"])
def test_an_unreadable_summary_is_a_clear_error_naming_it(tmp_path, damage):
    collector, schema = _write_dataset(tmp_path, files=2)
    summary = tmp_path / "_metadata"
    if damage == "garbage":
        summary.write_bytes(b"PAR1" + os.urandom(200) + b"PAR1")
    elif damage == "truncated":
        pq.write_metadata(schema, summary, metadata_collector=collector)
        summary.write_bytes(summary.read_bytes()[:-20])
    else:
        for c in collector:
            c.set_file_path("/etc/passwd" if damage == "absolute_path" else "")
        pq.write_metadata(schema, summary, metadata_collector=collector)
    code = ("import pqloader, sys\n"
            "try:\n"
            f"    pqloader.Loader({str(tmp_path)!r}, batch_size=10)\n"
            "except pqloader.InvalidDataError as e:\n"
            "    print('ERR', e)\n"
            "    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=subprocess_env())
    assert r.returncode == 3, r.stderr
    assert str(summary) in r.stdout and "use_summary=False" in r.stdout
    loader = pqloader.Loader(str(tmp_path), batch_size=100, use_summary=False)
    assert len(_values(loader)["y"]) == 1000


def test_write_index_refuses_files_with_different_schemas_and_files(tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": [1.5]}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="b.parquet"):
        pqloader.write_index(str(tmp_path))
    assert not (tmp_path / "_metadata").exists() and not (tmp_path / "_pqloader_index").exists()
    with pytest.raises(ValueError, match="directory"):
        pqloader.write_index(str(tmp_path / "a.parquet"))


def test_cli_index_then_inspect(tmp_path):
    _write_dataset(tmp_path, files=3)
    r = subprocess.run([sys.executable, "-m", "pqloader", "index", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert r.returncode == 0, r.stderr
    assert "3 file(s), 6 row group(s), 1500 rows" in r.stdout
    assert pq.read_metadata(tmp_path / "_metadata").num_rows == 1500
    lines = (tmp_path / "_pqloader_index").read_text().splitlines()
    assert lines[0] == "pqloader-index 2" and lines[1].startswith("summary\t") and len(lines) == 5
    for line in lines[2:]:
        size, mtime_ns, footer_hash, rel = line.split("\t")
        stat = (tmp_path / rel).stat()
        assert int(size) == stat.st_size and int(mtime_ns) == stat.st_mtime_ns
        assert len(footer_hash) == 32


def test_summary_only_takes_the_files_from_the_index_without_listing(tmp_path):
    _write_dataset(tmp_path)
    pqloader.write_index(str(tmp_path))
    listed = _values(pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=4))
    only = pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=4, use_summary="only")
    _equal(_values(only), listed)
    assert only.stats()["footers_from_summary"] == 6
    assert only.column_info["part"]["partition"]  # hive keys from the indexed paths
    # Files added since the index are not seen (the index is the listing).
    pq.write_table(pa.table({"x": np.zeros(10, np.float32), "y": np.arange(10, dtype=np.int64)}),
                   tmp_path / "part=0" / "new.parquet")
    _equal(_values(pqloader.Loader(str(tmp_path), batch_size=64, shuffle=True, seed=4,
                                   use_summary="only")), listed)


def test_summary_only_refuses_a_file_changed_since_the_index_when_it_reads_it(tmp_path):
    _write_dataset(tmp_path, partitioned=False)
    pqloader.write_index(str(tmp_path))
    changed = tmp_path / "f02.parquet"
    table = pq.read_table(changed)
    pq.write_table(table, changed, row_group_size=250, compression="zstd")  # same rows, new bytes
    loader = pqloader.Loader(str(tmp_path), batch_size=100, use_summary="only")
    with pytest.raises(pqloader.InvalidDataError, match="f02.parquet' changed since it was indexed"):
        collect(loader)
    # Listing mode notices the change from the listed size and reads the new footer.
    loader = pqloader.Loader(str(tmp_path), batch_size=100)
    assert len(_values(loader)["y"]) == 3000 and loader.stats()["footers_from_summary"] == 5


def test_summary_only_needs_the_index_and_checks_its_argument(tmp_path):
    _write_dataset(tmp_path, files=2)
    with pytest.raises(pqloader.DataNotFoundError, match="_metadata"):
        pqloader.Loader(str(tmp_path), batch_size=10, use_summary="only")
    with pytest.raises(ValueError, match="use_summary"):
        pqloader.Loader(str(tmp_path), batch_size=10, use_summary="yes")
    with pytest.raises(TypeError, match="use_summary"):
        pqloader.Loader(str(tmp_path), batch_size=10, use_summary=1)


def test_a_new_index_beside_an_old_summary_never_serves_the_old_layout(tmp_path):
    # The index was moved into place before `_metadata`: a run that failed (or was
    # killed, or raced another `pqloader index`) between the two left the new index
    # beside the old summary, and a file rewritten between the two runs was read with
    # the old summary's row groups (1,000 rows of a 1,500-row file).
    def write_a(value, rows):
        pq.write_table(pa.table({"y": np.full(rows, value, np.int64)}), tmp_path / "a.parquet",
                       row_group_size=rows // 2)
    write_a(1, 1000)
    pq.write_table(pa.table({"y": np.arange(10, dtype=np.int64)}), tmp_path / "b.parquet")
    pqloader.write_index(str(tmp_path))
    write_a(2, 1500)
    taken = tmp_path / f"_metadata.tmp-{os.getpid()}"
    taken.mkdir()  # the second run's summary cannot be written
    with pytest.raises(pqloader.Error, match="_metadata"):
        pqloader.write_index(str(tmp_path))
    taken.rmdir()
    expected = pq.read_table(tmp_path / "a.parquet")["y"].to_numpy()

    def ys():
        return _values(pqloader.Loader(str(tmp_path), batch_size=10_000, columns=["y"]))["y"][:-10]

    np.testing.assert_array_equal(ys(), expected)
    # The index's move failing instead (the new summary beside the old index), and the
    # pair of two runs crossed (the new index beside the old summary): neither pair
    # describes a.parquet as it is, and its own footer is read.
    old_summary = (tmp_path / "_metadata").read_bytes()
    taken = tmp_path / f"_pqloader_index.tmp-{os.getpid()}"
    taken.mkdir()
    with pytest.raises(pqloader.Error, match="_pqloader_index"):
        pqloader.write_index(str(tmp_path))
    taken.rmdir()
    np.testing.assert_array_equal(ys(), expected)
    pqloader.write_index(str(tmp_path))
    (tmp_path / "_metadata").write_bytes(old_summary)
    np.testing.assert_array_equal(ys(), expected)
    with pytest.raises(pqloader.InvalidDataError, match="_pqloader_index' does not describe"):
        pqloader.Loader(str(tmp_path), batch_size=10_000, use_summary="only")


def test_summary_only_with_a_warm_cache_refuses_a_file_changed_since_the_index(tmp_path):
    # The cache key of a file taken from the index is the index's (size, time, footer
    # hash): a hit must still check the file, or the answer depends on the cache's state
    # (an error cold, the old rows warm).
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"y": np.arange(i * 100, i * 100 + 100, dtype=np.int64)}),
                       data / f"f{i}.parquet", row_group_size=50)
    pqloader.write_index(str(data))
    collect(pqloader.Loader(str(data), batch_size=1000, use_summary="only", cache_dir=str(cache)))
    pq.write_table(pa.table({"y": np.arange(5000, 5100, dtype=np.int64)}), data / "f1.parquet",
                   row_group_size=50)
    for cache_dir in (None, str(cache)):
        loader = pqloader.Loader(str(data), batch_size=1000, use_summary="only", cache_dir=cache_dir)
        with pytest.raises(pqloader.InvalidDataError, match="f1.parquet' changed since it was indexed"):
            collect(loader)


def test_an_index_naming_a_file_twice_or_out_of_order_is_refused(tmp_path):
    _write_dataset(tmp_path, files=3, partitioned=False)
    pqloader.write_index(str(tmp_path))
    lines = (tmp_path / "_pqloader_index").read_text().splitlines()
    head, entries = lines[:2], lines[2:]  # the header, the summary's hash; three files
    assert len(entries) == 3
    for edited in (head + entries + [entries[0]], head + entries[::-1]):
        (tmp_path / "_pqloader_index").write_text("\n".join(edited) + "\n")
        for use_summary in (True, "only"):
            with pytest.raises(pqloader.InvalidDataError, match="_pqloader_index"):
                collect(pqloader.Loader(str(tmp_path), batch_size=100, use_summary=use_summary))


def test_write_index_refuses_files_loaders_refuse_together(tmp_path):
    # Same Parquet schema, other Arrow types (time zones): without an index the loader
    # refuses the pair; an index must not make it load them as the first file's type.
    pq.write_table(pa.table({"t": pa.array([1, 2], pa.timestamp("us", tz="UTC"))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"t": pa.array([3, 4], pa.timestamp("us", tz="Asia/Tokyo"))}),
                   tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="b.parquet"):
        pqloader.Loader(str(tmp_path), batch_size=10)
    with pytest.raises(pqloader.SchemaMismatchError, match="b.parquet"):
        pqloader.write_index(str(tmp_path))
    assert not (tmp_path / "_metadata").exists()


def test_write_index_refuses_files_whose_pandas_index_columns_differ(tmp_path):
    # One file's df.set_index("id") beside a file whose "id" is a plain column: the same
    # Arrow schema, other pandas metadata. Without an index the loader keeps "id" (a file
    # stores it as data); the summary held the first file's metadata only, so every file's
    # "id" was left out as a pandas index, silently.
    import pandas as pd
    a = pd.DataFrame({"x": [1, 2, 5], "id": [10, 17, 3]}).set_index("id")
    b = pd.DataFrame({"x": [3, 4], "id": [30, 40]})
    pq.write_table(pa.Table.from_pandas(a), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pandas(b, preserve_index=False), tmp_path / "b.parquet")
    assert pq.read_schema(tmp_path / "a.parquet").names == pq.read_schema(tmp_path / "b.parquet").names
    got = collect(pqloader.Loader(str(tmp_path), batch_size=10, shuffle=False))
    assert sorted(got["id"].tolist()) == [3, 10, 17, 30, 40]
    with pytest.raises(pqloader.SchemaMismatchError, match=r"b\.parquet.*pandas index"):
        pqloader.write_index(str(tmp_path))
    assert not (tmp_path / "_metadata").exists()


def test_a_file_rewritten_under_pyarrows_summary_fails_pointing_at_the_summary(tmp_path):
    # pyarrow's _metadata records no size or time: a file rewritten since is read with
    # the summary's layout (documented), and failed as "corrupt or truncated data" with
    # nothing pointing at the summary or use_summary=False.
    collector = []
    for name, ids in (("a", range(0, 40)), ("b", range(40, 80))):
        t = pa.table({"id": pa.array(list(ids), pa.int64()), "x": pa.array([i * 0.5 for i in ids])})
        pq.write_table(t, tmp_path / f"{name}.parquet", row_group_size=10, metadata_collector=collector)
        collector[-1].set_file_path(f"{name}.parquet")
    pq.write_metadata(t.schema, tmp_path / "_metadata", metadata_collector=collector)
    ids = list(range(1000, 1050))
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array([i * 0.5 for i in ids])}),
                   tmp_path / "a.parquet", row_group_size=10)
    with pytest.raises(pqloader.InvalidDataError, match=r"a\.parquet.*_metadata.*use_summary=False"):
        collect(pqloader.Loader(str(tmp_path), batch_size=8))
    got = collect(pqloader.Loader(str(tmp_path), batch_size=8, use_summary=False))
    assert sorted(got["id"].tolist()) == sorted(pq.read_table(tmp_path / "a.parquet")["id"].to_pylist() + list(range(40, 80)))


def test_write_index_of_a_missing_directory_is_not_found(tmp_path):
    # It said "pqloader index takes a directory; '...' is not one" (InvalidDataError),
    # where every other entry point says the path does not exist (DataNotFoundError).
    with pytest.raises(pqloader.DataNotFoundError, match="nope' does not exist"):
        pqloader.write_index(tmp_path / "nope")
    (tmp_path / "f.parquet").write_bytes(b"x")
    with pytest.raises(pqloader.InvalidDataError, match="f.parquet' is not a directory"):
        pqloader.write_index(tmp_path / "f.parquet")


def _two_summary_files(root, rows=40, rg=10):
    collector = []
    for i in range(2):
        ids = np.arange(i * 1000, i * 1000 + rows, dtype=np.int64)
        t = pa.table({"id": ids, "x": ids * 0.5})
        pq.write_table(t, root / f"f{i}.parquet", row_group_size=rg, metadata_collector=collector)
        collector[-1].set_file_path(f"f{i}.parquet")
    return collector, t.schema


def test_a_summary_listing_a_file_twice_is_refused_naming_it(tmp_path):
    # pyarrow's write_metadata took a collector holding f0 twice: every row of f0 was
    # served twice (120 rows for 80), silently.
    collector, schema = _two_summary_files(tmp_path)
    pq.write_metadata(schema, tmp_path / "_metadata", metadata_collector=collector + [collector[0]])
    with pytest.raises(pqloader.InvalidDataError, match=r"_metadata.*f0\.parquet.*twice"):
        collect(pqloader.Loader(str(tmp_path), batch_size=8))
    got = collect(pqloader.Loader(str(tmp_path), batch_size=8, use_summary=False))
    assert len(got["id"]) == 80


def test_a_file_shorter_than_its_summary_layout_names_the_summary(tmp_path):
    # pyarrow's _metadata records no size: a file rewritten smaller was reported as
    # "'f0.parquet' has a corrupt footer: ... spans bytes" (its footer is fine), with
    # nothing pointing at _metadata or use_summary=False.
    collector, schema = _two_summary_files(tmp_path, rows=400, rg=100)
    pq.write_metadata(schema, tmp_path / "_metadata", metadata_collector=collector)
    pq.write_table(pa.table({"id": np.arange(5, dtype=np.int64), "x": np.arange(5) * 0.5}),
                   tmp_path / "f0.parquet")
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"f0\.parquet.*_metadata.*use_summary=False") as info:
        pqloader.Loader(str(tmp_path), batch_size=8)
    assert "corrupt footer" not in str(info.value)
    assert len(collect(pqloader.Loader(str(tmp_path), batch_size=8, use_summary=False))["id"]) == 405


def test_summary_only_names_the_index_for_a_file_deleted_since(tmp_path):
    # It said "... is gone: make a new Loader to read it as it is now", which fails the
    # same way: the index still lists the file.
    _two_summary_files(tmp_path)
    pqloader.write_index(str(tmp_path))
    os.remove(tmp_path / "f1.parquet")
    with pytest.raises(pqloader.DataNotFoundError, match=r"f1\.parquet.*pqloader index") as info:
        collect(pqloader.Loader(str(tmp_path), batch_size=8, use_summary="only"))
    assert "make a new Loader" not in str(info.value)


def test_write_index_refuses_a_file_name_that_is_not_utf8(tmp_path):
    # The index was written with the name, and every Loader of the directory then refused
    # it (its paths cross into Python as str): refused where it is made, naming the bytes.
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [4]}), tmp_path / "b.parquet")
    os.rename(tmp_path / "b.parquet", os.path.join(os.fsencode(tmp_path), b"bad\xff.parquet"))
    with pytest.raises(pqloader.InvalidDataError, match=r"not UTF-8 \(b'bad\\xff.parquet'\).*rename"):
        pqloader.write_index(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", os.fsdecode(b"bad\xff.parquet")]  # no index
