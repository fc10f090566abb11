"""`pqloader.inspect(..., lengths=True)` and `pqloader inspect --lengths`: ragged list
columns and the statistics of their row lengths (issue 16).

The reference lengths come from pyarrow (`list_value_length` over the files as written,
statistics by `pyarrow.compute`), never from pqloader.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    """Three files of uneven row groups: a ragged token column (log-normal lengths, some
    empty rows), a ragged float column, a list column whose rows all have 16 values, a
    fixed-size list, a ragged list of 2-D points and a scalar."""
    d = tmp_path_factory.mktemp("lm")
    rng = np.random.default_rng(16)
    for f, (rows, group) in enumerate([(1500, 400), (999, 999), (1, 1)]):
        lengths = np.minimum(rng.lognormal(3.5, 1.0, rows).astype(np.int64), 4000)
        lengths[rng.random(rows) < 0.02] = 0
        tokens = [rng.integers(0, 50_000, n).astype(np.int32) for n in lengths]
        scores = [rng.random(int(n)).astype(np.float32) for n in rng.integers(0, 9, rows)]
        table = pa.table({
            "id": np.arange(rows),
            "tokens": pa.array(tokens, pa.list_(pa.int32())),
            "scores": pa.array(scores, pa.large_list(pa.float32())),
            "window": pa.array([rng.integers(0, 9, 16) for _ in range(rows)], pa.list_(pa.int64())),
            "xyz": pa.array([rng.random(3) for _ in range(rows)], pa.list_(pa.float64(), 3)),
            "points": pa.array([rng.random((n, 2)).tolist() for n in rng.integers(0, 4, rows)],
                               pa.list_(pa.list_(pa.float32(), 2))),
        })
        pq.write_table(table, d / f"part-{f}.parquet", row_group_size=group)
    return d


def reference(d, column):
    """Length statistics of `column` computed with pyarrow alone."""
    lengths = pa.concat_arrays([
        pc.list_value_length(pq.read_table(f, columns=[column]).column(0)).combine_chunks()
        for f in sorted(d.glob("*.parquet"))
    ]).cast(pa.int64())
    mm = pc.min_max(lengths).as_py()
    median, p99 = pc.quantile(lengths, q=[0.5, 0.99], interpolation="lower").to_pylist()
    total = pc.sum(lengths).as_py()
    return {"rows": len(lengths), "total": total, "min": mm["min"], "median": median,
            "p99": p99, "max": mm["max"], "mean": total / len(lengths)}


def test_lengths_equal_the_statistics_pyarrow_computes(lm_data):
    info = pqloader.inspect(str(lm_data), lengths=True)
    assert sorted(info["lengths"]) == ["points", "scores", "tokens", "window"]
    for column in ("tokens", "scores", "window", "points"):
        want = reference(lm_data, column)
        got = info["lengths"][column]
        assert got["mean"] == pytest.approx(want.pop("mean"))
        assert {k: got[k] for k in want} == want, column
    # The data is what it claims to be: the token lengths really spread out.
    t = info["lengths"]["tokens"]
    assert t["min"] == 0 < t["median"] < t["p99"] < t["max"]


def test_ragged_columns_show_as_ragged_without_reading_lengths(lm_data):
    info = pqloader.inspect(str(lm_data))
    assert "lengths" not in info
    assert info["ragged"] == ["tokens", "scores", "window", "points"]
    for column in info["ragged"]:
        assert info["loads_as"][column].startswith("ragged "), info["loads_as"][column]
        assert "(batch" not in info["loads_as"][column]
        assert "lists=" in info["loads_as"][column]
    assert "Pack" in info["loads_as"]["tokens"]
    assert info["loads_as"]["tokens"].startswith("ragged int32")
    assert info["loads_as"]["scores"].startswith("ragged float32")
    assert info["loads_as"]["points"].startswith("ragged float32 (n, 2):")
    assert "Pack" not in info["loads_as"]["points"]  # packing takes lists of numbers only
    assert info["loads_as"]["xyz"] == "float64(batch, 3)"
    assert info["loads_as"]["id"] == "int64(batch)"


def test_a_list_column_of_one_length_loads_as_a_tensor_once_lengths_are_read(lm_data):
    info = pqloader.inspect(str(lm_data), lengths=["window"])
    assert list(info["lengths"]) == ["window"]
    assert info["lengths"]["window"]["min"] == info["lengths"]["window"]["max"] == 16
    assert info["loads_as"]["window"].startswith("int64(batch, 16)")
    assert info["loads_as"]["tokens"].startswith("ragged int32")  # not read: unchanged
    batch = next(iter(pqloader.Loader(str(lm_data), columns=["window"], batch_size=8)))
    assert batch["window"].shape == (8, 16)


def test_lengths_argument_is_checked(lm_data):
    with pytest.raises(ValueError, match="'xyz' is not a ragged list column"):
        pqloader.inspect(str(lm_data), lengths=["xyz"])
    with pytest.raises(ValueError, match="not a ragged list column"):
        pqloader.inspect(str(lm_data), lengths=["nope"])
    with pytest.raises(TypeError):
        pqloader.inspect(str(lm_data), lengths="tokens")
    with pytest.raises(TypeError):
        pqloader.inspect(str(lm_data), lengths=[3])
    assert pqloader.inspect(str(lm_data), lengths=[])["lengths"] == {}


def test_lengths_need_no_pyarrow(lm_data):
    code = (
        "import sys, json\n"
        "sys.modules['pyarrow'] = None  # any import of pyarrow now fails\n"
        "import pqloader\n"
        f"print(json.dumps(pqloader.inspect({str(lm_data)!r}, lengths=True)['lengths']['tokens']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=subprocess_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = reference(lm_data, "tokens")
    assert (got["median"], got["p99"], got["total"]) == (want["median"], want["p99"], want["total"])


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pqloader", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=str(cwd), env=subprocess_env())


def test_cli_inspect_lengths_prints_the_statistics(lm_data, tmp_path):
    want = reference(lm_data, "tokens")
    r = cli("inspect", lm_data, "--lengths", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith("tokens") and "p99=" in l)
    for key in ("rows", "min", "median", "p99", "max", "total"):
        assert f"{key}={want[key]} " in line + " ", (key, line)
    r = cli("inspect", lm_data, "--lengths", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["lengths"]["tokens"]["p99"] == want["p99"]


def test_cli_inspect_names_ragged_columns_and_reads_no_lengths_by_default(lm_data, tmp_path):
    r = cli("inspect", lm_data, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "p99=" not in r.stdout
    assert "--lengths" in r.stdout
    tokens_line = next(l for l in r.stdout.splitlines() if l.strip().startswith("tokens "))
    assert "ragged int32" in tokens_line and "(batch, n)" not in tokens_line


# -- with issue 15's columns: notes after the description, list fields below structs --------


def test_ragged_description_keeps_its_wording_with_notes_after_it(tmp_path):
    """Nulls the footers count follow the description after "; ": what inspect(lengths=...)
    and pqloader.petastorm parse stays the same, and the notes survive a rewrite."""
    p = tmp_path / "n.parquet"
    pq.write_table(pa.table({
        "tok": pa.array([[1, None, 3], [4], []], pa.list_(pa.int32())),
        "pair": pa.array([[1, 2], [3, None], [5, 6]], pa.list_(pa.int64())),
        "id": pa.array([1, None, 3], pa.int64()),
    }), p)
    info = pqloader.inspect(str(p))
    assert info["ragged"] == ["tok", "pair"]
    assert info["loads_as"]["tok"] == ("ragged int32: lists='ragged' (values + offsets) or Pad(), "
                                       "or pack=Pack(); rows differ in length (the footers show it); "
                                       "1 null(s): needs fill_null or null_mask")
    assert info["loads_as"]["id"] == "int64(batch); 1 null(s): needs fill_null or null_mask"
    info = pqloader.inspect(str(p), lengths=True)
    assert info["lengths"]["pair"]["max"] == 2
    assert info["loads_as"]["pair"] == ("int64(batch, 2) (every row has length 2); "
                                        "1 null(s): needs fill_null or null_mask")
    assert info["loads_as"]["tok"].startswith("ragged int32:")


def test_petastorm_infers_fields_whose_description_has_notes(tmp_path):
    """make_batch_reader's schema inference reads the description before the notes."""
    from pqloader.petastorm import reader as reader_module

    d = tmp_path / "plain"
    d.mkdir()
    pq.write_table(pa.table({
        "id": pa.array(np.arange(6), pa.int64()),
        "tok": pa.array([[1], [2, 3], [], [4], [5, 6, 7], [8]], pa.list_(pa.int32())),
    }), d / "part-0.parquet")
    info = pqloader.inspect(str(d))
    assert "; rows differ in length" in info["loads_as"]["tok"]
    info["loads_as"]["id"] += "; nulls unknown (no statistics)"  # as without statistics
    info["loads_as"]["word"] = "list[str]; pandas index: left out unless selected"
    schema = reader_module._infer_schema(None, info)
    fields = schema.fields
    assert set(fields) == {"id", "tok", "word"}
    assert fields["id"].numpy_dtype == np.int64 and fields["id"].shape == ()
    assert fields["tok"].numpy_dtype == np.int32 and fields["tok"].shape == (None,)
    assert fields["word"].numpy_dtype == np.str_


