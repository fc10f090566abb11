"""Parquet conformance on a corpus generated at test time (issue 13), so that every clone
runs it: Apache's parquet-testing corpus (test_conformance.py) is not in the repository.

``conformance_corpus.py`` writes, into a session tmp dir, files from pyarrow (Arrow C++'s
writer), DuckDB and Polars covering what parquet-testing's INDEX.md lists: encodings
(plain, dictionary, RLE, delta binary packed, delta length / delta byte array, byte stream
split), compressions (none, snappy, gzip, zstd, lz4, brotli), data page v1 and v2, format
versions 1.0 / 2.4 / 2.6, nulls, nested lists / maps / structs, decimals, int96 timestamps,
float16, page index, bloom filters and page checksums. The expectation is
test_conformance.py's:

- every column of every file is either read by ``pqloader.Loader`` with values equal to
  pyarrow's view of the same file (converted by the README's type table), or refused with
  a pqloader error naming the column (and, for an unsupported type, the type); a struct is
  its leaves; a column with nulls also reads with ``null_mask`` (values and validity equal
  to pyarrow's); decimals of precision <= 18 also read with ``decimals="int64"`` as
  pyarrow's unscaled integers;
- files whose pages carry CRCs read with ``verify_checksums=True`` with the same values;
  one byte flipped inside a checksummed page's payload is refused with verification on
  (as pyarrow's ``page_checksum_verification`` refuses it), naming the file, and without
  verification reads as pyarrow reads it or fails cleanly;
- truncated files, footer lengths pointing outside the file, zeroed or random footers and
  damaged page headers give a pqloader error naming the file (or, where pyarrow reads
  the file, pyarrow's values), never a crash or a hang: those run in child processes with
  a timeout, as test_conformance.py runs ``bad_data/``.

Nothing is hard-coded: every expected value is pyarrow's reading of the file at hand.
"""

from __future__ import annotations

import functools
import json
import textwrap
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader
from conformance_corpus import (
    CASES,
    CHECKSUM_FLIPS,
    DATA_PAGE,
    DATA_PAGE_V2,
    MALFORMED,
    column_chunk_pages,
    generate,
    hostile_files,
)
from conftest import (
    assert_column_equal,
    classify_type,
    collect,
    column_null_count,
    to_expected,
    type_keyword,
    uniform_list_length,
)
from crash_guard import CRASH_SCRIPT, run_in_children

CASE_NAMES = [c.name for c in CASES]
CHECKSUM_CASES = [c.name for c in CASES if c.checksums]
FLIP_NAMES = [f[0] for f in CHECKSUM_FLIPS]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return generate(tmp_path_factory.mktemp("conformance-generated"))


@pytest.fixture(scope="session")
def hostile(tmp_path_factory) -> tuple[dict[str, Path], dict[str, Path]]:
    """({flipped-checksum case: path}, {malformed case: path})."""
    return hostile_files(tmp_path_factory.mktemp("conformance-hostile"))


# ---------------------------------------------------------------------------
# child processes: a crash or a hang fails the file's test, not the session
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def crash_report(corpus, hostile) -> dict:
    """{path: reason} for generated files on which pqloader crashed or hung in a child."""
    flipped, _ = hostile
    _, bad = run_in_children(CRASH_SCRIPT, [str(p) for p in [*corpus.values(), *flipped.values()]], timeout=150)
    return bad


def _no_crash(path: Path, crash_report: dict) -> None:
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {path.name}: {crash_report[str(path)]}")


# ---------------------------------------------------------------------------
# the corpus holds what it claims (else the tests below would prove less)
# ---------------------------------------------------------------------------


