"""Values read by pqloader equal pyarrow.parquet.read_table (natural order)."""

from __future__ import annotations

import glob
import itertools
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import (
    assert_batch_sizes,
    assert_batch_streams_equal,
    assert_column_equal,
    assert_columns_equal,
    batch_len,
    collect,
    concat_batches,
    id_table,
    ids_of,
    random_layout,
    read_expected,
    table_to_expected,
    to_expected,
    write_dataset,
    write_parquet,
)

# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def all_types_table(n: int, start: int, seed: int) -> pa.Table:
    """Every type the contract lists as supported, no nulls."""
    rng = np.random.default_rng(seed * 1_000_003 + start)
    ids = np.arange(start, start + n, dtype=np.int64)

    def ints(dtype):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)

    words = np.array(["alpha", "beta", "", "gamma", "δέλτα", "e\x00f", "x" * 40])
    strs = [f"{words[i % len(words)]}-{int(v)}" for i, v in enumerate(ids)]
    blobs = [bytes(rng.integers(0, 256, int(rng.integers(0, 12)), dtype=np.uint8)) for _ in range(n)]
    f64 = rng.standard_normal(n)
    f64[::17] = np.nan
    f64[5::23] = -0.0
    f64[7::29] = np.inf
    f32 = rng.standard_normal(n).astype(np.float32)
    f32[3::19] = np.nan
    f16 = (rng.standard_normal(n) * 100).astype(np.float16)
    f16[2::31] = np.nan
    fsl_vals = rng.standard_normal(n * 3).astype(np.float32)
    fsl2_vals = rng.integers(-(2**15), 2**15, n * 6, dtype=np.int16)
    lst_vals = rng.standard_normal(n * 4).astype(np.float32)
    llst_vals = rng.integers(-(2**62), 2**62, 2 * n, dtype=np.int64)
    ts = rng.integers(0, 2_000_000_000_000_000, n, dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids),
            "i8": pa.array(ints(np.int8)),
            "i16": pa.array(ints(np.int16)),
            "i32": pa.array(ints(np.int32)),
            "i64": pa.array(ints(np.int64)),
            "u8": pa.array(ints(np.uint8)),
            "u16": pa.array(ints(np.uint16)),
            "u32": pa.array(ints(np.uint32)),
            "u64": pa.array(ints(np.uint64)),
            "f16": pa.array(f16),
            "f32": pa.array(f32),
            "f64": pa.array(f64),
            "flag": pa.array(rng.integers(0, 2, n).astype(bool)),
            "s": pa.array(strs, type=pa.string()),
            "ls": pa.array(strs[::-1], type=pa.large_string()),
            "b": pa.array(blobs, type=pa.binary()),
            "lb": pa.array(blobs[::-1], type=pa.large_binary()),
            "dict_s": pa.array([str(words[i % 4]) for i in range(n)], type=pa.string()).dictionary_encode(),
            "ts_us_utc": pa.array(ts // 1000, type=pa.timestamp("us", tz="UTC")),
            "ts_ms_ny": pa.array(ts // 1_000_000, type=pa.timestamp("ms", tz="America/New_York")),
            "ts_ns": pa.array(ts, type=pa.timestamp("ns")),
            "d32": pa.array(rng.integers(-10_000, 30_000, n, dtype=np.int32), type=pa.date32()),
            "d64": pa.array(rng.integers(-10_000, 30_000, n, dtype=np.int64) * 86_400_000, type=pa.date64()),
            "t32": pa.array(rng.integers(0, 86_400_000, n, dtype=np.int32), type=pa.time32("ms")),
            "t64": pa.array(rng.integers(0, 86_400_000_000, n, dtype=np.int64), type=pa.time64("us")),
            "t64ns": pa.array(rng.integers(0, 86_400_000_000_000, n, dtype=np.int64), type=pa.time64("ns")),
            "dur": pa.array(rng.integers(-(10**12), 10**12, n, dtype=np.int64), type=pa.duration("us")),
            "fsl": pa.FixedSizeListArray.from_arrays(pa.array(fsl_vals), 3),
            "fsl2": pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(fsl2_vals), 2), 3),
            "lst": pa.ListArray.from_arrays(pa.array(np.arange(0, 4 * n + 1, 4, dtype=np.int32)), pa.array(lst_vals)),
            "llst": pa.LargeListArray.from_arrays(
                pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int64)), pa.array(llst_vals, type=pa.int64())
            ),
        }
    )


EXPECTED_INFO = {
    # name: (dtype, per-row shape)
    "id": ("int64", ()),
    "i8": ("int8", ()),
    "i16": ("int16", ()),
    "i32": ("int32", ()),
    "i64": ("int64", ()),
    "u8": ("uint8", ()),
    "u16": ("uint16", ()),
    "u32": ("uint32", ()),
    "u64": ("uint64", ()),
    "f16": ("float16", ()),
    "f32": ("float32", ()),
    "f64": ("float64", ()),
    "flag": ("bool", ()),
    "s": ("str", ()),
    "ls": ("str", ()),
    "b": ("bytes", ()),
    "lb": ("bytes", ()),
    "dict_s": ("str", ()),
    "ts_us_utc": ("int64", ()),
    "ts_ms_ny": ("int64", ()),
    "ts_ns": ("int64", ()),
    "d32": ("int32", ()),
    "t32": ("int32", ()),
    "t64": ("int64", ()),
    "t64ns": ("int64", ()),
    "dur": ("int64", ()),
    "fsl": ("float32", (3,)),
    "fsl2": ("int16", (3, 2)),
    "lst": ("float32", (4,)),
    "llst": ("int64", (2,)),
}

TYPES_LAYOUT = [[300, 7, 450], [1], [512], [129, 129, 3], [640, 200]]  # 2371 rows, uneven row groups