def test_lengths_of_a_list_field_below_a_struct(tmp_path):
    p = tmp_path / "s.parquet"
    pq.write_table(pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "meta": pa.array([{"ids": [1, 2, 3], "n": 1}, {"ids": [4], "n": 2}, {"ids": [], "n": 3}],
                         pa.struct([("ids", pa.list_(pa.int64())), ("n", pa.int32())])),
    }), p)
    info = pqloader.inspect(str(p), lengths=True)
    assert info["ragged"] == ["meta.ids"]
    assert info["loads_as"]["meta.ids"].startswith("ragged int64:")
    assert info["loads_as"]["meta.n"] == "int32(batch)"
    assert {k: info["lengths"]["meta.ids"][k] for k in ("rows", "total", "min", "max")} == \
        {"rows": 3, "total": 4, "min": 0, "max": 3}


def test_cli_inspect_lengths_without_a_list_column_says_so(tmp_path):
    pq.write_table(pa.table({"x": [1, 2], "v": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64(), 2))}),
                   tmp_path / "p.parquet")
    r = cli("inspect", tmp_path / "p.parquet", "--lengths", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "row lengths: no ragged list column among the selected ones" in r.stdout


def test_lengths_count_null_rows_and_files_without_the_column_as_empty(tmp_path):
    # It raised "row 1 is a null list" (inspect has no fill_null), losing every column's
    # statistics; a file without the column failed too. They count as empty lists (as
    # fill_null loads them) and apart, in "nulls".
    pq.write_table(pa.table({"tok": pa.array([[1, 2, 3], None, [4]], pa.list_(pa.int32())),
                             "w": pa.array([[1], [2, 3], []], pa.list_(pa.int32()))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"w": pa.array([[5, 6, 7]], pa.list_(pa.int32()))}), tmp_path / "b.parquet")
    info = pqloader.inspect(str(tmp_path), lengths=True)
    assert {k: info["lengths"]["tok"][k] for k in ("rows", "nulls", "total", "min", "max")} == \
        {"rows": 4, "nulls": 2, "total": 4, "min": 0, "max": 3}
    assert {k: info["lengths"]["w"][k] for k in ("rows", "nulls", "total", "max")} == \
        {"rows": 4, "nulls": 0, "total": 6, "max": 3}
    r = cli("inspect", tmp_path, "--lengths", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "nulls=2 (as empty lists)" in r.stdout


def test_a_zero_row_row_group_does_not_hide_the_nulls_the_footers_count(tmp_path):
    # pyarrow's ParquetWriter writes a row group of no rows (no statistics) for an empty
    # table: it has no nulls, and must not turn the file's counted nulls into "unknown"
    # (inspect said "nulls unknown (no statistics)", and the Loader was made, failing at
    # its first batch instead of when made).
    schema = pa.schema([("id", pa.int64()), ("a", pa.float32())])
    with pq.ParquetWriter(tmp_path / "a.parquet", schema) as w:
        w.write_table(schema.empty_table())
        w.write_table(pa.table({"id": [0, 1, 2], "a": pa.array([1.0, None, 3.0], pa.float32())}, schema=schema))
        w.write_table(schema.empty_table())
    assert pq.ParquetFile(tmp_path / "a.parquet").metadata.num_row_groups == 3
    info = pqloader.inspect(str(tmp_path))
    assert info["loads_as"] == {"id": "int64(batch)",
                                "a": "float32(batch); 1 null(s): needs fill_null or null_mask"}
    with pytest.raises(pqloader.InvalidDataError, match="column 'a' .* has 1 null value"):
        pqloader.Loader(tmp_path, columns=["id", "a"])
