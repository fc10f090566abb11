"""Arrow objects leave pqloader only through the Arrow PyCapsule protocol.

pqloader's Arrow C++ is its own (the wheel carries it, renamed), so what it hands to
pyarrow must be C Data Interface structs, never pyarrow objects. Here pyarrow 25 (the
development environment's) imports them; python/tests_wheel does the same with pyarrow
14 and 26 in the installed wheel.
"""

from __future__ import annotations

import copy
import ctypes
import pickle
import sys

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import pqloader


def _capsule_name(capsule) -> bytes:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get_name(capsule)


@pytest.fixture
def dataset(tmp_path):
    table = pa.table({
        "id": pa.array(np.arange(6), pa.int64()),
        "when": pa.array(np.arange(6), pa.timestamp("ms", tz="UTC")),
        "name": pa.array([f"n{i}" for i in range(6)], pa.large_string()),
        "vec": pa.array([[float(i)] * 3 for i in range(6)], pa.list_(pa.float32(), 3)),
    })
    for split in ("a", "b"):
        d = tmp_path / f"year=2024" / f"split={split}"
        d.mkdir(parents=True)
        pq.write_table(table, d / "part.parquet", row_group_size=3)
    return tmp_path, table.schema


def test_arrow_schema_is_the_files_schema_then_partition_keys(dataset):
    root, file_schema = dataset
    got = pa.schema(pqloader.Loader(str(root), batch_size=4).arrow_schema)
    expected = pa.schema(list(file_schema) + [pa.field("year", pa.int64(), nullable=False),
                                              pa.field("split", pa.string(), nullable=False)])
    assert got.names == expected.names
    assert got.types == expected.types  # large_string and the time zone kept, not rewritten
    assert [f.nullable for f in got] == [f.nullable for f in expected]


def test_arrow_schema_follows_the_selected_columns_in_order(dataset):
    root, _ = dataset
    loader = pqloader.Loader(str(root), batch_size=4, columns=["split", "vec", "id"])
    schema = loader.arrow_schema.to_pyarrow()
    assert schema.names == ["split", "vec", "id"]
    assert schema.types == [pa.string(), pa.list_(pa.float32(), 3), pa.int64()]
    assert list(loader.column_info) == schema.names


def test_arrow_schema_is_the_stored_columns_before_stacks_and_transforms(tmp_path):
    # The schema the loader reads (another loader can declare it as its schema=), not
    # the batches' arrays: column_info describes those.
    table = pa.table({"a": pa.array([1.0, 2.0], pa.float32()),
                      "b": pa.array([3.0, 4.0], pa.float32()),
                      "toks": pa.array([[1, 2, 3], [4]], pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "t.parquet")
    loader = pqloader.Loader(str(tmp_path), batch_size=2, stack={"ab": ["a", "b"]},
                             transforms={"toks": [pqloader.transforms.PadOrTruncate(4)]})
    assert pa.schema(loader.arrow_schema) == table.schema
    assert list(loader.column_info) == ["ab", "toks", "toks_length"]
    batch = next(iter(loader))
    assert batch["ab"].shape == (2, 2) and batch["toks"].shape == (2, 4)
    again = pqloader.Loader(str(tmp_path), batch_size=2, schema=loader.arrow_schema)
    assert pa.schema(again.arrow_schema) == table.schema


def test_each_export_is_a_fresh_capsule_that_frees_itself_unconsumed(dataset):
    root, _ = dataset
    schema = pqloader.Loader(str(root), batch_size=4).arrow_schema
    first, second = schema.__arrow_c_schema__(), schema.__arrow_c_schema__()
    assert first is not second
    assert _capsule_name(first) == _capsule_name(second) == b"arrow_schema"
    del first  # never imported: its destructor releases the C struct (ASan would tell)
    assert pa.Schema._import_from_c_capsule(second).names[0] == "id"


def test_arrow_schema_is_the_unified_schema_with_struct_leaves_and_masks(tmp_path):
    pq.write_table(pa.table({"v": pa.array([1, 2], pa.int32()),
                             "s": pa.array([{"a": 1.0}, {"a": 2.0}])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"v": pa.array([3, None], pa.int64()),
                             "s": pa.array([{"a": 3.0}, {"a": 4.0}])}), tmp_path / "b.parquet")
    loader = pqloader.Loader(str(tmp_path), batch_size=2, columns=["v", "s.a"], null_mask=["v"],
                             fill_null=0)
    got = loader.arrow_schema.to_pyarrow()
    assert got.names == ["v", "v_valid", "s.a"] == list(loader.column_info)
    assert got.types == [pa.int64(), pa.bool_(), pa.float64()]
    assert [f.nullable for f in got] == [True, False, True]


def test_a_declared_schema_is_taken_through_the_capsule_protocol(tmp_path):
    """Any object with __arrow_c_schema__ declares the schema (here pqloader's own
    export, then pyarrow's): nothing of pyarrow is needed to read it."""
    pq.write_table(pa.table({"v": pa.array([1, 2, 3], pa.int64()), "w": [1.0, 2.0, 3.0]}),
                   tmp_path / "a.parquet")
    declared = pqloader.Loader(str(tmp_path), batch_size=3, columns=["w"]).arrow_schema
    batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=3, schema=declared)))
    assert list(batch) == ["w"]
    batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=3,
                                      schema=pa.schema([("v", pa.float64())]))))
    assert batch["v"].dtype == np.float64 and batch["v"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="pyarrow.Schema"):
        pqloader.Loader(str(tmp_path), batch_size=3, schema=pa.field("v", pa.float64()))
    with pytest.raises(TypeError, match="__arrow_c_schema__"):
        pqloader.Loader(str(tmp_path), batch_size=3, schema={"v": "float64"})

    class NotAStruct:
        def __arrow_c_schema__(self):
            return pa.int64().__arrow_c_schema__()

    with pytest.raises(TypeError, match="struct"):
        pqloader.Loader(str(tmp_path), batch_size=3, schema=NotAStruct())