@pytest.fixture(scope="module")
def types_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("types")
    paths = write_dataset(root, TYPES_LAYOUT, all_types_table, seed=3)
    return root, paths


@pytest.fixture(scope="module")
def types_expected(types_dataset):
    _, paths = types_dataset
    return table_to_expected(read_expected(paths))


def _expected_batches(expected: dict, batch_size: int, drop_last: bool = False) -> list[dict]:
    n = len(next(iter(expected.values())))
    out = []
    for s in range(0, n, batch_size):
        e = min(s + batch_size, n)
        if drop_last and e - s < batch_size:
            break
        out.append({k: v[s:e] for k, v in expected.items()})
    return out


# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [97, 256, 5000])
def test_every_supported_type_reads_equal_to_pyarrow_in_natural_order(types_dataset, types_expected, batch_size):
    root, _ = types_dataset
    loader = pqloader.Loader(str(root), batch_size=batch_size)
    batches = list(loader)
    n = len(types_expected["id"])
    assert_batch_sizes(batches, batch_size, n)
    assert_columns_equal(concat_batches(batches), types_expected)


def test_batches_match_pyarrow_batch_by_batch_across_row_group_and_file_boundaries(types_dataset, types_expected):
    root, _ = types_dataset
    batches = list(pqloader.Loader(str(root), batch_size=131, num_workers=3))
    assert_batch_streams_equal(batches, _expected_batches(types_expected, 131))


def test_batch_values_have_documented_python_types(types_dataset):
    root, _ = types_dataset
    batch = next(iter(pqloader.Loader(str(root), batch_size=10)))
    assert isinstance(batch, dict)
    for name, (dtype, shape) in EXPECTED_INFO.items():
        col = batch[name]
        if dtype in ("str", "bytes"):
            assert isinstance(col, list), name
            assert all(type(x) is (str if dtype == "str" else bytes) for x in col), name
        else:
            assert isinstance(col, np.ndarray), name
            assert col.dtype == np.dtype(dtype), name
            assert col.shape == (10, *shape), name
    assert batch["flag"].dtype == np.bool_


def test_column_info_reports_numpy_dtype_row_shape_and_arrow_type(types_dataset):
    root, paths = types_dataset
    loader = pqloader.Loader(str(root))
    info = loader.column_info
    schema = pq.read_schema(str(paths[0]))
    assert set(info) == set(schema.names)
    for name, (dtype, shape) in EXPECTED_INFO.items():
        assert info[name]["dtype"] == dtype, name
        if name in ("lst", "llst"):
            # a list's length is only known once data is read: the schema says -1
            assert tuple(info[name]["shape"]) == (-1,), name
        else:
            assert tuple(info[name]["shape"]) == shape, name
    for name in ["i8", "u64", "f16", "s", "lb", "ts_us_utc", "ts_ms_ny", "t32", "dur", "fsl", "fsl2", "lst", "llst"]:
        assert info[name]["arrow_type"] == str(schema.field(name).type), name


@pytest.mark.parametrize(
    "columns", [["id"], ["s", "id"], ["fsl2", "dict_s", "f16"], ["lst", "b", "ts_ms_ny", "flag"]]
)
def test_projection_returns_exactly_the_selected_columns(types_dataset, types_expected, columns):
    root, _ = types_dataset
    got = collect(pqloader.Loader(str(root), columns=columns, batch_size=200))
    assert_columns_equal(got, {c: types_expected[c] for c in columns}, ordered=False)


def test_many_small_files_with_random_row_group_sizes_read_in_natural_order(tmp_path):
    rng = np.random.default_rng(11)
    layout = random_layout(rng, num_files=23, rg_min=1, rg_max=90, max_rgs=4)
    paths = write_dataset(tmp_path / "d", layout)
    n = sum(map(sum, layout))
    got = collect(pqloader.Loader(str(tmp_path / "d"), batch_size=64, num_workers=4))
    np.testing.assert_array_equal(got["id"], np.arange(n, dtype=np.int64))
    assert_columns_equal(got, table_to_expected(read_expected(paths)))


