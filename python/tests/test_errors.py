"""Error behaviour: clean, typed exceptions that name the culprit; no hangs."""

from __future__ import annotations

import decimal
import errno
import itertools
import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import collect, id_table, run_with_timeout, write_dataset, write_parquet


def read_all(source, **kwargs):
    """Construct and exhaust a loader (errors may come from either step)."""
    return collect(pqloader.Loader(source, **kwargs))


# ---------------------------------------------------------------------------
# exception hierarchy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,builtin",
    [
        ("DataNotFoundError", FileNotFoundError),
        ("InvalidDataError", ValueError),
        ("SchemaMismatchError", ValueError),
        ("ColumnNotFoundError", KeyError),
        ("UnsupportedTypeError", TypeError),
        ("IOError", OSError),
    ],
)
def test_exception_classes_subclass_pqloader_error_and_the_builtin(name, builtin):
    cls = getattr(pqloader, name)
    assert issubclass(cls, pqloader.Error)
    assert issubclass(cls, builtin)
    assert issubclass(pqloader.Error, Exception)


def test_schema_mismatch_error_is_an_invalid_data_error():
    assert issubclass(pqloader.SchemaMismatchError, pqloader.InvalidDataError)


# ---------------------------------------------------------------------------
# missing data
# ---------------------------------------------------------------------------


def test_missing_path_raises_data_not_found_naming_the_path(tmp_path):
    missing = tmp_path / "does-not-exist.parquet"
    with pytest.raises(pqloader.DataNotFoundError) as ei:
        read_all(str(missing))
    assert isinstance(ei.value, FileNotFoundError)
    assert "does-not-exist.parquet" in str(ei.value)


def test_missing_path_in_a_list_raises_data_not_found(tmp_path):
    good = write_parquet(tmp_path / "good.parquet", id_table(5))
    with pytest.raises(pqloader.DataNotFoundError, match="nope.parquet"):
        read_all([str(good), str(tmp_path / "nope.parquet")])


def test_empty_directory_raises_data_not_found(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(pqloader.DataNotFoundError):
        read_all(str(tmp_path / "empty"))


def test_directory_with_only_hidden_files_raises_data_not_found(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "_ignored.parquet", id_table(5))
    write_parquet(d / ".ignored.parquet", id_table(5))
    (d / "_SUCCESS").write_bytes(b"")
    with pytest.raises(pqloader.DataNotFoundError):
        read_all(str(d))


def test_a_link_back_up_the_tree_is_not_read_as_more_files(tmp_path):
    # Arrow's local lister follows a symbolic link to a directory: a cycle (`ln -s . self`)
    # listed every file once per level, 40 levels deep, each read as data. A link to a
    # directory elsewhere is still read as files of the dataset.
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", id_table(3))
    write_parquet(d / "sub" / "b.parquet", id_table(4, start=3))
    write_parquet(tmp_path / "other" / "c.parquet", id_table(5, start=7))
    (d / "self").symlink_to(".")
    (d / "sub" / "up").symlink_to("..")
    (d / "elsewhere").symlink_to(tmp_path / "other")
    files = [f["path"].rsplit("/d/", 1)[1] for f in pqloader.inspect(str(d))["files"]]
    assert files == ["a.parquet", "elsewhere/c.parquet", "sub/b.parquet"]
    ids = sorted(int(i) for i in read_all(str(d))["id"])
    assert ids == list(range(12))


def test_a_source_going_up_from_a_linked_directory_reads_what_the_os_opens(tmp_path):
    # `/p/link/../x` is, for the OS and pyarrow, `x` beside the link's target; abspath
    # collapsed `link/..` and read `/p/x`, another file, without a word.
    write_parquet(tmp_path / "store" / "train.parquet", id_table(3))
    write_parquet(tmp_path / "proj" / "train.parquet", id_table(4, start=100))
    (tmp_path / "store" / "sub").mkdir()
    (tmp_path / "proj" / "data").symlink_to(tmp_path / "store" / "sub")
    source = str(tmp_path / "proj" / "data" / ".." / "train.parquet")
    assert pq.read_table(source)["id"].to_pylist() == [0, 1, 2]
    assert sorted(int(i) for i in read_all(source)["id"]) == [0, 1, 2]
    assert sorted(int(i) for i in read_all(str(tmp_path / "proj" / "data" / ".."))["id"]) == [0, 1, 2]


def load_beside_a_closed_directory(closed: str, glob: str) -> list[str]:
    """Read `glob` below a new root holding a.parquet (5 rows) and directory `closed`
    (a file of 3 rows at closed/b.parquet), which its user cannot read: what the loader
    printed, the rows' count or "errno message" of its IOError. As root, the loader runs
    without the capabilities that let root read any directory."""
    import shutil
    import subprocess
    import sys
    import tempfile
    root = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        write_parquet(root / "a.parquet", id_table(5))
        os.chmod(root / "a.parquet", 0o644)
        write_parquet(root / closed / "b.parquet", id_table(3))
        os.chmod(root / closed, 0)
        script = ("import pqloader\n"
                  "try:\n"
                  f"    print(sum(len(b['id']) for b in pqloader.Loader({str(root / glob)!r}, batch_size=2)))\n"
                  "except pqloader.IOError as e:\n"
                  "    print(e.errno, str(e).replace(' ', '_'))")
        drop = (["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
                if os.geteuid() == 0 else [])
        run = subprocess.run(drop + [sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.split()
    finally:
        os.chmod(root / closed, 0o755)
        shutil.rmtree(root)


@pytest.mark.parametrize("glob", ["", "*.parquet", "*"])
def test_an_unreadable_hidden_directory_does_not_fail_a_directory_source(glob):
    # Hidden directories were walked, then their files dropped: a `_temporary/` the user
    # cannot read (another user's Spark job) failed the listing (with a glob that does not
    # spell a '_' prefix too, until the thirty-ninth session).
    assert load_beside_a_closed_directory("_temporary", glob) == ["5"]


@pytest.mark.parametrize("glob,expect", [("*.parquet", "5"), ("a*.parquet", "5"),
                                         ("*/b.parquet", "lost+found")])
def test_a_glob_does_not_enter_a_directory_none_of_its_names_can_match(glob, expect):
    # `d/*.parquet` walked the whole tree below d, a stat per entry (1.6 s beside 100k
    # files), and failed on any directory there it could not read (`lost+found`, another
    # user's): "cannot read directory ... Permission denied"; glob.glob and pyarrow read
    # the two files. ("*/b.parquet" must enter it: the error names it, with the errno.)
    out = load_beside_a_closed_directory("lost+found", glob)
    if expect == "5":
        assert out == ["5"]
    else:
        assert out[0] == str(errno.EACCES) and expect in out[-1], out


@pytest.mark.parametrize("index", [False, True])
def test_a_file_replaced_by_a_fifo_under_the_loader_is_an_error_not_a_hang(tmp_path, index):
    # Opened blocking, the FIFO waited for a writer forever (close() and Ctrl-C could not
    # end it); a file of an index read with use_summary="only" the same.
    write_parquet(tmp_path / "a.parquet", id_table(5))
    write_parquet(tmp_path / "b.parquet", id_table(5, 5))
    if index:
        pqloader.write_index(str(tmp_path))
    loader = pqloader.Loader(str(tmp_path), batch_size=2, use_summary="only" if index else True)
    (tmp_path / "b.parquet").unlink()
    os.mkfifo(tmp_path / "b.parquet")
    with pytest.raises(pqloader.IOError, match=r"b\.parquet.*not a regular file.*no longer a regular file"):
        run_with_timeout(lambda: collect(loader), timeout=60)


def test_glob_matching_nothing_raises_data_not_found(tmp_path):
    write_parquet(tmp_path / "a.parquet", id_table(5))
    with pytest.raises(pqloader.DataNotFoundError):
        read_all(str(tmp_path / "*.nothing"))


def test_inspect_gives_a_duplicated_columns_file_type_not_partition(tmp_path):
    # Two fields named x: inspect said 'partition' (no such key) for its type.
    p = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3.0, 4.0])], names=["x", "x"]), p)
    info = pqloader.inspect(str(p))
    assert info["schema"] == {"x": "int64"}
    assert "2 columns named 'x'" in info["loads_as"]["x"]


