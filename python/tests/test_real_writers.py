"""Files as real writers make them (issue 15): pyarrow, DuckDB, Polars, pandas, Hugging Face
``datasets`` (every Feature type, also against datasets' own values) and Spark (pyspark
local mode), each read value by value against pyarrow's view of the same files.

Every writer's data has what real datasets hold: structs (read by dotted path), lists of
strings, decimals, nulls, hive partitions; the expected values are pyarrow's, converted
by the README's type table (decimals → float64 via pyarrow's cast, structs flattened to
``parent.child`` columns, lists of strings → lists of lists of str).
"""

from __future__ import annotations

import datetime
import decimal
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import assert_column_equal, collect, to_expected

N = 240  # rows per writer: small files, several row groups where the writer allows


def expected_of(table: pa.Table) -> dict:
    """What pqloader must return for every column of `table` (structs flattened)."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        out[name] = _expected_array(col)
    return out


def _expected_array(arr: pa.Array):
    t = arr.type
    if pa.types.is_dictionary(t):
        return _expected_array(arr.dictionary_decode())
    if pa.types.is_decimal(t):
        return arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return arr.cast(pa.large_string()).to_pylist()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return arr.cast(pa.large_binary()).to_pylist()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        vt = t.value_type
        if pa.types.is_dictionary(vt):
            vt = vt.value_type
        if pa.types.is_string(vt) or pa.types.is_large_string(vt) or pa.types.is_binary(vt):
            return arr.to_pylist()
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return arr.cast(pa.int32()).to_numpy(zero_copy_only=False)
    return to_expected(arr)


def assert_matches(got: dict, expected: dict, columns=None) -> None:
    for name in columns or expected:
        assert name in got, f"column {name!r} missing; got {list(got)}"
        exp = expected[name]
        if isinstance(exp, list):
            assert got[name] == exp, name
        else:
            assert_column_equal(got[name], exp, name)


# ---------------------------------------------------------------------------
# pyarrow: structs, lists of strings, decimals, views, nulls with masks
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pyarrow_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    d = tmp_path_factory.mktemp("pyarrow")
    table = pa.table({
        "id": pa.array(np.arange(N, dtype=np.int64)),
        "meta": pa.array([{"label": int(i % 7), "score": float(i) / 3, "tag": f"t{i % 5}"} for i in range(N)]),
        "words": pa.array([[f"w{i}", f"x{i % 3}"][: 1 + i % 2] for i in range(N)], pa.list_(pa.string())),
        "price": pa.array([decimal.Decimal(f"{i}.{i % 100:02d}") for i in range(N)], pa.decimal128(12, 2)),
        "name": pa.array([f"n{i}" for i in range(N)], pa.string_view()),
        "big": pa.array([f"b{i}" for i in range(N)], pa.large_string()),
        "emb": pa.array(rng.standard_normal((N, 4)).astype(np.float32).tolist(), pa.list_(pa.float32(), 4)),
    })
    path = d / "data.parquet"
    pq.write_table(table, path, row_group_size=70)
    return path


def test_pyarrow_file_with_structs_string_lists_decimals_and_views_equals_pyarrow(pyarrow_file):
    got = collect(pqloader.Loader(str(pyarrow_file), batch_size=64, num_workers=2))
    expected = expected_of(pq.read_table(pyarrow_file))
    assert list(got) == list(expected)  # a struct is its leaves, named by path, in order
    assert list(got)[1:4] == ["meta.label", "meta.score", "meta.tag"]
    assert_matches(got, expected)


def test_struct_field_by_dotted_path_reads_only_that_field(pyarrow_file):
    got = collect(pqloader.Loader(str(pyarrow_file), columns=["meta.score", "id"], batch_size=50))
    assert list(got) == ["meta.score", "id"]
    expected = expected_of(pq.read_table(pyarrow_file, columns=["id", "meta"]))
    assert_matches(got, expected, ["meta.score", "id"])


def test_decimals_as_exact_scaled_int64_on_request(pyarrow_file):
    got = collect(pqloader.Loader(str(pyarrow_file), columns=["price"], decimals="int64"))
    unscaled = [int(v * 100) for v in pq.read_table(pyarrow_file)["price"].to_pylist()]
    assert_column_equal(got["price"], np.array(unscaled, dtype=np.int64), "price")


# ---------------------------------------------------------------------------
# DuckDB: decimals (x * 0.5), structs, lists of strings, maps, hive partitions
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duckdb_dir(tmp_path_factory):
    duckdb = pytest.importorskip("duckdb")
    d = tmp_path_factory.mktemp("duckdb")
    con = duckdb.connect()
    con.execute(f"""
        COPY (SELECT i::BIGINT AS id, i * 0.5 AS half,
                     {{'a': i::INTEGER, 'b': 'v' || i::VARCHAR}} AS s,
                     ['x' || i::VARCHAR, 'y'] AS tags,
                     MAP {{'k': i::INTEGER}} AS m,
                     CASE WHEN i % 2 = 0 THEN 'New York' ELSE 'a/b=c' END AS city
              FROM range({N}) t(i))
        TO '{d}/out' (FORMAT PARQUET, PARTITION_BY (city), ROW_GROUP_SIZE 60)""")
    con.close()
    return d / "out"


def test_duckdb_partitioned_decimals_structs_and_string_lists_equal_pyarrow(duckdb_dir):
    got = collect(pqloader.Loader(str(duckdb_dir), columns=["id", "half", "s", "tags", "m.value", "city"]))
    table = pads.dataset(str(duckdb_dir), partitioning="hive").to_table()
    assert pa.types.is_decimal(table.schema.field("half").type), "precondition: DuckDB writes a decimal"
    order = np.argsort(got["id"])
    expected = expected_of(table.sort_by("id").select(["id", "half", "s", "tags", "city"]))
    for name in ("id", "half", "s.a", "s.b", "tags", "city"):
        col = got[name]
        sorted_col = [col[i] for i in order] if isinstance(col, list) else col[order]
        exp = expected[name]
        if isinstance(exp, list):
            assert sorted_col == exp, name
        else:
            assert_column_equal(sorted_col, exp, name)
    # a dotted path through a map is a list per row
    m_values = [got["m.value"][i] for i in order]
    assert_column_equal(np.asarray(m_values), np.arange(N, dtype=np.int32).reshape(N, 1), "m.value")
    # hive values are URL-decoded as pyarrow does
    assert set(got["city"]) == {"New York", "a/b=c"}


def test_duckdb_map_column_whole_is_refused_with_its_paths(duckdb_dir):
    with pytest.raises(pqloader.UnsupportedTypeError) as ei:
        pqloader.Loader(str(duckdb_dir), columns=["m"])
    assert "'m'" in str(ei.value) and "m.key" in str(ei.value)


# ---------------------------------------------------------------------------
# Polars: partition_by writes the key into the files too
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def polars_dir(tmp_path_factory):
    pl = pytest.importorskip("polars")
    d = tmp_path_factory.mktemp("polars") / "out"
    df = pl.DataFrame({
        "id": np.arange(N, dtype=np.int64),
        "part": [int(i % 3) for i in range(N)],
        "x": np.linspace(0, 1, N),
        "tags": [[f"t{i}", "u"] for i in range(N)],
        "rec": [{"p": int(i), "q": f"q{i}"} for i in range(N)],
    })
    df.write_parquet(str(d), partition_by="part")
    return d


def test_polars_partition_by_key_stored_in_files_and_path_is_accepted(polars_dir):
    files = sorted(str(p) for p in polars_dir.rglob("*.parquet"))
    assert "part" in pq.read_schema(files[0]).names, "precondition: Polars stores the key in the file"
    got = collect(pqloader.Loader(str(polars_dir), batch_size=32))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    expected = expected_of(table)
    assert sorted(got) == sorted(expected)
    assert_matches(got, expected)



def test_a_filter_on_a_key_polars_stores_compares_the_stored_values(tmp_path):
    # The key loads from the files (str "01", "1", "2"), so the filter must see it so too:
    # it was typed from the paths (int64), refusing k == '1' and keeping "01" for k == 1.
    pl = pytest.importorskip("polars")
    pl.DataFrame({"k": ["01", "1", "2"], "x": [0, 1, 2]}).write_parquet(str(tmp_path), partition_by="k")
    files = [str(p) for p in tmp_path.rglob("*.parquet")]
    expected = pa.concat_tables([pq.read_table(f) for f in files]).filter(pc.field("k") == "1")
    with pqloader.Loader(str(tmp_path), batch_size=10, filter="k == '1'") as loader:
        assert [int(x) for b in loader for x in b["x"]] == expected["x"].to_pylist() == [1]
    with pytest.raises(pqloader.InvalidDataError, match="does not apply"):
        pqloader.Loader(str(tmp_path), batch_size=10, filter="k == 1")  # str against int, as pyarrow


def test_polars_float_and_zoned_time_keys_stored_in_files_load(tmp_path):
    # Polars writes f=1.0/ and f=-0.0/ (the statistics print 1 and -0..0), and a zoned
    # time as ...+00:00 (printed ...Z): compared as text, the paths were refused.
    pl = pytest.importorskip("polars")
    import datetime as dt
    when = [dt.datetime(2020, 1, 1, 12, 30, tzinfo=dt.timezone.utc), dt.datetime(2021, 6, 1, tzinfo=dt.timezone.utc)]
    pl.DataFrame({"f": [1.0, 2.5, -0.0], "x": [0, 1, 2]}).write_parquet(str(tmp_path / "f"), partition_by="f")
    pl.DataFrame({"t": when, "x": [0, 1]}).write_parquet(str(tmp_path / "t"), partition_by="t")
    with pqloader.Loader(str(tmp_path / "f"), batch_size=10) as loader:
        got = sorted((int(x), float(f)) for b in loader for x, f in zip(b["x"], b["f"]))
    assert got == [(0, 1.0), (1, 2.5), (2, -0.0)]
    files = sorted(str(p) for p in (tmp_path / "t").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    with pqloader.Loader(str(tmp_path / "t"), batch_size=10) as loader:
        got = sorted((int(x), int(t)) for b in loader for x, t in zip(b["x"], b["t"]))
    assert got == sorted(zip(table["x"].to_pylist(), table["t"].cast(pa.int64()).to_pylist()))


def test_a_polars_time_key_written_to_the_second_is_refused_saying_why_and_what_to_do(tmp_path):
    # Polars writes t=12:30:00/ for 12:30:00.25 (and for 12:30:00.75, whose row it lost):
    # the path cannot name the value. The refusal named the disagreement only.
    pl = pytest.importorskip("polars")
    import datetime as dt
    pl.DataFrame({"t": [dt.time(12, 30, 0, 250000), dt.time(1, 2, 3)], "x": [0, 1]}).write_parquet(
        str(tmp_path), partition_by="t")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"partition key 't' is '12:30:00' in the path of "
                       r".*without its fraction of a second.*partition by the time as an integer"):
        pqloader.Loader(str(tmp_path), batch_size=10)


def test_a_decimal_key_stored_in_files_compares_the_path_at_the_columns_scale(tmp_path):
    # d=1.5/ over a file storing decimal(10, 2) 1.50 (and d=2/ over 2.00) was refused as
    # text ("is '1.5' ... stores values from 1.50 to 1.50"); pyarrow casts the path's
    # "1.5" to 1.50. A path the column's scale cannot hold exactly still disagrees.
    import decimal
    for key, value in (("1.5", "1.50"), ("2", "2.00"), ("-0.25", "-0.25")):
        (tmp_path / "ok" / f"d={key}").mkdir(parents=True)
        pq.write_table(pa.table({"d": pa.array([decimal.Decimal(value)], pa.decimal128(10, 2)), "x": [1]}),
                       tmp_path / "ok" / f"d={key}" / "f.parquet")
    with pqloader.Loader(str(tmp_path / "ok"), batch_size=10) as loader:
        assert sorted(float(v) for b in loader for v in b["d"]) == [-0.25, 1.5, 2.0]
    (tmp_path / "bad" / "d=1.505").mkdir(parents=True)
    pq.write_table(pa.table({"d": pa.array([decimal.Decimal("1.51")], pa.decimal128(10, 2)), "x": [1]}),
                   tmp_path / "bad" / "d=1.505" / "f.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"partition key 'd' is '1.505'"):
        pqloader.Loader(str(tmp_path / "bad"), batch_size=10)


# ---------------------------------------------------------------------------
# pandas: index columns, nullable integers, object strings with None
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pandas_file(tmp_path_factory):
    pd = pytest.importorskip("pandas")
    d = tmp_path_factory.mktemp("pandas")
    df = pd.DataFrame({
        "a": pd.array([i if i % 5 else None for i in range(N)], dtype="Int64"),
        "b": [f"s{i}" if i % 7 else None for i in range(N)],
        "c": np.arange(N, dtype=np.float32),
    }, index=pd.Index([f"r{i}" for i in range(N)], name=None))
    path = d / "frame.parquet"
    df.to_parquet(path, row_group_size=100)
    return path


def test_pandas_index_is_left_out_unless_selected(pandas_file):
    assert "__index_level_0__" in pq.read_schema(pandas_file).names, "precondition"
    loader = pqloader.Loader(str(pandas_file), null_mask=True)
    assert "__index_level_0__" not in loader.column_info
    got = collect(pqloader.Loader(str(pandas_file), columns=["c", "__index_level_0__"]))
    assert got["__index_level_0__"] == [f"r{i}" for i in range(N)]


def test_pandas_nulls_are_refused_at_construction_naming_file_and_count(pandas_file):
    with pytest.raises(pqloader.InvalidDataError) as ei:
        pqloader.Loader(str(pandas_file))  # no batch read
    msg = str(ei.value)
    assert "'a'" in msg and "frame.parquet" in msg and f"{len(range(0, N, 5))} null" in msg
    assert "fill_null" in msg and "null_mask" in msg


def test_pandas_nulls_with_masks_equal_pyarrow(pandas_file):
    got = collect(pqloader.Loader(str(pandas_file), null_mask=["a", "b"], fill_null={"a": -1}, batch_size=64))
    table = pq.read_table(pandas_file)
    a = table["a"].combine_chunks()
    assert_column_equal(got["a_valid"], a.is_valid().to_numpy(zero_copy_only=False), "a_valid")
    assert_column_equal(got["a"], a.fill_null(-1).to_numpy(), "a")
    b = table["b"].to_pylist()
    assert got["b"] == [v if v is not None else "" for v in b]
    assert got["b_valid"].tolist() == [v is not None for v in b]
    assert list(got) == ["a", "a_valid", "b", "b_valid", "c"]


@pytest.mark.parametrize("columns", [None, ["x", "iv.left"], ["iv"], ["iv.right", "x"]])
def test_a_pandas_interval_column_loads_as_its_storage_structs_leaves(tmp_path, columns):
    # pandas registers its interval type (storage struct<left, right>) with pyarrow when it
    # writes one: in such a process the column was refused ("column 'iv.left' has no
    # Parquet leaves"), and every column of the file with it; Arrow builds the extension
    # type only from all of its storage's leaves.
    pd = pytest.importorskip("pandas")
    n = 300
    path = tmp_path / "interval.parquet"
    pd.DataFrame({"x": np.arange(n), "iv": pd.arrays.IntervalArray.from_breaks(np.arange(n + 1) * 0.5)}).to_parquet(
        path, row_group_size=70)
    assert isinstance(pq.read_schema(path).field("iv").type, pa.ExtensionType), "precondition"
    storage = pq.read_table(path)["iv"].combine_chunks().storage
    want = {"x": np.arange(n), "iv.left": storage.field("left").to_numpy(),
            "iv.right": storage.field("right").to_numpy()}
    names = {None: ["x", "iv.left", "iv.right"], ("iv",): ["iv.left", "iv.right"]}.get(
        tuple(columns) if columns else None, columns)
    for shuffle in (False, True):
        with pqloader.Loader(str(path), batch_size=32, columns=columns, shuffle=shuffle, seed=1) as loader:
            got = collect(loader)
        assert list(got) == names
        order = np.argsort(got["x"] if "x" in got else got["iv.left"])  # (unique, ascending)
        for name in names:
            np.testing.assert_array_equal(got[name][order], want[name], err_msg=name)


def test_pandas_period_columns_load_and_a_dropped_loader_does_not_hang(tmp_path):
    # pandas registers its period (and interval) types with pyarrow (Python extension types):
    # a reader of such a file, freed on a worker thread, takes the GIL; a Loader dropped
    # without close() after an epoch (its next epoch read ahead) joined its workers with
    # the GIL held, and the process hung. In a child process, so a hang fails the test.
    pytest.importorskip("pandas")
    script = tmp_path / "period.py"
    script.write_text(
        "import sys, numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq, pqloader\n"
        "path = sys.argv[1]\n"
        "n = 600\n"
        "pd.DataFrame({'x': np.arange(n), 'p': pd.period_range('2000-01', periods=n, freq='M')}).to_parquet(path, row_group_size=60)\n"
        "assert isinstance(pq.read_schema(path).field('p').type, pa.ExtensionType)  # precondition\n"
        "want = pq.read_table(path)['p'].combine_chunks().storage.to_numpy()\n"
        "for i in range(8):\n"
        "    loader = pqloader.Loader(path, batch_size=64, shuffle=bool(i % 2), seed=i, columns=['x', 'p'])\n"
        "    got = {}\n"
        "    for b in loader:\n"
        "        for k, v in b.items():\n"
        "            got.setdefault(k, []).append(v)\n"
        "    x, p = (np.concatenate(got[k]) for k in ('x', 'p'))\n"
        "    assert sorted(x.tolist()) == list(range(n)) and (p == want[x]).all()\n"
        "    del loader  # no close(): the next epoch's read-ahead is joined here\n"
        "print('ok')\n")
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "period.parquet")],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a Loader of a pandas period file hung when dropped")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ---------------------------------------------------------------------------
# Hugging Face datasets: the Image feature (struct<bytes, path>)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_image_file(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(5)
    images = []
    for i in range(24):
        arr = rng.integers(0, 255, (8 + i % 3, 10, 3), dtype=np.uint8)
        images.append(Image.fromarray(arr) if i % 4 else Image.fromarray(arr[:, :, 0]))  # some gray
    ds = datasets.Dataset.from_dict({"image": images, "label": list(range(24))},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    path = tmp_path_factory.mktemp("hf") / "train.parquet"
    ds.to_parquet(str(path))
    return path


def test_hf_image_feature_loads_by_dotted_path_and_decodes_like_pil(hf_image_file):
    from PIL import Image
    from pqloader import transforms as T

    schema = pq.read_schema(hf_image_file)
    assert pa.types.is_struct(schema.field("image").type), "precondition: HF stores images as structs"
    batches = list(pqloader.Loader(str(hf_image_file), columns=["image.bytes", "label"], batch_size=1,
                                   transforms={"image.bytes": [T.DecodeImage()]}))
    table = pq.read_table(hf_image_file).flatten()
    assert [int(b["label"][0]) for b in batches] == table["label"].to_pylist()
    for b, raw in zip(batches, table["image.bytes"].to_pylist(), strict=True):
        want = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
        np.testing.assert_array_equal(b["image.bytes"][0], want)


def test_hf_image_struct_whole_is_its_leaves(hf_image_file):
    loader = pqloader.Loader(str(hf_image_file), fill_null={"image.path": ""})
    assert list(loader.column_info) == ["image.bytes", "image.path", "label"]
    got = collect(loader)
    expected = expected_of(pq.read_table(hf_image_file))
    assert got["image.bytes"] == expected["image.bytes"]
    assert got["image.path"] == [p or "" for p in expected["image.path"]]


def test_hf_array2d_list_of_lists_of_one_length_is_refused_naming_the_column(tmp_path):
    # Hugging Face's Array2D feature: list<list<float>> whose inner lists all have one
    # length. Refused by its type (README's type table), naming the column and the type.
    table = pa.table({
        "id": pa.array(range(4), pa.int64()),
        "arr2d": pa.array([[[float(i)] * 3] * 2 for i in range(4)], pa.list_(pa.list_(pa.float32()))),
    })
    path = tmp_path / "hf_array2d.parquet"
    pq.write_table(table, path)
    with pytest.raises(pqloader.UnsupportedTypeError, match=r"column 'arr2d' has type list<element: list<element: float>>"):
        pqloader.Loader(str(path))
    assert collect(pqloader.Loader(str(path), columns=["id"]))["id"].tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------------------
# Spark (pyspark local mode): decimals, structs, arrays of strings, null partitions,
# INT96 timestamps (Spark's default) with its 9999-12-31 "end of time"
# ---------------------------------------------------------------------------

SPARK_SCRIPT = r"""
import datetime
import sys
from decimal import Decimal
from pyspark.sql import SparkSession
from pyspark.sql import types as T
spark = (SparkSession.builder.master("local[1]").appName("pqloader-writers")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.memory", "1g").config("spark.sql.session.timeZone", "UTC")
         .getOrCreate())