def test_generated_corpus_covers_what_the_parquet_testing_index_lists(corpus):
    compressions, encodings, page_types, physical, logical = set(), set(), set(), set(), set()
    rle_booleans = page_index = bloom = crc = nulls = nested = 0
    writers, arrow_kinds = set(), set()
    for path in corpus.values():
        pf = pq.ParquetFile(str(path))
        md = pf.metadata
        writers.add(md.created_by.split()[0])
        for f in pf.schema_arrow:
            arrow_kinds.update(k for k in ("map", "list", "struct", "fixed_size_list", "dictionary", "null")
                               if getattr(pa.types, f"is_{k}")(f.type))
        for i in range(len(pf.schema)):
            col = pf.schema.column(i)
            physical.add(col.physical_type)
            logical.add(str(col.logical_type).split("(")[0])
            nested += col.max_repetition_level > 0
        for rg in range(md.num_row_groups):
            for j in range(md.num_columns):
                cc = md.row_group(rg).column(j)
                compressions.add(cc.compression)
                encodings.update(cc.encodings)
                rle_booleans += cc.physical_type == "BOOLEAN" and "PLAIN" not in cc.encodings
                page_index += cc.has_column_index and cc.has_offset_index
                bloom += cc.bloom_filter_offset is not None
                nulls += bool(cc.is_stats_set and cc.statistics.has_null_count and cc.statistics.null_count)
                if rg == 0 and md.num_rows:
                    pages = column_chunk_pages(path, 0, j)
                    page_types.update(p.type for p in pages)
                    crc += any(p.has_crc for p in pages)
    assert writers >= {"parquet-cpp-arrow", "DuckDB", "Polars"}, writers
    assert compressions >= {"UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD", "LZ4", "BROTLI"} or compressions >= {
        "UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD", "LZ4_RAW", "BROTLI"}, compressions
    assert encodings >= {"PLAIN", "RLE", "RLE_DICTIONARY", "PLAIN_DICTIONARY", "DELTA_BINARY_PACKED",
                         "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "BYTE_STREAM_SPLIT"}, encodings
    assert {DATA_PAGE, DATA_PAGE_V2} <= page_types, page_types
    assert {"INT96", "FIXED_LEN_BYTE_ARRAY", "BYTE_ARRAY", "BOOLEAN", "INT32", "INT64", "FLOAT",
            "DOUBLE"} <= physical, physical
    assert {"Float16", "Decimal", "Timestamp", "Date", "Time", "String"} <= logical, logical
    assert {"map", "list", "struct", "fixed_size_list", "dictionary", "null"} <= arrow_kinds, arrow_kinds
    assert rle_booleans and page_index and bloom and crc and nulls and nested


# ---------------------------------------------------------------------------
# column by column, and all together: equal to pyarrow or refused cleanly
# ---------------------------------------------------------------------------


def _outcome_of(col: pa.ChunkedArray):
    """(outcome, payload) of a column pyarrow read, as test_conformance.py decides it."""
    kind = classify_type(col.type)
    if kind == "unsupported":
        return "unsupported", col.type
    if kind == "struct":
        return "struct", None
    has_nulls = column_null_count(col) > 0
    if kind == "list" and (has_nulls or uniform_list_length(col) is None):
        return "ragged", None  # nulls and/or ragged: InvalidDataError either way
    if has_nulls:
        return "nulls", None
    return "values", to_expected(col)


def _flat(path: Path, name: str) -> pa.Table:
    flat = pq.read_table(str(path), columns=[name])
    while any(pa.types.is_struct(f.type) for f in flat.schema):
        flat = flat.flatten()
    return flat


@functools.lru_cache(maxsize=None)
def _expected_outcome(path: Path, name: str):
    """(outcome, payload) for one top-level column: 'values' (payload: expected values),
    'nulls', 'ragged', 'unsupported' (payload: arrow type), 'pyarrow_fails', or 'struct'
    (payload: {leaf: (outcome, payload)})."""
    field_type = pq.read_schema(str(path)).field(name).type
    if classify_type(field_type) == "unsupported":
        return "unsupported", field_type  # refused from the schema alone, whatever the data
    try:
        table = pq.read_table(str(path), columns=[name])
    except Exception:
        return "pyarrow_fails", None
    outcome = _outcome_of(table.column(0))
    if outcome[0] == "struct":
        flat = _flat(path, name)
        return "struct", {leaf: _outcome_of(flat.column(leaf)) for leaf in flat.column_names}
    return outcome


def _is_refused(outcome: str, payload) -> bool:
    if outcome == "struct":
        return any(o != "values" for o, _ in payload.values())
    return outcome != "values"


def _read(path: Path, **kw) -> dict:
    return collect(pqloader.Loader(str(path), batch_size=333, **kw))


def _check_column(path: Path, name: str) -> None:
    outcome, payload = _expected_outcome(path, name)
    where = f"{path.name}:{name}"
    if outcome == "pyarrow_fails":
        with pytest.raises(pqloader.Error):
            _read(path, columns=[name])
        return
    if outcome == "struct":
        # A struct is its leaves: each equals pyarrow's flattened column when every leaf
        # is readable; else the loader refuses, naming the struct (or the leaf's dotted path).
        if _is_refused(outcome, payload):
            with pytest.raises(pqloader.Error) as ei:
                _read(path, columns=[name])
            assert name in str(ei.value), f"{where}: error does not name the column: {ei.value}"
            return
        got = _read(path, columns=[name])
        if all(len(v) == 0 for _, v in payload.values()):
            assert all(len(v) == 0 for v in got.values()), where
            return
        assert list(got) == list(payload), where
        for leaf, (_, expected) in payload.items():
            assert_column_equal(got[leaf], expected, f"{where} leaf {leaf}")
        return
    if outcome == "values":
        got = _read(path, columns=[name])
        if len(payload) == 0:
            assert got == {} or len(got[name]) == 0, where
            return
        assert list(got) == [name], where
        assert_column_equal(got[name], payload, where)
        return
    if outcome == "unsupported":
        with pytest.raises(pqloader.UnsupportedTypeError) as ei:
            pqloader.Loader(str(path), columns=[name])
        msg = str(ei.value)
        assert name in msg, f"{where}: error does not name the column: {msg}"
        assert type_keyword(payload) in msg.lower(), f"{where}: error does not name the type {payload}: {msg}"
        return
    if outcome in ("nulls", "ragged"):
        with pytest.raises(pqloader.InvalidDataError) as ei:
            _read(path, columns=[name])
        msg = str(ei.value)
        assert name in msg, f"{where}: error does not name the column: {msg}"
        if outcome == "nulls":
            assert "null" in msg.lower(), f"{where}: error does not mention nulls: {msg}"
        return
    raise AssertionError(f"{where}: unknown outcome {outcome!r}")


@pytest.mark.parametrize("case", CASE_NAMES)
def test_generated_file_each_column_equals_pyarrow_or_is_refused_cleanly(case, corpus, crash_report):
    path = corpus[case]
    _no_crash(path, crash_report)
    for name in pq.read_schema(str(path)).names:
        _check_column(path, name)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_generated_file_all_columns_together_equal_pyarrow_or_name_a_refused_column(case, corpus, crash_report):
    path = corpus[case]
    _no_crash(path, crash_report)
    names = pq.read_schema(str(path)).names
    outcomes = {n: _expected_outcome(path, n) for n in names}
    refused = [n for n, (o, p) in outcomes.items() if _is_refused(o, p)]
    if refused:
        with pytest.raises(pqloader.Error) as ei:
            _read(path)
        assert any(n in str(ei.value) for n in refused), f"{case}: error names none of {refused}: {ei.value}"
    readable = [n for n in names if n not in refused]
    if not readable:
        return
    got = collect(pqloader.Loader(str(path), columns=readable, batch_size=777, num_workers=2))
    expected = {}
    for n in readable:
        o, p = outcomes[n]
        expected.update(((leaf, v) for leaf, (_, v) in p.items()) if o == "struct" else [(n, p)])
    if pq.ParquetFile(str(path)).metadata.num_rows == 0:
        assert all(len(v) == 0 for v in got.values()), case
        return
    assert list(got) == list(expected), f"{case}: columns not in schema order"
    for n, v in expected.items():
        assert_column_equal(got[n], v, f"{case}:{n}")


def _nullable_columns(path: Path) -> list[tuple[str, pa.ChunkedArray]]:
    """Columns (struct leaves by dotted path) with nulls at row level only, of types that
    ``null_mask`` handles: scalars and fixed-size lists."""
    out = []
    for name in pq.read_schema(str(path)).names:
        if _expected_outcome(path, name)[0] not in ("nulls", "struct"):
            continue
        flat = _flat(path, name)
        for leaf in flat.column_names:
            col = flat.column(leaf)
            if classify_type(col.type) in ("scalar", "fsl") and 0 < col.null_count == column_null_count(col):
                out.append((leaf, col))
    return out


@pytest.mark.parametrize("case", [c for c in CASE_NAMES if "nulls" in c or c.startswith(("duckdb", "polars"))])
def test_generated_columns_with_nulls_read_with_null_mask_equal_to_pyarrow(case, corpus, crash_report):
    path = corpus[case]
    _no_crash(path, crash_report)
    columns = _nullable_columns(path)
    assert columns, f"{case}: precondition: columns with nulls"
    for name, col in columns:
        where = f"{case}:{name}"
        got = _read(path, columns=[name], null_mask=[name])
        assert list(got) == [name, f"{name}_valid"], where
        valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
        assert_column_equal(got[f"{name}_valid"], valid, f"{where}_valid")
        expected = to_expected(col.filter(pc.is_valid(col)))
        values = got[name]
        kept = [v for v, ok in zip(values, valid) if ok] if isinstance(values, list) else values[valid]
        assert_column_equal(kept, expected, where)


def _unscaled(col: pa.ChunkedArray) -> np.ndarray:
    scale = col.type.scale
    return np.array([int(Decimal(v).scaleb(scale)) for v in col.to_pylist()], dtype=np.int64)


@pytest.mark.parametrize("case", [c for c in CASE_NAMES if "nulls" not in c and "empty" not in c])
def test_generated_decimals_read_as_exact_int64_equal_to_pyarrow(case, corpus, crash_report):
    path = corpus[case]
    _no_crash(path, crash_report)
    schema = pq.read_schema(str(path))
    decimals = [f.name for f in schema if pa.types.is_decimal(f.type) and f.type.precision <= 18]
    assert decimals, f"{case}: precondition: decimal columns of precision <= 18"
    table = pq.read_table(str(path), columns=decimals)
    got = _read(path, columns=decimals, decimals="int64")
    for n in decimals:
        assert_column_equal(got[n], _unscaled(table.column(n)), f"{case}:{n}")


# ---------------------------------------------------------------------------
# page checksums
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CHECKSUM_CASES)
def test_valid_page_checksums_pass_verification_with_equal_values(case, corpus, crash_report):
    path = corpus[case]
    _no_crash(path, crash_report)
    names = pq.read_schema(str(path)).names
    readable = [n for n in names if not _is_refused(*_expected_outcome(path, n))]
    expected = pq.read_table(str(path), columns=readable, page_checksum_verification=True)
    while any(pa.types.is_struct(f.type) for f in expected.schema):
        expected = expected.flatten()
    got = _read(path, columns=readable, verify_checksums=True)
    assert list(got) == expected.column_names, case
    for name in expected.column_names:
        assert_column_equal(got[name], to_expected(expected.column(name)), f"{case}:{name}")


