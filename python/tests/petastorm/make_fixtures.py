"""Build the Petastorm test fixtures with real Petastorm 0.13.1 + pyspark, and record
what Petastorm decodes from them.

    bash bench/setup_venvs.sh petastorm        # pinned venv: petastorm, pyspark, pyarrow<15, numpy<2
    bench/.venvs/petastorm/bin/python python/tests/petastorm/make_fixtures.py

Needs Java 17 (Debian package ``openjdk-17-jre-headless``). Writes, under
``python/tests/petastorm/fixtures/`` (checked in, about 200 KB):

- ``codecs/``: a Petastorm dataset written by ``materialize_dataset`` under pyspark:
  3 files, several row groups each, fields with ScalarCodec (8 Spark types),
  CompressedImageCodec ('png' RGB and gray, 'jpeg'), NdarrayCodec, CompressedNdarrayCodec,
  and a row-group index (``build_rowgroup_index``, SingleFieldIndexer on ``label``).
- ``codecs_expected.npz``: every field as ``make_reader`` decodes it (natural order,
  ``shuffle_row_groups=False``), one array per field, plus what Petastorm returns for the
  predicates, the row-group selector, a TransformSpec and ``petastorm.pytorch.DataLoader``.
- ``plain/``: plain Parquet written by Spark (no Petastorm metadata), and
  ``plain_expected.npz``: what ``make_batch_reader`` returns for it, concatenated.
- ``unischema.pickle``: the raw ``dataset-toolkit.unischema.v1`` bytes (for the reader test).

The tests (python/tests/test_petastorm.py) compare pqloader.petastorm against these files
without importing petastorm. Rerunning rewrites them; the generated pixels, arrays and
ids are seeded, so only Spark's file names (random UUIDs) change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
N_ROWS = 40
N_FILES = 3
H, W = 16, 24


def _check_java() -> None:
    try:
        subprocess.run(["java", "-version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        sys.exit("Java is missing: pyspark needs it (Debian: apt-get install openjdk-17-jre-headless)")


def _image(rng: np.random.Generator, i: int, channels: int) -> np.ndarray:
    """A smooth gradient with a little noise: compresses well, and decodes exactly (PNG)."""
    y, x = np.mgrid[0:H, 0:W]
    base = (x * 7 + y * 5 + i * 11) % 256
    img = np.stack([(base + 40 * c) % 256 for c in range(channels)], axis=-1)
    img = img + rng.integers(0, 8, img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img[..., 0] if channels == 1 else img


def schema():
    from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql import types as T

    return Unischema("FixtureSchema", [
        UnischemaField("id", np.int32, (), ScalarCodec(T.IntegerType()), False),
        UnischemaField("id64", np.int64, (), ScalarCodec(T.LongType()), False),
        UnischemaField("label", np.int32, (), ScalarCodec(T.IntegerType()), False),
        UnischemaField("small", np.int8, (), ScalarCodec(T.ByteType()), False),
        UnischemaField("short", np.int16, (), ScalarCodec(T.ShortType()), False),
        UnischemaField("u8", np.uint8, (), ScalarCodec(T.ShortType()), False),
        UnischemaField("f32", np.float32, (), ScalarCodec(T.FloatType()), False),
        UnischemaField("f64", np.float64, (), ScalarCodec(T.DoubleType()), False),
        UnischemaField("flag", np.bool_, (), ScalarCodec(T.BooleanType()), False),
        UnischemaField("name", np.str_, (), ScalarCodec(T.StringType()), False),
        UnischemaField("image_png", np.uint8, (H, W, 3), CompressedImageCodec("png"), False),
        UnischemaField("image_jpeg", np.uint8, (H, W, 3), CompressedImageCodec("jpeg", quality=90), False),
        UnischemaField("gray_png", np.uint8, (H, W), CompressedImageCodec("png"), False),
        UnischemaField("matrix", np.float32, (4, 5), NdarrayCodec(), False),
        UnischemaField("tags", np.int32, (3,), NdarrayCodec(), False),
        UnischemaField("volume", np.uint8, (None, 3, 2), NdarrayCodec(), False),
        UnischemaField("packed", np.float64, (3, 3), CompressedNdarrayCodec(), False),
    ])


def row(i: int) -> dict:
    rng = np.random.default_rng(1000 + i)
    return {
        "id": np.int32(i),
        "id64": np.int64(i) * 10_000_000_000,
        "label": np.int32(i % 5),
        "small": np.int8(i - 20),
        "short": np.int16(i * 300 - 7000),
        "u8": np.uint8(200 + i % 50),
        "f32": np.float32(i) / np.float32(3),
        "f64": np.float64(i) * 1.5 - 0.25,
        "flag": np.bool_(i % 3 == 0),
        "name": f"row-{i:03d}-{'x' * (i % 4)}",
        "image_png": _image(rng, i, 3),
        "image_jpeg": _image(rng, i + 100, 3),
        "gray_png": _image(rng, i + 200, 1),
        "matrix": rng.standard_normal((4, 5)).astype(np.float32),
        "tags": np.array([i % 7, (i * 3) % 11, 100 + i % 2], dtype=np.int32),
        "volume": rng.integers(0, 255, (2, 3, 2), dtype=np.uint8),
        "packed": rng.standard_normal((3, 3)),
    }


def spark_session():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.master("local[1]").appName("pqloader-fixtures")
            .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.memory", "1g").getOrCreate())


def write_codecs(spark, path: str) -> None:
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.etl.rowgroup_indexers import SingleFieldIndexer
    from petastorm.etl.rowgroup_indexing import build_rowgroup_index
    from petastorm.unischema import dict_to_spark_row

    s = schema()
    url = "file://" + path
    with materialize_dataset(spark, url, s, row_group_size_mb=1):
        # Small row groups (several per file): the block size in bytes, after
        # materialize_dataset has set it in MB; without dictionaries, whose size
        # parquet-mr leaves out of its row-group size estimate.
        _small_row_groups(spark, 6 * 1024)
        rdd = spark.sparkContext.parallelize(range(N_ROWS), N_FILES).map(row).map(
            lambda r: dict_to_spark_row(s, r))
        spark.createDataFrame(rdd, s.as_spark_schema()).write.mode("overwrite").parquet(url)
    build_rowgroup_index(url, spark.sparkContext, [SingleFieldIndexer("label_index", "label")])


def _small_row_groups(spark, block_bytes: int) -> None:
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.setInt("parquet.block.size", block_bytes)
    conf.setBoolean("parquet.enable.dictionary", False)
    conf.setInt("parquet.block.size.row.check.min", 3)
    conf.setInt("parquet.row-group.size.row.check.min", 3)
    conf.setInt("parquet.page.size.row.check.min", 3)  # what parquet-mr 1.13 checks row groups by


def write_plain(spark, path: str) -> None:
    from pyspark.sql import Row
    from pyspark.sql import types as T

    st = T.StructType([
        T.StructField("id", T.LongType(), False),
        T.StructField("score", T.DoubleType(), False),
        T.StructField("count", T.IntegerType(), False),
        T.StructField("word", T.StringType(), False),
        T.StructField("vec", T.ArrayType(T.FloatType(), False), False),
    ])
    rows = [Row(id=i, score=i * 0.5, count=i % 9, word=f"w{i % 6}",
                vec=[float(i), float(i) / 2, -float(i)]) for i in range(N_ROWS)]
    _small_row_groups(spark, 512)
    spark.createDataFrame(rows, st).repartition(1).write.mode("overwrite").parquet("file://" + path)


def _stack(values: list) -> np.ndarray:
    if isinstance(values[0], str):
        return np.array(values, dtype=np.str_)
    return np.stack([np.asarray(v) for v in values])


def record_codecs(path: str) -> dict:
    import torch
    from petastorm import TransformSpec, make_reader
    from petastorm.predicates import in_intersection, in_lambda, in_pseudorandom_split, in_reduce, in_set
    from petastorm.pytorch import DataLoader
    from petastorm.selectors import SingleIndexSelector

    url = "file://" + path
    kw = dict(reader_pool_type="dummy", shuffle_row_groups=False, num_epochs=1)
    out: dict = {}
    with make_reader(url, **kw) as reader:
        rows = [r._asdict() for r in reader]
    for name in rows[0]:
        out[f"field/{name}"] = _stack([r[name] for r in rows])
        out[f"dtype/{name}"] = np.array(str(np.asarray(rows[0][name]).dtype))

    def ids(**extra):
        with make_reader(url, **kw, **extra) as reader:  # predicate fields must be read too
            return np.array([int(r.id) for r in reader], dtype=np.int64)

    out["pred/in_set"] = ids(predicate=in_set([1, 2, 3, 17, 40], "label"))
    out["pred/in_set_ids"] = ids(predicate=in_set({3, 5, 8, 13, 21, 34}, "id"))
    out["pred/in_lambda"] = ids(predicate=in_lambda(["f64", "flag"], lambda f, b: f > 20 and not b))
    out["pred/in_lambda_state"] = ids(predicate=in_lambda(["id"], lambda i, s: i % s == 1, 4))
    out["pred/in_intersection"] = ids(predicate=in_intersection([3, 10], "tags"))
    out["pred/in_reduce_all"] = ids(predicate=in_reduce([in_set([0, 1], "label"),
                                                        in_lambda(["id"], lambda i: i > 10)], all))
    out["pred/in_reduce_any"] = ids(predicate=in_reduce([in_set([0], "label"),
                                                        in_lambda(["id"], lambda i: i > 40)], any))
    out["pred/in_pseudorandom_split_0"] = ids(predicate=in_pseudorandom_split([0.3, 0.7], 0, "name"))
    out["pred/in_pseudorandom_split_1"] = ids(predicate=in_pseudorandom_split([0.3, 0.7], 1, "id"))
    out["selector/label_2_4"] = ids(rowgroup_selector=SingleIndexSelector("label_index", [2, 4]))

    def double_matrix(r):
        r["matrix"] = r["matrix"] * 2
        r["ratio"] = np.float64(r["id"]) / 7
        return r

    spec = TransformSpec(double_matrix, edit_fields=[("ratio", np.float64, (), False)],
                         removed_fields=["image_png", "image_jpeg", "gray_png", "name"])
    with make_reader(url, schema_fields=["id", "matrix", "name", "image_png", "image_jpeg", "gray_png"],
                     transform_spec=spec, **kw) as reader:
        trows = [r._asdict() for r in reader]
    out["transform/fields"] = np.array(sorted(trows[0]))
    for name in trows[0]:
        out[f"transform/{name}"] = _stack([r[name] for r in trows])

    with DataLoader(make_reader(url, schema_fields=["id", "u8", "flag", "f32", "name", "matrix",
                                                    "gray_png"], **kw),
                    batch_size=10) as loader:
        batches = list(loader)
    out["torch/num_batches"] = np.array(len(batches))
    for name, value in batches[0].items():
        if isinstance(value, torch.Tensor):
            out[f"torch/{name}"] = np.concatenate([b[name].numpy() for b in batches])
            out[f"torch_dtype/{name}"] = np.array(str(value.dtype))
        else:
            out[f"torch/{name}"] = np.array([v for b in batches for v in b[name]])
            out[f"torch_dtype/{name}"] = np.array(type(value).__name__)
    return out


def record_plain(path: str) -> dict:
    from petastorm import make_batch_reader

    out: dict = {}
    with make_batch_reader("file://" + path, reader_pool_type="dummy", shuffle_row_groups=False,
                           num_epochs=1) as reader:
        batches = [b._asdict() for b in reader]
    out["num_batches"] = np.array(len(batches))
    for name in batches[0]:
        out[f"field/{name}"] = np.concatenate([b[name] for b in batches])
        out[f"dtype/{name}"] = np.array(str(batches[0][name].dtype))
    return out


def _tidy(path: str) -> None:
    """Drop Spark's checksum and marker files: they are not data."""
    for name in os.listdir(path):
        if name.startswith(".") or name == "_SUCCESS":
            os.remove(os.path.join(path, name))