schema = T.StructType([
    T.StructField("id", T.LongType()),
    T.StructField("amount", T.DecimalType(10, 3)),
    T.StructField("info", T.StructType([T.StructField("k", T.IntegerType()), T.StructField("v", T.StringType())])),
    T.StructField("words", T.ArrayType(T.StringType())),
    T.StructField("region", T.StringType()),
    T.StructField("valid_to", T.TimestampType()),
])
rows = [(i, Decimal(i) / Decimal(8), (i % 9, "v%d" % i), ["a%d" % i, "b"], None if i % 4 == 0 else "r%d" % (i % 3),
         datetime.datetime(9999, 12, 31, 23, 59, 59) if i % 5 == 0 else datetime.datetime(2020, 1, 1 + i % 28, i % 24))
        for i in range(__N__)]
spark.createDataFrame(rows, schema).coalesce(1).write.partitionBy("region").parquet(sys.argv[1])
spark.stop()
"""


@pytest.fixture(scope="module")
def spark_dir(tmp_path_factory):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.fail("pyspark needs Java: install openjdk-17-jre-headless (make test does)", pytrace=False)
    out = tmp_path_factory.mktemp("spark") / "out"
    script = tmp_path_factory.mktemp("spark_script") / "write.py"
    script.write_text(SPARK_SCRIPT.replace("__N__", str(N)))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC")
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_spark_dataset_with_decimals_structs_arrays_and_null_partition_equals_pyarrow(spark_dir):
    names = {p.name for p in spark_dir.rglob("*")}
    assert "_SUCCESS" in names and any(n.startswith("region=__HIVE_DEFAULT_PARTITION__") for n in names)
    got = collect(pqloader.Loader(str(spark_dir), null_mask=["region"], batch_size=50,
                                  columns=["id", "amount", "info", "words", "region"]))
    table = pads.dataset(str(spark_dir), partitioning="hive").to_table().sort_by("id")
    order = np.argsort(got["id"])
    expected = expected_of(table)
    for name in ("id", "amount", "info.k", "info.v", "words"):
        col = got[name]
        sorted_col = [col[i] for i in order] if isinstance(col, list) else col[order]
        exp = expected[name]
        if isinstance(exp, list):
            assert sorted_col == exp, name
        else:
            assert_column_equal(sorted_col, exp, name)
    region = [got["region"][i] for i in order]
    valid = got["region_valid"][order]
    assert [r if v else None for r, v in zip(region, valid)] == table["region"].to_pylist()


def test_spark_int96_end_of_time_is_refused_as_nanoseconds_and_loads_as_microseconds(spark_dir):
    files = sorted(spark_dir.rglob("*.parquet"))
    schemas = [pq.ParquetFile(f).schema for f in files]
    assert {s.column(s.names.index("valid_to")).physical_type for s in schemas} == {"INT96"}
    with pytest.raises(pqloader.InvalidDataError, match="9999-12-31.*coerce_int96_timestamp_unit='us'"):
        collect(pqloader.Loader(str(spark_dir), columns=["id", "valid_to"]))
    got = collect(pqloader.Loader(str(spark_dir), columns=["id", "valid_to"], shuffle=True, seed=5,
                                  coerce_int96_timestamp_unit="us"))
    table = pads.dataset(str(spark_dir), partitioning="hive").to_table(columns=["id"]).sort_by("id")
    expected = pq.read_table(spark_dir, columns=["id", "valid_to"], coerce_int96_timestamp_unit="us").sort_by("id")
    assert expected["id"].to_pylist() == table["id"].to_pylist()
    by_id = dict(zip(expected["id"].to_pylist(), expected["valid_to"].cast(pa.int64()).to_pylist()))
    assert got["valid_to"].tolist() == [by_id[i] for i in got["id"].tolist()]
    end = pa.scalar(datetime.datetime(9999, 12, 31, 23, 59, 59), pa.timestamp("us")).value
    assert sum(v == end for v in by_id.values()) == len([i for i in by_id if i % 5 == 0]) > 0


def test_hf_gray_images_without_channel_axis_on_request(hf_image_file):
    from PIL import Image
    from pqloader import transforms as T

    loader = pqloader.Loader(str(hf_image_file), columns=["image.bytes"], batch_size=1,
                             transforms={"image.bytes": [T.DecodeImage(mode="gray", keepdims=False)]})
    raws = pq.read_table(hf_image_file).flatten()["image.bytes"].to_pylist()
    for b, raw in zip(loader, raws, strict=True):
        want = np.asarray(Image.open(io.BytesIO(raw)).convert("L"))
        assert b["image.bytes"][0].shape == want.shape  # (H, W)
        np.testing.assert_array_equal(b["image.bytes"][0], want)
    kept = next(iter(pqloader.Loader(str(hf_image_file), columns=["image.bytes"], batch_size=1,
                                     transforms={"image.bytes": [T.DecodeImage(mode="gray")]})))
    assert kept["image.bytes"].shape[-1] == 1  # (H, W, 1) by default, as before


# ---------------------------------------------------------------------------
# Hugging Face datasets: every Feature type against datasets' own values
# ---------------------------------------------------------------------------


def _hf_features_dataset():
    """A datasets.Dataset of the Feature types HF writes, with its Python values."""
    datasets = pytest.importorskip("datasets")
    from datasets import ClassLabel, Features, List, Translation, TranslationVariableLanguages, Value

    n = 40
    rng = np.random.default_rng(11)
    ints = {}
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(name)
        ints[name] = [int(info.min), int(info.max)] + [int(v) for v in rng.integers(info.min, info.max, n - 2,
                                                                                      dtype=name, endpoint=True)]
    base = datetime.datetime(2021, 3, 4, 5, 6, 7, 891011)
    data = {f"v_{k}": pa.array(v, pa.uint64()) if k == "uint64" else v for k, v in ints.items()}
    data.update({
        "v_float16": [float(v) for v in rng.standard_normal(n).astype(np.float16)],
        "v_float32": [float(v) for v in rng.standard_normal(n).astype(np.float32)],
        "v_float64": [float(v) for v in rng.standard_normal(n)],
        "v_bool": [bool(i % 3) for i in range(n)],
        "v_string": [f"s{i}é" * (i % 3) for i in range(n)],
        "v_large_string": [f"L{i}" for i in range(n)],
        "v_binary": [bytes([i]) * (i % 4) for i in range(n)],
        "v_date32": [datetime.date(1960, 1, 1) + datetime.timedelta(days=400 * i) for i in range(n)],
        "v_ts_us_tz": [base + datetime.timedelta(hours=37 * i, microseconds=i) for i in range(n)],
        "v_ts_ns": [base - datetime.timedelta(days=91 * i) for i in range(n)],
        "v_duration_us": [datetime.timedelta(seconds=7 * i - 100, microseconds=i) for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "fixed": [[float(i), -float(i)] for i in range(n)],
        "fixed2d": [[[i, i + 1, i + 2], [-i, 0, i]] for i in range(n)],
        "tokens": [list(range(i % 4)) for i in range(n)],
        "words": [[f"w{j}" for j in range(i % 3)] for i in range(n)],
        "spans": [[{"start": j, "text": f"t{j}"} for j in range(i % 3)] for i in range(n)],
        "meta": [{"a": i, "b": f"b{i}", "c": {"d": i / 4}} for i in range(n)],
        "tr": [{"en": f"e{i}", "fr": f"f{i}"} for i in range(n)],
        "trv": [{"en": f"e{i}", "fr": [f"f{i}", f"g{i}"]} if i % 2 else {"de": f"d{i}"} for i in range(n)],
    })
    features = Features({
        **{f"v_{k}": Value(k) for k in ints},
        "v_float16": Value("float16"), "v_float32": Value("float32"), "v_float64": Value("float64"),
        "v_bool": Value("bool"), "v_string": Value("string"), "v_large_string": Value("large_string"),
        "v_binary": Value("binary"), "v_date32": Value("date32"),
        "v_ts_us_tz": Value("timestamp[us, tz=Europe/Paris]"), "v_ts_ns": Value("timestamp[ns]"),
        "v_duration_us": Value("duration[us]"),
        "label": ClassLabel(names=["a", "b", "c"]),
        "fixed": List(Value("float32"), length=2),
        "fixed2d": List(List(Value("int16"), length=3), length=2),
        "tokens": List(Value("int32")),
        "words": List(Value("string")),
        "spans": List({"start": Value("int32"), "text": Value("string")}),
        "meta": {"a": Value("int16"), "b": Value("string"), "c": {"d": Value("float32")}},
        "tr": Translation(languages=["en", "fr"]),
        "trv": TranslationVariableLanguages(languages=["de", "en", "fr"]),
    })
    return datasets.Dataset.from_dict(data, features=features)


def test_hf_every_feature_type_equals_datasets_own_values(tmp_path):
    ds = _hf_features_dataset()
    path = tmp_path / "features.parquet"
    ds.to_parquet(str(path))
    # A list of structs loads by its fields' dotted paths (the whole column is refused).
    columns = [c for c in ds.column_names if c != "spans"] + ["spans.start", "spans.text"]
    got = collect(pqloader.Loader(str(path), columns=columns, batch_size=len(ds),  # one batch: one offsets
                                  lists={"tokens": "ragged", "spans.start": "ragged"}))
    rows = ds[:]  # datasets' Python values, in its order
    for name in ("v_int8", "v_int16", "v_int32", "v_int64", "v_uint8", "v_uint16", "v_uint32", "v_uint64",
                 "v_float16", "v_float32", "v_float64", "v_bool", "label"):
        assert got[name].dtype == np.dtype(name[2:] if name.startswith("v_") else "int64"), name
        assert got[name].tolist() == rows[name], name
    for name in ("v_string", "v_large_string", "v_binary", "words"):
        assert got[name] == rows[name], name
    epoch = datetime.date(1970, 1, 1)
    assert got["v_date32"].dtype == np.int32
    assert got["v_date32"].tolist() == [(d - epoch).days for d in rows["v_date32"]]
    utc = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    assert got["v_ts_us_tz"].tolist() == [(t - utc) // datetime.timedelta(microseconds=1) for t in rows["v_ts_us_tz"]]
    assert got["v_ts_ns"].tolist() == [(t - utc.replace(tzinfo=None)) // datetime.timedelta(microseconds=1) * 1000
                                       for t in rows["v_ts_ns"]]
    assert got["v_duration_us"].tolist() == [d // datetime.timedelta(microseconds=1) for d in rows["v_duration_us"]]
    assert got["fixed"].shape == (len(ds), 2) and got["fixed"].tolist() == rows["fixed"]
    assert got["fixed2d"].shape == (len(ds), 2, 3) and got["fixed2d"].dtype == np.int16
    assert got["fixed2d"].tolist() == rows["fixed2d"]
    offsets = np.cumsum([0] + [len(t) for t in rows["tokens"]])
    assert got["tokens"].tolist() == [v for t in rows["tokens"] for v in t]
    assert got["tokens_offsets"].tolist() == offsets.tolist()
    assert got["spans.start"].tolist() == [s["start"] for r in rows["spans"] for s in r]
    assert got["spans.text"] == [[s["text"] for s in r] for r in rows["spans"]]
    assert got["meta.a"].tolist() == [m["a"] for m in rows["meta"]]
    assert got["meta.b"] == [m["b"] for m in rows["meta"]]
    assert got["meta.c.d"].tolist() == [m["c"]["d"] for m in rows["meta"]]
    assert got["tr.en"] == [t["en"] for t in rows["tr"]] and got["tr.fr"] == [t["fr"] for t in rows["tr"]]
    assert got["trv.language"] == [t["language"] for t in rows["trv"]]
    assert got["trv.translation"] == [t["translation"] for t in rows["trv"]]


def test_hf_sharded_files_load_in_file_order_with_empty_shards(tmp_path):
    # As push_to_hub shards a split (train-00000-of-00100.parquet ...), the small ones empty.
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": list(range(60)), "text": [f"t{i}" for i in range(60)]})
    for i in range(100):
        shard = ds.shard(num_shards=100, index=i) if i < 60 else ds.select([])
        shard.to_parquet(str(tmp_path / f"train-{i:05d}-of-00100.parquet"))
    got = collect(pqloader.Loader(str(tmp_path), batch_size=8))
    assert got["id"].tolist() == list(range(60)) and got["text"] == ds["text"]
    shuffled = collect(pqloader.Loader(str(tmp_path), batch_size=8, shuffle=True, seed=4))
    assert sorted(shuffled["id"].tolist()) == list(range(60))


@pytest.fixture(scope="module")
def hf_null_image_files(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    d = tmp_path_factory.mktemp("hf_null_images")
    rng = np.random.default_rng(8)
    images = [Image.fromarray(rng.integers(0, 255, (4, 5, 3), dtype=np.uint8)) for _ in range(6)]
    for i, im in enumerate(images):
        im.save(d / f"{i}.png")
    features = datasets.Features({"image": datasets.Image()})
    # None beside images; images made from local files (HF keeps their paths, bytes null)
    datasets.Dataset.from_dict({"image": [None if i % 3 == 1 else im for i, im in enumerate(images)]},
                               features=features).to_parquet(str(d / "some_none.parquet"))
    by_path = datasets.Dataset.from_dict({"image": [str(d / f"{i}.png") for i in range(6)]}, features=features)
    by_path.to_parquet(str(d / "by_path.parquet"))
    return d, images, by_path


def test_hf_null_images_are_refused_naming_a_fill_the_decoder_takes(hf_null_image_files):
    # The null refusal's hint gave fill_null={'image.bytes': ''}, which the Loader then
    # refuses (each null row is decoded from its fill): it names an image instead, and
    # where Hugging Face leaves null bytes (images kept by path) and how to embed them.
    from PIL import Image
    from pqloader import transforms as T

    d, images, by_path = hf_null_image_files
    ops = {"image.bytes": [T.DecodeImage()]}
    for name, nulls in (("some_none", 2), ("by_path", 6)):
        with pytest.raises(pqloader.InvalidDataError) as e:
            pqloader.Loader(str(d / f"{name}.parquet"), columns=["image.bytes"], transforms=ops)
        text = str(e.value)
        assert text.startswith(f"column 'image.bytes' (binary) has {nulls} null value(s)"), text
        assert "fill_null={'image.bytes': <a JPEG or PNG image>}" in text and "''" not in text, text
        assert "'image.path'" in text and "embed_table_storage" in text, text
        # The filter it names is one the Loader takes (pc.field('image.bytes') is no
        # top-level column: a ColumnNotFoundError), and it drops the null rows.
        named = re.search(r"filter=(pc\..*?\.is_valid\(\))", text).group(1)
        kept = collect(pqloader.Loader(str(d / f"{name}.parquet"), columns=["image.bytes"], transforms=ops,
                                       batch_size=1, filter=eval(named, {"pc": pc})))
        assert len(kept.get("image.bytes", [])) == 6 - nulls
    # Without a decode op '' is a fill that works: the engine's hint stands.
    with pytest.raises(pqloader.InvalidDataError, match=r"fill_null=\{'image.bytes': ''\}"):
        pqloader.Loader(str(d / "some_none.parquet"), columns=["image.bytes"])
    # The fill it names loads; the masked rows are the None ones.
    fill = (d / "0.png").read_bytes()
    got = collect(pqloader.Loader(str(d / "some_none.parquet"), columns=["image.bytes"], batch_size=1,
                                  transforms=ops, fill_null={"image.bytes": fill}, null_mask=True))
    assert got["image.bytes_valid"].tolist() == [i % 3 != 1 for i in range(6)]
    for i, im in enumerate(images):
        want = np.asarray(im if i % 3 != 1 else Image.open(d / "0.png").convert("RGB"))
        np.testing.assert_array_equal(got["image.bytes"][i], want)
    # The embedding it names: the files' bytes in the Parquet file, pixel for pixel.
    from datasets.table import embed_table_storage

    embedded = by_path.with_format("arrow").map(embed_table_storage, batched=True).with_format(None)
    embedded.to_parquet(str(d / "embedded.parquet"))
    got = collect(pqloader.Loader(str(d / "embedded.parquet"), columns=["image.bytes"], batch_size=1,
                                  transforms=ops))
    for i, im in enumerate(images):
        np.testing.assert_array_equal(got["image.bytes"][i], np.asarray(im))


def test_hf_save_to_disk_arrow_files_are_refused_pointing_to_parquet(tmp_path):
    # save_to_disk (and datasets' cache) write Arrow IPC streams named .arrow: "not
    # Parquet", and where they come from and how to write Parquet.
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"a": list(range(10))}).save_to_disk(str(saved), num_shards=2)
    arrow = sorted(saved.glob("*.arrow"))
    assert len(arrow) == 2
    hint = r"'\.arrow' files are Arrow IPC, as Hugging Face datasets' save_to_disk .*to_parquet"
    with pytest.raises(pqloader.DataNotFoundError, match="no Parquet files found.*" + hint):
        pqloader.Loader(str(saved))
    with pytest.raises(pqloader.DataNotFoundError, match=hint):
        pqloader.inspect(str(saved))
    with pytest.raises(pqloader.InvalidDataError, match="is not a readable Parquet file.*" + hint):
        pqloader.Loader(str(arrow[0]))
    # A corrupt .parquet is not blamed on an .arrow file beside it.
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    shutil.copy(arrow[0], tmp_path / "x.arrow")
    with pytest.raises(pqloader.InvalidDataError) as e:
        pqloader.Loader(str(tmp_path / "bad.parquet"))
    assert "Arrow IPC" not in str(e.value)
    # Listed beyond the five files the message names: found by the directory's listing.
    many = tmp_path / "many"
    many.mkdir()
    for i in range(6):
        (many / f"a{i}.json").write_text("{}")
    shutil.copy(arrow[0], many / "z.arrow")
    with pytest.raises(pqloader.DataNotFoundError, match=r"\.\.\.\) is not Parquet.*" + hint):
        pqloader.Loader(str(many))


def test_hf_images_written_as_tiff_are_refused_naming_the_format(tmp_path):
    # HF's Image feature writes a PIL image of mode P (a palette: segmentation masks), I,
    # F, I;16 or CMYK as TIFF: the refusal said only "not a JPEG or PNG image (N bytes)".
    datasets = pytest.importorskip("datasets")
    from PIL import Image
    from pqloader import transforms as T

    im = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3)).convert("P")
    path = tmp_path / "p.parquet"
    datasets.Dataset.from_dict({"image": [im]}, features=datasets.Features({"image": datasets.Image()})
                               ).to_parquet(str(path))
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"row 0, column 'image.bytes': .*not a JPEG or PNG image \(\d+ bytes; it is a "
                             r"TIFF image: Hugging Face's Image feature writes .*\): re-encode it as PNG"):
        collect(pqloader.Loader(str(path), columns=["image.bytes"], transforms={"image.bytes": [T.DecodeImage()]}))