@pytest.mark.parametrize("flip", FLIP_NAMES)
def test_flipped_byte_in_a_checksummed_page_is_refused_when_verification_is_on(flip, hostile, crash_report):
    path = hostile[0][flip]
    _no_crash(path, crash_report)
    with pytest.raises(Exception):  # precondition: the flip breaks the page's CRC
        pq.read_table(str(path), page_checksum_verification=True)
    with pytest.raises(pqloader.InvalidDataError) as ei:
        _read(path, verify_checksums=True)
    assert path.name in str(ei.value), f"error does not name the file: {ei.value}"


@pytest.mark.parametrize("flip", FLIP_NAMES)
def test_flipped_byte_without_verification_reads_as_pyarrow_or_fails_cleanly(flip, hostile, crash_report):
    path = hostile[0][flip]
    _no_crash(path, crash_report)
    try:
        expected = pq.read_table(str(path))
    except Exception:
        with pytest.raises(pqloader.Error) as ei:
            _read(path)
        assert path.name in str(ei.value), f"error does not name the file: {ei.value}"
        return
    got = _read(path)
    assert list(got) == expected.column_names
    for name in expected.column_names:
        assert_column_equal(got[name], to_expected(expected.column(name)), f"{path.name}:{name}")


# ---------------------------------------------------------------------------
# malformed files: clean errors, in child processes
# ---------------------------------------------------------------------------