def test_a_file_with_zero_rows_contributes_nothing(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", id_table(10, 0))
    write_parquet(d / "b.parquet", id_table(0, 10), [0])
    write_parquet(d / "c.parquet", id_table(5, 10))
    got = collect(pqloader.Loader(str(d), batch_size=4))
    np.testing.assert_array_equal(got["id"], np.arange(15, dtype=np.int64))


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------


def test_single_file_path_source(tmp_path):
    p = write_parquet(tmp_path / "one.parquet", id_table(100), [30, 70])
    got = collect(pqloader.Loader(str(p), batch_size=33))
    assert_columns_equal(got, table_to_expected(pq.read_table(str(p))))


def test_file_url_source_reads_the_same_as_the_path(tmp_path):
    p = write_parquet(tmp_path / "one.parquet", id_table(100), [30, 70])
    got = collect(pqloader.Loader(p.resolve().as_uri(), batch_size=33))
    assert p.resolve().as_uri().startswith("file://")
    assert_columns_equal(got, table_to_expected(pq.read_table(str(p))))


def test_file_url_directory_source(tmp_path):
    paths = write_dataset(tmp_path / "d", [[10], [5, 5]])
    got = collect(pqloader.Loader((tmp_path / "d").resolve().as_uri(), batch_size=7))
    assert_columns_equal(got, table_to_expected(read_expected(paths)))


def test_glob_source_matches_sorted_files_only(tmp_path):
    d = tmp_path / "d"
    write_dataset(d, [[10], [11], [12]], name="b-{i}.parquet")
    # not matched by the glob
    write_parquet(d / "a-0.other", id_table(5, 1000))
    write_parquet(d / "zz.parquet.bak", id_table(5, 2000))
    pattern = str(d / "*.parquet")
    expected_paths = sorted(glob.glob(pattern))
    assert len(expected_paths) == 3
    got = collect(pqloader.Loader(pattern, batch_size=8))
    assert_columns_equal(got, table_to_expected(read_expected(expected_paths)))


def test_a_directory_a_glob_matches_is_read_whole(tmp_path):
    # As a directory source is: recursively, hive keys included ('run*' matched run2/ and
    # its files were skipped, silently). Hidden directories stay hidden.
    write_parquet(tmp_path / "run1" / "lang=de" / "a.parquet", id_table(3, 0))
    write_parquet(tmp_path / "run2" / "lang=en" / "b.parquet", id_table(2, 10))
    write_parquet(tmp_path / "run2" / "_tmp" / "c.parquet", id_table(2, 20))
    write_parquet(tmp_path / "other" / "lang=fr" / "d.parquet", id_table(2, 30))
    got = collect(pqloader.Loader(str(tmp_path / "run*"), batch_size=4))
    assert got["id"].tolist() == [0, 1, 2, 10, 11]
    assert list(got["lang"]) == ["de", "de", "de", "en", "en"]
    got = collect(pqloader.Loader(str(tmp_path / "run*" / "*" / "*.parquet"), batch_size=4))
    assert got["id"].tolist() == [0, 1, 2, 10, 11]  # files at that depth
    with pytest.raises(pqloader.DataNotFoundError, match="matches no files"):
        pqloader.Loader(str(tmp_path / "run*" / "*.parquet"))  # no file at that depth
    assert collect(pqloader.Loader(str(tmp_path / "**"), batch_size=9))["id"].tolist() == \
        [30, 31, 0, 1, 2, 10, 11]


def test_glob_is_sorted_by_path_not_by_creation_order(tmp_path):
    d = tmp_path / "d"
    # written in reverse name order, ids increase with write order
    write_parquet(d / "c.parquet", id_table(3, 0))
    write_parquet(d / "a.parquet", id_table(3, 3))
    write_parquet(d / "b.parquet", id_table(3, 6))
    got = collect(pqloader.Loader(str(d / "*.parquet"), batch_size=4))
    assert got["id"].tolist() == [3, 4, 5, 6, 7, 8, 0, 1, 2]


def test_explicit_list_of_paths_keeps_the_given_order(tmp_path):
    paths = write_dataset(tmp_path / "d", [[4], [3, 2], [6]])
    order = [paths[2], paths[0], paths[1]]
    got = collect(pqloader.Loader([str(p) for p in order], batch_size=5))
    assert_columns_equal(got, table_to_expected(read_expected(order)))
    assert got["id"].tolist() == [9, 10, 11, 12, 13, 14, 0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_directory_is_recursive_sorted_and_skips_hidden_and_underscore_names(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "b" / "x.parquet", id_table(4, 4))
    write_parquet(d / "a" / "y.parquet", id_table(4, 0))
    write_parquet(d / "a" / "z" / "deep.parquet", id_table(2, 8))  # a/z/deep sorts after a/y
    write_parquet(d / "c.parquet", id_table(3, 10))
    # skipped:
    write_parquet(d / ".hidden.parquet", id_table(5, 100))
    write_parquet(d / "_tmp.parquet", id_table(5, 200))
    write_parquet(d / "_temporary" / "p.parquet", id_table(5, 300))
    write_parquet(d / ".staging" / "p.parquet", id_table(5, 400))
    (d / "_SUCCESS").write_bytes(b"")
    got = collect(pqloader.Loader(str(d), batch_size=6))
    # sorted by path: a/y, a/z/deep, b/x, c
    assert got["id"].tolist() == [0, 1, 2, 3, 8, 9, 4, 5, 6, 7, 10, 11, 12]


def test_hive_partition_columns_are_int64_when_all_values_are_integers_else_str(tmp_path):
    d = tmp_path / "d"
    parts = [("2021", "eu"), ("2021", "us"), ("2022", "eu"), ("10", "apac")]
    sizes = [5, 7, 3, 4]
    start = 0
    entries = []
    for (year, region), n in zip(parts, sizes):
        p = d / f"year={year}" / f"region={region}" / "data.parquet"
        write_parquet(p, id_table(n, start), [n])
        entries.append((str(p), year, region, n))
        start += n
    entries.sort(key=lambda e: e[0])  # files sorted by path: year=10 < year=2021 < year=2022
    loader = pqloader.Loader(str(d), batch_size=6)
    got = collect(loader)
    exp_ids = np.concatenate([pq.read_table(e[0])["id"].to_numpy() for e in entries])
    np.testing.assert_array_equal(got["id"], exp_ids)
    exp_year = np.concatenate([np.full(e[3], int(e[1]), dtype=np.int64) for e in entries])
    assert_column_equal(got["year"], exp_year, "year")
    exp_region = [e[2] for e in entries for _ in range(e[3])]
    assert_column_equal(got["region"], exp_region, "region")
    assert loader.column_info["year"]["dtype"] == "int64"
    assert loader.column_info["region"]["dtype"] == "str"


def test_hive_partition_column_with_one_non_integer_value_is_str(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "bucket=1" / "a.parquet", id_table(2, 0))
    write_parquet(d / "bucket=2" / "a.parquet", id_table(2, 2))
    write_parquet(d / "bucket=x3" / "a.parquet", id_table(2, 4))
    loader = pqloader.Loader(str(d), batch_size=4)
    got = collect(loader)
    assert_column_equal(got["bucket"], ["1", "1", "2", "2", "x3", "x3"], "bucket")
    assert got["id"].tolist() == list(range(6))
    assert loader.column_info["bucket"]["dtype"] == "str"


def test_hive_partition_column_can_be_projected(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "shard=3" / "a.parquet", id_table(3, 0))
    write_parquet(d / "shard=7" / "a.parquet", id_table(2, 3))
    got = collect(pqloader.Loader(str(d), columns=["shard", "id"], batch_size=2))
    assert sorted(got) == ["id", "shard"]
    assert got["shard"].tolist() == [3, 3, 3, 7, 7]
    assert got["id"].tolist() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------
# batching, epochs, len
# ---------------------------------------------------------------------------


@pytest.fixture
def small_ds(tmp_path):
    layout = [[13, 40], [7], [25, 1, 14]]  # 100 rows
    write_dataset(tmp_path / "d", layout)
    return str(tmp_path / "d"), 100


@pytest.mark.parametrize("batch_size,drop_last", [(7, False), (7, True), (10, False), (10, True), (100, True), (101, True), (1, False)])
def test_batch_sizes_and_drop_last(small_ds, batch_size, drop_last):
    src, n = small_ds
    loader = pqloader.Loader(src, batch_size=batch_size, drop_last=drop_last)
    batches = list(loader)
    assert_batch_sizes(batches, batch_size, n, drop_last)
    kept = len(batches) * batch_size if drop_last else n
    assert ids_of(batches) == list(range(min(kept, n)))
    assert len(loader) == len(batches)
    assert loader.num_rows == n


def test_num_epochs_yields_that_many_natural_order_epochs(small_ds):
    src, n = small_ds
    loader = pqloader.Loader(src, batch_size=30, num_epochs=3)
    assert len(loader) == 4
    batches = list(loader)
    assert [batch_len(b) for b in batches] == [30, 30, 30, 10] * 3
    assert ids_of(batches) == list(range(n)) * 3
    assert loader.epoch == 3


def test_each_new_iter_continues_the_epoch_count(small_ds):
    src, n = small_ds
    loader = pqloader.Loader(src, batch_size=32, num_epochs=1, shuffle=True, seed=5)
    assert loader.epoch == 0
    e0 = list(loader)
    assert loader.epoch == 1
    e1 = list(loader)
    assert loader.epoch == 2
    both = list(pqloader.Loader(src, batch_size=32, num_epochs=2, shuffle=True, seed=5))
    assert_batch_streams_equal(e0 + e1, both)
    assert ids_of(e0) != ids_of(e1)


def test_num_epochs_none_is_endless(small_ds):
    src, n = small_ds
    loader = pqloader.Loader(src, batch_size=25, num_epochs=None)
    first = list(itertools.islice(iter(loader), 4 * 7 + 2))
    assert ids_of(first) == (list(range(n)) * 8)[: 25 * 30]


def test_len_is_batches_per_epoch(small_ds):
    src, n = small_ds
    for bs in (1, 3, 7, 99, 100, 101, 1000):
        assert len(pqloader.Loader(src, batch_size=bs)) == math.ceil(n / bs)
        assert len(pqloader.Loader(src, batch_size=bs, drop_last=True)) == n // bs
        assert len(pqloader.Loader(src, batch_size=bs, num_epochs=5)) == math.ceil(n / bs)


def test_num_rows_is_rows_per_epoch(small_ds):
    src, n = small_ds
    assert pqloader.Loader(src).num_rows == n
    assert pqloader.Loader(src, drop_last=True, batch_size=33).num_rows == n


# ---------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------


def test_numeric_batch_arrays_do_not_own_a_copy(types_dataset):
    root, _ = types_dataset
    for batch in itertools.islice(iter(pqloader.Loader(str(root), batch_size=500, columns=["id", "f32", "fsl2"])), 3):
        for name in ("id", "f32", "fsl2"):
            arr = batch[name]
            assert arr.base is not None or not arr.flags.owndata, name


def test_batch_arrays_can_be_handed_to_torch_via_dlpack(types_dataset, types_expected):
    torch = pytest.importorskip("torch")
    root, _ = types_dataset
    batch = next(iter(pqloader.Loader(str(root), batch_size=64, columns=["i64", "f32", "fsl"])))
    for name in ("i64", "f32", "fsl"):
        t = torch.from_dlpack(batch[name])
        np.testing.assert_array_equal(t.numpy(), types_expected[name][:64])


def test_batches_stay_valid_after_later_batches_are_produced(types_dataset, types_expected):
    root, _ = types_dataset
    batches = list(pqloader.Loader(str(root), batch_size=100, columns=["id", "f64", "fsl2", "s"], num_workers=4))
    got = concat_batches(batches)  # batches are only read after the whole epoch was produced
    assert_columns_equal(got, {c: types_expected[c] for c in ["id", "f64", "fsl2", "s"]}, ordered=False)


# ---------------------------------------------------------------------------
# nulls
# ---------------------------------------------------------------------------


@pytest.fixture
def nulls_ds(tmp_path):
    d = tmp_path / "d"
    write_parquet(
        d / "a.parquet",
        pa.table(
            {
                "id": pa.array(np.arange(6, dtype=np.int64)),
                "x": pa.array([1.5, None, 3.5, 4.5, 5.5, 6.5], type=pa.float64()),
                "cnt": pa.array([1, 2, 3, None, 5, None], type=pa.int32()),
                "label": pa.array(["a", "b", None, "d", "e", "f"], type=pa.string()),
            }
        ),
        [3, 3],
    )
    return d


def test_nulls_raise_invalid_data_error_naming_column_and_file(nulls_ds):
    with pytest.raises(pqloader.InvalidDataError) as ei:
        collect(pqloader.Loader(str(nulls_ds), columns=["id", "cnt"], batch_size=4))
    msg = str(ei.value)
    assert "cnt" in msg and "a.parquet" in msg
    assert isinstance(ei.value, ValueError)
    assert "null" in msg.lower()


def test_nulls_in_a_string_column_raise_invalid_data_error(nulls_ds):
    with pytest.raises(pqloader.InvalidDataError, match="label"):
        collect(pqloader.Loader(str(nulls_ds), columns=["label"], batch_size=4))


def test_unselected_columns_with_nulls_do_not_matter(nulls_ds):
    got = collect(pqloader.Loader(str(nulls_ds), columns=["id"], batch_size=4))
    assert got["id"].tolist() == list(range(6))


def test_scalar_fill_null_fills_every_numeric_column(nulls_ds):
    got = collect(pqloader.Loader(str(nulls_ds), columns=["id", "x", "cnt"], batch_size=4, fill_null=-1))
    assert_column_equal(got["x"], np.array([1.5, -1.0, 3.5, 4.5, 5.5, 6.5]), "x")
    assert_column_equal(got["cnt"], np.array([1, 2, 3, -1, 5, -1], dtype=np.int32), "cnt")
    assert_column_equal(got["id"], np.arange(6, dtype=np.int64), "id")


def test_per_column_fill_null_dict(nulls_ds):
    got = collect(
        pqloader.Loader(str(nulls_ds), batch_size=5, fill_null={"x": 0.25, "cnt": 9, "label": "<missing>"})
    )
    assert_column_equal(got["x"], np.array([1.5, 0.25, 3.5, 4.5, 5.5, 6.5]), "x")
    assert_column_equal(got["cnt"], np.array([1, 2, 3, 9, 5, 9], dtype=np.int32), "cnt")
    assert got["label"] == ["a", "b", "<missing>", "d", "e", "f"]


@pytest.mark.parametrize("arrow_type, fill, rounded", [
    (pa.float32(), 2**24 + 1, 2**24), (pa.float64(), 2**53 + 1, 2**53), (pa.float16(), 2049, 2048)])
def test_an_integer_fill_a_float_column_would_round_is_refused(tmp_path, arrow_type, fill, rounded):
    # It loaded rounded (2**24 + 1 as 2**24, a value of the data), where pyarrow's
    # fill_null refuses it and integers in the files load only exactly.
    pq.write_table(pa.table({"v": pa.array([1, None], arrow_type)}), tmp_path / "f.parquet")
    with pytest.raises(ValueError, match=rf"fill_null={fill} is not exact in column 'v' \(.*it would be {rounded}\)"):
        pqloader.Loader(str(tmp_path), fill_null=fill)
    with pytest.raises(ValueError, match=rf"fill_null\['v'\]={fill} is not exact"):
        pqloader.Loader(str(tmp_path), fill_null={"v": fill})
    got = collect(pqloader.Loader(str(tmp_path), fill_null=rounded))["v"]
    assert got.tolist() == [1.0, float(rounded)]
    assert collect(pqloader.Loader(str(tmp_path), fill_null=0.1))["v"][1] == np.dtype(got.dtype).type(0.1)


def test_bytes_fill_null_of_a_string_column_must_be_utf8(nulls_ds):
    # Refused when made, naming the argument, not at decode as the file's "row 2" data.
    with pytest.raises(ValueError, match=r"fill_null\['label'\].*not valid UTF-8") as ei:
        pqloader.Loader(str(nulls_ds), columns=["label"], batch_size=4, fill_null={"label": b"\xff"})
    assert not isinstance(ei.value, pqloader.InvalidDataError)
    got = collect(pqloader.Loader(str(nulls_ds), columns=["label"], batch_size=4, fill_null=b"\xc3\xa9"))
    assert got["label"] == ["a", "b", "\u00e9", "d", "e", "f"]
    got = collect(pqloader.Loader(str(nulls_ds), columns=["label"], batch_size=4, strings="bytes",
                                  fill_null=b"\xff"))
    assert got["label"][2] == b"\xff"


@pytest.mark.parametrize("dictionary", [False, True])
def test_a_fixed_size_binary_fill_must_have_the_columns_width(tmp_path, dictionary):
    # A 1-byte fill among 3-byte values would be a value the column cannot hold.
    b = pa.array([b"abc", None, b"xyz"], pa.binary(3))
    pq.write_table(pa.table({"b": b.dictionary_encode() if dictionary else b}), tmp_path / "f.parquet")
    with pytest.raises(ValueError, match=r"fill_null\['b'\]=b'Q' is not 3 bytes long.*fixed_size_binary\[3\]"):
        pqloader.Loader(str(tmp_path), batch_size=3, fill_null={"b": b"Q"})
    with pytest.raises(ValueError, match=r"fill_null='' is not 3 bytes long"):
        pqloader.Loader(str(tmp_path), batch_size=3, fill_null="")
    assert collect(pqloader.Loader(str(tmp_path), batch_size=3, fill_null="QQQ"))["b"] == [b"abc", b"QQQ", b"xyz"]


def test_the_null_hint_of_a_fixed_size_binary_column_is_a_fill_that_works(tmp_path):
    # It said fill_null={'x': ''}, which the width check then refused.
    pq.write_table(pa.table({"x": pa.array([b"abc", None], pa.binary(3))}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.InvalidDataError) as e:
        pqloader.Loader(str(tmp_path))
    fill = eval(re.search(r"fill_null=(\{.*?\})", str(e.value)).group(1))
    assert fill == {"x": b"\x00\x00\x00"}
    assert collect(pqloader.Loader(str(tmp_path), fill_null=fill))["x"] == [b"abc", b"\x00\x00\x00"]


def test_fill_null_dict_without_an_entry_for_a_null_column_still_raises(nulls_ds):
    with pytest.raises(pqloader.InvalidDataError, match="cnt"):
        collect(pqloader.Loader(str(nulls_ds), columns=["x", "cnt"], batch_size=4, fill_null={"x": 0.0}))


# ---------------------------------------------------------------------------
# lists
# ---------------------------------------------------------------------------


def test_list_column_with_non_uniform_lengths_raises_naming_the_column(tmp_path):
    t = pa.table(
        {
            "id": pa.array(np.arange(6, dtype=np.int64)),
            "ragged": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0], [8.0, 9.0], [1.0, 2.0]], type=pa.list_(pa.float32())),
        }
    )
    p = write_parquet(tmp_path / "r.parquet", t, [3, 3])
    with pytest.raises(pqloader.Error) as ei:
        collect(pqloader.Loader(str(p), batch_size=2))
    assert "ragged" in str(ei.value)
    # without the ragged column the file reads fine
    assert collect(pqloader.Loader(str(p), columns=["id"]))["id"].tolist() == list(range(6))


