"""Datasets as they grow (issue 15): schemas that change between files, hive keys as
pyarrow decodes them, files that are not Parquet beside the data, and problems the
footers show refused when the Loader is made."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_column_equal, collect, write_parquet


def test_safe_widening_across_files_equals_pyarrow_unified_cast(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", pa.table({"i": pa.array([1, -2], pa.int32()), "f": pa.array([0.5, 1.5], pa.float32()),
                                             "s": pa.array(["x", "y"], pa.string())}))
    write_parquet(d / "b.parquet", pa.table({"i": pa.array([2**40, 3], pa.int64()), "f": pa.array([2.25, 1e300], pa.float64()),
                                             "s": pa.array(["z", "w"], pa.large_string())}))
    loader = pqloader.Loader(str(d))
    assert loader.column_info["i"]["dtype"] == "int64" and loader.column_info["f"]["dtype"] == "float64"
    got = collect(loader)
    schema = pa.unify_schemas([pq.read_schema(d / "a.parquet"), pq.read_schema(d / "b.parquet")],
                              promote_options="permissive")
    want = pads.dataset(str(d), schema=schema).to_table()
    assert_column_equal(got["i"], want["i"].to_numpy(), "i")
    assert_column_equal(got["f"], want["f"].to_numpy(), "f")
    assert got["s"] == want["s"].to_pylist()


def test_unsafe_difference_names_both_files_and_types_and_a_declared_schema_loads_it(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", pa.table({"v": pa.array([1, 2], pa.int64())}))
    write_parquet(d / "b.parquet", pa.table({"v": pa.array([0.5, None], pa.float64())}))
    with pytest.raises(pqloader.SchemaMismatchError) as ei:
        pqloader.Loader(str(d))
    msg = str(ei.value)
    assert "a.parquet" in msg and "b.parquet" in msg and "int64" in msg and "double" in msg and "schema=" in msg
    got = collect(pqloader.Loader(str(d), schema=pa.schema([("v", pa.float64())]), fill_null=-1.0))
    assert_column_equal(got["v"], np.array([1.0, 2.0, 0.5, -1.0]), "v")


def test_column_added_in_a_later_file_is_never_silently_dropped(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "1.parquet", pa.table({"id": pa.array([0, 1])}))
    write_parquet(d / "2.parquet", pa.table({"id": pa.array([2]), "new": pa.array([7.5])}))
    with pytest.raises(pqloader.InvalidDataError, match=r"'new'.*1\.parquet"):
        pqloader.Loader(str(d))
    got = collect(pqloader.Loader(str(d), null_mask=True))
    assert list(got) == ["id", "id_valid", "new", "new_valid"]  # pyarrow's fields are all nullable
    assert got["new"].tolist() == [0.0, 0.0, 7.5] and got["new_valid"].tolist() == [False, False, True]


def test_hive_values_are_url_decoded_and_null_partitions_are_null(tmp_path):
    root = tmp_path / "d"
    for city in ("New%20York", "S%C3%A3o%20Paulo", "__HIVE_DEFAULT_PARTITION__"):
        write_parquet(root / f"city={city}" / "p.parquet", pa.table({"x": pa.array([1, 2])}))
    got = collect(pqloader.Loader(str(root), null_mask=["city"]))
    want = pads.dataset(str(root), partitioning="hive").to_table()
    assert [c if v else None for c, v in zip(got["city"], got["city_valid"])] == want["city"].to_pylist()
    assert "New York" in got["city"] and "São Paulo" in got["city"]
    with pytest.raises(pqloader.InvalidDataError, match="'city'"):
        pqloader.Loader(str(root))  # a null key without a policy is refused when made


def test_files_that_are_not_parquet_are_skipped_and_listed(tmp_path, capsys):
    d = tmp_path / "d"
    write_parquet(d / "part-0.parquet", pa.table({"x": pa.array([1, 2])}))
    write_parquet(d / "part-1", pa.table({"x": pa.array([3])}))  # Parquet without an extension
    (d / "README.md").write_text("# data\n")
    (d / "manifest.json").write_text("{}")
    loader = pqloader.Loader(str(d))
    assert collect(loader)["x"].tolist() == [1, 2, 3]
    assert sorted(p.rsplit("/", 1)[1] for p, _ in loader.skipped_files) == ["README.md", "manifest.json"]
    info = pqloader.inspect(str(d))
    assert sorted(s["path"].rsplit("/", 1)[1] for s in info["skipped"]) == ["README.md", "manifest.json"]
    assert info["num_files"] == 2
    from pqloader import cli

    assert cli.main(["inspect", str(d)]) == 0
    assert "skipped (not Parquet)" in capsys.readouterr().out


def test_a_corrupt_file_named_parquet_is_still_an_error(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "good.parquet", pa.table({"x": pa.array([1])}))
    (d / "bad.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(pqloader.InvalidDataError, match="bad.parquet"):
        pqloader.Loader(str(d))


def test_inspect_shows_ragged_lists_struct_leaves_and_nulls(tmp_path):
    p = write_parquet(tmp_path / "r.parquet", pa.table({
        "tok": pa.array([[1, 2, 3], [4], [5]], pa.list_(pa.int32())),
        "img": pa.array([{"bytes": b"a", "path": None}] * 3, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    }))
    info = pqloader.inspect(str(p))
    assert "ragged" in info["loads_as"]["tok"] and "lists=" in info["loads_as"]["tok"]
    assert info["schema"]["img.bytes"] == "binary" and "null" in info["loads_as"]["img.path"]


def test_nulls_in_a_list_of_strings_are_filled_and_masked(tmp_path):
    p = write_parquet(tmp_path / "w.parquet", pa.table({"w": pa.array([["a", None], None, []], pa.list_(pa.string()))}))
    got = collect(pqloader.Loader(str(p), fill_null="?", null_mask=True))
    assert got["w"] == [["a", "?"], [], []] and got["w_valid"].tolist() == [True, False, True]