def test_inspect_of_missing_path_raises_data_not_found(tmp_path):
    with pytest.raises(pqloader.DataNotFoundError):
        pqloader.inspect(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------
# broken files
# ---------------------------------------------------------------------------


def _good_bytes(tmp_path, **kw) -> bytes:
    p = write_parquet(tmp_path / "src" / "good.parquet", id_table(500), [200, 300], **kw)
    return p.read_bytes()


def _footer_span(data: bytes) -> tuple[int, int]:
    """(start, end) of the thrift FileMetaData in a parquet file's bytes."""
    assert data[-4:] == b"PAR1"
    (footer_len,) = struct.unpack("<i", data[-8:-4])
    end = len(data) - 8
    return end - footer_len, end


def test_an_os_error_is_named_in_the_message_and_set_as_errno(tmp_path):
    # Arrow keeps a local file's errno beside its message ("Failed stat()ing path"):
    # the reason is in ours, and the number is the exception's errno (an OSError).
    import errno

    path = tmp_path / ("a" * 300 + ".parquet")
    with pytest.raises(pqloader.IOError) as ei:
        pqloader.Loader(str(path))
    assert ei.value.errno == errno.ENAMETOOLONG
    assert str(ei.value).endswith(f"({os.strerror(errno.ENAMETOOLONG)})") and str(path) in str(ei.value)
    with pytest.raises(pqloader.IOError) as ei:
        pqloader.inspect(str(path))
    assert ei.value.errno == errno.ENAMETOOLONG


def test_a_file_name_that_is_not_utf8_raises_invalid_data_naming_it(tmp_path):
    # The engine lists it; its path, turned into str where it crosses into Python, raised
    # a bare UnicodeDecodeError naming no file.
    d = tmp_path / "ds"
    write_parquet(d / "good.parquet", id_table(10))
    write_parquet(d / "bad.parquet", id_table(10, 10))
    os.rename(os.fsencode(d / "bad.parquet"), os.path.join(os.fsencode(d), b"\xff.parquet"))
    for make in (pqloader.Loader, pqloader.inspect):
        with pytest.raises(pqloader.InvalidDataError) as e:
            make(str(d))
        assert repr(str(d)) in str(e.value) and r"b'\xff.parquet'" in str(e.value), str(e.value)
        assert "UTF-8" in str(e.value)


def test_a_directory_name_that_is_not_utf8_is_named_with_its_parent(tmp_path):
    d = tmp_path / "ds"
    write_parquet(d / "sub" / "a.parquet", id_table(10))
    os.rename(os.fsencode(d / "sub"), os.path.join(os.fsencode(d), b"sub\xfe"))
    with pytest.raises(pqloader.InvalidDataError) as e:
        pqloader.Loader(str(d))
    assert repr(str(d)) in str(e.value) and r"b'sub\xfe'" in str(e.value), str(e.value)


def test_a_source_that_is_not_utf8_is_a_value_error_naming_it(tmp_path):
    write_parquet(tmp_path / "a.parquet", id_table(10))
    os.rename(os.fsencode(tmp_path / "a.parquet"), os.path.join(os.fsencode(tmp_path), b"\xff.parquet"))
    path = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"\xff.parquet"))
    for make in (pqloader.Loader, pqloader.inspect):
        with pytest.raises(ValueError, match=r"not UTF-8.*\\xff\.parquet"):
            make(path)