def test_uniform_list_column_reads_as_2d_array(tmp_path):
    vals = np.arange(30, dtype=np.float64).reshape(10, 3)
    t = pa.table({"l": pa.array(vals.tolist(), type=pa.list_(pa.float64()))})
    p = write_parquet(tmp_path / "l.parquet", t, [4, 6])
    got = collect(pqloader.Loader(str(p), batch_size=3))
    assert_column_equal(got["l"], vals, "l")


# ---------------------------------------------------------------------------
# inspect, stats
# ---------------------------------------------------------------------------


def test_inspect_reports_files_rows_row_groups_sizes_compression_and_schema(tmp_path):
    d = tmp_path / "d"
    p0 = write_parquet(d / "a.parquet", id_table(30, 0), [10, 20], compression="snappy")
    p1 = write_parquet(d / "b.parquet", id_table(7, 30), [7], compression="zstd")
    info = pqloader.inspect(str(d))
    json.dumps(info)  # plain data
    assert info["num_files"] == 2
    assert info["num_rows"] == 37
    assert info["num_row_groups"] == 3
    files = info["files"]
    assert [Path(f["path"]).name for f in files] == ["a.parquet", "b.parquet"]
    assert [f["num_rows"] for f in files] == [30, 7]
    assert [f["num_row_groups"] for f in files] == [2, 1]
    assert [f["size_bytes"] for f in files] == [os.path.getsize(p0), os.path.getsize(p1)]
    assert "snappy" in str(files[0]["compression"]).lower()
    assert "zstd" in str(files[1]["compression"]).lower()
    schema = pq.read_schema(str(p0))
    assert info["schema"] == {f.name: str(f.type) for f in schema}
    # Columns of other codecs: each named (the first column's alone was).
    mixed = tmp_path / "m"
    mixed.mkdir()
    pq.write_table(pa.table({"a": [1, 2], "b": [3, 4], "c": [5, 6]}), mixed / "m.parquet",
                   compression={"a": "none", "b": "zstd", "c": "none"})
    assert pqloader.inspect(str(mixed))["files"][0]["compression"] == "uncompressed+zstd"


