"""Conformance against Apache's parquet-testing corpus.

The corpus is not part of the repository (see ``conftest.find_conformance_dir`` for
where it is looked for). Without it this module is skipped, unless
``PQLOADER_REQUIRE_CONFORMANCE=1`` (CI), where a missing corpus is an error.

* ``data/``: every column of every file has exactly one expected outcome, from its
  type (README, "What a batch holds") and its data: read with values equal to
  pyarrow's (converted per the pqloader type rules), or refused cleanly
  (UnsupportedTypeError naming the column and its type, or InvalidDataError for
  nulls / ragged lists naming the column). A column pyarrow cannot read must be
  refused with a pqloader.Error.
* ``bad_data/``: every file pyarrow refuses yields a clean ``pqloader.Error``, every
  file pyarrow reads is read with equal values; run in a subprocess with a timeout
  so a crash or hang fails one test instead of killing pytest.
* Files with deliberately corrupt page checksums are refused when
  ``verify_checksums=True``.

Reads of ``data/`` happen in-process, but only after a subprocess has read
every file once without crashing (see ``crash_report``).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crash_guard import CRASH_SCRIPT, run_in_children
from conftest import (
    assert_column_equal,
    classify_type,
    collect,
    column_null_count,
    find_conformance_dir,
    subprocess_env,
    to_expected,
    type_keyword,
    uniform_list_length,
)

CONF = find_conformance_dir()
if CONF is None or not (CONF / "data").is_dir():
    where = ("$PQLOADER_CONFORMANCE_DIR, python/tests/data/parquet-testing or "
             "shared/conformance/parquet-testing above the checkout")
    if os.environ.get("PQLOADER_REQUIRE_CONFORMANCE") == "1":
        raise RuntimeError(f"PQLOADER_REQUIRE_CONFORMANCE=1 but no parquet-testing corpus in {where}")
    pytest.skip(f"parquet-testing corpus not found ({where}); "
                "get it from https://github.com/apache/parquet-testing", allow_module_level=True)

import pqloader  # noqa: E402  (after the skip so a missing corpus is reported first)

DATA_FILES = sorted(p for p in (CONF / "data").rglob("*.parquet") if p.is_file())
BAD_FILES = sorted(p for p in (CONF / "bad_data").rglob("*.parquet") if p.is_file())


def rel(p: Path) -> str:
    return p.relative_to(CONF).as_posix()


def is_corrupt_checksum_file(p: Path) -> bool:
    n = p.name.lower()
    return "checksum" in n and "corrupt" in n


CHECKSUM_FILES = [p for p in DATA_FILES if "checksum" in p.name.lower() or "crc" in p.name.lower()]
CORRUPT_CHECKSUM_FILES = [p for p in CHECKSUM_FILES if is_corrupt_checksum_file(p)]
VALID_CHECKSUM_FILES = [p for p in CHECKSUM_FILES if not is_corrupt_checksum_file(p)]


def test_index_describes_the_corpus_layout():
    index = (CONF / "INDEX.md").read_text()
    assert "data/" in index and "bad_data/" in index
    assert len(DATA_FILES) >= 40, "conformance corpus looks incomplete"
    assert len(BAD_FILES) >= 5
    assert CORRUPT_CHECKSUM_FILES, "expected files with deliberately corrupt checksums"


# ---------------------------------------------------------------------------
# crash guard: read everything once in a child process
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crash_report() -> dict:
    """{path: reason} for data files on which pqloader crashed or hung in a child process."""
    return run_in_children(CRASH_SCRIPT, [str(p) for p in DATA_FILES], timeout=150)[1]


# ---------------------------------------------------------------------------
# data/: column-by-column equality with pyarrow
# ---------------------------------------------------------------------------


def _int96_outside_nanoseconds(path: Path, name: str) -> bool:
    """Whether a timestamp column holds an INT96 value that int64 nanoseconds cannot
    (pyarrow's default read wraps it into another date; pqloader refuses it)."""
    try:
        us = pq.read_table(str(path), columns=[name], coerce_int96_timestamp_unit="us").column(0)
    except Exception:
        return False
    if not pa.types.is_timestamp(us.type) or us.type.unit != "us":
        return False
    values = [v for v in us.cast(pa.int64()).to_pylist() if v is not None]
    return any(not -9223372036854775 <= v <= 9223372036854775 for v in values)


@functools.lru_cache(maxsize=None)
def _expected_outcome(path: Path, name: str):
    """(outcome, payload) for one top-level column.

    outcome: 'values' (payload: expected values), 'nulls', 'ragged',
    'unsupported' (payload: arrow type), 'pyarrow_fails'.
    """
    field_type = pq.read_schema(str(path)).field(name).type
    if classify_type(field_type) == "unsupported":
        return "unsupported", field_type  # refused from the schema alone, whatever the data
    try:
        table = pq.read_table(str(path), columns=[name])
    except Exception:
        return "pyarrow_fails", None
    col = table.column(0)
    kind = classify_type(col.type)
    if kind == "struct":
        return "struct", None
    has_nulls = column_null_count(col) > 0
    if kind == "list":
        if has_nulls:
            return "ragged", None  # nulls and/or ragged: InvalidDataError either way
        if uniform_list_length(col) is None:
            return "ragged", None
    if has_nulls:
        return "nulls", None  # found from the footers, before any value is decoded
    if _int96_outside_nanoseconds(path, name):
        return "int96_range", None
    return "values", to_expected(col)


def _check_column(path: Path, name: str) -> None:
    outcome, payload = _expected_outcome(path, name)
    where = f"{rel(path)}:{name}"

    def read():
        return collect(pqloader.Loader(str(path), columns=[name], batch_size=1000))

    if outcome == "pyarrow_fails":
        with pytest.raises(pqloader.Error):
            read()
        return
    if outcome == "struct":
        # A struct is its leaves: each equals pyarrow's flattened column, or the loader
        # refuses cleanly (a leaf with nulls, an unsupported leaf type).
        try:
            got = read()
        except pqloader.Error:
            return
        flat = pq.read_table(str(path), columns=[name])
        while any(pa.types.is_struct(f.type) for f in flat.schema):
            flat = flat.flatten()
        assert list(got) == flat.column_names, where
        for leaf in flat.column_names:
            assert_column_equal(got[leaf], to_expected(flat.column(leaf)), f"{where}.{leaf}")
        return
    if outcome == "values":
        got = read()
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
    if outcome == "int96_range":
        with pytest.raises(pqloader.InvalidDataError, match="INT96 timestamp of row") as ei:
            read()
        assert name in str(ei.value), where
        return
    if outcome in ("nulls", "ragged"):
        with pytest.raises(pqloader.InvalidDataError) as ei:
            read()
        msg = str(ei.value)
        assert name in msg, f"{where}: error does not name the column: {msg}"
        if outcome == "nulls":
            assert "null" in msg.lower(), f"{where}: error does not mention nulls: {msg}"
        return
    raise AssertionError(f"{where}: unknown outcome {outcome!r}")


@pytest.mark.parametrize("path", DATA_FILES, ids=rel)
def test_data_file_each_column_equals_pyarrow_or_is_refused_cleanly(path, crash_report):
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {rel(path)}: {crash_report[str(path)]}")
    try:
        names = pq.read_schema(str(path)).names
    except Exception:
        names = None
    if names is None:
        # pyarrow cannot open it: pqloader must fail with its own error type
        with pytest.raises(pqloader.Error):
            collect(pqloader.Loader(str(path)))
        return
    for name in names:
        _check_column(path, name)


@pytest.mark.parametrize("path", DATA_FILES, ids=rel)
def test_data_file_with_default_columns_equals_pyarrow_or_names_a_refused_column(path, crash_report):
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {rel(path)}: {crash_report[str(path)]}")
    try:
        names = pq.read_schema(str(path)).names
    except Exception:
        with pytest.raises(pqloader.Error):  # pyarrow cannot open it
            collect(pqloader.Loader(str(path), batch_size=777))
        return
    outcomes = {n: _expected_outcome(path, n) for n in names}
    if any(o == "struct" for o, _ in outcomes.values()):
        return  # checked leaf by leaf above
    refused = [n for n, (o, _) in outcomes.items() if o in ("unsupported", "nulls", "ragged", "pyarrow_fails", "int96_range")]
    if refused:
        with pytest.raises(pqloader.Error) as ei:
            collect(pqloader.Loader(str(path), batch_size=777))
        assert any(n in str(ei.value) for n in refused), f"{rel(path)}: error names none of {refused}: {ei.value}"
        return
    got = collect(pqloader.Loader(str(path), batch_size=777))
    for n, (o, p) in outcomes.items():
        assert o == "values", (n, o)
        if len(p) == 0:
            continue
        assert_column_equal(got[n], p, f"{rel(path)}:{n}")
    assert list(got) == [n for n in names if n in got], f"{rel(path)}: columns not in schema order"


@pytest.mark.parametrize("path", DATA_FILES, ids=rel)
def test_data_file_columns_with_nulls_load_masked_or_refuse_a_null_inside_a_list(path, crash_report):
    # null_mask=[name] on each top-level column that holds nulls: the mask is pyarrow's
    # row validity and the valid rows of a scalar column are pyarrow's values; a list
    # column with a null inside a row (which a row mask cannot flag) is refused, naming
    # it, unless fill_null gives a value.
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {rel(path)}: {crash_report[str(path)]}")
    try:
        schema = pq.read_schema(str(path))
    except Exception:
        return  # checked above
    for name in schema.names:
        kind = classify_type(schema.field(name).type)
        if kind not in ("scalar", "list", "strlist"):
            continue
        try:
            col = pq.read_table(str(path), columns=[name]).column(0)
        except Exception:
            continue
        if column_null_count(col) == 0:
            continue
        where = f"{rel(path)}:{name}"
        if _int96_outside_nanoseconds(path, name):  # masked, its dates are still refused
            with pytest.raises(pqloader.InvalidDataError, match="INT96 timestamp of row") as ei:
                collect(pqloader.Loader(str(path), columns=[name], batch_size=1000, null_mask=[name]))
            assert name in str(ei.value), where
            continue
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        inside = column_null_count(col) - col.null_count
        kw = dict(columns=[name], batch_size=1000, null_mask=[name])
        if kind == "list":
            kw["lists"] = {name: "ragged"}
        if inside > 0:
            with pytest.raises(pqloader.InvalidDataError, match="null inside a list") as ei:
                collect(pqloader.Loader(str(path), **kw))
            assert name in str(ei.value), where
            kw["fill_null"] = {name: "" if kind == "strlist" else 0}
        try:
            got = collect(pqloader.Loader(str(path), **kw))
        except pqloader.UnsupportedTypeError:
            continue  # refused for its type (checked above)
        assert got[f"{name}_valid"].tolist() == valid.tolist(), where
        if kind == "scalar":
            expected = to_expected(col.filter(pa.array(valid)))
            kept = [v for v, ok in zip(got[name], valid) if ok] if isinstance(got[name], list) else got[name][valid]
            assert_column_equal(kept, expected, where)


# ---------------------------------------------------------------------------
# page checksums
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", CORRUPT_CHECKSUM_FILES, ids=rel)
def test_corrupt_page_checksum_is_refused_when_verification_is_on(path, crash_report):
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {rel(path)}: {crash_report[str(path)]}")
    with pytest.raises(pqloader.InvalidDataError) as ei:
        collect(pqloader.Loader(str(path), verify_checksums=True))
    assert path.name in str(ei.value)


@pytest.mark.parametrize("path", VALID_CHECKSUM_FILES, ids=rel)
def test_valid_page_checksums_pass_verification_with_equal_values(path, crash_report):
    if str(path) in crash_report:
        pytest.fail(f"pqloader crashed or hung on {rel(path)}: {crash_report[str(path)]}")
    expected = pq.read_table(str(path), page_checksum_verification=True)
    got = collect(pqloader.Loader(str(path), verify_checksums=True, batch_size=500))
    for name in expected.column_names:
        assert_column_equal(got[name], to_expected(expected.column(name)), f"{rel(path)}:{name}")


# ---------------------------------------------------------------------------
# bad_data/: clean errors, in a subprocess
# ---------------------------------------------------------------------------

_BAD_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    import pqloader

    path, workers = sys.argv[1], int(sys.argv[2])
    res = {}
    try:
        pqloader.inspect(path)
        res["inspect"] = "ok"
    except pqloader.Error as e:
        res["inspect"] = "error"
    except BaseException as e:
        res["inspect"] = "foreign " + type(e).__module__ + "." + type(e).__qualname__ + ": " + str(e)
    try:
        rows = 0
        for b in pqloader.Loader(path, num_workers=workers, batch_size=1000):
            rows += len(next(iter(b.values())))
        res["read"] = "ok"
        res["rows"] = rows
    except pqloader.Error as e:
        res["read"] = "error"
        res["type"] = type(e).__name__
        res["invalid_data"] = isinstance(e, pqloader.InvalidDataError)
        res["msg"] = str(e)
    except BaseException as e:
        res["read"] = "foreign " + type(e).__module__ + "." + type(e).__qualname__ + ": " + str(e)
    # each column alone: a clean pqloader.Error or data, never a foreign exception
    res["foreign_columns"] = []
    try:
        import pyarrow.parquet as pq
        names = pq.read_schema(path).names
    except Exception:
        names = []
    for c in names:
        try:
            for _ in pqloader.Loader(path, columns=[c], num_workers=workers):
                pass
        except pqloader.Error:
            pass
        except BaseException as e:
            res["foreign_columns"].append(c + ": " + type(e).__qualname__ + ": " + str(e))
    print("RESULT " + json.dumps(res), flush=True)
    """
)


def _pyarrow_reads(path: Path) -> bool:
    try:
        pq.read_table(str(path))
        return True
    except Exception:
        return False


@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("path", BAD_FILES, ids=rel)
def test_bad_data_file_raises_a_clean_pqloader_error_without_crash_or_hang(path, workers):
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _BAD_SCRIPT, str(path), str(workers)],
            capture_output=True,
            text=True,
            timeout=60,
            env=subprocess_env(),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pqloader hung on {rel(path)} (no result within 60 s)")
    assert proc.returncode == 0, f"child crashed with return code {proc.returncode}: {proc.stderr[-3000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout + proc.stderr
    res = json.loads(line[-1][len("RESULT ") :])
    assert not res["inspect"].startswith("foreign"), f"inspect leaked a non-pqloader exception: {res['inspect']}"
    assert not res["read"].startswith("foreign"), f"reading leaked a non-pqloader exception: {res['read']}"
    assert not res["foreign_columns"], f"single-column reads leaked non-pqloader exceptions: {res['foreign_columns']}"
    if _pyarrow_reads(path):
        # pyarrow accepts a few of these (ARROW-GH-43605 decodes to all zeros in Arrow 25):
        # then pqloader reads it too, with values equal to pyarrow's.
        assert res["read"] == "ok", f"{rel(path)}: pyarrow reads it, pqloader refused it: {res}"
        expected = pq.read_table(str(path))
        got = collect(pqloader.Loader(str(path), batch_size=1000))
        for name in expected.column_names:
            if classify_type(expected.schema.field(name).type) in ("scalar", "fsl"):
                assert_column_equal(got[name], to_expected(expected.column(name)), f"{rel(path)}:{name}")
        return
    assert res["read"] == "error", f"{rel(path)}: pyarrow refuses it, pqloader read it: {res}"
    if res["invalid_data"]:
        assert path.name in res["msg"], f"InvalidDataError does not name the file: {res['msg']}"