def test_pqloader_does_not_import_pyarrow_by_itself():
    code = ("import sys, pqloader; "
            "assert 'pyarrow' not in sys.modules, sorted(m for m in sys.modules if 'arrow' in m)")
    import subprocess
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_pyarrow_s3_filesystem_becomes_only_the_options_it_sets():
    import pyarrow.fs as pafs
    from pqloader.petastorm._dataset import storage_options_from
    fs = pafs.S3FileSystem(endpoint_override="127.0.0.1:9", scheme="http", region="us-east-1",
                           access_key="a", secret_key="b")
    options = storage_options_from(None, fs)
    assert {k: options[k] for k in ("endpoint_override", "scheme", "region", "access_key",
                                    "secret_key")} == {
        "endpoint_override": "127.0.0.1:9", "scheme": "http", "region": "us-east-1",
        "access_key": "a", "secret_key": "b"}
    # pyarrow's -1 means "unset"; pqloader refuses negative timeouts.
    assert "connect_timeout" not in options and "request_timeout" not in options
    assert pqloader._env.normalize_storage_options(options)["scheme"] == "http"
    fs = pafs.S3FileSystem(region="us-east-1", connect_timeout=2.5, request_timeout=0)
    options = storage_options_from(None, fs)
    assert options["connect_timeout"] == 2.5 and options["request_timeout"] == 0


def test_a_declared_partition_key_loads_from_the_paths(tmp_path):
    # With schema= naming the key (pyarrow's dataset(schema=) way, or a loader's own
    # arrow_schema), the key was taken for a file column no file has: all null.
    for year in ("2023", "2024"):
        (tmp_path / f"year={year}").mkdir()
        pq.write_table(pa.table({"id": [1, 2]}), tmp_path / f"year={year}" / "p.parquet")
    schema = pa.schema([("id", pa.int64()), ("year", pa.int64())])
    want = pads.dataset(str(tmp_path), partitioning="hive", schema=schema).to_table()
    for declared in (schema, pqloader.Loader(str(tmp_path), batch_size=4).arrow_schema):
        batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=4, schema=declared)))
        assert batch["year"].tolist() == want["year"].to_pylist() == [2023, 2023, 2024, 2024]
    # Declared as a string, the key keeps its text, as pyarrow's.
    batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=4,
                                      schema=pa.schema([("id", pa.int64()), ("year", pa.string())]))))
    assert batch["year"] == ["2023", "2023", "2024", "2024"]
    # ... and so does the filter (it typed the key from the paths: int64).
    with pqloader.Loader(str(tmp_path), batch_size=4, filter="year == '2024'",
                         schema=pa.schema([("id", pa.int64()), ("year", pa.string())])) as loader:
        assert [y for b in loader for y in b["year"]] == ["2024", "2024"]
    with pytest.raises(pqloader.SchemaMismatchError, match="'year' is declared double"):
        pqloader.Loader(str(tmp_path), batch_size=4, schema=pa.schema([("id", pa.int64()), ("year", pa.float64())]))


def test_another_loaders_arrow_schema_reads_struct_leaves_and_masks_again(tmp_path):
    # arrow_schema names a struct's leaves "st.a" and lists the masks: declared back, "st.a"
    # was a new all-null column and "v_valid" clashed with the mask null_mask= adds.
    pq.write_table(pa.table({"id": [1, 2, 3], "st": pa.array([{"a": 1.5}, {"a": 2.5}, {"a": 3.5}]),
                             "v": pa.array([1, None, 3], pa.int32())}), tmp_path / "a.parquet")
    first = pqloader.Loader(str(tmp_path), batch_size=3, columns=["id", "st.a", "v"], null_mask=["v"])
    again = pqloader.Loader(str(tmp_path), batch_size=3, schema=first.arrow_schema, null_mask=["v"])
    a, b = next(iter(first)), next(iter(again))
    assert list(a) == list(b) == ["id", "st.a", "v", "v_valid"]
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert pa.schema(again.arrow_schema) == pa.schema(first.arrow_schema)