def test_non_parquet_file_raises_invalid_data_naming_the_file(tmp_path):
    p = tmp_path / "notes.parquet"
    p.write_text("this is not a parquet file\n" * 20)
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(p))
    assert "notes.parquet" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_empty_file_raises_invalid_data(tmp_path):
    p = tmp_path / "zero.parquet"
    p.write_bytes(b"")
    with pytest.raises(pqloader.InvalidDataError, match="zero.parquet"):
        read_all(str(p))


@pytest.mark.parametrize("keep", ["half", "all_but_3", "all_but_9", "just_magic"])
def test_truncated_file_raises_invalid_data_naming_the_file(tmp_path, keep):
    data = _good_bytes(tmp_path)
    cut = {"half": len(data) // 2, "all_but_3": len(data) - 3, "all_but_9": len(data) - 9, "just_magic": 4}[keep]
    p = tmp_path / "trunc.parquet"
    p.write_bytes(data[:cut])
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(p))
    assert "trunc.parquet" in str(ei.value)


@pytest.mark.parametrize("keep", ["half", "just_magic"])
def test_truncated_hive_file_without_extension_raises_naming_it(tmp_path, keep):
    # Hive names its data files 000000_0 (no extension): one that starts with PAR1 but was
    # cut short is corrupt Parquet, as pyarrow and Spark read it, not a file to skip.
    d = tmp_path / "t" / "ds=1"
    d.mkdir(parents=True)
    pq.write_table(id_table(50), d / "000000_0")
    pq.write_table(id_table(50, 50), d / "000001_0")
    data = (d / "000001_0").read_bytes()
    (d / "000001_0").write_bytes(data[: len(data) // 2 if keep == "half" else 4])
    with pytest.raises(pqloader.InvalidDataError, match="000001_0"):
        read_all(str(tmp_path / "t"), batch_size=16)


def test_truncated_file_among_good_files_raises_naming_the_bad_one(tmp_path):
    d = tmp_path / "d"
    write_dataset(d, [[50], [50], [50]])
    data = (d / "part-001.parquet").read_bytes()
    (d / "part-001.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(d), batch_size=16)
    assert "part-001.parquet" in str(ei.value)


@pytest.mark.parametrize("how", ["garbage_metadata", "huge_length", "bad_magic"])
def test_corrupt_footer_raises_invalid_data_naming_the_file(tmp_path, how):
    data = bytearray(_good_bytes(tmp_path))
    start, end = _footer_span(bytes(data))
    if how == "garbage_metadata":
        data[start:end] = b"\xff" * (end - start)
    elif how == "huge_length":
        data[-8:-4] = struct.pack("<i", len(data) * 10)
    else:
        data[-4:] = b"PARX"
    p = tmp_path / "badfooter.parquet"
    p.write_bytes(bytes(data))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(p))
    assert "badfooter.parquet" in str(ei.value)


def _corrupt_column_chunk(src: Path, dst: Path, column: int, row_group: int = 0) -> None:
    """Flip 16 bytes in the middle of one column chunk."""
    md = pq.ParquetFile(str(src)).metadata
    col = md.row_group(row_group).column(column)
    start = col.dictionary_page_offset or col.data_page_offset
    mid = start + col.total_compressed_size // 2
    data = bytearray(src.read_bytes())
    for i in range(mid, mid + 16):
        data[i] ^= 0xFF
    dst.write_bytes(bytes(data))


def _gzip_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "payload": pa.array(rng.standard_normal(n)),
        }
    )


def test_corrupt_compressed_page_raises_invalid_data_naming_file_and_column(tmp_path):
    src = write_parquet(tmp_path / "src.parquet", _gzip_table(2000), [1000, 1000], compression="gzip", use_dictionary=False)
    bad = tmp_path / "pagecorrupt.parquet"
    _corrupt_column_chunk(src, bad, column=1, row_group=1)
    with pytest.raises(Exception):  # precondition: the corruption is detectable at all
        pq.read_table(str(bad))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(bad), batch_size=100)
    msg = str(ei.value)
    assert "pagecorrupt.parquet" in msg
    assert "payload" in msg