def test_stats_count_rows_batches_and_report_timings(small_ds):
    src, n = small_ds
    loader = pqloader.Loader(src, batch_size=30, num_epochs=2)
    batches = list(loader)
    st = loader.stats()
    json.dumps(st)
    assert st["rows"] == 2 * n
    assert st["batches"] == len(batches) == 8
    assert st["bytes_read"] > 0
    assert st["units_read"] == 2 * 6  # every row group once per epoch
    assert st["bytes_decoded"] > 0
    # Two epochs read and assembled data, and the consumer waited for it: every time
    # counter has grown (a counter that is not wired up stays 0).
    for key in ("read_seconds", "decode_seconds", "assemble_seconds", "wait_seconds", "engine_wait_seconds",
                "wall_seconds", "time_to_first_batch_seconds"):
        assert isinstance(st[key], float) and st[key] > 0, key
    assert st["engine_wait_seconds"] <= st["wait_seconds"]
    assert st["wait_fraction"] == st["wait_seconds"] / st["wall_seconds"]
    assert st["time_to_first_batch_seconds"] <= st["wall_seconds"]


def test_stats_before_iterating_are_zero(small_ds):
    src, _ = small_ds
    st = pqloader.Loader(src, batch_size=30).stats()
    for key in ("rows", "batches", "units_read", "bytes_read", "bytes_decoded"):
        assert st[key] == 0, key
    for key in ("read_seconds", "decode_seconds", "assemble_seconds", "wait_seconds", "wall_seconds", "wait_fraction"):
        assert st[key] == 0.0, key
    assert st["time_to_first_batch_seconds"] is None