def test_a_column_the_declared_schema_lacks_is_named_as_missing_from_it(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError, match="declared schema"):
        pqloader.Loader(str(tmp_path), batch_size=2, schema=pa.schema([("id", pa.int64())]),
                        columns=["s"])


def test_a_key_the_files_store_but_the_declared_schema_leaves_out_loads_from_the_paths(tmp_path):
    # A first version of the declared-key change sent such a key to the declared schema,
    # which lacks it: ColumnNotFoundError for what loaded before.
    for k in (1, 2):
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(pa.table({"x": [k * 10], "k": [k]}), tmp_path / f"k={k}" / "f.parquet")
    batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=4, schema=pa.schema([("x", pa.int64())]))))
    assert sorted(zip(batch["x"].tolist(), batch["k"].tolist())) == [(10, 1), (20, 2)]


def test_the_filter_types_a_declared_text_key_as_text_when_it_is_not_selected(tmp_path):
    # Declared pa.string(), k=01 stays "01" (as pyarrow): the filter typed an unselected
    # key from its paths (int64), refusing k == '01' and keeping the 01 rows for k == 1.
    for k in ("01", "2", "1000"):
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(pa.table({"x": [len(k)]}), tmp_path / f"k={k}" / "f.parquet")
    schema = pa.schema([("x", pa.int64()), ("k", pa.string())])
    want = pads.dataset(str(tmp_path), partitioning=pads.partitioning(pa.schema([("k", pa.string())]), flavor="hive"))
    expected = want.to_table(filter=pads.field("k") == "01")["x"].to_pylist()
    with pqloader.Loader(str(tmp_path), batch_size=4, schema=schema, columns=["x"], filter="k == '01'") as loader:
        assert [int(v) for b in loader for v in b["x"]] == expected == [2]
    with pytest.raises(pqloader.InvalidDataError, match="does not apply"):
        pqloader.Loader(str(tmp_path), batch_size=4, schema=schema, columns=["x"], filter="k == 1")


def test_a_key_declared_a_narrow_integer_refuses_a_value_out_of_its_range(tmp_path):
    for k in (1, 1000):
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(pa.table({"x": [k]}), tmp_path / f"k={k}" / "f.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"'k' is declared int8.*'1000'"):
        pqloader.Loader(str(tmp_path), batch_size=4, schema=pa.schema([("x", pa.int64()), ("k", pa.int8())]))


def test_a_key_declared_uint64_refuses_a_value_int64_does_not_hold(tmp_path):
    # A key from the paths declared an integer type loads as int64: k=18446744073709551615
    # made the column str ('1', '18446744073709551615'), silently, and the filter compared
    # it as text.
    for k in ("1", str(2**64 - 1)):
        (tmp_path / f"k={k}").mkdir()
        pq.write_table(pa.table({"x": [len(k)]}), tmp_path / f"k={k}" / "f.parquet")
    schema = pa.schema([("x", pa.int64()), ("k", pa.uint64())])
    for kwargs in ({}, {"columns": ["x"], "filter": "k == 1"}):
        with pytest.raises(pqloader.SchemaMismatchError, match=r"'k' is declared uint64.*'18446744073709551615'.*int64"):
            pqloader.Loader(str(tmp_path), batch_size=4, schema=schema, **kwargs)


def test_a_loader_declared_with_another_loaders_arrow_schema_checkpoints_and_pickles(tmp_path):
    # schema= takes any __arrow_c_schema__ object; state_dict() called pyarrow's
    # Schema.to_string on it (AttributeError), and its options did not pickle for spawned
    # DataLoader workers (the ArrowSchema holds the engine: "cannot pickle '_thread.RLock'").
    table = pa.table({"x": np.arange(10, dtype=np.int64), "y": np.arange(10, dtype=np.float32)})
    pq.write_table(table, tmp_path / "t.parquet")
    first = pqloader.Loader(str(tmp_path), batch_size=4, shuffle=True, seed=1)
    declared = pqloader.Loader(str(tmp_path), batch_size=4, shuffle=True, seed=1, schema=first.arrow_schema)
    by_pyarrow = pqloader.Loader(str(tmp_path), batch_size=4, shuffle=True, seed=1, schema=table.schema)
    it = iter(declared)
    next(it)
    state = declared.state_dict()
    by_pyarrow.load_state_dict(state)  # one schema, declared either way: one fingerprint
    assert [b["x"].tolist() for b in by_pyarrow] == [b["x"].tolist() for b in it]
    for again in (copy.deepcopy(first.arrow_schema), pickle.loads(pickle.dumps(first.arrow_schema)),
                  pickle.loads(pickle.dumps(declared.options)).schema):
        assert isinstance(again, pqloader.ArrowSchema) and pa.schema(again) == table.schema