@pytest.mark.parametrize("codec", ["snappy", "gzip", "brotli", "zstd", "lz4", "lz4_raw"])
@pytest.mark.parametrize("how", ["expression", "predicate"])
def test_corrupt_compressed_page_of_a_filter_column_raises_invalid_data_naming_it(tmp_path, codec, how):
    """The filter's read of a corrupt page is bad data, not storage, as the load's read
    of it is: it raised pqloader.IOError naming no column ("Corrupt snappy compressed
    data.", "GZipCodec failed: ...", "Couldn't deserialize thrift: ..." come from Arrow as
    IOErrors, and only a lower-case "corrupt" or "CRC" in them was taken for bad data)."""
    n = 2000  # compressible values: a flipped byte breaks the codec's stream, not a literal
    table = pa.table({"id": np.arange(n, dtype=np.int64), "payload": np.arange(n) % 7 - 3.0})
    src = write_parquet(tmp_path / "src.parquet", table, [1000, 1000], compression=codec,
                        use_dictionary=False)
    bad = tmp_path / "pagecorrupt.parquet"
    _corrupt_column_chunk(src, bad, column=1, row_group=1)
    with pytest.raises(Exception):  # precondition: the corruption is detectable at all
        pq.read_table(str(bad))
    filt = "payload > 0" if how == "expression" else \
        pqloader.Predicate(["payload"], lambda b: pc.greater(b["payload"], 0))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        read_all(str(bad), columns=["id"], batch_size=100, filter=filt)
    msg = str(ei.value)
    assert "pagecorrupt.parquet" in msg and "row group 1" in msg
    assert "payload" in msg


def test_corrupt_page_error_surfaces_after_good_batches_and_iteration_then_stops(tmp_path):
    d = tmp_path / "d"
    for i in range(3):
        write_parquet(d / f"f{i}.parquet", _gzip_table(600, seed=i), [300, 300], compression="gzip", use_dictionary=False)
    good = d / "f3.src"
    write_parquet(good, _gzip_table(600, seed=9), [300, 300], compression="gzip", use_dictionary=False)
    _corrupt_column_chunk(good, d / "f3.parquet", column=1, row_group=1)
    good.unlink()

    loader = pqloader.Loader(str(d), batch_size=50, num_workers=4, _debug_max_delay_us=500)
    it = iter(loader)

    def consume_until_error():
        n = 0
        try:
            for _ in it:
                n += 1
        except pqloader.InvalidDataError as e:
            return n, e
        return n, None

    n_good, err = run_with_timeout(consume_until_error, timeout=60)
    assert err is not None, "corrupt page was not reported"
    assert "f3.parquet" in str(err)
    assert n_good >= 1  # the error is raised at the consumer's next(), not at construction

    def next_again():
        try:
            next(it)
        except StopIteration:
            return "stop"
        except pqloader.Error:
            return "error"
        return "batch"

    assert run_with_timeout(next_again, timeout=30) in ("stop", "error")
    assert run_with_timeout(next_again, timeout=30) in ("stop", "error")


@pytest.mark.parametrize("num_workers", [1, 4])
def test_error_in_worker_does_not_hang_with_small_inflight_budget(tmp_path, num_workers):
    d = tmp_path / "d"
    write_dataset(d, [[100, 100]] * 4)
    bad = d / "part-004.parquet"
    bad.write_bytes(b"garbage" * 100)

    def run():
        with pytest.raises(pqloader.InvalidDataError, match="part-004"):
            collect(pqloader.Loader(str(d), batch_size=8, num_workers=num_workers, max_inflight_bytes=4096))

    run_with_timeout(run, timeout=60)


def test_breaking_out_of_iteration_early_does_not_hang(tmp_path):
    d = tmp_path / "d"
    write_dataset(d, [[200, 200]] * 5)

    def run():
        for _ in range(5):
            loader = pqloader.Loader(str(d), batch_size=10, num_workers=4, max_inflight_bytes=8192)
            for b in itertools.islice(iter(loader), 2):
                pass
            del loader
        return True

    assert run_with_timeout(run, timeout=60)


# ---------------------------------------------------------------------------
# columns and types
# ---------------------------------------------------------------------------


def _unsupported_table() -> pa.Table:
    n = 4
    return pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "los": pa.array([[{"a": i, "b": float(i)}] for i in range(n)]),
            "mp": pa.array([[("k", i)] for i in range(n)], type=pa.map_(pa.string(), pa.int64())),
            "lol": pa.array([[[i], [i, i]] for i in range(n)], type=pa.list_(pa.list_(pa.int32()))),
            "nul": pa.array([None] * n, type=pa.null()),
        }
    )


@pytest.mark.parametrize(
    "column,keyword", [("los", "struct"), ("mp", "map"), ("lol", "list"), ("nul", "null")]
)
def test_unsupported_column_type_raises_at_construction_naming_column_and_type(tmp_path, column, keyword):
    p = write_parquet(tmp_path / "u.parquet", _unsupported_table())
    with pytest.raises(pqloader.UnsupportedTypeError) as ei:
        pqloader.Loader(str(p), columns=["id", column])
    msg = str(ei.value)
    assert column in msg
    assert keyword in msg.lower()
    assert isinstance(ei.value, TypeError)