def test_stage_times_are_parts_of_the_unit_time(small_ds):
    src, _ = small_ds
    loader = pqloader.Loader(src, batch_size=30, num_epochs=2)
    list(loader)
    st = loader.stats()
    assert st["decode_seconds"] > 0 and st["unit_seconds"] > 0
    # Waiting for bytes and decoding are steps of producing a unit, measured apart.
    assert st["read_seconds"] + st["decode_seconds"] <= st["unit_seconds"]
    assert st["decode_seconds"] != st["read_seconds"], "decode_seconds is an alias of read_seconds"
    assert st["transform_seconds"] == 0.0  # no transforms


# --- INT96 timestamps (Impala, Hive and Spark's default) -------------------------------

def _write_int96(path, values, **columns):
    table = pa.table({"ts": pa.array(values, pa.timestamp("ns") if isinstance(values[0], int) else pa.timestamp("us")),
                      **columns})
    pq.write_table(table, path, use_deprecated_int96_timestamps=True, row_group_size=4)
    assert pq.ParquetFile(path).schema.column(0).physical_type == "INT96"


@pytest.mark.parametrize("shuffle", [False, True])
def test_int96_timestamps_read_as_pyarrows_nanoseconds(tmp_path, shuffle):
    # Nanoseconds kept (Impala writes them), the edges of int64 nanoseconds included.
    ns = [0, 1, -1, 1_700_000_000_123_456_789, -5_000_000_000_000_000_001,
          np.iinfo(np.int64).max, np.iinfo(np.int64).min + 1, 86_399_999_999_999]
    _write_int96(tmp_path / "t.parquet", ns, id=np.arange(len(ns)))
    expected = pq.read_table(tmp_path / "t.parquet")["ts"].cast(pa.int64()).to_pylist()
    assert expected == ns
    got = collect(pqloader.Loader(str(tmp_path), batch_size=3, shuffle=shuffle, seed=2))
    assert [ns[i] for i in got["id"]] == got["ts"].tolist()