_BAD_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    import pqloader

    def foreign(e):
        return "foreign " + type(e).__module__ + "." + type(e).__qualname__ + ": " + str(e)

    for path in sys.argv[1:]:
        print("START", path, flush=True)
        res = {}
        try:
            pqloader.inspect(path)
            res["inspect"] = "ok"
        except pqloader.Error as e:
            res["inspect"] = "error"
            res["inspect_msg"] = str(e)
        except BaseException as e:
            res["inspect"] = foreign(e)
        for workers in (1, 4):
            key = "read%d" % workers
            try:
                rows = 0
                for b in pqloader.Loader(path, num_workers=workers, batch_size=100):
                    rows += len(next(iter(b.values())))
                res[key] = "ok"
                res[key + "_rows"] = rows
            except pqloader.Error as e:
                res[key] = "error"
                res[key + "_type"] = type(e).__name__
                res[key + "_msg"] = str(e)
            except BaseException as e:
                res[key] = foreign(e)
        # each column alone: a clean pqloader.Error or data, never a foreign exception
        res["foreign_columns"] = []
        try:
            import pyarrow.parquet as pq
            names = pq.read_schema(path).names
        except Exception:
            names = []
        for c in names:
            try:
                for _ in pqloader.Loader(path, columns=[c], num_workers=2):
                    pass
            except pqloader.Error:
                pass
            except BaseException as e:
                res["foreign_columns"].append(c + ": " + foreign(e))
        print("DONE " + path + "\t" + json.dumps(res), flush=True)
    """
)


@pytest.fixture(scope="session")
def malformed_results(hostile) -> tuple[dict, dict]:
    _, malformed = hostile
    return run_in_children(_BAD_SCRIPT, [str(p) for p in malformed.values()], timeout=60)


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_file_raises_a_clean_pqloader_error_naming_it_without_crash_or_hang(name, hostile,
                                                                                     malformed_results):
    path = hostile[1][name]
    results, bad = malformed_results
    if str(path) in bad:
        pytest.fail(f"pqloader crashed or hung on {path.name}: {bad[str(path)]}")
    res = results[str(path)]
    for key in ("inspect", "read1", "read4"):
        assert not res[key].startswith("foreign"), f"{key} leaked a non-pqloader exception: {res[key]}"
    assert not res["foreign_columns"], f"single-column reads leaked non-pqloader exceptions: {res['foreign_columns']}"
    try:
        expected = pq.read_table(str(path))
    except Exception:
        expected = None
    if expected is not None:
        # pyarrow reads it: pqloader reads it too, with values equal to pyarrow's
        assert res["read1"] == res["read4"] == "ok", f"{path.name}: pyarrow reads it, pqloader refused it: {res}"
        got = _read(path)
        for n in expected.column_names:
            assert_column_equal(got[n], to_expected(expected.column(n)), f"{path.name}:{n}")
        return
    for key in ("read1", "read4"):
        assert res[key] == "error", f"{path.name}: pyarrow refuses it, pqloader read it ({key}): {res}"
        assert path.name in res[key + "_msg"], f"{key}: error does not name the file: {res[key + '_msg']}"
    if res["inspect"] == "error":
        assert path.name in res["inspect_msg"], f"inspect's error does not name the file: {res['inspect_msg']}"
