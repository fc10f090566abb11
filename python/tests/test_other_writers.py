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