def test_int96_dates_outside_int64_nanoseconds_are_refused_not_wrapped(tmp_path):
    # Arrow converts INT96 to nanoseconds without a range check: 3000-01-01 came out as
    # 1830-11-23, silently.
    import datetime as dt

    import pyarrow.compute as pc
    days = [dt.datetime(2000, 1, 1), dt.datetime(2001, 1, 1), dt.datetime(2002, 1, 1),
            dt.datetime(2003, 1, 1), dt.datetime(2004, 1, 1), dt.datetime(3000, 1, 1)]
    _write_int96(tmp_path / "far.parquet", days, id=np.arange(6), keep=[1, 1, 1, 1, 1, 0])
    with pytest.raises(pqloader.InvalidDataError) as ei:
        collect(pqloader.Loader(str(tmp_path), batch_size=2))
    msg = str(ei.value)
    for part in ("far.parquet", "row group 1", "column 'ts'", "row 1", "3000-01-01", "INT96"):
        assert part in msg, msg
    # Rows a filter leaves out are not read, so not refused; the others are exact.
    got = collect(pqloader.Loader(str(tmp_path), batch_size=2, filter=pc.field("keep") == 1))
    assert got["ts"].tolist() == [int(pa.scalar(d, pa.timestamp("ns")).value) for d in days[:5]]
    # A filter on the column itself compares every row: refused when the Loader is made.
    with pytest.raises(pqloader.InvalidDataError, match="the filter's column 'ts'.*3000-01-01"):
        pqloader.Loader(str(tmp_path), filter=pc.field("ts") > pa.scalar(days[0], pa.timestamp("ns")))
    # Inside lists too (Spark writes array<timestamp> as INT96).
    nested = pa.table({"ts": pa.array([[days[0]], [days[1], days[5]], []], pa.list_(pa.timestamp("us")))})
    pq.write_table(nested, tmp_path / "nested.parquet", use_deprecated_int96_timestamps=True)
    with pytest.raises(pqloader.InvalidDataError, match="row 1 \\(3000-01-01\\)"):
        collect(pqloader.Loader(str(tmp_path / "nested.parquet"), lists={"ts": "ragged"}))


@pytest.mark.parametrize("unit", ["us", "ms", "s"])
def test_int96_dates_outside_nanoseconds_load_in_a_coarser_unit_as_pyarrow_reads_them(tmp_path, unit):
    # Spark's 9999-12-31 "end of time" and 0001-01-01, refused as nanoseconds, load with
    # coerce_int96_timestamp_unit as pyarrow's argument of that name reads them.
    import datetime as dt

    import pyarrow.compute as pc
    days = [dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1), dt.datetime(2000, 1, 1, 12),
            dt.datetime(1500, 6, 1), None, dt.datetime(1970, 1, 1, 0, 0, 0, 1)]
    _write_int96(tmp_path / "far.parquet", days[:1] + days[1:], id=np.arange(6))
    expected = pq.read_table(tmp_path / "far.parquet", coerce_int96_timestamp_unit=unit)
    assert expected["ts"].type == pa.timestamp(unit)
    want = pc.fill_null(expected["ts"].cast(pa.int64()), 0).to_pylist()
    for shuffle in (False, True):
        loader = pqloader.Loader(str(tmp_path), batch_size=4, shuffle=shuffle, seed=3, null_mask=True,
                                 coerce_int96_timestamp_unit=unit)
        assert loader.column_info["ts"]["arrow_type"] == f"timestamp[{unit}]"
        got = collect(loader)
        assert got["ts"].tolist() == [want[i] for i in got["id"]]
        assert got["ts_valid"].tolist() == [days[i] is not None for i in got["id"]]
    # A filter compares in that unit too (as nanoseconds, it refuses the file).
    got = collect(pqloader.Loader(str(tmp_path), batch_size=8, coerce_int96_timestamp_unit=unit,
                                  filter=pc.field("ts") > pa.scalar(dt.datetime(2262, 5, 1), pa.timestamp(unit))))
    assert got["id"].tolist() == [0]
    # Cached entries of one unit never serve another; a state of one refuses the other.
    cache = tmp_path / "cache"
    ns_path = tmp_path / "ns"
    ns_path.mkdir()
    _write_int96(ns_path / "a.parquet", [dt.datetime(2000, 1, 1, 0, 0, 1, 500)] * 4, id=np.arange(4))
    us = collect(pqloader.Loader(str(ns_path), cache_dir=str(cache), coerce_int96_timestamp_unit=unit))
    default = collect(pqloader.Loader(str(ns_path), cache_dir=str(cache)))
    assert default["ts"].tolist() == [pa.scalar(dt.datetime(2000, 1, 1, 0, 0, 1, 500), pa.timestamp("ns")).value] * 4
    assert us["ts"].tolist() == pq.read_table(ns_path, coerce_int96_timestamp_unit=unit)["ts"].cast(pa.int64()).to_pylist()
    state = pqloader.Loader(str(ns_path), coerce_int96_timestamp_unit=unit).state_dict()
    with pytest.raises(ValueError, match="int96"):
        pqloader.Loader(str(ns_path)).load_state_dict(state)
    pqloader.Loader(str(ns_path), coerce_int96_timestamp_unit=unit).load_state_dict(state)