def test_unsupported_column_among_default_columns_raises_at_construction(tmp_path):
    p = write_parquet(tmp_path / "u.parquet", _unsupported_table())
    with pytest.raises(pqloader.UnsupportedTypeError):
        pqloader.Loader(str(p))


def test_file_with_unsupported_columns_reads_fine_when_they_are_not_selected(tmp_path):
    p = write_parquet(tmp_path / "u.parquet", _unsupported_table())
    got = read_all(str(p), columns=["id"])
    assert list(got) == ["id"]
    assert got["id"].tolist() == [0, 1, 2, 3]


def test_nonexistent_column_raises_column_not_found_naming_it(tmp_path):
    p = write_parquet(tmp_path / "a.parquet", id_table(10))
    with pytest.raises(pqloader.ColumnNotFoundError) as ei:
        read_all(str(p), columns=["id", "no_such_column"])
    assert isinstance(ei.value, KeyError)
    assert "no_such_column" in str(ei.value)


def test_a_missing_column_of_a_wide_file_lists_fifty_names_not_all(tmp_path):
    # 8,000 columns made a message of 63 KB, every name listed.
    pq.write_table(pa.table({f"c{i}": [i] for i in range(2000)}), tmp_path / "w.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError) as ei:
        pqloader.Loader(str(tmp_path), columns=["nope"])
    msg = str(ei.value)
    assert "'nope'" in msg and "'c0' 'c1'" in msg and "'c49' ... and 1950 more" in msg and "'c50'" not in msg
    assert len(msg) < 2000


def test_null_mask_of_every_name_of_a_wide_file_equals_null_mask_true(tmp_path):
    # Each column was compared with every name (quadratic: 9 s at 20,000 columns); a
    # struct's name asks for its leaves, a leaf's for itself.
    n = 3000
    table = pa.table({**{f"c{i}": pa.array([1.0, None]) for i in range(n)},
                      "s": pa.array([{"a": 1, "b": None}, None], pa.struct([("a", pa.int64()), ("b", pa.int64())]))})
    pq.write_table(table, tmp_path / "w.parquet")
    listed = pqloader.Loader(str(tmp_path), batch_size=2, null_mask=[f"c{i}" for i in range(n)] + ["s"])
    whole = pqloader.Loader(str(tmp_path), batch_size=2, null_mask=True)
    assert list(listed.column_info) == list(whole.column_info)
    assert "s.a_valid" in listed.column_info and "s.b_valid" in listed.column_info
    leaf = pqloader.Loader(str(tmp_path), batch_size=2, columns=["s"], null_mask=["s.b"], fill_null={"s.a": 0})
    assert list(leaf.column_info) == ["s.a", "s.b", "s.b_valid"]


# ---------------------------------------------------------------------------
# schema mismatch
# ---------------------------------------------------------------------------


def test_type_mismatch_between_files_names_both_files_column_and_types(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "first.parquet", pa.table({"id": pa.array([1, 2], pa.int64()), "value_col": pa.array([1.0, 2.0], pa.float64())}))
    write_parquet(d / "second.parquet", pa.table({"id": pa.array([3, 4], pa.int64()), "value_col": pa.array([1, 2], pa.int32())}))
    with pytest.raises(pqloader.SchemaMismatchError) as ei:
        read_all(str(d))
    msg = str(ei.value)
    assert "first.parquet" in msg and "second.parquet" in msg
    assert "value_col" in msg
    assert "double" in msg or "float64" in msg
    assert "int32" in msg
    assert isinstance(ei.value, pqloader.InvalidDataError)


def test_type_mismatch_in_an_unselected_column_is_not_an_error(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "first.parquet", pa.table({"id": pa.array([1, 2], pa.int64()), "value_col": pa.array([1.0, 2.0], pa.float64())}))
    write_parquet(d / "second.parquet", pa.table({"id": pa.array([3, 4], pa.int64()), "value_col": pa.array([1, 2], pa.int32())}))
    assert read_all(str(d), columns=["id"])["id"].tolist() == [1, 2, 3, 4]


def test_column_missing_from_one_file_is_null_there_and_refused_without_a_fill(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "first.parquet", pa.table({"id": pa.array([1, 2], pa.int64()), "extra_col": pa.array([1, 2], pa.int16())}))
    write_parquet(d / "second.parquet", pa.table({"id": pa.array([3, 4], pa.int64())}))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(d))  # refused when made: no batch is read
    msg = str(ei.value)
    assert "extra_col" in msg and "second.parquet" in msg and "lacks the column" in msg
    got = read_all(str(d), fill_null={"extra_col": -1})
    assert got["extra_col"].tolist() == [1, 2, -1, -1] and got["extra_col"].dtype == np.int16


def _two_files_of_four_row_groups(d, second):
    """first.parquet: k 0-7, x without nulls; second.parquet: `second` (k 0-7); row groups of 4."""
    d.mkdir(parents=True)
    k = pa.array(range(8), pa.int64())
    pq.write_table(pa.table({"k": k, "x": pa.array(range(8), pa.int64())}), d / "first.parquet", row_group_size=4)
    pq.write_table(second, d / "second.parquet", row_group_size=4)


