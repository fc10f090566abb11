"""A Parquet conformance corpus written at test time by real writers (issue 13).

Apache's parquet-testing corpus (test_conformance.py) lives outside the repository and is
missing in a plain clone. This module writes, into a directory the caller gives, files
covering the same features with the writers installed beside the tests: pyarrow (Arrow
C++'s writer), DuckDB and Polars. Each writer option the corpus exercises is a case:

- encodings: PLAIN, dictionary (RLE_DICTIONARY, with a fallback to PLAIN inside a column
  chunk), RLE booleans, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY,
  BYTE_STREAM_SPLIT (on every leaf column whose physical type allows it, nested ones too);
- compressions: none, snappy, gzip, zstd, lz4 (raw), brotli;
- data page v1 and v2; format versions 1.0, 2.4, 2.6; small pages and row groups so that
  values cross many page and row-group boundaries;
- nulls (flat, in lists, in structs, whole null columns), nested lists / structs / maps,
  decimals (32/64-bit integers, fixed-length byte arrays, 256-bit), int96 timestamps,
  float16, page index, page checksums, bloom filters, no stored Arrow schema.

``hostile_files`` derives damaged files from a valid one: a flipped byte inside a
checksummed page (found by parsing the page headers, so the flip lands in a payload), and
truncated or inconsistent footers and page headers.

Everything is seeded: the same call writes the same bytes (DuckDB and Polars too).
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

N_ROWS = 1000  # rows per generated file: small, but many pages and row groups below

# ---------------------------------------------------------------------------
# the data
# ---------------------------------------------------------------------------


def _floats(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Random values with the special ones at fixed places: NaN, ±inf, -0.0, extremes."""
    a = (rng.standard_normal(n) * 1000).astype(dtype)
    info = np.finfo(dtype)
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, info.max, info.min, info.tiny, info.smallest_subnormal, 1.0]
    for k, v in enumerate(specials[: (n + 6) // 7]):
        a[7 * k] = dtype(v)
    return a


def _ints(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Full-range values (wide deltas), a sorted run and a constant run (narrow ones)."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    q = n // 4
    a[q : 2 * q] = np.sort(a[q : 2 * q])
    a[2 * q : 2 * q + 50] = info.max
    a[:2] = [info.min, info.max][: len(a)]
    return a


def _strings(rng: np.random.Generator, n: int) -> pa.Array:
    """Shared prefixes (for DELTA_BYTE_ARRAY), empty strings, non-ASCII, a few long ones."""
    kind, reps, long = rng.integers(0, 20, n), rng.integers(1, 5, n), rng.integers(200, 600, n)
    prefix = pc.utf8_lpad(pa.array(np.arange(n) // 7).cast(pa.string()), 5, "0")
    item = pa.array(rng.integers(0, 10**6, n)).cast(pa.string())
    return pc.case_when(
        pc.make_struct(pa.array(kind == 0), pa.array(kind == 1), pa.array(kind == 2)),
        "", pc.binary_repeat("é€😀", reps), pc.binary_repeat("x", long),
        pc.binary_join_element_wise("user/", prefix, "/item-", item, ""))


def _masked(rng: np.random.Generator, n: int, nulls: bool, rate: float = 0.15) -> np.ndarray | None:
    return (rng.random(n) < rate) if nulls else None


def _arrow_mask(rng: np.random.Generator, n: int, nulls: bool) -> pa.Array | None:
    mask = _masked(rng, n, nulls)
    return None if mask is None else pa.array(mask, type=pa.bool_())


def _offsets(lengths: np.ndarray, dtype=np.int32) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(dtype))


def _binaries(rng: np.random.Generator, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """Random bytes of the given lengths, one value each."""
    offsets = _offsets(lengths, np.int64 if typ == pa.large_binary() else np.int32)
    data = pa.py_buffer(rng.bytes(int(lengths.sum())))
    return pa.Array.from_buffers(typ, len(lengths), [None, offsets.buffers()[1], data])


def _decimals(unscaled: pa.Array, typ: pa.DataType) -> pa.Array:
    """Decimals of type ``typ`` whose unscaled integers are ``unscaled`` (integers, or
    decimals of scale 0)."""
    wide = unscaled.cast(pa.decimal256(76, 0))
    return pa.Array.from_buffers(pa.decimal256(76, typ.scale), len(wide), wide.buffers()).cast(typ)


def table_all_types(n: int = N_ROWS, seed: int = 0, nulls: bool = False) -> pa.Table:
    """One column per Arrow type the loader's contract names (README, "What a batch holds"),
    plus the ones it refuses. ``nulls``: about 15% nulls in every column but ``id``, inside
    lists and structs too, and one column that is null in every row."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    cols: dict[str, pa.Array] = {"id": pa.array(i.astype(np.int64))}

    def add(name, values, typ=None):
        mask = _masked(rng, n, nulls)
        if isinstance(values, np.ndarray):
            cols[name] = pa.array(values, type=typ, mask=mask)
        else:
            cols[name] = values if mask is None else pc.if_else(mask, pa.scalar(None, values.type), values)

    for dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        add(np.dtype(dt).name, _ints(rng, n, dt))
    add("f16", _floats(rng, n, np.float16))
    add("f32", _floats(rng, n, np.float32))
    add("f64", _floats(rng, n, np.float64))
    add("bool", rng.random(n) < 0.3)
    strings = _strings(rng, n)
    add("str", strings)
    add("large_str", strings[::-1].cast(pa.large_string()))
    add("bin", _binaries(rng, rng.integers(0, 24, n), pa.binary()))
    add("large_bin", _binaries(rng, rng.integers(0, 9, n), pa.large_binary()))
    add("fsb", pa.Array.from_buffers(pa.binary(6), n, [None, pa.py_buffer(rng.bytes(6 * n))]))
    cats = pa.array(["alpha", "beta", "", "δέλτα", "epsilon" * 20])
    idx = rng.integers(0, len(cats), n).astype(np.int32)
    cols["dict_str"] = pa.DictionaryArray.from_arrays(pa.array(idx, mask=_masked(rng, n, nulls)), cats)
    unscaled = rng.integers(-(10**9) + 1, 10**9, n)
    add("dec9", _decimals(pa.array(unscaled), pa.decimal128(9, 2)))
    add("dec18", _decimals(pa.array(unscaled * 10**8 + unscaled % 97), pa.decimal128(18, 6)))
    wide = pa.array(unscaled).cast(pa.decimal256(19, 0))
    add("dec38", _decimals(pc.subtract(pc.multiply(wide, pa.scalar(10**28, pa.decimal256(29, 0))), 17),
                           pa.decimal128(38, 10)))
    add("dec256", _decimals(pc.add(pc.multiply(wide, pa.scalar(10**30, pa.decimal256(31, 0))), 3),
                            pa.decimal256(40, 6)))
    add("date32", rng.integers(-20000, 40000, n).astype(np.int32), pa.date32())
    add("ts_ms", rng.integers(-(2**41), 2**41, n), pa.timestamp("ms"))
    add("ts_us", rng.integers(-(2**50), 2**50, n), pa.timestamp("us"))
    add("ts_ns", rng.integers(-(2**62), 2**62, n), pa.timestamp("ns"))
    add("ts_tz", rng.integers(0, 2**50, n), pa.timestamp("us", tz="Europe/Paris"))
    add("time32", rng.integers(0, 86_400_000, n).astype(np.int32), pa.time32("ms"))
    add("time64", rng.integers(0, 86_400_000_000_000, n), pa.time64("ns"))
    add("dur", rng.integers(-(2**40), 2**40, n), pa.duration("us"))
    # lists: one length in every row (a 2-D array), ragged (refused), of strings
    add("lst", pa.ListArray.from_arrays(_offsets(np.full(n, 3)),
                                        rng.integers(-(2**31), 2**31, 3 * n).astype(np.int32)))
    add("large_lst", pa.LargeListArray.from_arrays(_offsets(np.full(n, 2), np.int64), rng.standard_normal(2 * n)))
    lengths = rng.integers(0, 5, n)
    add("ragged", pa.ListArray.from_arrays(_offsets(lengths), rng.standard_normal(int(lengths.sum()))))
    lengths = rng.integers(0, 4, n)
    words = pa.array(["a", "bb", "", "çç"]).take(rng.integers(0, 4, int(lengths.sum())))
    add("lst_str", pa.ListArray.from_arrays(_offsets(lengths), words))
    fsl_vals = rng.standard_normal(n * 4).astype(np.float32)
    cols["fsl"] = pa.FixedSizeListArray.from_arrays(pa.array(fsl_vals), 4, mask=_arrow_mask(rng, n, nulls))
    inner = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(-999, 999, n * 6).astype(np.int16)), 2)
    cols["fsl2"] = pa.FixedSizeListArray.from_arrays(inner, 3)
    # struct (read leaf by leaf), with a nested struct
    d = pa.StructArray.from_arrays([pa.array(rng.standard_normal(n), mask=_masked(rng, n, nulls))], ["d"])
    b = pc.binary_join_element_wise("s", pa.array(i).cast(pa.string()), "")
    b_mask = _masked(rng, n, nulls)
    cols["st"] = pa.StructArray.from_arrays(
        [pa.array(_ints(rng, n, np.int32), mask=_masked(rng, n, nulls)),
         b if b_mask is None else pc.if_else(b_mask, pa.scalar(None, pa.string()), b), d],
        ["a", "b", "c"], mask=_arrow_mask(rng, n, nulls))
    # refused types: map, list of lists, list of structs, null
    lengths = i % 3
    j = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # 0, 1, .. in a row
    add("mp", pa.MapArray.from_arrays(_offsets(lengths), pc.binary_join_element_wise(
        "k", pa.array(j).cast(pa.string()), ""), pa.array((j * np.repeat(i, lengths)).astype(np.int32))))
    pairs = pa.ListArray.from_arrays(_offsets(np.tile([2, 1], n)),
                                     np.stack([i, i + 1, i], axis=1).ravel().astype(np.int32))
    add("lst_lst", pa.ListArray.from_arrays(_offsets(np.full(n, 2)), pairs))
    add("lst_st", pa.ListArray.from_arrays(_offsets(np.ones(n, np.int64)),
                                           pa.StructArray.from_arrays([pa.array(i.astype(np.int32))], ["x"])))
    cols["nul"] = pa.nulls(n)
    if nulls:
        cols["all_null_i64"] = pa.array([None] * n, type=pa.int64())
    return pa.table(cols)


# ---------------------------------------------------------------------------
# encodings by physical type
# ---------------------------------------------------------------------------

# Which physical types each encoding of Arrow C++'s writer accepts.
ENCODING_TYPES = {
    "DELTA_BINARY_PACKED": {"INT32", "INT64"},
    "DELTA_LENGTH_BYTE_ARRAY": {"BYTE_ARRAY"},
    "DELTA_BYTE_ARRAY": {"BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"},
    "BYTE_STREAM_SPLIT": {"FLOAT", "DOUBLE", "INT32", "INT64", "FIXED_LEN_BYTE_ARRAY"},
    "RLE": {"BOOLEAN"},
}


def leaf_columns(table: pa.Table, **write_kwargs) -> list[tuple[str, str]]:
    """(path, physical type) of every leaf column ``table`` is written as."""
    sink = pa.BufferOutputStream()
    pq.write_table(table.slice(0, 1), sink, **write_kwargs)
    schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return [(schema.column(i).path, schema.column(i).physical_type) for i in range(len(schema))]


def column_encoding_for(table: pa.Table, encoding: str, **write_kwargs) -> dict[str, str]:
    """``column_encoding=`` giving ``encoding`` to every leaf column that accepts it."""
    accepted = ENCODING_TYPES[encoding]
    return {path: encoding for path, phys in leaf_columns(table, **write_kwargs) if phys in accepted}


# ---------------------------------------------------------------------------
# the cases
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    write: Callable[[Path], None]
    checksums: bool = False  # pages carry CRCs: also read with verify_checksums=True


def _pa_case(name: str, nulls: bool = False, n: int = N_ROWS, encoding: str | None = None, **kw) -> Case:
    """``table_all_types`` written by ``pq.write_table(**kw)``; ``encoding``: that encoding
    on every leaf column that accepts it (dictionary off), PLAIN on the others."""

    def write(path: Path) -> None:
        t = table_all_types(n, seed=zlib.crc32(name.encode()), nulls=nulls)
        kwargs = dict(kw)
        if encoding is not None:
            kwargs["use_dictionary"] = False
            kwargs["column_encoding"] = column_encoding_for(t, encoding, **{
                k: v for k, v in kwargs.items() if k in ("version", "use_deprecated_int96_timestamps",
                                                         "store_decimal_as_integer", "store_schema")})
        pq.write_table(t, str(path), **kwargs)

    return Case(f"pyarrow-{name}", write, checksums=bool(kw.get("write_page_checksum")))


SMALL = dict(row_group_size=300, data_page_size=1024)  # 4 row groups, many pages per chunk

_PYARROW_CASES = [
    _pa_case("default"),
    *[_pa_case(f"{c}-v{v}", compression=c, data_page_version=f"{v}.0", **SMALL)
      for c in ("none", "snappy", "gzip", "zstd", "lz4", "brotli") for v in (1, 2)],
    _pa_case("plain-v1", use_dictionary=False, **SMALL),
    _pa_case("plain-v2", use_dictionary=False, data_page_version="2.0", **SMALL),
    *[_pa_case(f"{e.lower()}-v{v}-{c}", encoding=e, data_page_version=f"{v}.0", compression=c, **SMALL)
      for e in ENCODING_TYPES for v, c in ((1, "none"), (2, "zstd"))],
    # before 2.6 there are no nanoseconds: pyarrow truncates them to microseconds
    _pa_case("version-1.0", version="1.0", allow_truncated_timestamps=True, coerce_timestamps="us", **SMALL),
    _pa_case("version-2.4", version="2.4", allow_truncated_timestamps=True, coerce_timestamps="us", **SMALL),
    _pa_case("int96", use_deprecated_int96_timestamps=True, **SMALL),
    _pa_case("int96-v2-plain", use_deprecated_int96_timestamps=True, use_dictionary=False,
             data_page_version="2.0", **SMALL),
    _pa_case("page-index", write_page_index=True, **SMALL),
    _pa_case("checksums-v1", write_page_checksum=True, compression="none", **SMALL),
    _pa_case("checksums-v2-zstd", write_page_checksum=True, data_page_version="2.0", compression="zstd", **SMALL),
    _pa_case("bloom-filters", bloom_filter_options={c: {"ndv": N_ROWS, "fpp": 0.05}
                                                     for c in ("int64", "str", "dict_str", "fsb")}, **SMALL),
    _pa_case("decimals-as-integers", store_decimal_as_integer=True, **SMALL),
    _pa_case("decimals-as-integers-delta", store_decimal_as_integer=True, encoding="DELTA_BINARY_PACKED", **SMALL),
    _pa_case("no-arrow-schema", store_schema=False, **SMALL),
    _pa_case("non-compliant-nested", use_compliant_nested_type=False, **SMALL),
    _pa_case("tiny-pages", row_group_size=97, data_page_size=64, max_rows_per_page=7, write_batch_size=5),
    _pa_case("dictionary-fallback", dictionary_pagesize_limit=256, **SMALL),
    _pa_case("nulls-v1-dict", nulls=True, **SMALL),
    _pa_case("nulls-v2-plain-zstd", nulls=True, use_dictionary=False, data_page_version="2.0",
             compression="zstd", **SMALL),
    _pa_case("nulls-v2-delta", nulls=True, encoding="DELTA_BINARY_PACKED", data_page_version="2.0", **SMALL),
    _pa_case("nulls-v1-byte-stream-split", nulls=True, encoding="BYTE_STREAM_SPLIT", **SMALL),
    _pa_case("nulls-v1-delta-byte-array", nulls=True, encoding="DELTA_BYTE_ARRAY", **SMALL),
    _pa_case("nulls-tiny-pages-checksums", nulls=True, row_group_size=97, data_page_size=64,
             max_rows_per_page=7, write_page_checksum=True),
    # without statistics, nulls and ragged lists show only when the pages are decoded
    _pa_case("no-statistics", write_statistics=False, **SMALL),
    _pa_case("nulls-no-statistics-v2", nulls=True, write_statistics=False, data_page_version="2.0", **SMALL),
    _pa_case("empty", n=0),
]


_DUCKDB_QUERY = """
SELECT i::BIGINT AS id,
       ((i * 2654435761) % 4294967291 - 2147483645)::INTEGER AS i32,
       (i % 9 - 4)::TINYINT AS i8,
       (i * 48271 % 65521)::USMALLINT AS u16,
       (i * 2654435761)::UBIGINT AS u64,
       (i * 0.37 - 100)::DOUBLE AS f64,
       (i * 0.25 - 17)::FLOAT AS f32,
       i % 3 = 0 AS flag,
       'row_' || i::VARCHAR || repeat('x', (i % 13)::INTEGER) AS s,
       'cat' || (i % 4)::VARCHAR AS low_card,
       (i % 7 - 3)::DECIMAL(4, 1) AS dec4,
       (i * 1.5 - 300)::DECIMAL(9, 2) AS dec9,
       (i * 123456.789)::DECIMAL(18, 3) AS dec18,
       (i * 98765432109.12345)::DECIMAL(38, 5) AS dec38,
       i::HUGEINT * 1000000007 AS huge,
       DATE '2020-01-01' + (i % 1000)::INTEGER AS dt,
       TIMESTAMP '2021-01-01 00:00:00' + to_microseconds(i * 1000003) AS ts,
       TIMESTAMP_NS '2021-01-01 00:00:00' + to_microseconds(i * 7) AS ts_ns,
       TIMESTAMPTZ '2021-01-01 00:00:00+00' + to_seconds(i) AS tstz,
       TIME '01:02:03' + to_seconds(i % 3600) AS tm,
       encode('b' || i::VARCHAR) AS blob,
       CASE WHEN i % 5 = 0 THEN NULL ELSE i END AS with_nulls,
       CASE WHEN i % 11 = 0 THEN NULL ELSE 's' || i::VARCHAR END AS str_nulls,
       [i::DOUBLE, (i + 1)::DOUBLE, (i * 2)::DOUBLE] AS lst,
       [i::INTEGER, 1, 2]::INTEGER[3] AS arr,
       range(i % 4) AS ragged,
       ['a' || i::VARCHAR, 'b'] AS lst_str,
       {'a': i::INTEGER, 'b': 'v' || i::VARCHAR, 'c': {'d': i * 0.5}} AS st,
       CASE WHEN i % 7 = 0 THEN NULL ELSE [i, i + 1] END AS lst_nulls,
       [i, CASE WHEN i % 9 = 0 THEN NULL ELSE i END] AS lst_null_items,
       {'x': CASE WHEN i % 3 = 0 THEN NULL ELSE i END, 'y': i * 2} AS st_nulls,
       MAP {'k': i} AS mp,
       INTERVAL (i) SECOND AS iv
FROM range({n}) t(i)
"""


def _duckdb_case(name: str, options: str, n: int = 5000) -> Case:
    def write(path: Path) -> None:
        import duckdb

        con = duckdb.connect()
        try:
            con.execute("SET threads TO 1")  # one writer thread: the same bytes every time
            con.execute(f"COPY ({_DUCKDB_QUERY.replace('{n}', str(n))}) TO '{path}' (FORMAT PARQUET, {options})")
        finally:
            con.close()

    return Case(f"duckdb-{name}", write)


_DUCKDB_CASES = [
    _duckdb_case(f"{c.lower()}-{v.lower()}", f"COMPRESSION {c}, PARQUET_VERSION {v}, ROW_GROUP_SIZE 2048")
    for c, v in (("SNAPPY", "V1"), ("ZSTD", "V2"), ("GZIP", "V1"), ("LZ4_RAW", "V2"), ("BROTLI", "V1"),
                 ("UNCOMPRESSED", "V2"))
]


def _polars_frame(n: int, seed: int):
    import polars as pl

    rng = np.random.default_rng(seed)
    i = np.arange(n)
    return pl.DataFrame({
        "id": i.astype(np.int64),
        "i8": _ints(rng, n, np.int8),
        "u32": _ints(rng, n, np.uint32),
        "u64": _ints(rng, n, np.uint64),
        "f16": _floats(rng, n, np.float16),
        "f32": _floats(rng, n, np.float32),
        "f64": _floats(rng, n, np.float64),
        "b": rng.random(n) < 0.5,
        "s": pl.Series(_strings(rng, n)),
        "cat": pl.Series([f"c{x % 4}" for x in i], dtype=pl.Categorical),
        "enum": pl.Series([f"e{x % 3}" for x in i], dtype=pl.Enum(["e0", "e1", "e2"])),
        "bin": [rng.bytes(int(rng.integers(0, 12))) for _ in range(n)],
        "dec": pl.Series([f"{x * 1.25 - 500:.3f}" for x in i]).cast(pl.Decimal(12, 3)),
        "dt": pl.Series(rng.integers(-10000, 30000, n).astype(np.int32)).cast(pl.Date),
        "ts": pl.Series(rng.integers(0, 2**45, n)).cast(pl.Datetime("ms")),
        "dur": pl.Series(rng.integers(-(2**40), 2**40, n)).cast(pl.Duration("us")),
        "n": [None if x % 5 == 0 else int(x) for x in i],
        "l": [[int(x), int(x) + 1] for x in i],
        "ragged": [list(range(x % 3)) for x in i],
        "lst_str": [[f"w{x}", ""] for x in i],
        "arr": pl.Series([[int(x), 0, -int(x)] for x in i], dtype=pl.Array(pl.Int16, 3)),
        "st": [{"a": int(x), "b": f"b{x}"} for x in i],
    })


def _polars_case(name: str, n: int = N_ROWS, **kw) -> Case:
    def write(path: Path) -> None:
        _polars_frame(n, seed=zlib.crc32(name.encode())).write_parquet(str(path), **kw)

    return Case(f"polars-{name}", write)


_POLARS_CASES = [
    _polars_case(c, compression=c, row_group_size=300, data_page_size=2048)
    for c in ("uncompressed", "snappy", "gzip", "zstd", "lz4", "brotli")
] + [_polars_case("tiny-pages", compression="zstd", row_group_size=128, data_page_size=128),
       _polars_case("no-statistics", compression="snappy", row_group_size=300, statistics=False)]

CASES: list[Case] = _PYARROW_CASES + _DUCKDB_CASES + _POLARS_CASES


def generate(root: Path) -> dict[str, Path]:
    """Write every case into ``root``; {case name: path}."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for case in CASES:
        path = root / f"{case.name}.parquet"
        case.write(path)
        out[case.name] = path
    return out


# ---------------------------------------------------------------------------
# page headers (Thrift compact protocol), to damage files where it matters
# ---------------------------------------------------------------------------

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3


class _Thrift:
    """Just enough of the Thrift compact protocol to walk a PageHeader."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def skip(self, ttype: int) -> None:
        if ttype in (1, 2):  # bool in the field header
            return
        if ttype == 3:
            self.pos += 1
        elif ttype in (4, 5, 6):
            self.varint()
        elif ttype == 7:
            self.pos += 8
        elif ttype == 8:
            length = self.varint()  # (not `self.pos += self.varint()`: pos is read first)
            self.pos += length
        elif ttype in (9, 10):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.pos += 1 if etype in (1, 2) else 0
                if etype not in (1, 2):
                    self.skip(etype)
        elif ttype == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4)
                    self.skip(kv & 0x0F)
        elif ttype == 12:
            self.struct(lambda fid, t: False)
        else:
            raise ValueError(f"unknown thrift type {ttype} at {self.pos}")

    def struct(self, on_field: Callable[[int, int], bool]) -> None:
        """Walk a struct; ``on_field(id, type)`` reads the value itself and returns True,
        or returns False to have it skipped."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, ttype = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            last = fid
            if not on_field(fid, ttype):
                self.skip(ttype)


@dataclasses.dataclass
class Page:
    offset: int  # of the page header
    header_len: int
    type: int
    compressed_size: int
    uncompressed_size: int
    has_crc: bool
    size_fields: dict  # field id (2, 3) → (offset, length) of its varint

    @property
    def payload(self) -> tuple[int, int]:
        start = self.offset + self.header_len
        return start, start + self.compressed_size


def parse_page_header(data: bytes, offset: int) -> Page:
    t = _Thrift(data, offset)
    got: dict = {"crc": False, "sizes": {}}

    def on_field(fid: int, ttype: int) -> bool:
        if fid in (1, 2, 3) and ttype == 5:
            start = t.pos
            value = t.zigzag()
            got[fid] = value
            if fid in (2, 3):
                got["sizes"][fid] = (start, t.pos - start)
            return True
        if fid == 4:
            got["crc"] = True
        return False

    t.struct(on_field)
    return Page(offset, t.pos - offset, got[1], got[3], got[2], got["crc"], got["sizes"])


def column_chunk_pages(path: Path, row_group: int, column: int) -> list[Page]:
    """Every page of one column chunk, in file order."""
    data = Path(path).read_bytes()
    cc = pq.ParquetFile(str(path)).metadata.row_group(row_group).column(column)
    start = cc.data_page_offset
    if cc.has_dictionary_page and cc.dictionary_page_offset is not None:
        start = min(start, cc.dictionary_page_offset)
    end = start + cc.total_compressed_size
    pages, pos = [], start
    while pos < end:
        page = parse_page_header(data, pos)
        pages.append(page)
        pos = page.payload[1]
    assert pos == end, f"pages of {path} rg {row_group} col {column} end at {pos}, chunk at {end}"
    return pages


# ---------------------------------------------------------------------------
# hostile variants
# ---------------------------------------------------------------------------


def _flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x5A
    return bytes(b)


def _checksum_source(path: Path, **kw) -> None:
    rng = np.random.default_rng(3)
    n = 2000
    t = pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "x": pa.array(rng.integers(-(2**40), 2**40, n)),
        "cat": pa.array([f"c{int(v)}" for v in rng.integers(0, 50, n)]),
    })
    pq.write_table(t, str(path), write_page_checksum=True, row_group_size=1000, data_page_size=2048, **kw)


def _flip_in_page(src: Path, dst: Path, column: int, page_type: int, nth: int = 1) -> None:
    """Copy ``src`` with one byte flipped in the middle of the payload of the ``nth`` page
    of type ``page_type`` (0-based, wrapping) in row group 1, ``column``."""
    pages = [p for p in column_chunk_pages(src, 1, column) if p.type == page_type]
    assert pages, f"{src}: no page of type {page_type} in column {column}"
    page = pages[nth % len(pages)]
    assert page.has_crc, f"{src}: the page carries no CRC"
    lo, hi = page.payload
    dst.write_bytes(_flip(src.read_bytes(), (lo + hi) // 2))


def _malformed(src: bytes, name: str, src_path: Path) -> bytes:
    size = len(src)
    (footer_len,) = struct.unpack("<I", src[-8:-4])
    footer_start = size - 8 - footer_len
    md = pq.ParquetFile(str(src_path)).metadata
    rg1 = md.row_group(1).column(0)
    rg1_mid = rg1.data_page_offset + rg1.total_compressed_size // 2
    first_page = parse_page_header(src, md.row_group(0).column(0).data_page_offset)

    def with_len(n: int) -> bytes:
        return src[:-8] + struct.pack("<I", n) + b"PAR1"

    def with_varint(field: int, page: Page = first_page) -> bytes:
        at, length = page.size_fields[field]
        b = bytearray(src)
        # the largest positive value a varint of this many bytes holds (zigzag: even)
        b[at : at + length] = bytes([0xFE] + [0xFF] * (length - 2) + [0x7F]) if length > 1 else b"\x7E"
        return bytes(b)

    if name == "truncated-in-tail-magic":
        return src[:-2]
    if name == "truncated-before-tail-magic":
        return src[:-4]
    if name == "truncated-in-footer-length":
        return src[:-6]
    if name == "truncated-in-footer":
        return src[: footer_start + footer_len // 2]
    if name == "truncated-in-page":
        return src[:rg1_mid]
    if name == "truncated-in-head-magic":
        return src[:2]
    if name == "magic-only":
        return b"PAR1PAR1"
    if name == "empty-file":
        return b""
    if name == "page-bytes-cut-footer-kept":
        return src[:rg1_mid] + src[footer_start:]
    if name == "footer-length-huge":
        return with_len(0xFFFFFFF0)
    if name == "footer-length-past-start":
        return with_len(size - 8 + 1)
    if name == "footer-length-zero":
        return with_len(0)
    if name == "footer-length-short":
        return with_len(footer_len - 9)
    if name == "footer-zeroed":
        return src[:footer_start] + bytes(footer_len) + src[-8:]
    if name == "footer-random":
        rng = np.random.default_rng(11)
        return src[:footer_start] + rng.bytes(footer_len) + src[-8:]
    if name == "page-header-garbage":
        b = bytearray(src)
        b[first_page.offset : first_page.offset + first_page.header_len] = b"\xff" * first_page.header_len
        return bytes(b)
    if name == "page-compressed-size-inflated":
        return with_varint(3)
    if name == "page-uncompressed-size-inflated":
        return with_varint(2)
    raise KeyError(name)


MALFORMED = [
    "truncated-in-tail-magic", "truncated-before-tail-magic", "truncated-in-footer-length",
    "truncated-in-footer", "truncated-in-page", "truncated-in-head-magic", "magic-only", "empty-file",
    "page-bytes-cut-footer-kept", "footer-length-huge", "footer-length-past-start", "footer-length-zero",
    "footer-length-short", "footer-zeroed", "footer-random", "page-header-garbage",
    "page-compressed-size-inflated", "page-uncompressed-size-inflated",
]

# (name, writer options of the source, column, page type, nth page of that type)
CHECKSUM_FLIPS = [
    ("plain-uncompressed-v1", dict(compression="none", use_dictionary=False), 1, DATA_PAGE, 1),
    ("plain-snappy-v1", dict(compression="snappy", use_dictionary=False), 1, DATA_PAGE, 2),
    ("dictionary-page", dict(compression="none"), 2, DICTIONARY_PAGE, 0),
    ("dictionary-indices-zstd", dict(compression="zstd"), 2, DATA_PAGE, 0),
    ("plain-uncompressed-v2", dict(compression="none", use_dictionary=False, data_page_version="2.0"), 1,
     DATA_PAGE_V2, 1),
    ("delta-gzip-v2", dict(compression="gzip", use_dictionary=False, data_page_version="2.0",
                           column_encoding={"id": "DELTA_BINARY_PACKED", "x": "DELTA_BINARY_PACKED",
                                            "cat": "DELTA_BYTE_ARRAY"}), 1, DATA_PAGE_V2, 0),
]


def hostile_files(root: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """({checksum case: path}, {malformed case: path}) written into ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    flipped = {}
    for name, kw, column, page_type, nth in CHECKSUM_FLIPS:
        src = root / f"src-{name}.parquet"
        _checksum_source(src, **kw)
        dst = root / f"checksum-flip-{name}.parquet"
        _flip_in_page(src, dst, column, page_type, nth)
        src.unlink()
        flipped[name] = dst
    src = root / "src-malformed.parquet"
    pq.write_table(table_all_types(600, seed=5).select(["id", "int32", "f64", "str", "dict_str", "lst"]), str(src),
                   row_group_size=200, data_page_size=1024)
    data = src.read_bytes()
    malformed = {}
    for name in MALFORMED:
        dst = root / f"malformed-{name}.parquet"
        dst.write_bytes(_malformed(data, name, src))
        malformed[name] = dst
    src.unlink()
    return flipped, malformed
