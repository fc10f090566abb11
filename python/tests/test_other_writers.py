"""Files written by DuckDB and Polars read equal to pyarrow's view of them."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_columns_equal, collect, table_to_expected

duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")


def _row_groups(path) -> list[int]:
    md = pq.ParquetFile(str(path)).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def _duckdb_file(path, n: int, row_group_size: int, compression: str = "snappy"):
    con = duckdb.connect()
    try:
        con.execute(
            f"""
            COPY (
              SELECT i::BIGINT AS id,
                     (i % 7 - 3)::INTEGER AS i32,
                     (i % 5)::TINYINT AS i8,
                     (i % 300)::USMALLINT AS u16,
                     (i * 2654435761)::UBIGINT AS u64,
                     (i * 0.5)::DOUBLE AS d,
                     (i * 0.25 - 100)::FLOAT AS f,
                     i % 3 = 0 AS flag,
                     'row_' || i::VARCHAR AS s,
                     'cat' || (i % 4)::VARCHAR AS low_card,
                     DATE '2020-01-01' + (i % 1000)::INTEGER AS dt,
                     TIMESTAMP '2021-01-01 00:00:00' + to_microseconds(i * 1000003) AS ts,
                     TIMESTAMPTZ '2021-01-01 00:00:00+00' + to_seconds(i) AS tstz,
                     TIME '01:02:03' + to_seconds(i % 3600) AS tm,
                     [i::DOUBLE, (i + 1)::DOUBLE, (i * 2)::DOUBLE] AS lst,
                     [i::INTEGER, 1, 2]::INTEGER[3] AS arr,
                     encode('b' || i::VARCHAR) AS blob
              FROM range({n}) t(i)
            ) TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE {row_group_size}, COMPRESSION {compression})
            """
        )
    finally:
        con.close()
    return path


@pytest.mark.parametrize("compression", ["snappy", "zstd", "uncompressed"])
def test_duckdb_file_reads_equal_to_pyarrow(tmp_path, compression):
    p = _duckdb_file(tmp_path / "duck.parquet", 5000, 1000, compression)
    assert len(_row_groups(p)) > 1, "precondition: several row groups"
    expected = table_to_expected(pq.read_table(str(p)))
    got = collect(pqloader.Loader(str(p), batch_size=333, num_workers=3))
    assert_columns_equal(got, expected)


def test_directory_of_duckdb_files_reads_in_natural_order(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    paths = [_duckdb_file(d / f"f{i}.parquet", 2500 + 100 * i, 1000) for i in range(3)]
    expected_tables = [pq.read_table(str(p)) for p in paths]
    got = collect(pqloader.Loader(str(d), columns=["id", "s", "lst"], batch_size=1000))
    for name in ("id", "lst"):
        exp = np.concatenate([table_to_expected(t.select([name]))[name] for t in expected_tables])
        np.testing.assert_array_equal(got[name], exp, strict=True)
    assert got["s"] == sum((t["s"].to_pylist() for t in expected_tables), [])


def _polars_frame(n: int, seed: int):
    rng = np.random.default_rng(seed)
    base = datetime.datetime(2020, 1, 1)
    return pl.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "i16": rng.integers(-30000, 30000, n, dtype=np.int16),
            "u8": rng.integers(0, 256, n, dtype=np.uint8),
            "u32": rng.integers(0, 2**32, n, dtype=np.uint32),
            "f32": rng.standard_normal(n).astype(np.float32),
            "f64": rng.standard_normal(n),
            "b": rng.integers(0, 2, n).astype(bool),
            "s": [f"s{i}-{'x' * (i % 5)}" for i in range(n)],
            "cat": pl.Series([f"c{i % 5}" for i in range(n)], dtype=pl.Categorical),
            "dt": pl.Series([datetime.date(2020, 1, 1) + datetime.timedelta(days=int(i % 500)) for i in range(n)]),
            "ts": pl.Series([base + datetime.timedelta(seconds=int(i) * 7) for i in range(n)]).dt.replace_time_zone("UTC"),
            "ts_naive_ms": pl.Series([base + datetime.timedelta(milliseconds=int(i)) for i in range(n)]).cast(
                pl.Datetime("ms")
            ),
            "dur": pl.Series([datetime.timedelta(milliseconds=int(i)) for i in range(n)]),
            "tm": pl.Series([datetime.time(1, 2, int(i % 60)) for i in range(n)]),
            "emb": pl.Series(rng.standard_normal((n, 3)).astype(np.float32), dtype=pl.Array(pl.Float32, 3)),
            "emb2": pl.Series(
                rng.integers(0, 100, (n, 2, 2)).astype(np.int32).tolist(), dtype=pl.Array(pl.Int32, (2, 2))
            ),
            "lst": pl.Series([[int(i), int(i) * 2] for i in range(n)], dtype=pl.List(pl.Int64)),
            "bin": pl.Series([bytes([i % 256, (i * 7) % 256]) for i in range(n)]),
        }
    )


@pytest.mark.parametrize("compression", ["snappy", "zstd", "lz4"])
def test_polars_file_reads_equal_to_pyarrow(tmp_path, compression):
    p = tmp_path / "pol.parquet"
    _polars_frame(3000, seed=1).write_parquet(str(p), row_group_size=700, compression=compression)
    assert len(_row_groups(p)) > 1, "precondition: several row groups"
    expected = table_to_expected(pq.read_table(str(p)))
    got = collect(pqloader.Loader(str(p), batch_size=256, num_workers=2))
    assert_columns_equal(got, expected)


def test_polars_dataset_with_statistics_off_and_small_row_groups(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    paths = []
    for i in range(3):
        p = d / f"p{i}.parquet"
        _polars_frame(1000 + 37 * i, seed=10 + i).write_parquet(str(p), row_group_size=150, statistics=False)
        paths.append(p)
    got = collect(pqloader.Loader(str(d), columns=["f64", "emb", "s"], batch_size=100))
    exp = [table_to_expected(pq.read_table(str(p), columns=["f64", "emb", "s"])) for p in paths]
    np.testing.assert_array_equal(got["f64"], np.concatenate([e["f64"] for e in exp]), strict=True)
    np.testing.assert_array_equal(got["emb"], np.concatenate([e["emb"] for e in exp]), strict=True)
    assert got["s"] == sum((e["s"] for e in exp), [])


def test_a_polars_int128_column_is_refused_as_unsupported(tmp_path):
    # Polars writes Int128 as INT(128) on 16 fixed bytes, which Arrow cannot read (nor
    # pyarrow): it was refused as corrupt data (InvalidDataError), the file valid.
    p = tmp_path / "i128.parquet"
    pl.DataFrame({"id": [1, 2], "big": pl.Series([1, -2], dtype=pl.Int128)}).write_parquet(str(p))
    with pytest.raises(Exception):
        pq.read_table(p)
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"i128\.parquet' has an integer column wider than 64 bits"):
        pqloader.Loader(str(p))


# ---------------------------------------------------------------------------
# One directory appended by several writers (same logical rows, disjoint ids)
# ---------------------------------------------------------------------------


def _mixed_rows(base: int, n: int = 120):
    import decimal

    import pyarrow as pa

    rows = [dict(
        id=base + i,
        i32=None if i % 11 == 0 else (i * 7919) % 100000 - 50000,
        f32=float(np.float32(i) / np.float32(3)),
        f64=None if i % 13 == 0 else i / 7,
        s=None if i % 5 == 0 else f"s{i}é" * (1 + i % 3),
        b=bytes([i % 256, (i * 3) % 256]) * (i % 4),
        d10=decimal.Decimal(i * 101 - 5000) / 100,
        dt=datetime.date(2020, 1, 1) + datetime.timedelta(days=3 * i),
        ts_us=datetime.datetime(2021, 3, 1) + datetime.timedelta(microseconds=i * 123456789),
        ts_utc=datetime.datetime(2022, 6, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=61 * i),
        tokens=None if i % 17 == 0 else list(range(i, i + i % 7)),
        emb=[float(np.float32(i + k / 8)) for k in range(4)],
        st=None if i % 19 == 0 else {"a": i % 50, "b": f"b{i}"},
    ) for i in range(n)]
    schema = pa.schema([
        ("id", pa.int64()), ("i32", pa.int32()), ("f32", pa.float32()), ("f64", pa.float64()), ("s", pa.string()),
        ("b", pa.binary()), ("d10", pa.decimal128(10, 2)), ("dt", pa.date32()), ("ts_us", pa.timestamp("us")),
        ("ts_utc", pa.timestamp("us", tz="UTC")), ("tokens", pa.list_(pa.int64())), ("emb", pa.list_(pa.float32())),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ])
    return rows, pa.Table.from_pylist(rows, schema=schema)


def _write_mixed_directory(d):
    import pandas as pd
    import pyarrow as pa

    def cast(t, kinds):
        return t.cast(pa.schema([pa.field(f.name, kinds.get(f.name, f.type)) for f in t.schema]))

    writers = {
        "pa_default": lambda p, t: pq.write_table(t, p, row_group_size=50),
        "pa_v1": lambda p, t: pq.write_table(t, p, version="1.0", row_group_size=64),
        "pa_v2_nodict": lambda p, t: pq.write_table(t, p, data_page_version="2.0", use_dictionary=False,
                                                    row_group_size=37),
        "pa_large": lambda p, t: pq.write_table(cast(t, {"s": pa.large_string(), "b": pa.large_binary(),
                                                         "tokens": pa.large_list(pa.int64())}), p),
        "pa_view": lambda p, t: pq.write_table(cast(t, {"s": pa.string_view(), "b": pa.binary_view()}), p),
        # pandas: nullable Int32, inferred decimal(4, 2), large_string, struct a: int64
        "pandas": lambda p, t: t.to_pandas(types_mapper={pa.int32(): pd.Int32Dtype()}.get).to_parquet(p),
        "polars": lambda p, t: pl.from_arrow(t).write_parquet(str(p), row_group_size=45),
        "duckdb": None,
    }
    for k, (name, write) in enumerate(writers.items()):
        p = d / f"{name}.parquet"
        _, t = _mixed_rows(1000 * (k + 1))
        if write is None:
            con = duckdb.connect()
            con.register("t", t)
            con.execute(f"COPY (SELECT * FROM t) TO '{p}' (FORMAT PARQUET, ROW_GROUP_SIZE 40)")
            con.close()
        else:
            write(p, t)
    return sorted(d.glob("*.parquet"))


def _rows_by_id(batches) -> dict:
    """id -> {column: value or None (masked)}; ragged tokens as lists."""
    out = {}
    for b in batches:
        ids = b["id"].tolist()
        for name, v in b.items():
            if name == "id" or name.endswith(("_valid", "_offsets")):
                continue
            valid = b.get(name + "_valid")
            if name + "_offsets" in b:
                off = b[name + "_offsets"]
                v = [v[off[k]:off[k + 1]].tolist() for k in range(len(ids))]
            for k, i in enumerate(ids):
                x = v[k].tolist() if isinstance(v[k], np.ndarray) else v[k]
                row = out.setdefault(i, {})
                assert name not in row, f"id {i} twice"
                row[name] = None if valid is not None and not valid[k] else x
    return out


def test_a_directory_appended_by_pyarrow_pandas_polars_and_duckdb_loads_each_row_as_its_file_reads(tmp_path):
    import pyarrow as pa

    files = _write_mixed_directory(tmp_path)
    cache = tmp_path / "cache"
    options = dict(null_mask=True, lists={"tokens": "ragged"}, batch_size=64, shuffle=True, seed=3, num_workers=2,
                   cache_dir=str(cache))
    loader = pqloader.Loader(str(tmp_path), **options)
    first, second = list(loader), list(loader)
    loader.close()
    again = pqloader.Loader(str(tmp_path), **options)  # every row group from the cache now
    replay = list(again), list(again)
    assert again.stats()["cache_hits"] > 0 and again.stats()["cache_misses"] == 0
    for a, b in zip(first + second, replay[0] + replay[1]):
        for name in a:
            assert (a[name] == b[name]) if isinstance(a[name], list) else a[name].tobytes() == b[name].tobytes()
    assert len(first) == len(replay[0])
    # dtypes: the unified ones (pandas' struct field a is int64: it widens st.a)
    assert {n: str(first[0][n].dtype) for n in ("i32", "f32", "d10", "dt", "ts_us", "ts_utc", "emb", "st.a")} == {
        "i32": "int32", "f32": "float32", "d10": "float64", "dt": "int32", "ts_us": "int64", "ts_utc": "int64",
        "emb": "float32", "st.a": "int64"}
    for epoch in (first, second):
        got = _rows_by_id(epoch)
        seen = 0
        for f in files:
            table = pq.read_table(f)
            table = table.cast(pa.schema([pa.field(x.name, pa.large_string() if x.type == pa.string_view() else
                                                   pa.large_binary() if x.type == pa.binary_view() else x.type)
                                          for x in table.schema]))
            for row in table.to_pylist():
                g = got[row["id"]]
                seen += 1
                st = row["st"] or {"a": None, "b": None}
                want = dict(row, ts_us=row["ts_us"] and pa.scalar(row["ts_us"], pa.timestamp("us")).value,
                            ts_utc=pa.scalar(row["ts_utc"], pa.timestamp("us", "UTC")).value,
                            dt=(row["dt"] - datetime.date(1970, 1, 1)).days,
                            d10=float(pa.array([row["d10"]], table["d10"].type).cast(pa.float64())[0].as_py()),
                            **{"st.a": st["a"], "st.b": st["b"]})
                del want["id"], want["st"]
                assert g == want, f.name
        assert seen == len(got)


def test_a_pandas_index_of_one_file_stays_where_other_files_store_it_as_data(tmp_path):
    # The index columns of every file's pandas metadata were left out of every file, and
    # out of a declared schema= too: a directory appended by pandas (set_index("id")) and
    # another tool lost 'id' silently, in every file.
    import pandas as pd
    import pyarrow as pa
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [1.0, 2.0]}), tmp_path / "a.parquet")
    # (not evenly spaced: pandas stores a RangeIndex in the metadata only)
    pd.DataFrame({"id": [3, 7, 8], "x": [3.0, 4.0, 4.5]}).set_index("id").to_parquet(tmp_path / "b.parquet")
    assert pq.read_schema(tmp_path / "b.parquet").pandas_metadata["index_columns"] == ["id"]
    got = collect(pqloader.Loader(str(tmp_path), batch_size=10))
    assert list(got) == ["id", "x"] and got["id"].tolist() == [1, 2, 3, 7, 8]
    assert "pandas index" not in pqloader.inspect(str(tmp_path))["loads_as"]["id"]
    # Alone, the pandas file's index is still left out unless selected ...
    assert list(collect(pqloader.Loader(str(tmp_path / "b.parquet")))) == ["x"]
    assert collect(pqloader.Loader(str(tmp_path / "b.parquet"), columns=["id"]))["id"].tolist() == [3, 7, 8]
    # ... or declared (another loader's arrow_schema too).
    declared = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    assert collect(pqloader.Loader(str(tmp_path / "b.parquet"), schema=declared))["id"].tolist() == [3, 7, 8]
    a = pqloader.Loader(str(tmp_path), columns=["id", "x"])
    assert list(collect(pqloader.Loader(str(tmp_path), schema=a.arrow_schema))) == ["id", "x"]


def test_a_pandas_index_that_is_also_a_partition_key_is_not_called_left_out_by_inspect(tmp_path):
    # The Loader loads a partition key whatever the files' pandas metadata say; inspect
    # said "pandas index: left out unless selected" for it.
    import pandas as pd
    (tmp_path / "id=1").mkdir()
    pd.DataFrame({"x": [1.0, 2.0, 5.0], "id": [1, 1, 1]}).set_index("id").to_parquet(tmp_path / "id=1" / "a.parquet")
    got = collect(pqloader.Loader(str(tmp_path), batch_size=10))
    assert sorted(got) == ["id", "x"] and got["id"].tolist() == [1, 1, 1]
    assert "pandas index" not in pqloader.inspect(str(tmp_path))["loads_as"]["id"]


def test_a_float_fill_of_a_uint64_column_at_or_above_2_63_loads_exactly(tmp_path):
    # DuckDB's UBIGINT (pandas' UInt64, Polars' UInt64) with a null: a float fill >= 2**63
    # went through int64 in C++ (undefined: x86 gave 2**63 for every such fill).
    p = tmp_path / "u.parquet"
    con = duckdb.connect()
    con.execute(f"COPY (SELECT CASE WHEN i = 1 THEN NULL ELSE (18446744073709551615 - i)::UBIGINT END AS u "
                f"FROM range(3) t(i)) TO '{p}' (FORMAT PARQUET)")
    con.close()
    for fill in (1.8e19, 9.3e18, 2.0**64 - 2048):
        for cache in (None, str(tmp_path / "cache")):
            got = collect(pqloader.Loader(str(p), fill_null={"u": fill}, cache_dir=cache))["u"]
            assert got.dtype == np.uint64 and got.tolist() == [2**64 - 1, int(fill), 2**64 - 3], fill
    # An int fill past int64 is refused, saying how to give a uint64 column's large fill.
    with pytest.raises(ValueError, match=r"must fit in int64, got 18446744073709551615 \(a uint64 column's fill"):
        pqloader.Loader(str(p), fill_null={"u": 2**64 - 1})
    # 2**64 - 1 has no float: the float the hint shows is named as another value, not as it.
    with pytest.raises(ValueError, match=r"no float is 18446744073709551615: the nearest below is "
                                         r"18446744073709549568 = 1\.844674407370955e\+19\)"):
        pqloader.Loader(str(p), fill_null={"u": 2**64 - 1})
    with pytest.raises(ValueError, match=r"a multiple of 2048: the engine takes integers as int64; "
                                         r"9\.2233720368547758e\+18\)"):
        pqloader.Loader(str(p), fill_null={"u": 2**63})