def test_nulls_that_a_filter_keeps_are_refused_at_construction_naming_file_and_row_group(tmp_path):
    # The filter kept part of second.parquet's row group 0, so its footers' counts were
    # not trusted for the whole file: the null of row group 1, which the filter keeps
    # whole, failed mid-epoch, after batches were handed out.
    d = tmp_path / "d"
    k = pa.array(range(8), pa.int64())
    _two_files_of_four_row_groups(d, pa.table({"k": k, "x": pa.array([0, 1, 2, 3, 4, 5, None, 7], pa.int64())}))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(d), batch_size=4, filter=pc.field("k") > 1)
    msg = str(ei.value)
    assert "column 'x'" in msg and "second.parquet' (row group 1)" in msg and "fill_null" in msg, msg
    # Nothing proven (the filter may drop the null, and does): no refusal, none is read.
    got = read_all(str(d), batch_size=4, filter=pc.field("k") != 6)
    assert sorted(got["k"].tolist()) == sorted([0, 1, 2, 3, 4, 5, 7] * 2)
    # One value per row: a filter keeping 3 of a row group's 4 rows, 2 of them null, keeps one.
    d2 = tmp_path / "d2"
    _two_files_of_four_row_groups(d2, pa.table({"k": k, "x": pa.array([0, 1, 2, 3, 4, None, None, 7], pa.int64())}))
    with pytest.raises(pqloader.InvalidDataError, match=r"has at least 1 null value\(s\): 1 in "):
        pqloader.Loader(str(d2), batch_size=4, filter=pc.field("k") != 6)


def test_a_column_missing_from_a_file_under_a_filter_is_refused_at_construction(tmp_path):
    d = tmp_path / "d"
    _two_files_of_four_row_groups(d, pa.table({"k": pa.array(range(8), pa.int64())}))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(d), batch_size=4, filter=pc.field("k") > 1)  # failed after a batch
    msg = str(ei.value)
    assert "column 'x'" in msg and "second.parquet" in msg and "lacks the column" in msg, msg
    assert "has 6 null value(s)" in msg, msg  # the rows the filter keeps, exactly
    got = read_all(str(d), batch_size=4, filter=pc.field("k") > 1, fill_null={"x": -1})
    assert sorted(got["x"].tolist()) == [-1] * 6 + [2, 3, 4, 5, 6, 7]


def test_a_null_partition_key_under_a_filter_is_refused_at_construction_naming_the_file(tmp_path):
    d = tmp_path / "d"
    t = pa.table({"k": pa.array(range(8), pa.int64())})
    (d / "g=1").mkdir(parents=True)
    (d / "g=__HIVE_DEFAULT_PARTITION__").mkdir()
    pq.write_table(t, d / "g=1" / "a.parquet", row_group_size=4)
    pq.write_table(t, d / "g=__HIVE_DEFAULT_PARTITION__" / "b.parquet", row_group_size=4)
    # It failed after a batch, without naming the file: "partition key 'g' is null ...".
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(d), batch_size=4, filter=pc.field("k") > 1)
    msg = str(ei.value)
    assert "column 'g'" in msg and "b.parquet" in msg and "has 6 null value(s)" in msg, msg
    got = read_all(str(d), batch_size=4, filter=pc.field("k") > 1, fill_null={"g": -1})
    assert sorted(got["g"].tolist()) == [-1] * 6 + [1] * 6


def test_the_null_count_from_the_footers_names_the_first_row_group_with_nulls(tmp_path):
    d = tmp_path / "d"
    _two_files_of_four_row_groups(d, pa.table({"k": pa.array(range(8), pa.int64()),
                                               "x": pa.array([0, 1, 2, 3, 4, 5, None, 7], pa.int64())}))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(d))
    assert "has 1 null value(s): 1 in '" in str(ei.value) and "second.parquet' (row group 1)" in str(ei.value)


def test_fixed_size_list_size_mismatch_is_a_schema_mismatch(tmp_path):
    d = tmp_path / "d"
    a = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(6, np.float32)), 3)
    b = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float32)), 4)
    write_parquet(d / "first.parquet", pa.table({"emb": a}))
    write_parquet(d / "second.parquet", pa.table({"emb": b}))
    with pytest.raises(pqloader.SchemaMismatchError, match="emb"):
        read_all(str(d))


def test_a_valid_encoding_arrow_cannot_decode_is_not_called_corrupt(tmp_path):
    # Dictionary strings stored with DELTA_BYTE_ARRAY: valid Parquet that Arrow C++ 25
    # does not decode into a dictionary (pyarrow refuses it too). The error names the
    # column and says what is missing, not "corrupt or truncated".
    strings = pa.array([f"s{i % 7}" for i in range(100)]).dictionary_encode()
    path = tmp_path / "delta_dict.parquet"
    pq.write_table(pa.table({"s": strings}), path, use_dictionary=False,
                   column_encoding={"s": "DELTA_BYTE_ARRAY"})
    with pytest.raises(Exception):
        pq.read_table(path)
    with pytest.raises(pqloader.InvalidDataError) as e:
        collect(pqloader.Loader(str(path), columns=["s"], batch_size=10))
    message = str(e.value)
    assert "'s'" in message and "delta_dict.parquet" in message
    assert "does not implement" in message and "corrupt" not in message


