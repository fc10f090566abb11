"""Column names that collide: duplicate struct fields, a partition key named like a
struct's dotted leaf, a filter on a name two columns share."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import collect


def _dup_field_struct(values_f1, values_f2):
    return pa.StructArray.from_arrays([pa.array(values_f1), pa.array(values_f2)], names=["f", "f"])


def test_struct_with_two_fields_of_one_name_is_refused_not_a_crash(tmp_path):
    # A struct whose two fields share a name made a leaf no file had (GetFieldIndex is -1
    # for both): its type was null, and the Loader's construction crashed (SIGSEGV).
    pq.write_table(pa.table({"s": _dup_field_struct([1, 2], [3, 4]), "v": [1, 2]}),
                   tmp_path / "a.parquet")
    code = ("import pqloader, sys\n"
            "try:\n"
            f"    pqloader.Loader({str(tmp_path)!r}, batch_size=2)\n"
            "except pqloader.InvalidDataError as e:\n"
            "    print(e); sys.exit(0)\n"
            "sys.exit(3)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert "a.parquet' has 2 fields named 'f' in struct 's'" in run.stdout
    for columns in (["s.f"], ["s"]):
        with pytest.raises(pqloader.InvalidDataError, match=r"a\.parquet' has 2 fields named 'f' in struct 's'"):
            pqloader.Loader(str(tmp_path), columns=columns, batch_size=2)


def test_struct_with_two_fields_of_one_name_in_one_file_is_not_read_as_absent(tmp_path):
    # b.parquet's s.f read as absent (null; fill_null's value, silently) where a.parquet
    # has one field f.
    pq.write_table(pa.table({"s": pa.array([{"f": 1}, {"f": 2}]), "v": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"s": _dup_field_struct([3, 4], [5, 6]), "v": [3, 4]}), tmp_path / "b.parquet")
    for kwargs in ({}, {"fill_null": 0}, {"null_mask": True}):
        with pytest.raises(pqloader.InvalidDataError, match=r"b\.parquet' has 2 fields named 'f' in struct 's'"):
            pqloader.Loader(str(tmp_path), columns=["s.f", "v"], batch_size=2, **kwargs)


def _hive_key_like_struct_leaf(root, statistics=True):
    for k in (1, 2):
        (root / f"a.b={k}").mkdir()
        pq.write_table(pa.table({"a": pa.array([{"b": 10}, {"b": 20}]), "v": [1, 2]}),
                       root / f"a.b={k}" / "f.parquet", write_statistics=statistics)


@pytest.mark.parametrize("statistics", [True, False])
def test_partition_key_named_like_a_struct_leaf_is_refused_not_dropped(tmp_path, statistics):
    # Both were columns 'a.b': the batch's dict kept the key's and dropped the struct's
    # values silently (or, with statistics, the struct's were checked against the path).
    _hive_key_like_struct_leaf(tmp_path, statistics)
    for columns in (None, ["a", "a.b"], ["a.b", "a"]):
        with pytest.raises(pqloader.InvalidDataError,
                           match=r"two columns would be named 'a\.b': partition key 'a\.b' of the paths "
                                 r"\(as in the path of '.*f\.parquet'\) and field 'b' of struct 'a' "
                                 r"\(in '.*f\.parquet'"):
            pqloader.Loader(str(tmp_path), columns=columns, batch_size=8)


def test_struct_leaf_named_like_a_partition_key_is_not_checked_against_the_path(tmp_path):
    # Selecting the struct only (its leaf 'a.b'), or the key only, loads; a filter names
    # the key. The struct's leaf was compared with the path's a.b=1 and refused.
    _hive_key_like_struct_leaf(tmp_path)
    got = collect(pqloader.Loader(str(tmp_path), columns=["a"], batch_size=8))
    assert sorted(got["a.b"].tolist()) == [10, 10, 20, 20]
    got = collect(pqloader.Loader(str(tmp_path), columns=["a"], batch_size=8, filter="`a.b` == 2"))
    assert sorted(got["a.b"].tolist()) == [10, 20]
    got = collect(pqloader.Loader(str(tmp_path), columns=["a.b", "v"], batch_size=8))
    assert sorted(got["a.b"].tolist()) == [1, 1, 2, 2]


def test_filter_on_a_name_two_columns_share_is_refused_early_and_clearly(tmp_path):
    t = pa.Table.from_arrays([pa.array([1, 2, 3]), pa.array([4, 5, 6]), pa.array([7, 8, 9])],
                             names=["x", "y", "x"])
    pq.write_table(t, tmp_path / "a.parquet")
    for flt in ("x > 1", pqloader.Predicate(["x"], lambda b: pa.compute.greater(b["x"], 1))):
        with pytest.raises(pqloader.InvalidDataError,
                           match=r"a\.parquet' has 2 columns named 'x': which one the filter reads is ambiguous"):
            pqloader.Loader(str(tmp_path), columns=["y"], batch_size=2, filter=flt)


def _odd_names(root):
    pq.write_table(pa.table({"": [1, 2, 3], "v`w": [4, 5, 6], "a,b": [7, 8, 9], "x=y": [1.0, 2.0, 3.0],
                             " x": [0, 1, 0], "id": [0, 1, 2]}), root / "f.parquet")


def test_filter_string_names_an_empty_name_and_a_backtick(tmp_path):
    # `` was refused ("names no column") and `v``w` named '_pq_column_0_pq_column_1': a
    # column named '' or with a backtick could not be written in a filter string.
    _odd_names(tmp_path)
    got = collect(pqloader.Loader(str(tmp_path), columns=["id"], batch_size=8, filter="`` >= 2"))
    assert got["id"].tolist() == [1, 2]
    got = collect(pqloader.Loader(str(tmp_path), columns=["id"], batch_size=8, filter="`v``w` == 6"))
    assert got["id"].tolist() == [2]
    with pytest.raises(ValueError, match=r"'`v``w` \+ 1' is neither a column nor a literal"):
        pqloader.parse_filter("`v``w` + 1 > 3")


def test_cli_names_with_commas_equals_and_spaces_in_backticks(tmp_path):
    # --columns split 'a,b' in two and stripped ' x'; --transform split 'x=y' at its '=':
    # such columns could not be named from the CLI.
    from pqloader._cli_args import column_list, parse_transform
    assert column_list("id, `a,b`,` x`,``,`v``w`") == ["id", "a,b", " x", "", "v`w"]
    assert column_list(" a , b") == ["a", "b"]
    for bad, says in (("a,", "an empty column name"), ("`a` b", "a comma must follow"),
                      ("`a", "not closed")):
        with pytest.raises(ValueError, match=says):
            column_list(bad)
    column, ops = parse_transform('`x=y` = Cast("float32")')
    assert column == "x=y" and len(ops) == 1
    assert parse_transform('x=Cast("float32")')[0] == "x"
    with pytest.raises(ValueError, match="'=' must follow"):
        parse_transform('`x` Cast("float32")')
    _odd_names(tmp_path)
    run = subprocess.run([sys.executable, "-m", "pqloader", "bench", str(tmp_path), "--json",
                          "--columns", "id,`a,b`,` x`,``,`x=y`", "--transform", '`x=y`=Cast("float32")',
                          "--batch-size", "8", "--num-workers", "1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_dotted_name_two_struct_paths_spell_is_refused_not_picked(tmp_path):
    # C++ fix (cpp.md): struct a{'b.c', b{c}}: columns=['a.b.c'] loaded a.b's c silently
    # ('b.c' could never be selected); both are named, with the file.
    a = pa.StructArray.from_arrays([pa.array([1, 2]), pa.StructArray.from_arrays([pa.array([3, 4])], names=["c"])],
                                   names=["b.c", "b"])
    pq.write_table(pa.table({"a": a, "v": [1, 2]}), tmp_path / "f.parquet")
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"column 'a\.b\.c' is ambiguous: it names field 'c' of struct 'a\.b' "
                             r"\(in '.*f\.parquet'\) and field 'b\.c' of struct 'a' \(in '.*f\.parquet'\)|"
                             r"column 'a\.b\.c' is ambiguous: it names field 'b\.c' of struct 'a' "
                             r"\(in '.*f\.parquet'\) and field 'c' of struct 'a\.b'"):
        pqloader.Loader(str(tmp_path), columns=["a.b.c"], batch_size=2)
    with pytest.raises(pqloader.InvalidDataError, match=r"'.*f\.parquet' has both; .*rename one"):
        pqloader.Loader(str(tmp_path), columns=["a"], batch_size=2)
    assert collect(pqloader.Loader(str(tmp_path), columns=["v"], batch_size=2))["v"].tolist() == [1, 2]


def test_a_loaders_arrow_schema_reads_the_struct_leaf_it_lists(tmp_path):
    # C++ fix (cpp.md): 'a.b' beside struct a{b}: loader A (columns=['a']) lists the
    # struct's a.b; schema=A.arrow_schema read the top-level 'a.b' silently.
    pq.write_table(pa.table({"a": pa.array([{"b": 1}, {"b": 2}]), "a.b": [100, 200]}), tmp_path / "f.parquet")
    a = pqloader.Loader(str(tmp_path), columns=["a"], batch_size=2)
    assert collect(a)["a.b"].tolist() == [1, 2]
    assert collect(pqloader.Loader(str(tmp_path), schema=a.arrow_schema, batch_size=2))["a.b"].tolist() == [1, 2]
    top = pqloader.Loader(str(tmp_path), columns=["a.b"], batch_size=2)  # exact top-level name wins
    assert collect(top)["a.b"].tolist() == [100, 200]
    assert collect(pqloader.Loader(str(tmp_path), schema=top.arrow_schema, batch_size=2))["a.b"].tolist() == [100, 200]
    # A schema that does not say which (its field has no metadata): refused, naming both.
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"column 'a\.b' is ambiguous: it names the column 'a\.b' \(in '.*f\.parquet'\) "
                             r"and field 'b' of struct 'a' \(in '.*f\.parquet'\)"):
        pqloader.Loader(str(tmp_path), schema=pa.schema([pa.field("a.b", pa.int64())]), batch_size=2)


def test_a_schema_from_arrow_schema_has_the_state_options_of_the_plain_one(tmp_path):
    # The leaf-path mark of a loader's arrow_schema entered the state's options text: a
    # state taken with schema=loader.arrow_schema did not load into a loader declaring
    # the same fields plainly (nor one taken before the mark existed).
    pq.write_table(pa.table({"s": pa.array([{"x": 1, "y": 2}, {"x": 3, "y": 4}])}),
                   tmp_path / "f.parquet")
    marked = pqloader.Loader(str(tmp_path), batch_size=1).arrow_schema
    plain = pa.schema([("s.x", pa.int64()), ("s.y", pa.int64())])
    for a, b in ((marked, plain), (pa.schema(marked), plain), (plain, pa.schema(marked))):
        first = pqloader.Loader(str(tmp_path), batch_size=1, schema=a)
        next(iter(first))
        second = pqloader.Loader(str(tmp_path), batch_size=1, schema=b)
        second.load_state_dict(first.state_dict())
        assert [x["s.x"].tolist() for x in second] == [[3]]


def test_a_partition_key_in_the_schema_or_the_files_is_listed_once_among_the_available_columns(tmp_path):
    # 'k' 'k': the key was listed as a declared (or stored) column and again as a key.
    for k in ("1", "2"):
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(pa.table({"x": [1, 2], "k": [int(k)] * 2}), tmp_path / f"k={k}" / "a.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError) as e:
        pqloader.Loader(str(tmp_path), columns=["nope"])
    assert str(e.value).endswith("available columns: 'x' 'k'")
    with pytest.raises(pqloader.ColumnNotFoundError) as e:
        pqloader.Loader(str(tmp_path), columns=["nope"], schema=pa.schema([("k", pa.string())]))
    assert str(e.value).endswith("the declared columns and partition keys: 'k'")


def test_available_columns_say_where_dotted_fields_are(tmp_path):
    # A list of structs' and a map's fields are selected by dotted path, as a struct's:
    # the listing said so only for structs ('o' alone read as a column without fields).
    pq.write_table(pa.table({
        "o": pa.array([[{"x": 1}]]),
        "m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
        "s": pa.array([{"a": 1}]),
        "v": [1]}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError) as e:
        pqloader.Loader(str(tmp_path), columns=["nope"])
    assert str(e.value).endswith(
        "available columns: 'o' (a list of structs: 'o.<field>') 'm' (a map: 'm.key', 'm.value') "
        "'s' (a struct: 's.<field>') 'v'"), str(e.value)


@pytest.mark.parametrize("declared", [False, True])
def test_a_field_below_two_lists_is_refused_as_such_not_as_missing(tmp_path, declared):
    # 'o.i.x' of list<struct<i: list<struct<x>>>> (and a map's value below a list) was
    # "does not exist", listing 'o' as a list of structs whose fields may be selected.
    inner = pa.list_(pa.struct([("x", pa.int64())]))
    t = pa.table({
        "o": pa.array([[{"i": [{"x": 1}, {"x": 2}]}], []], pa.list_(pa.struct([("i", inner)]))),
        "m": pa.array([[("a", [{"x": 3}])], []], pa.map_(pa.string(), inner)),
        "v": [1, 2]})
    pq.write_table(t, tmp_path / "a.parquet")
    kw = {"schema": t.schema} if declared else {}
    where = "the declared schema" if declared else f"'{tmp_path / 'a.parquet'}'"
    for name, second in (("o.i.x", "o.i"), ("m.value.x", "m.value")):
        with pytest.raises(pqloader.UnsupportedTypeError) as e:
            pqloader.Loader(str(tmp_path), columns=[name], **kw)
        assert str(e.value).startswith(
            f"column '{name}' is a field below two lists (of '{name.split('.')[0]}' and of "
            f"'{second}', in {where}), which is not supported"), str(e.value)
    # A name below them that no field has is still one that does not exist.
    with pytest.raises(pqloader.ColumnNotFoundError, match="'o.i.y'"):
        pqloader.Loader(str(tmp_path), columns=["o.i.y"], **kw)
    assert pqloader.Loader(str(tmp_path), columns=["v"], batch_size=2, **kw).num_rows == 2


def test_a_field_below_two_lists_names_the_lists_not_a_struct_above_them(tmp_path):
    # "below two lists (of 's' and of 's.l.i')" named the struct 's' as a list, and
    # "(of 'o' and of 'o')" one list of lists twice.
    inner = pa.list_(pa.struct([("x", pa.int64())]))
    t = pa.table({
        "s": pa.array([{"l": [{"i": [{"x": 1}]}]}], pa.struct([("l", pa.list_(pa.struct([("i", inner)])))])),
        "o": pa.array([[[{"i": 1}]]], pa.list_(pa.list_(pa.struct([("i", pa.int64())]))))})
    pq.write_table(t, tmp_path / "a.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError) as e:
        pqloader.Loader(str(tmp_path), columns=["s.l.i.x"])
    assert "is a field below two lists (of 's.l' and of 's.l.i', in" in str(e.value), str(e.value)
    with pytest.raises(pqloader.UnsupportedTypeError) as e:
        pqloader.Loader(str(tmp_path), columns=["o.i"])
    assert "is a field below two lists (a list of lists at 'o', in" in str(e.value), str(e.value)
