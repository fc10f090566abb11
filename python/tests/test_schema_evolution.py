"""Datasets as they grow (issue 15): schemas that change between files, hive keys as
pyarrow decodes them, files that are not Parquet beside the data, and problems the
footers show refused when the Loader is made."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


def test_hive_keys_are_url_decoded_as_pyarrow_does(tmp_path):
    # Spark's partitionBy("my:key") writes my%3Akey=.../ and pyarrow names the column my:key.
    d = tmp_path / "d" / "my%3Akey=a%20b"
    write_parquet(d / "p.parquet", pa.table({"x": pa.array([1])}))
    got = collect(pqloader.Loader(str(tmp_path / "d"), columns=["x", "my:key"]))
    want = pads.dataset(str(tmp_path / "d"), partitioning="hive").to_table()
    assert list(got) == want.schema.names == ["x", "my:key"]
    assert list(got["my:key"]) == want["my:key"].to_pylist() == ["a b"]


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


@pytest.mark.parametrize("struct_first", [False, True])
def test_inspect_shows_the_column_a_dotted_name_selects_and_the_clash(tmp_path, struct_first):
    """A column 'st.p' beside struct 'st' with field 'p': inspect showed one 'st.p', of
    the type of whichever came last ('double': columns=['st.p'] loads the int64 column),
    and no word of the clash that refuses a Loader of every column."""
    cols = {"st.p": pa.array([1, 2]), "st": pa.array([{"p": 1.0}, {"p": 2.0}])}
    if struct_first:
        cols = dict(reversed(list(cols.items())))
    p = write_parquet(tmp_path / "c.parquet", pa.table(cols))
    info = pqloader.inspect(str(p))
    loader = pqloader.Loader(str(p), columns=["st.p"])
    assert list(info["schema"]) == ["st.p"]
    assert info["schema"]["st.p"] == loader.column_info["st.p"]["arrow_type"] == "int64"
    assert info["loads_as"]["st.p"].startswith("int64(batch)")
    assert "struct's field" in info["loads_as"]["st.p"]
    with pytest.raises(pqloader.Error, match="two columns would be named 'st.p'"):
        pqloader.Loader(str(p))


def test_nulls_in_a_list_of_strings_are_filled_and_masked(tmp_path):
    p = write_parquet(tmp_path / "w.parquet", pa.table({"w": pa.array([["a", None], None, []], pa.list_(pa.string()))}))
    got = collect(pqloader.Loader(str(p), fill_null="?", null_mask=True))
    assert got["w"] == [["a", "?"], [], []] and got["w_valid"].tolist() == [True, False, True]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_null_inside_a_list_is_refused_by_a_mask_alone_and_filled_by_fill_null(tmp_path, shuffle):
    # null_mask flags whole rows: a null element of a valid row would become 0 (or '')
    # with the row marked valid, so it is refused, naming the column, file and row;
    # fill_null fills it (the mask still flags null rows).
    table = pa.table({
        "id": [0, 1, 2],
        "t": pa.array([[1, 2, 3], None, [4, None, 6]], pa.list_(pa.int32())),
        # (no null row: Arrow C++ cannot read a fixed-size list's null rows back)
        "f": pa.array([[1.0, 2.0], [7.0, 8.0], [None, 3.0]], pa.list_(pa.float32(), 2)),
        "s": pa.array([["a", "b"], None, [None]], pa.list_(pa.string())),
    })
    p = write_parquet(tmp_path / "n.parquet", table)
    cases = {"t": (-1, {"t": "ragged"}, [[1, 2, 3], [], [4, -1, 6]], [True, False, True]),
             "f": (-1, None, [[1, 2], [7, 8], [-1, 3]], [True, True, True]),
             "s": ("?", None, [["a", "b"], [], ["?"]], [True, False, True])}
    for col, (fill, lists, want, valid) in cases.items():
        kw = dict(columns=["id", col], shuffle=shuffle, seed=1, batch_size=3)
        if lists:
            kw["lists"] = lists
        with pytest.raises(pqloader.InvalidDataError,
                           match=rf"row group 0: column '{col}' .* null(\(s\))? inside a list.*fill_null"):
            list(pqloader.Loader(str(p), null_mask=[col], **kw))
        b = next(iter(pqloader.Loader(str(p), null_mask=[col], fill_null={col: fill}, **kw)))
        order = np.argsort(b["id"])
        assert b[f"{col}_valid"][order].tolist() == valid
        if lists:
            rows = np.split(b[col], b[f"{col}_offsets"][1:-1])
        else:
            rows = list(b[col])
        got = [np.asarray(rows[i]).tolist() if col != "s" else list(rows[i]) for i in order]
        assert got == want
    # A filter that skips rows before it: the row is still the file's row.
    with pytest.raises(pqloader.InvalidDataError, match=r"column 't' .* null inside a list \(row 2\)"):
        list(pqloader.Loader(str(p), columns=["id", "t"], null_mask=["t"], lists={"t": "ragged"},
                             filter="id != 1", shuffle=shuffle, seed=1))
    # Null rows alone, under the mask alone, still load.
    only_rows = write_parquet(tmp_path / "r.parquet",
                              pa.table({"t": pa.array([[1, 2], None], pa.list_(pa.int32()))}))
    got = collect(pqloader.Loader(str(only_rows), null_mask=True))
    assert got["t_valid"].tolist() == [True, False] and got["t"].tolist() == [[1, 2], [0, 0]]


def test_a_list_column_absent_from_a_file_needs_ragged_or_padded_batches(tmp_path):
    # Its rows there are null lists of no known length: refused from the footers with
    # the ways to batch it, naming the file; ragged and padded batches load it.
    pq.write_table(pa.table({"id": [0, 1], "l": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32()))}),
                   tmp_path / "p0.parquet")
    pq.write_table(pa.table({"id": [2]}), tmp_path / "p1.parquet")
    for kw in (dict(fill_null={"l": -7}), dict(null_mask=["l"]),
               dict(null_mask=True, shuffle=True, seed=0)):
        with pytest.raises(pqloader.InvalidDataError,
                           match=r"column 'l' .* is absent from '.*p1\.parquet'.*lists=\{'l': 'ragged'\}"):
            pqloader.Loader(str(tmp_path), batch_size=10, **kw)
    got = collect(pqloader.Loader(str(tmp_path), null_mask=["l"], lists={"l": "ragged"}))
    assert got["l"].tolist() == [1, 2, 3, 4] and got["l_offsets"].tolist() == [0, 2, 4, 4]
    assert got["l_valid"].tolist() == [True, True, False]
    got = collect(pqloader.Loader(str(tmp_path), null_mask=["l"], lists={"l": pqloader.Pad()}))
    assert got["l"].tolist() == [[1, 2], [3, 4], [0, 0]] and got["l_length"].tolist() == [2, 2, 0]


def test_integers_declared_as_floats_must_convert_exactly(tmp_path):
    # A float holds every integer up to 2^(mantissa bits) and only some beyond: an
    # integer the declared float type would round is refused, naming the value; exact
    # ones (2^60, -2^53), nulls' slots and dictionary-encoded values are not.
    p = write_parquet(tmp_path / "p.parquet", pa.table({
        "a": pa.array([1, 2**60, -2**53, 3], pa.int64()),
        "b": pa.array([1, 2**24 + 1, None, 3], pa.int32()),
        "late": pa.array([1, 2, 3, 2**53 + 1], pa.int64()),
        "u": pa.array([2**64 - 1, 1, 2, 3], pa.uint64()),
    }))

    def load(col, t):
        return collect(pqloader.Loader(str(p), columns=[col], fill_null=0,
                                       schema=pa.schema([(col, t)]), batch_size=2))[col]

    assert load("a", pa.float64()).tolist() == [1.0, 2.0**60, -2.0**53, 3.0]
    assert load("b", pa.float64()).tolist() == [1.0, 2.0**24 + 1, 0.0, 3.0]
    for col, t, value in (("b", pa.float32(), 2**24 + 1), ("late", pa.float64(), 2**53 + 1),
                          ("u", pa.float64(), 2**64 - 1)):
        with pytest.raises(pqloader.SchemaMismatchError,
                           match=rf"'{p}', row group 0: column '{col}': value {value} .* without loss"):
            load(col, t)


def test_decimals_int64_scale_error_names_each_files_own_type(tmp_path):
    # Two scales (1 and 9) unify to decimal256(46, 9), which no file holds: the message
    # named it "elsewhere" and only a.parquet; now each file and its own type.
    from decimal import Decimal as D
    write_parquet(tmp_path / "a.parquet", pa.table({"d": pa.array([D("1.5")], pa.decimal128(38, 1))}))
    write_parquet(tmp_path / "b.parquet", pa.table({"d": pa.array([D("1.5")], pa.decimal128(38, 9))}))
    with pytest.raises(pqloader.SchemaMismatchError) as e:
        pqloader.Loader(str(tmp_path), decimals="int64")
    msg = str(e.value)
    assert "decimal256" not in msg and "decimal128(38, 1)" in msg and "decimal128(38, 9)" in msg
    assert "a.parquet" in msg and "b.parquet" in msg


@pytest.mark.parametrize("list_type", [pa.list_, lambda t: pa.list_(t, 2), pa.large_list])
def test_decimals_of_two_scales_in_lists_are_refused_as_int64(tmp_path, list_type):
    # decimals="int64" gives unscaled integers: a list of decimal(10, 2) beside one of
    # decimal(12, 4) (or a declared one) would give 125 for 1.25 in one file and 12500 in
    # the other (it did, silently). Refused as plain decimal columns are, naming both;
    # as float64 both load.
    from decimal import Decimal as D
    a = write_parquet(tmp_path / "a.parquet", pa.table(
        {"x": pa.array([[D("1.25"), D("-3.50")]], list_type(pa.decimal128(10, 2)))}))
    write_parquet(tmp_path / "b.parquet", pa.table(
        {"x": pa.array([[D("1.2500"), D("7.0001")]], list_type(pa.decimal128(12, 4)))}))
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"decimal128\(12, 4\).*b\.parquet' but .*decimal128\(10, 2\).* in '.*a\.parquet': "
                             r"decimals='int64' needs one scale"):
        pqloader.Loader(str(tmp_path), decimals="int64")
    with pytest.raises(pqloader.SchemaMismatchError, match="in the declared schema: decimals='int64'"):
        pqloader.Loader(str(a), decimals="int64",
                        schema=pa.schema([("x", list_type(pa.decimal128(12, 4)))]))
    got = collect(pqloader.Loader(str(tmp_path), batch_size=2))["x"]
    as_float = pa.array([D("1.25"), D("-3.5"), D("1.25"), D("7.0001")],
                        pa.decimal128(12, 4)).cast(pa.float64()).to_pylist()  # Arrow's rounding
    assert got.ravel().tolist() == as_float
    assert collect(pqloader.Loader(str(a), decimals="int64"))["x"].tolist() == [[125, -350]]


@pytest.mark.parametrize("wrap", [None, pa.list_])
def test_decimals_of_two_scales_become_the_float64_of_the_unified_type(tmp_path, wrap):
    # A decimal(5, 2) file beside a decimal(10, 4) one: the column is decimal(10, 4), and
    # pyarrow casts each file's values to it before float64. Converted at each file's own
    # scale, -47.01 came out as -47.01 from one file and -47.010000000000005 from the other.
    from decimal import Decimal as D
    values = [D(v) for v in ["0.60", "-47.01", "1.23", "0.07", "123.45", "-0.10"]]

    def column(t):
        return pa.array([[v] for v in values], wrap(t)) if wrap else pa.array(values, t)
    write_parquet(tmp_path / "a.parquet", pa.table({"id": np.arange(6), "x": column(pa.decimal128(5, 2))}))
    write_parquet(tmp_path / "b.parquet", pa.table({"id": np.arange(6, 12), "x": column(pa.decimal128(10, 4))}))
    unified = pa.schema([("id", pa.int64()), ("x", wrap(pa.decimal128(10, 4)) if wrap else pa.decimal128(10, 4))])
    table = pads.dataset(tmp_path, schema=unified).to_table().sort_by("id")
    want = (table["x"].combine_chunks().flatten() if wrap else table["x"]).cast(pa.float64()).to_numpy()
    assert want[1] != float(D("-47.01"))  # Arrow's rounding at scale 4: the case
    for schema in (None, unified):
        got = collect(pqloader.Loader(str(tmp_path), columns=["id", "x"], batch_size=12, schema=schema))
        np.testing.assert_array_equal(got["id"], np.arange(12))
        assert got["x"].ravel().tobytes() == want.tobytes(), (got["x"].ravel(), want)


def test_a_file_with_two_columns_of_one_name_is_refused_naming_it(tmp_path):
    # pyarrow writes such a table; Arrow finds neither field by name, so the file read as
    # lacking the column: its rows became fill_null's (silently), or "does not exist".
    write_parquet(tmp_path / "a.parquet",
                  pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4]), pa.array([7, 8])],
                                       names=["d", "d", "e"]))
    write_parquet(tmp_path / "b.parquet", pa.table({"d": [5], "e": [9]}))
    for kwargs in ({"fill_null": -1}, {}, {"columns": ["d"]}):
        with pytest.raises(pqloader.InvalidDataError,
                           match=r"a\.parquet' has 2 columns named 'd': which one to read is ambiguous"):
            pqloader.Loader(str(tmp_path), **kwargs)
    assert collect(pqloader.Loader(str(tmp_path), columns=["e"]))["e"].tolist() == [7, 8, 9]


def test_timestamps_of_two_units_are_refused_saying_a_schema_cannot_convert_them(tmp_path):
    # They load as integers in the stored unit: the message said to declare a schema,
    # whose check then refused the same (the ms -> us conversion "with loss").
    a = write_parquet(tmp_path / "a.parquet",
                      pa.table({"t": pa.array([1, 2], pa.timestamp("ms"))}))
    write_parquet(tmp_path / "b.parquet", pa.table({"t": pa.array([3], pa.timestamp("us"))}))
    for kwargs, source in (({}, tmp_path), ({"schema": pa.schema([("t", pa.timestamp("us"))])}, a)):
        with pytest.raises(pqloader.SchemaMismatchError,
                           match="different units or time zones are refused rather than converted") as e:
            pqloader.Loader(str(source), **kwargs)
        assert "with schema=" not in str(e.value)


def test_a_fixed_size_list_in_one_file_and_a_list_in_another_load_as_the_list(tmp_path):
    """Lists unify by their values (docs): a fixed_size_list file beside a list one failed
    while decoding ('decoded 16 bytes for 2 rows of 0'; ragged: '0 list lengths')."""
    fixed = pa.array([[1, 2], [3, 4]], pa.list_(pa.int32(), 2))
    write_parquet(tmp_path / "a.parquet", pa.table({"x": fixed}))
    write_parquet(tmp_path / "b.parquet", pa.table({"x": pa.array([[5, 6], [7, 8]], pa.list_(pa.int32()))}))
    out = collect(pqloader.Loader(str(tmp_path), batch_size=4))
    assert out["x"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    # Ragged, with rows of another length in the list file (pyarrow 25 cannot read a
    # fixed_size_list with null rows back, so there are none here).
    write_parquet(tmp_path / "b.parquet", pa.table({"x": pa.array([[5, 6, 7], [8]], pa.list_(pa.int32()))}))
    write_parquet(tmp_path / "c.parquet", pa.table({"x": pa.array([[9, 9]], pa.list_(pa.int32(), 2))}))
    loader = pqloader.Loader(str(tmp_path), batch_size=5, lists={"x": "ragged"})
    batch = next(iter(loader))
    assert batch["x"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    assert batch["x_offsets"].tolist() == [0, 2, 4, 7, 8, 10]
    # Not ragged: rows of another length are refused as in list files.
    with pytest.raises(pqloader.InvalidDataError, match="different lengths"):
        collect(pqloader.Loader(str(tmp_path), batch_size=5))


def test_a_partition_key_stored_by_some_files_only_is_refused_naming_both(tmp_path):
    # year=2021/b.parquet lacks the column 'year' that year=2020/a.parquet stores (Polars'
    # partition_by beside a plain writer): its rows loaded as null (fill_null's 0, or
    # dropped by a filter on the key) where pyarrow gives the path's 2021.
    write_parquet(tmp_path / "year=2020" / "a.parquet", pa.table({"v": [1, 2], "year": [2020, 2020]}))
    write_parquet(tmp_path / "year=2021" / "b.parquet", pa.table({"v": [3]}))
    for kwargs in ({"fill_null": 0}, {"null_mask": ["year"]},
                   {"columns": ["v"], "filter": pc.field("year") == 2021}):
        with pytest.raises(pqloader.SchemaMismatchError,
                           match=r"partition key 'year' is stored .*a\.parquet' but not in .*b\.parquet'"):
            pqloader.Loader(str(tmp_path), **kwargs)


def test_a_field_of_a_list_of_structs_absent_from_a_file_is_refused_naming_it(tmp_path):
    # pyarrow gives s.b = [None, None] for b.parquet's row [{a: 7}, {a: 8}]; pqloader gave
    # an empty list (offsets [.., 3, 3]) beside s.a's two values, marked as a null row.
    s2 = pa.list_(pa.struct([("a", pa.int32()), ("b", pa.float64())]))
    s1 = pa.list_(pa.struct([("a", pa.int32())]))
    write_parquet(tmp_path / "a.parquet", pa.table({"s": pa.array([[{"a": 1, "b": 1.5}]], s2)}))
    write_parquet(tmp_path / "b.parquet", pa.table({"s": pa.array([[{"a": 7}, {"a": 8}]], s1)}))
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"column 's\.b' is absent from .*b\.parquet', whose 's' is a list \(or map\) of structs"):
        pqloader.Loader(str(tmp_path), columns=["s.a", "s.b"], fill_null=-1.0,
                        lists={"s.a": "ragged", "s.b": "ragged"})
    # A plain struct lacking a field: null rows, as pyarrow.
    write_parquet(tmp_path / "c" / "a.parquet", pa.table({"s": pa.array([{"a": 1, "b": 1.5}])}))
    write_parquet(tmp_path / "c" / "b.parquet", pa.table({"s": pa.array([{"a": 7}])}))
    got = collect(pqloader.Loader(str(tmp_path / "c"), fill_null=-1.0))
    assert got["s.b"].tolist() == [1.5, -1.0]


def test_decimals_rescaled_past_38_digits_load_as_pyarrow_casts_them(tmp_path):
    # 10**37 at scale 0 beside a scale-10 file: 10**47 unscaled, past 128 bits (the column
    # is a decimal256); an error once, where pyarrow gives 1e37. Most such values passed
    # Arrow's 128-bit overflow check (it compares the wrapped product with the value):
    # 8315828106689743556748183507200378 loaded as 7.62e27, also under a declared schema.
    import decimal
    big = 8315828106689743556748183507200378
    a = pa.table({"x": pa.array([decimal.Decimal(v) for v in (10**37, 5, big, -big)], pa.decimal128(38, 0))})
    b = pa.table({"x": pa.array([decimal.Decimal("1.5")], pa.decimal128(38, 10))})
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    want = pa.concat_tables([a, b], promote_options="permissive")["x"].cast(pa.float64()).to_pylist()
    assert want[:2] + want[-1:] == [1e37, 5.0, 1.5] and want[2] == -want[3] > 8e33
    assert collect(pqloader.Loader(str(tmp_path), batch_size=8))["x"].tolist() == want
    declared = pa.schema([("x", pa.decimal256(48, 10))])
    got = collect(pqloader.Loader(str(tmp_path / "a.parquet"), batch_size=8, schema=declared))["x"]
    assert got.tolist() == want[:4]


def test_decimals_rescaled_to_a_scale_above_38_load_as_pyarrow_casts_them(tmp_path):
    # A decimal128 value rescaled to a decimal256 column of scale > 38 was converted by
    # Decimal128::ToDouble at that scale, out of its range: 0.005 loaded as 0.0 under
    # schema=decimal256(42, 39), as 0.00018 beside a decimal256(76, 40) file.
    from decimal import Decimal as D
    x = pa.array([D("0.005"), D("-0.0001"), D("0.25"), D("1.25")], pa.decimal128(20, 18))
    pq.write_table(pa.table({"x": x}), tmp_path / "x.parquet")
    declared = pa.decimal256(42, 39)
    got = collect(pqloader.Loader(str(tmp_path / "x.parquet"), batch_size=8,
                                  schema=pa.schema([("x", declared)])))["x"]
    assert got.tolist() == x.cast(declared).cast(pa.float64()).to_pylist()
    (tmp_path / "d").mkdir()
    y = pa.array([D("0.005"), D("-0.000123")], pa.decimal128(38, 38))
    z = pa.array([D(0)], pa.decimal256(76, 40))
    pq.write_table(pa.table({"x": y}), tmp_path / "d" / "a.parquet")
    pq.write_table(pa.table({"x": z}), tmp_path / "d" / "b.parquet")
    want = pa.concat_arrays([y.cast(z.type), z]).cast(pa.float64()).to_pylist()
    assert collect(pqloader.Loader(str(tmp_path / "d"), batch_size=8))["x"].tolist() == want


def test_declaring_the_files_own_extension_types_loads(tmp_path):
    # schema=pq.read_schema(f) of a file with a tensor, uuid or json column was refused
    # ("fixed_size_binary[16] ... does not convert to the declared extension<arrow.uuid>"):
    # the files' extension types are read as their storage, the declared ones were not.
    import uuid
    path = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({
        "img": pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(12, dtype=np.int16).reshape(2, 2, 3)),
        "u": pa.array([uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes], pa.uuid()),
        "j": pa.array(['{"a":1}', '[]'], pa.json_())}), path)
    plain = next(iter(pqloader.Loader(path, batch_size=2)))
    got = next(iter(pqloader.Loader(path, batch_size=2, schema=pq.read_schema(path))))
    np.testing.assert_array_equal(got["img"], plain["img"])
    np.testing.assert_array_equal(got["img"], np.arange(12, dtype=np.int16).reshape(2, 2, 3))
    assert got["u"] == plain["u"] == [uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes]
    assert got["j"] == plain["j"] == ['{"a":1}', "[]"]


def test_a_partition_key_stored_by_some_files_only_loads_when_nothing_loads_it(tmp_path):
    # Refused only where the key is loaded (selected, or named by a filter): else the
    # other columns load, as pyarrow's.
    write_parquet(tmp_path / "year=2020" / "a.parquet", pa.table({"v": [1, 2], "year": [2020, 2020]}))
    write_parquet(tmp_path / "year=2021" / "b.parquet", pa.table({"v": [3]}))
    assert collect(pqloader.Loader(str(tmp_path), columns=["v"], batch_size=8))["v"].tolist() == [1, 2, 3]
    assert collect(pqloader.Loader(str(tmp_path), columns=["v"], filter=pc.field("v") > 1,
                                   batch_size=8))["v"].tolist() == [2, 3]


def test_float16_signalling_nans_widen_to_float32_bit_for_bit(tmp_path):
    # float16 -> double -> float quieted a signalling NaN (0x7c01 gave 0x7fc02000; pyarrow's
    # cast and numpy's astype give 0x7f802000).
    halves = np.array([0x7C01, 0x7D00, 0xFC01, 0x3C00, 0x8000], np.uint16).view(np.float16)
    pq.write_table(pa.table({"v": pa.array(halves)}), tmp_path / "h.parquet")
    got = collect(pqloader.Loader(str(tmp_path), batch_size=8, schema=pa.schema([("v", pa.float32())])))["v"]
    want = pc.cast(pa.array(halves), pa.float32()).to_numpy(zero_copy_only=False)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_string_and_binary_files_load_as_a_declared_binary(tmp_path):
    # The error for a string file beside a binary one says to declare the type with
    # schema=, and every declaration was refused, binary too (text to bytes loses nothing).
    pq.write_table(pa.table({"x": pa.array(["a", "é"])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([b"b", b"\xff"])}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="schema="):
        pqloader.Loader(str(tmp_path))
    declared = pa.schema([("x", pa.binary())])
    got = [v for b in pqloader.Loader(str(tmp_path), schema=declared) for v in b["x"]]
    assert got == [b"a", "é".encode(), b"b", b"\xff"]
    assert got == pads.dataset(str(tmp_path), schema=declared).to_table()["x"].to_pylist()
    filtered = [v for b in pqloader.Loader(str(tmp_path), schema=declared, filter=pc.field("x") == b"a")
                for v in b["x"]]
    assert filtered == [b"a"]


def test_the_loaded_type_of_strings_of_two_layouts_is_the_large_one_in_any_order(tmp_path):
    # [large_string, string] loaded as string and the other order as large_string; a
    # dictionary<int8> file beside 300 distinct strings made the column's type a
    # dictionary whose indices cannot number them.
    for name, types in (("ab", (pa.large_string(), pa.string())), ("ba", (pa.string(), pa.large_string()))):
        d = tmp_path / name
        d.mkdir()
        for i, t in enumerate(types):
            pq.write_table(pa.table({"s": pa.array(["x", "y"], t)}), d / f"{i}.parquet")
        assert pa.schema(pqloader.Loader(str(d)).arrow_schema).field("s").type == pa.large_string()
    d = tmp_path / "dict"
    d.mkdir()
    pq.write_table(pa.table({"s": pa.array([f"v{i}" for i in range(300)])}), d / "0.parquet")
    pq.write_table(pa.table({"s": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), ["a", "b"])}),
                   d / "1.parquet")
    schema = pa.schema(pqloader.Loader(str(d)).arrow_schema)
    assert schema.field("s").type == pa.large_string()
    assert pads.dataset(str(d), schema=schema).to_table().num_rows == 302


@pytest.mark.parametrize("first", [pa.string(), pa.large_string()])
def test_lists_of_strings_of_two_layouts_unify_to_large_string_whatever_the_order(tmp_path, first):
    # CommonType unifies string layouts to large_string only at the top: in a
    # list the first file's layout won (ConvertsTo shortcut), and a list of
    # dictionary<int8> could be the type of 300 values (pyarrow refuses the schema then).
    other = pa.large_string() if first == pa.string() else pa.string()
    pq.write_table(pa.table({"s": pa.array([["a"]], pa.list_(first))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"s": pa.array([["b"]], pa.list_(other))}), tmp_path / "b.parquet")
    schema = pa.schema(pqloader.Loader(str(tmp_path), batch_size=2).arrow_schema)
    assert schema.field("s").type.value_type == pa.large_string()


def test_a_list_of_dictionary_int8_is_not_the_type_of_300_values(tmp_path):
    vals = [[f"v{i}"] for i in range(300)]
    pq.write_table(pa.table({"s": pa.array(vals, pa.list_(pa.string()))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"s": pa.array([["b"]], pa.list_(pa.string())).cast(
        pa.list_(pa.dictionary(pa.int8(), pa.string())))}), tmp_path / "b.parquet")
    schema = pa.schema(pqloader.Loader(str(tmp_path), batch_size=2).arrow_schema)
    assert pads.dataset(str(tmp_path), schema=schema).to_table().num_rows == 301


def test_a_hive_key_named_like_a_struct_column_is_refused(tmp_path):
    # s=1/ and s=2/ over files holding a struct column s: the key's values vanished (the
    # struct's leaves loaded instead, unchecked against the paths); pyarrow cannot merge them.
    for k in (1, 2):
        (tmp_path / f"s={k}").mkdir()
        pq.write_table(pa.table({"id": [k], "s": pa.array([{"a": k * 10}], pa.struct([("a", pa.int64())]))}),
                       tmp_path / f"s={k}" / "f.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"partition key 's' of the paths is a struct"):
        pqloader.Loader(str(tmp_path), batch_size=4)
    assert [int(i) for b in pqloader.Loader(str(tmp_path), batch_size=4, columns=["id"]) for i in b["id"]] == [1, 2]


def test_a_whole_list_of_structs_names_its_paths_and_a_struct_fill_names_its_leaves(tmp_path):
    # The refusal named a placeholder ('ls.field'), and fill_null={'s': 0} said 's' was not
    # selected where columns=['s'] had selected its leaves.
    pq.write_table(pa.table({
        "ls": pa.array([[{"a": 1, "b": 2}]], pa.list_(pa.struct([("a", pa.int64()), ("b", pa.int64())]))),
        "s": pa.array([{"x": 1, "y": None}], pa.struct([("x", pa.int64()), ("y", pa.int64())]))}),
        tmp_path / "f.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"\('ls\.a', 'ls\.b'\)"):
        pqloader.Loader(str(tmp_path), columns=["ls"])
    with pytest.raises(pqloader.ColumnNotFoundError, match=r"'s', a struct: name its leaf columns \('s\.x', 's\.y'\)"):
        pqloader.Loader(str(tmp_path), columns=["s"], fill_null={"s": 0})
    got = next(iter(pqloader.Loader(str(tmp_path), columns=["s"], fill_null={"s.y": 0})))
    assert (got["s.x"].tolist(), got["s.y"].tolist()) == ([1], [0])


def test_timestamps_of_one_unit_and_other_zones_name_the_zone(tmp_path):
    # Old Spark files (INT96, no zone) beside new ones (TIMESTAMP_MICROS, UTC) read in one
    # unit: the message said "write the files in one unit" and offered the INT96 option
    # already given; the units agree, the zones differ.
    import datetime as dt
    pq.write_table(pa.table({"x": pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us"))}),
                   tmp_path / "a.parquet", use_deprecated_int96_timestamps=True, store_schema=False)
    pq.write_table(pa.table({"x": pa.array([dt.datetime(2021, 1, 1)], pa.timestamp("us", tz="UTC"))}),
                   tmp_path / "b.parquet", store_schema=False)
    with pytest.raises(pqloader.SchemaMismatchError, match="different time zones") as e:
        pqloader.Loader(str(tmp_path), coerce_int96_timestamp_unit="us")
    assert "coerce_int96_timestamp_unit" not in str(e.value) and "one unit" not in str(e.value)
    with pytest.raises(pqloader.SchemaMismatchError, match="INT96, which has no time zone") as e:
        pqloader.Loader(str(tmp_path))  # ns against us, UTC: no unit of the option helps
    assert "coerce_int96_timestamp_unit='" not in str(e.value)


def test_a_declared_schema_of_no_field_is_refused_as_columns_of_none(tmp_path):
    # schema=pa.schema([]) loaded no column: len() said 1 batch of 3 rows and iterating
    # handed out none (columns=[] is refused).
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="declares no column"):
        pqloader.Loader(str(tmp_path), batch_size=4, schema=pa.schema([]))
    # A partitioned source's keys still load (a column to hand out).
    (tmp_path / "p" / "k=1").mkdir(parents=True)
    pq.write_table(pa.table({"x": [4]}), tmp_path / "p" / "k=1" / "b.parquet")
    batch = next(iter(pqloader.Loader(str(tmp_path / "p"), batch_size=4, schema=pa.schema([]))))
    assert list(batch) == ["k"] and batch["k"].tolist() == [1]


def test_an_integer_a_declared_float_cannot_hold_is_refused_from_the_footers(tmp_path):
    # Row group 10's statistics say 2**53 + 1: the Loader was made and 1000 batches came
    # out before its decode refused it (nulls are refused from the footers already).
    pq.write_table(pa.table({"x": pa.array(list(range(100_000)) + [2**53 + 1], pa.int64())}),
                   tmp_path / "a.parquet", row_group_size=10_000)
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"a\.parquet', row group 10: column 'x': value 9007199254740993"):
        pqloader.Loader(str(tmp_path), batch_size=100, schema=pa.schema([("x", pa.float64())]))
    # float32 too, and a list's elements
    pq.write_table(pa.table({"x": pa.array([1, 2**24 + 1], pa.int32()),
                             "l": pa.array([[1], [2**24 + 1]], pa.list_(pa.int64()))}),
                   tmp_path / "a.parquet")
    for name in ("x", "l"):
        t = pa.float32() if name == "x" else pa.list_(pa.float32())
        with pytest.raises(pqloader.SchemaMismatchError, match="16777217"):
            pqloader.Loader(str(tmp_path), batch_size=4, schema=pa.schema([(name, t)]))
    # A filter that drops the row drops the check (README), and exact values load.
    pq.write_table(pa.table({"id": [0, 1, 2], "x": pa.array([1, 2**53 + 1, 2**60], pa.int64())}),
                   tmp_path / "a.parquet")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    got = [v for b in pqloader.Loader(str(tmp_path), batch_size=4, schema=schema, filter="id != 1")
           for v in b["x"].tolist()]
    assert got == [1.0, float(2**60)]


def test_a_struct_leaf_over_a_file_field_that_is_no_struct_is_refused_not_filled(tmp_path):
    # The file's x (int64) read as lacking x.a: its 5 became fill_null's 0 (or a null).
    pq.write_table(pa.table({"x": pa.array([5], pa.int64())}), tmp_path / "b.parquet")
    declared = pa.schema([("x", pa.struct([("a", pa.int64())]))])
    with pytest.raises(pqloader.SchemaMismatchError, match=r"'x' is int64 in '.*b\.parquet'"):
        pqloader.Loader(str(tmp_path), batch_size=4, fill_null=0, schema=declared)
    pq.write_table(pa.table({"x": pa.array([{"a": 1}])}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"'x' is int64 in '.*b\.parquet'"):
        pqloader.Loader(str(tmp_path), batch_size=4, fill_null=0, columns=["x.a"])
    # An all-null x (pandas' all-None column) is still absent: null rows, filled.
    pq.write_table(pa.table({"x": pa.array([None], pa.null())}), tmp_path / "b.parquet")
    got = [v for b in pqloader.Loader(str(tmp_path), batch_size=4, fill_null=0, columns=["x.a"])
           for v in b["x.a"].tolist()]
    assert sorted(got) == [0, 1]


def test_int96_beside_zoned_timestamps_suggests_no_unit_and_a_coarser_unit_says_it_truncates(tmp_path):
    # The hint named coerce_int96_timestamp_unit='us' beside timestamp[us, tz=UTC] (Spark's
    # files from before and after TIMESTAMP_MICROS), which then failed on the zones; and
    # 'ms' beside an ms file without saying that it drops the microseconds.
    import datetime
    ts = [datetime.datetime(2020, 1, 1, 12, 0, 0, 123456)]
    pq.write_table(pa.table({"ts": pa.array(ts, pa.timestamp("ns"))}), tmp_path / "a.parquet",
                   use_deprecated_int96_timestamps=True)
    pq.write_table(pa.table({"ts": pa.array(ts, pa.timestamp("us", "UTC"))}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError) as e:
        pqloader.Loader(str(tmp_path))
    assert "coerce_int96_timestamp_unit='" not in str(e.value), str(e.value)
    assert "stores them as INT96, which has no time zone" in str(e.value), str(e.value)
    (tmp_path / "b.parquet").unlink()
    pq.write_table(pa.table({"ts": pa.array(ts, pa.timestamp("ms"))}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError,
                       match="'ms' reads in that unit, dropping the digits below a millisecond"):
        pqloader.Loader(str(tmp_path))
    got = collect(pqloader.Loader(str(tmp_path / "a.parquet"), coerce_int96_timestamp_unit="ms"))
    assert got["ts"].tolist() == [pa.scalar(ts[0], pa.timestamp("ms")).value]


def test_a_list_declared_a_fixed_size_list_says_why_and_what_to_declare(tmp_path):
    # "does not convert ... without loss" read as if values would be lost: a list has no
    # length to convert by, and rows of one length load as (batch, n) without schema=.
    pq.write_table(pa.table({"l": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"a list has no fixed length to convert by"):
        pqloader.Loader(str(tmp_path), schema=pa.schema([("l", pa.list_(pa.int64(), 2))]))
    got = collect(pqloader.Loader(str(tmp_path), schema=pa.schema([("l", pa.list_(pa.int64()))])))
    assert got["l"].shape == (2, 2)


def test_a_filter_only_column_of_types_without_a_common_one_is_refused_naming_both_files(tmp_path):
    # int64 in one file, double in another: loading 'y' is refused; a filter that reads it
    # was evaluated in each file's own type (divide(y, 2) == 0.5 divided the int64 file's 1
    # as integers: no row, where pyarrow's dataset, y as double, keeps id 0).
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", pa.table({"id": [0, 1], "y": pa.array([1, 3], pa.int64())}))
    write_parquet(d / "b.parquet", pa.table({"id": [2, 3], "y": pa.array([0.5, 1.5])}))
    expr = pc.divide(pc.field("y"), 2) == 0.5
    with pytest.raises(pqloader.SchemaMismatchError) as ei:
        pqloader.Loader(str(d), columns=["id"], filter=expr)
    msg = str(ei.value)
    assert "'y'" in msg and "a.parquet" in msg and "b.parquet" in msg and "int64" in msg and "double" in msg
    # a declared type is still the way to filter it, as pyarrow with that schema
    got = [int(i) for b in pqloader.Loader(str(d), columns=["id"], filter=expr,
                                          schema=pa.schema([("id", pa.int64()), ("y", pa.float64())]))
           for i in b["id"]]
    assert got == [0]


def test_a_null_inside_a_list_under_a_mask_alone_is_refused_from_the_footers(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", pa.table({"x": pa.array([[1], [2], [3]], pa.list_(pa.int64()))}))
    write_parquet(d / "b.parquet", pa.table({"x": pa.array([[4], [5, None]], pa.list_(pa.int64()))}))
    with pytest.raises(pqloader.InvalidDataError, match=r"b\.parquet.*'x'.*null.* inside.*fill_null"):
        pqloader.Loader(str(d), null_mask=True, lists={"x": "ragged"})  # not after a.parquet's batches
    loader = pqloader.Loader(str(d), null_mask=True, lists={"x": "ragged"}, fill_null={"x": -1})
    assert [v for b in loader for v in b["x"].tolist()] == [1, 2, 3, 4, 5, -1]


def test_times_of_time32_and_time64_say_a_schema_cannot_convert_them(tmp_path):
    d = tmp_path / "d"
    write_parquet(d / "a.parquet", pa.table({"x": pa.array([1000], pa.time32("ms"))}))
    write_parquet(d / "b.parquet", pa.table({"x": pa.array([5], pa.time64("us"))}))
    with pytest.raises(pqloader.SchemaMismatchError) as ei:
        pqloader.Loader(str(d))
    assert "different units" in str(ei.value) and "declare the type" not in str(ei.value)
    with pytest.raises(pqloader.SchemaMismatchError) as ei:
        pqloader.Loader(str(d), schema=pa.schema([("x", pa.time64("us"))]))
    assert "different units" in str(ei.value) and "without loss" not in str(ei.value)


def test_a_filter_only_column_without_a_common_type_is_refused_in_any_file_order(tmp_path):
    # The refusal stopped at the first pair without a common type: [timestamp, timestamp,
    # int64] compared the int64 file in its own type, [int64, timestamp, ...] was refused.
    # Lists of int64 beside lists of double were compared per file too (one outer type).
    import datetime

    ts = [pa.table({"id": [0, 1], "t": pa.array([1000, 2000], pa.timestamp("ms"))}),
          pa.table({"id": [2, 3], "t": pa.array([1000, 2000], pa.timestamp("us"))}),
          pa.table({"id": [4, 5], "t": pa.array([1000, 2000], pa.int64())})]
    for order in ([0, 1, 2], [2, 0, 1]):
        d = tmp_path / f"o{order[0]}"
        for i, k in enumerate(order):
            write_parquet(d / f"{i}.parquet", ts[k])
        with pytest.raises(pqloader.SchemaMismatchError, match="filter column 't' has type .*int64"):
            pqloader.Loader(str(d), columns=["id"], filter=pc.field("t").cast(pa.int64()) > 1500)
    d = tmp_path / "lists"
    write_parquet(d / "a.parquet", pa.table({"id": [0, 1], "l": pa.array([[1], [3]], pa.list_(pa.int64()))}))
    write_parquet(d / "b.parquet", pa.table({"id": [2, 3], "l": pa.array([[0.5], [1.5]], pa.list_(pa.float64()))}))
    with pytest.raises(pqloader.SchemaMismatchError, match="filter column 'l'.*int64.*double"):
        pqloader.Loader(str(d), columns=["id"], filter=pc.divide(pc.list_element(pc.field("l"), 0), 2) == 0.5)
    # Times of one kind in other units are compared in the finest unit, each file's column
    # cast to it exactly (a unit-dependent expression gave each file's own unit's rows).
    d = tmp_path / "units"
    write_parquet(d / "a.parquet", ts[0])
    write_parquet(d / "b.parquet", ts[1])
    ids = lambda f: sorted(int(i) for b in pqloader.Loader(str(d), columns=["id"], filter=f) for i in b["id"])
    assert ids(pc.field("t").cast(pa.int64()) > 1500) == [0, 1, 3]  # as microseconds
    assert ids(pc.field("t") > pa.scalar(datetime.datetime(1970, 1, 1, 0, 0, 1, 500), pa.timestamp("us"))) == [1]
    d = tmp_path / "times"
    write_parquet(d / "a.parquet", pa.table({"id": [0, 1], "y": pa.array([1000, 3000], pa.time32("ms"))}))
    write_parquet(d / "b.parquet", pa.table({"id": [2, 3], "y": pa.array([1000000, 3000000], pa.time64("us"))}))
    assert sorted(int(i) for b in pqloader.Loader(str(d), columns=["id"], filter=pc.field("y") > pa.scalar(
        datetime.time(0, 0, 2))) for i in b["id"]) == [1, 3]


@pytest.mark.parametrize("path_key, stored", [("k=__HIVE_DEFAULT_PARTITION__", [7, 7]), ("k=1", [1, None])])
def test_a_stored_key_whose_nulls_disagree_with_the_path_is_refused(tmp_path, path_key, stored):
    # Polars (and DuckDB) write a null key's rows under __HIVE_DEFAULT_PARTITION__ and
    # read the path's value back: 7, 7 under a null path loaded as 7, 7 (Polars: null),
    # a null under k=1/ as null (Polars: 1), silently; values that disagree otherwise
    # were refused from the statistics.
    write_parquet(tmp_path / path_key / "a.parquet", pa.table({"id": [0, 1], "k": pa.array(stored, pa.int64())}))
    write_parquet(tmp_path / "k=3" / "b.parquet", pa.table({"id": [2], "k": pa.array([3], pa.int64())}))
    for kwargs in ({"null_mask": True}, {"columns": ["id"], "filter": pc.field("k").is_null()}):
        with pytest.raises(pqloader.SchemaMismatchError,
                           match=r"partition key 'k' is .* in the path of '.*a\.parquet', but the file stores "):
            pqloader.Loader(str(tmp_path), **kwargs)
    # A null key over stored nulls (as Polars writes it) loads.
    (tmp_path / path_key / "a.parquet").unlink()
    write_parquet(tmp_path / "k=__HIVE_DEFAULT_PARTITION__" / "a.parquet",
                  pa.table({"id": [0, 1], "k": pa.array([None, None], pa.int64())}))
    got = collect(pqloader.Loader(str(tmp_path), null_mask=True, batch_size=8))
    assert sorted(zip(got["id"].tolist(), got["k"].tolist(), got["k_valid"].tolist())) == [
        (0, 0, False), (1, 0, False), (2, 3, True)]


def test_a_missing_column_lists_the_columns_that_later_files_added(tmp_path):
    # "does not exist in '1.parquet' or any other file; available columns: 'id'" left out
    # 'new', which 2.parquet has (the list was the first file's).
    write_parquet(tmp_path / "1.parquet", pa.table({"id": pa.array([0, 1])}))
    write_parquet(tmp_path / "2.parquet", pa.table({"id": pa.array([2]), "new": pa.array([7.5])}))
    with pytest.raises(pqloader.ColumnNotFoundError, match=r"available columns: 'id' 'new'$"):
        pqloader.Loader(str(tmp_path), columns=["id", "nwe"])