def test_a_column_named_like_a_struct_field_is_told_apart_from_it(tmp_path):
    # 'a.b' beside struct a{b}: both would be the output column 'a.b'. The default
    # selection is refused naming both; either loads alone.
    pq.write_table(pa.table({"a.b": [1, 2], "a": [{"b": 10}, {"b": 20}]}), tmp_path / "p.parquet")
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"two columns would be named 'a\.b': the column 'a\.b' and field 'b' "
                             r"of struct 'a'.*columns="):
        pqloader.Loader(str(tmp_path))
    assert collect(pqloader.Loader(str(tmp_path), columns=["a.b"]))["a.b"].tolist() == [1, 2]
    assert collect(pqloader.Loader(str(tmp_path), columns=["a"]))["a.b"].tolist() == [10, 20]


def test_a_file_rewritten_under_the_loader_is_said_to_have_changed(tmp_path):
    # It reads as corrupt (the footer the loader holds no longer matches the bytes): the
    # error says the file changed since it was listed.
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": np.arange(1000)}), path, row_group_size=300)
    loader = pqloader.Loader(str(tmp_path), batch_size=100)
    pq.write_table(pa.table({"id": np.arange(5000) * 7, "y": np.arange(5000.0)}), path,
                   row_group_size=300)
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"changed since the loader listed it \(\d+ bytes, now \d+\): make a new Loader"):
        collect(loader)


def test_a_file_deleted_under_the_loader_is_not_found_naming_it(tmp_path):
    # A storage error, but of a file that is gone: DataNotFoundError (a FileNotFoundError,
    # errno ENOENT), saying it is gone; the file before it was read in full.
    for name, n in (("a", 1000), ("b", 500)):
        pq.write_table(pa.table({"id": np.arange(n)}), tmp_path / f"{name}.parquet", row_group_size=300)
    loader = pqloader.Loader(str(tmp_path), batch_size=100)
    (tmp_path / "b.parquet").unlink()
    seen = []
    with pytest.raises(FileNotFoundError, match=r"b\.parquet' is gone: make a new Loader") as e:
        for b in loader:
            seen.extend(b["id"].tolist())
    assert isinstance(e.value, pqloader.DataNotFoundError) and e.value.errno == errno.ENOENT
    assert seen == list(range(1000))


def test_a_path_with_brackets_that_exists_is_read_as_it_is(tmp_path):
    # '[' is a glob's wildcard too: a name that has one and exists is itself.
    d = tmp_path / "run[1]"
    d.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), d / "p[0].parquet")
    for source in (d / "p[0].parquet", d, tmp_path / "run[[]1]" / "*.parquet"):
        assert collect(pqloader.Loader(str(source)))["a"].tolist() == [1, 2], source
    with pytest.raises(pqloader.DataNotFoundError, match="matches no files"):
        pqloader.Loader(str(tmp_path / "run[2]" / "*.parquet"))


def test_a_local_path_with_a_star_or_question_mark_that_exists_is_read_as_it_is(tmp_path):
    # Read as a glob, 'q?x.parquet' also read 'qax.parquet' (twice where listed too),
    # and 'a*b.parquet' every 'a...b.parquet': rows of other files, duplicated rows.
    for name, other in (("q?x.parquet", "qax.parquet"), ("a*b.parquet", "a-long-b.parquet")):
        pq.write_table(pa.table({"a": [1]}), tmp_path / name)
        pq.write_table(pa.table({"a": [2]}), tmp_path / other)
        assert collect(pqloader.Loader(str(tmp_path / name)))["a"].tolist() == [1], name
        listed = [str(tmp_path / name), str(tmp_path / other)]
        assert sorted(collect(pqloader.Loader(listed))["a"].tolist()) == [1, 2], name
    d = tmp_path / "what?"
    d.mkdir()
    (tmp_path / "whats").mkdir()
    pq.write_table(pa.table({"a": [3]}), d / "p.parquet")
    pq.write_table(pa.table({"a": [4]}), tmp_path / "whats" / "p.parquet")
    assert collect(pqloader.Loader(str(d)))["a"].tolist() == [3]


def test_a_glob_that_spells_a_hidden_prefix_names_those_files(tmp_path):
    # As a shell's `_*` or `.*`: "matches no files" before, though '_y.parquet' matched.
    for name, a in (("_y.parquet", 1), (".z.parquet", 2), ("w.parquet", 3)):
        pq.write_table(pa.table({"a": [a]}), tmp_path / name)
    (tmp_path / "_part").mkdir()
    pq.write_table(pa.table({"a": [4]}), tmp_path / "_part" / "p.parquet")
    pq.write_table(pa.table({"a": [5]}), tmp_path / "_part" / "_hidden.parquet")
    assert collect(pqloader.Loader(str(tmp_path / "_*.parquet")))["a"].tolist() == [1]
    assert collect(pqloader.Loader(str(tmp_path / ".*")))["a"].tolist() == [2]
    assert collect(pqloader.Loader(str(tmp_path / "_*" / "*.parquet")))["a"].tolist() == [4]
    assert sorted(collect(pqloader.Loader(str(tmp_path / "*")))["a"].tolist()) == [3]  # still skipped
    assert collect(pqloader.Loader(str(tmp_path / "_part")))["a"].tolist() == [4]