def test_int96_dates_outside_microseconds_are_refused_not_wrapped(tmp_path):
    # Julian days beyond int64 microseconds (year 294247 on): a value no writer of dates
    # stores, refused as the nanosecond one is.
    t = pa.table({"ts": pa.array([0, 0], pa.timestamp("ns"))})
    pq.write_table(t, tmp_path / "t.parquet", use_deprecated_int96_timestamps=True, use_dictionary=False,
                   compression="none")
    raw = bytearray((tmp_path / "t.parquet").read_bytes())
    day0 = (2440588).to_bytes(4, "little")
    at = raw.index(bytes(8) + day0)  # the first value: nanoseconds of the day, Julian day
    raw[at + 8:at + 12] = (2440588 + 110_000_000).to_bytes(4, "little")
    (tmp_path / "t.parquet").write_bytes(bytes(raw))
    with pytest.raises(pqloader.InvalidDataError, match="row 0.*outside the dates int64 microseconds hold"):
        collect(pqloader.Loader(str(tmp_path), coerce_int96_timestamp_unit="us"))
    got = collect(pqloader.Loader(str(tmp_path), coerce_int96_timestamp_unit="ms"))
    assert got["ts"].tolist() == [110_000_000 * 86_400_000, 0]


def test_inspect_filter_reads_int96_in_the_unit_given(tmp_path):
    # inspect(filter=) on a Spark INT96 column holding 9999-12-31 refused it, asking for
    # coerce_int96_timestamp_unit='us', which inspect did not take.
    import datetime as dt

    import pyarrow.compute as pc
    _write_int96(tmp_path / "far.parquet", [dt.datetime(9999, 12, 31), dt.datetime(2000, 1, 1)], id=np.arange(2))
    flt = pc.field("ts") > pa.scalar(dt.datetime(2001, 1, 1), pa.timestamp("us"))
    with pytest.raises(pqloader.InvalidDataError, match="coerce_int96_timestamp_unit='us'"):
        pqloader.inspect(str(tmp_path), filter=flt)
    info = pqloader.inspect(str(tmp_path), filter=flt, coerce_int96_timestamp_unit="us")
    assert info["filter"]["rows_kept"] == 1
    assert info["schema"]["ts"] == "timestamp[us]"
    assert pqloader.inspect(str(tmp_path))["schema"]["ts"] == "timestamp[ns]"


def test_int96_beside_microsecond_files_names_the_unit_option(tmp_path):
    # A Spark table written before and after spark.sql.parquet.outputTimestampType changed:
    # the refusal named only rewriting the files.
    import datetime as dt
    _write_int96(tmp_path / "a.parquet", [dt.datetime(2000, 1, 1), dt.datetime(9999, 12, 31)], id=np.arange(2))
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us")), "id": [2]}),
                   tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="INT96.*coerce_int96_timestamp_unit='us'"):
        pqloader.Loader(str(tmp_path))
    with pytest.raises(pqloader.SchemaMismatchError, match="coerce_int96_timestamp_unit='us'"):
        pqloader.Loader(str(tmp_path / "a.parquet"), schema=pa.schema([("ts", pa.timestamp("us")), ("id", pa.int64())]))
    got = collect(pqloader.Loader(str(tmp_path), coerce_int96_timestamp_unit="us"))
    want = pq.read_table(tmp_path, coerce_int96_timestamp_unit="us")
    assert got["ts"].tolist() == want["ts"].cast(pa.int64()).to_pylist()


def test_coerce_int96_timestamp_unit_is_checked():
    with pytest.raises(ValueError, match="coerce_int96_timestamp_unit must be 'ns' or 'us'"):
        pqloader.Loader("nowhere", coerce_int96_timestamp_unit="days")


# --- Arrow extension types ---------------------------------------------------------------

def test_extension_columns_read_as_their_storage_and_tensors_in_their_shape(tmp_path):
    # Refused before ("unsupported type extension<...>"), though their storage is not.
    import uuid
    n = 7
    values = np.arange(n * 6, dtype=np.float32)
    tensor_type = pa.fixed_shape_tensor(pa.float32(), [2, 3])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(values), 6)
    table = pa.table({
        "id": np.arange(n),
        "t": pa.ExtensionArray.from_storage(tensor_type, storage),
        "b8": pa.ExtensionArray.from_storage(pa.bool8(), pa.array([1, 0, 2, -1, 0, 1, 0], pa.int8())),
        "u": pa.array([uuid.UUID(int=i).bytes for i in range(n)], pa.uuid()),
        "j": pa.array([f'{{"a": {i}}}' for i in range(n)], pa.json_()),
    })
    pq.write_table(table, tmp_path / "ext.parquet", row_group_size=3)
    for shuffle in (False, True):
        loader = pqloader.Loader(str(tmp_path), batch_size=4, shuffle=shuffle, seed=1)
        assert loader.column_info["t"]["shape"] == (2, 3) and loader.column_info["t"]["dtype"] == "float32"
        got = collect(loader)
        ids = got["id"]
        np.testing.assert_array_equal(got["t"], values.reshape(n, 2, 3)[ids])
        assert got["b8"].dtype == np.bool_ and got["b8"].tolist() == [bool(v) for v in np.array([1, 0, 2, -1, 0, 1, 0])[ids]]
        assert got["u"] == [uuid.UUID(int=int(i)).bytes for i in ids]
        assert got["j"] == [f'{{"a": {i}}}' for i in ids]
    # Filters see them as they are read (they failed to bind: "no kernel matching
    # extension<arrow.bool8>").
    got = collect(pqloader.Loader(str(tmp_path), batch_size=4, filter="b8 == True"))
    assert got["id"].tolist() == [0, 2, 3, 5]
    got = collect(pqloader.Loader(str(tmp_path), batch_size=4, filter='j == \'{"a": 3}\''))
    assert got["id"].tolist() == [3]
    # A tensor stored in another dimension order is not a row of its shape: refused.
    permuted = pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0])
    pq.write_table(pa.table({"p": pa.ExtensionArray.from_storage(permuted, storage)}), tmp_path / "p.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match="'p'"):
        pqloader.Loader(str(tmp_path / "p.parquet"))