def main() -> None:
    _check_java()
    import pyarrow.parquet as pq

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    spark = spark_session()
    try:
        codecs = os.path.join(OUT, "codecs")
        plain = os.path.join(OUT, "plain")
        write_codecs(spark, codecs)
        write_plain(spark, plain)
    finally:
        spark.stop()
    _tidy(codecs)
    _tidy(plain)
    meta = pq.read_schema(os.path.join(codecs, "_common_metadata")).metadata
    with open(os.path.join(OUT, "unischema.pickle"), "wb") as f:
        f.write(meta[b"dataset-toolkit.unischema.v1"])
    np.savez_compressed(os.path.join(OUT, "codecs_expected.npz"), **record_codecs(codecs))
    np.savez_compressed(os.path.join(OUT, "plain_expected.npz"), **record_plain(plain))
    layout = {}
    for d in (codecs, plain):
        for name in sorted(os.listdir(d)):
            if name.endswith(".parquet"):
                md = pq.ParquetFile(os.path.join(d, name)).metadata
                layout[f"{os.path.basename(d)}/{name}"] = [md.row_group(i).num_rows
                                                           for i in range(md.num_row_groups)]
    with open(os.path.join(OUT, "layout.json"), "w") as f:
        json.dump(layout, f, indent=1, sort_keys=True)
    print(json.dumps(layout, indent=1))


if __name__ == "__main__":
    main()