def test_a_glob_spelling_underscore_does_not_read_summaries_and_a_slash_names_directories(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    collector = []
    for i, name in enumerate(["_part-0.parquet", "_part-1.parquet"]):
        table = pa.table({"id": pa.array(range(10 * i, 10 * i + 3), pa.int64())})
        pq.write_table(table, ds / name, metadata_collector=collector)
        collector[-1].set_file_path(name)
    pq.write_metadata(table.schema, ds / "_metadata", metadata_collector=collector)
    pq.write_metadata(table.schema, ds / "_common_metadata")
    assert sorted(collect(pqloader.Loader(str(ds / "_*")))["id"].tolist()) == [0, 1, 2, 10, 11, 12]
    runs = tmp_path / "runs"
    for name, a in (("run1", 1), ("run2", 2)):
        (runs / name).mkdir(parents=True)
        pq.write_table(pa.table({"a": [a]}), runs / name / "p.parquet")
    pq.write_table(pa.table({"a": [3]}), runs / "run-x.parquet")
    assert sorted(collect(pqloader.Loader(str(runs / "run*") + "/"))["a"].tolist()) == [1, 2]
    assert sorted(collect(pqloader.Loader(str(runs / "run*")))["a"].tolist()) == [1, 2, 3]


def test_a_summary_named_as_a_source_is_refused_as_a_summary(tmp_path):
    # README: summaries are never read as data. Named itself, it was read as data and
    # refused as corrupt ("Couldn't deserialize thrift ... page header").
    collector = []
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "p.parquet", metadata_collector=collector)
    collector[-1].set_file_path("p.parquet")
    pq.write_metadata(pa.schema([("id", pa.int64())]), tmp_path / "_metadata", metadata_collector=collector)
    pq.write_metadata(pa.schema([("id", pa.int64())]), tmp_path / "_common_metadata")
    for source in (tmp_path / "_metadata", [str(tmp_path / "p.parquet"), str(tmp_path / "_common_metadata")]):
        with pytest.raises(pqloader.InvalidDataError, match="is a summary .* give its directory"):
            pqloader.Loader(source)
    assert collect(pqloader.Loader(str(tmp_path)))["id"].tolist() == [1, 2]


@pytest.mark.parametrize("kw", [{}, {"fill_null": 0}, {"null_mask": True, "fill_null": 0}])
def test_fixed_size_lists_with_null_rows_are_refused_before_any_batch(tmp_path, kw):
    # Arrow C++ cannot read them back (apache/arrow#35692): the loader was built, and the
    # epoch failed mid-way calling the valid file corrupt (no fill_null could help).
    pq.write_table(pa.table({"l": pa.array([[1, 2]] * 10, pa.list_(pa.int32(), 2))}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"l": pa.array([[1, 2], None] * 5, pa.list_(pa.int32(), 2))}), tmp_path / "1.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"'l'.*1\.parquet', row group 0 has null rows.*35692"):
        pqloader.Loader(str(tmp_path), batch_size=4, **kw)


def test_fixed_size_lists_under_a_null_struct_and_of_size_0_are_refused(tmp_path):
    inner = pa.struct([("i", pa.list_(pa.int64(), 2))])
    pq.write_table(pa.table({"s": pa.array([{"o": {"i": [1, 2]}}, {"o": None}], pa.struct([("o", inner)]))}),
                   tmp_path / "a.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"'s\.o\.i'.*a\.parquet.*null rows"):
        pqloader.Loader(str(tmp_path), columns=["s.o.i"], batch_size=2, fill_null=0)
    zero = tmp_path / "zero"
    zero.mkdir()
    pq.write_table(pa.table({"z": pa.array([[], []], pa.list_(pa.float32(), 0))}), zero / "z.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"'z'.*z\.parquet.*size 0"):
        pqloader.Loader(str(zero), batch_size=2)


def test_fixed_size_lists_with_null_values_inside_still_load(tmp_path):
    pq.write_table(pa.table({"l": pa.array([[1, None], [3, 4]], pa.list_(pa.int32(), 2))}), tmp_path / "a.parquet")
    b = next(iter(pqloader.Loader(str(tmp_path), batch_size=2, fill_null=-1)))
    assert b["l"].tolist() == [[1, -1], [3, 4]]


def test_an_unsupported_type_names_the_file_that_has_it(tmp_path):
    for i in range(3):
        pq.write_table(pa.table({"x": pa.nulls(2), "y": [1, 2]}), tmp_path / f"{i}.parquet")
    pq.write_table(pa.table({"x": pa.array([[[1]], []], pa.list_(pa.list_(pa.int32()))), "y": [1, 2]}),
                   tmp_path / "3.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"'x'.*list<element: list.*the type of '.*3\.parquet'"):
        pqloader.Loader(str(tmp_path), batch_size=2)


def test_a_null_inner_fixed_size_list_is_not_called_a_null_row(tmp_path):
    # [[1, 2], None] in a fixed_size_list of fixed_size_lists: no row is null, one inner
    # list is (Arrow C++ cannot read it back either); the refusal said "has null rows".
    t = pa.list_(pa.list_(pa.int32(), 2), 2)
    pq.write_table(pa.table({"v": pa.array([[[1, 2], None], [[3, 4], [5, 6]]], t)}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError,
                       match=r"'v'.*a\.parquet', row group 0 has null rows or null inner lists.*35692"):
        pqloader.Loader(str(tmp_path), batch_size=2, fill_null=0)
